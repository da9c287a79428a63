"""A FIFO, a device or a socket where planrun reads a file is refused at once, never waited
on (found by a fresh helper: a FIFO as ``tools.yaml`` or as the journal hung
``validate`` and ``runs`` forever; ``/dev/null`` as the journal read as "no runs"). A
``planrun.toml`` that is no regular file is refused too, not passed over (found by an
operator: a FIFO or a folder there was skipped, so a parent folder's settings, or none,
were used without a word).

Real processes with a timeout: a hang fails the test instead of stopping the suite.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

PLAN = "planrun: 1\ngoal: nothing\nsteps: []\n"
TOOLS = "tools: {}\n"


def planrun(root: Path, *args: str, journal: Path | str | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``planrun ARGS -C ROOT`` (with ``cwd``: ``planrun ARGS`` run in ``cwd``, no ``-C``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PLANRUN_")}
    env["PLANRUN_JOURNAL"] = str(journal or root / "j.sqlite3")
    where = [] if cwd is not None else ["-C", str(root)]
    return subprocess.run([sys.executable, "-m", "planrun", *args, *where],
                          cwd=cwd or root, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=60)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "plans").mkdir()
    (tmp_path / "plans" / "p.yaml").write_text(PLAN)
    (tmp_path / "tools.yaml").write_text(TOOLS)
    return tmp_path


@contextmanager
def not_regular(path: Path, kind: str) -> Iterator[None]:
    """``path`` made a FIFO, a Unix socket (listening), a device (a symlink to one), a
    folder or a symlink to nothing."""
    path.unlink(missing_ok=True)
    if kind == "folder":
        path.mkdir()
        yield
    elif kind == "dangling":
        path.symlink_to(path.parent / "nothing-here")
        yield
    elif kind == "fifo":
        os.mkfifo(path)
        yield
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(path))
            s.listen()
            yield
    else:
        path.symlink_to("/dev/zero")
        yield


@pytest.mark.parametrize("kind", ["fifo", "socket", "device"])
@pytest.mark.parametrize("which", ["tools.yaml", "plans/p.yaml"])
def test_a_plan_or_registry_that_is_no_regular_file_is_refused(root: Path, kind: str,
                                                                which: str) -> None:
    with not_regular(root / which, kind):
        result = planrun(root, "validate", "p")
    assert result.returncode == 3, result  # refused, with the file named
    assert "not a regular file" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("kind", ["fifo", "socket", "device"])
@pytest.mark.parametrize("command", [["runs"], ["status"], ["execute", "p"]])
def test_a_journal_that_is_no_regular_file_is_exit_6(root: Path, kind: str,
                                                     command: list[str]) -> None:
    journal = root / "journal"
    with not_regular(journal, kind):
        result = planrun(root, *command, journal=journal)
    assert result.returncode == 6, result
    assert "error[journal]" in result.stderr
    assert "not a regular file" in result.stderr
    assert "Traceback" not in result.stderr


def test_dev_null_as_the_journal_is_no_journal(root: Path) -> None:
    result = planrun(root, "runs", journal="/dev/null")
    assert result.returncode == 6, result
    assert "not a regular file" in result.stderr


KINDS = ["fifo", "socket", "device", "folder", "dangling"]
#: What the message says of each kind.
SAID = {"fifo": "it is a FIFO", "socket": "it is a socket", "device": "it is a device",
        "folder": "it is a folder", "dangling": "No such file or directory"}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["found", "-C"])
def test_a_settings_file_that_is_no_regular_file_is_refused(root: Path, kind: str,
                                                            how: str) -> None:
    """Exit 3 (``config``) at once, whether planrun.toml is found from the current folder
    or in the folder -C names; before, it was passed over (the defaults were used)."""
    with not_regular(root / "planrun.toml", kind):
        result = planrun(root, "validate", "p", cwd=root if how == "found" else None)
    assert result.returncode == 3, result
    assert "error[config]" in result.stderr
    assert SAID[kind] in result.stderr
    assert "Traceback" not in result.stderr


def test_a_settings_file_that_is_no_regular_file_is_not_passed_over_for_a_parent(
        root: Path) -> None:
    """A project in a subfolder whose planrun.toml is a FIFO is not the parent project."""
    (root / "planrun.toml").write_text('plans_dir = "plans"\n')
    sub = root / "sub"
    (sub / "plans").mkdir(parents=True)
    os.mkfifo(sub / "planrun.toml")
    result = planrun(root, "plans", cwd=sub)
    assert result.returncode == 3, result
    assert f"{sub / 'planrun.toml'}: cannot read file: it is a FIFO" in result.stderr
    assert "p" not in result.stdout.split()  # the parent project's plan was not listed


@pytest.mark.parametrize("kind", ["fifo", "socket", "folder"])
def test_a_seed_that_is_no_regular_file_is_named_so(root: Path, kind: str) -> None:
    """``import`` of a FIFO or a folder says what is there, not "no seed file"."""
    seed = root / "seed.json"
    with not_regular(seed, kind):
        result = planrun(root, "import", str(seed))
    assert result.returncode == 3, result
    out = result.stdout + result.stderr
    assert SAID[kind] in out
    assert "no seed file" not in out


def test_a_missing_seed_is_not_found(root: Path) -> None:
    result = planrun(root, "import", str(root / "none.json"))
    assert result.returncode == 3, result
    assert "error[not_found]: no seed file" in result.stdout + result.stderr


@pytest.mark.parametrize(("state", "said"), [
    ("empty", "no plans in plans"), ("missing", "no plans folder plans"),
    ("file", "the plans folder plans is not a folder")])
def test_validate_of_no_plans_says_why(root: Path, state: str, said: str) -> None:
    """``validate`` with no plan named and none found: a warning that tells the cases apart."""
    (root / "plans" / "p.yaml").unlink()
    if state != "empty":
        (root / "plans").rmdir()
    if state == "file":
        (root / "plans").write_text("")
    result = planrun(root, "validate")
    assert result.returncode == 0, result
    assert f"warning[not_found]: {said}" in result.stdout


# `planrun repair` writes the revised plan where the failed run's plan file was (found by
# a review: it replaced whatever was there, a FIFO or a device included, without a word).
FAILING_TOOLS = f"""
tools:
  boom:
    command: ["{sys.executable}", "-c", "import sys; sys.exit(3)"]
    arguments: {{type: object}}
  fine:
    command: ["{sys.executable}", "-c", "pass"]
    arguments: {{type: object}}
