"""Attacks on planrun.parse_cache by a fresh reader (one defect each; all fixed).

Real processes where the defect was seen in one; in-process where the environment (a uid
with no home, a file-size limit) is simpler to make there.
"""

from __future__ import annotations

import hashlib
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from planrun import fits, parse_cache
from planrun.loading import load_file

TOOLS = """\
tools:
  dump:
    command: [python3, -c, "print('{}')"]
    output: json
    arguments: {type: object}
"""


def project(tmp_path: Path, plan: str) -> tuple[Path, dict[str, str], Path]:
    proj = tmp_path / "proj"
    (proj / "plans").mkdir(parents=True)
    (proj / "tools.yaml").write_text(TOOLS)
    (proj / "plans" / "p.yaml").write_text(plan)
    cache = tmp_path / "cache"
    env = dict(os.environ, XDG_CACHE_HOME=str(cache), HOME=str(tmp_path),
               PLANRUN_JOURNAL=str(tmp_path / "j.sqlite"))
    return proj, env, cache / "planrun"


def validate(proj: Path, env: dict[str, str],
             preexec_fn: Callable[[], object] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "planrun", "validate", "p"], cwd=proj,
                          env=env, capture_output=True, text=True, timeout=120, check=False,
                          stdin=subprocess.DEVNULL, preexec_fn=preexec_fn)


def big_plan(n: int = 300_000) -> str:
    return ("planrun: 1\ngoal: big\nsteps:\n"
            f"  - {{id: a, tool: dump, arguments: {{x: \"{'y' * n}\"}}}}\n")


def test_a_failed_write_leaves_no_partial_temporary_file(tmp_path: Path) -> None:
    """Disk full / quota (here RLIMIT_FSIZE -> EFBIG): put() leaves its partial .tmp behind,
    one per process, never removed; on a real full disk it keeps the disk full (a later
    `execute` then fails with error[journal], exit 6)."""
    proj, env, folder = project(tmp_path, big_plan())

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

    for _ in range(3):
        assert validate(proj, env, preexec_fn=limit).returncode == 0
    stray = sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))
    assert stray == [], stray


def test_a_folder_in_the_file_s_place_leaves_no_temporary_copies(tmp_path: Path) -> None:
    """os.replace onto a directory fails: every later process leaves a full .tmp copy."""
    plan = "planrun: 1\ngoal: g\nsteps:\n  - {id: a, tool: dump, arguments: {x: 1}}\n"
    proj, env, folder = project(tmp_path, plan)
    assert validate(proj, env).returncode == 0
    folder.joinpath(f"parsed-{parse_cache.parser()}-"
                    f"{hashlib.sha256(plan.encode()).hexdigest()}.json").unlink()
    folder.joinpath(f"parsed-{parse_cache.parser()}-"
                    f"{hashlib.sha256(plan.encode()).hexdigest()}.json").mkdir()
    for _ in range(3):
        assert validate(proj, env).returncode == 0
    assert [p.name for p in folder.iterdir() if p.name.endswith(".tmp")] == []


def test_what_a_killed_writer_leaves_is_cleaned_or_bounded(tmp_path: Path) -> None:
    """A writer killed (SIGKILL) mid-write leaves `.parsed-…json.PID.tmp` (reproduced with
    real kills); no later process removes it and it is not counted in the 64 files."""
    plan = "planrun: 1\ngoal: g\nsteps:\n  - {id: a, tool: dump, arguments: {x: 1}}\n"
    proj, env, folder = project(tmp_path, plan)
    assert validate(proj, env).returncode == 0
    name = next(p.name for p in folder.glob("parsed-*.json"))
    old = time.time() - 2 * parse_cache.STALE_TMP_S
    for pid in range(1_000_000, 1_000_000 + 2 * parse_cache.MAX_FILES):  # dead writers
        dead = folder / f".{name}.{pid}.tmp"
        dead.write_bytes(b"0" * 1000)
        os.utime(dead, (old, old))
    live = folder / f".{name}.999999.tmp"  # a writer at work now: left alone
    live.write_bytes(b"0")
    (proj / "plans" / "p.yaml").write_text(plan + "# edited\n")  # a write (and a prune)
    assert validate(proj, env).returncode == 0
    entries = [p for p in folder.iterdir() if p.name.startswith((".parsed-", "parsed-"))]
    assert len(entries) <= parse_cache.MAX_FILES, len(entries)
    assert live.exists()
    assert not any(p.name.endswith(".tmp") for p in entries if p != live)


@pytest.fixture
def no_home(monkeypatch: pytest.MonkeyPatch) -> None:
    """HOME relative and the uid not in /etc/passwd (a container run with --user N):
    platformdirs raises RuntimeError for every user folder."""
    import pwd

    for name in ("XDG_CACHE_HOME", "XDG_DATA_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", "relative-home")

    def no_entry(_uid: int) -> object:
        raise KeyError("uid not in passwd")

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    monkeypatch.setattr(fits, "_folder_of", None)


@pytest.mark.usefixtures("no_home")
def test_no_resolvable_home_is_a_parse_not_a_traceback(tmp_path: Path) -> None:
    """get() did not catch platformdirs' RuntimeError (real process: traceback, exit 1,
    even for a JSON plan, since tools.yaml is read with keep=True)."""
    path = tmp_path / "plan.yaml"
    path.write_text("planrun: 1\ngoal: g\nsteps: []\n")
    assert load_file(path, keep=True).data["goal"] == "g"


def test_a_checksummed_file_too_deep_for_json_is_no_traceback(tmp_path: Path) -> None:
    """get() catches ValueError from json.loads but not RecursionError (put() does):
    a file with a valid first line and deeply nested JSON gives a traceback (exit 1)."""
    plan = "planrun: 1\ngoal: g\nsteps:\n  - {id: a, tool: dump, arguments: {x: 1}}\n"
    proj, env, folder = project(tmp_path, plan)
    folder.mkdir(parents=True, mode=0o700)
    body = b"[" * 100_000 + b"]" * 100_000
    (folder / f"parsed-{parse_cache.parser()}-{hashlib.sha256(plan.encode()).hexdigest()}"
              ".json").write_bytes(hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
    r = validate(proj, env)
    assert "Traceback" not in r.stderr, r.stderr[-300:]
    assert r.returncode == 0


@pytest.mark.usefixtures("no_home")
def test_no_resolvable_home_keeps_no_fits_and_names_no_default_journal() -> None:
    """The same user without a home: fits are not kept, a check runs; the default journal
    is a clear journal error (exit 6), not a traceback."""
    from planrun.errors import JournalError
    from planrun.paths import default_journal, user_cache_folder

    fits.reset()
    assert user_cache_folder() is None
    assert not fits.known(fits.key("schema", "{}"))
    fits.learn(fits.key("schema", "{}"))
    fits.save()
    with pytest.raises(JournalError) as caught:
        default_journal()
    assert caught.value.exit_code == 6
    assert "--journal" in (caught.value.hint or "")
    fits.reset()