"""
FIXING_PLANNER = """
import json, sys
plan = json.load(sys.stdin)["run"]["plan"]
plan["steps"][0]["tool"] = "fine"
print(json.dumps(plan))
"""


def _failed_run(root: Path) -> str:
    (root / "tools.yaml").write_text(FAILING_TOOLS)
    (root / "plans" / "p.yaml").write_text(
        "planrun: 1\ngoal: fail once\nsteps:\n  - {id: a, tool: boom, arguments: {}}\n")
    (root / "fix.py").write_text(FIXING_PLANNER)
    result = planrun(root, "execute", "p", "--json")
    assert result.returncode == 1, result.stderr
    return str(json.loads(result.stdout)["run_id"])


@pytest.mark.parametrize("kind", ["fifo", "socket", "device", "folder", "dangling"])
def test_repair_never_writes_its_revision_over_what_is_no_regular_file(
        root: Path, kind: str) -> None:
    run_id = _failed_run(root)
    target = root / "plans" / "p.yaml"
    with not_regular(target, kind):
        before = os.lstat(target)
        result = planrun(root, "repair", run_id, "--planner", f"cmd:{sys.executable} fix.py",
                         "--json")
        assert result.returncode == 2, (result.returncode, result.stderr)
        said = json.loads(result.stdout)["error"]
        assert said["code"] == "usage"
        assert said["message"].startswith(f"cannot write the revised plan to {target}: ")
        assert ("symlink to nothing" if kind == "dangling"
                else "not a regular file") in said["message"]
        assert "Traceback" not in result.stderr
        after = os.lstat(target)  # still what it was, never replaced
        assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    runs = json.loads(planrun(root, "runs", "--json").stdout)
    assert [r["run_id"] for r in runs] == [run_id]  # no child run was started


def test_repair_through_a_symlink_replaces_the_file_it_names(root: Path) -> None:
    run_id = _failed_run(root)
    real = root / "shared-p.yaml"
    (root / "plans" / "p.yaml").rename(real)
    (root / "plans" / "p.yaml").symlink_to(real)
    result = planrun(root, "repair", run_id, "--planner", f"cmd:{sys.executable} fix.py",
                     "--json")
    assert result.returncode == 0, result.stderr
    assert (root / "plans" / "p.yaml").is_symlink()
    assert "tool: fine" in real.read_text()
