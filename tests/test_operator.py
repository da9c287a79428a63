"""Issue 10: the nightly job works unattended, and the operator's commands fit their habits.

Everything here goes through the real ``planrun`` process (``python -m planrun``) in a
project folder written by the test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

GRANT_TOML = """\
[policy.classes.cleanup]
tools = ["prune_backups"]
level = "act"

[[policy.grants]]
id = "nightly-prune"
class = "cleanup"
arguments = {type = "object", properties = {keep = {type = "integer", minimum = 3}}}
expires = 2099-12-31T00:00:00Z
granted_by = "ops@example.com"
"""


def run(cwd: Path, *args: str, env: dict[str, str] | None = None,
        stdin: Any = subprocess.DEVNULL, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``planrun ARGS`` in ``cwd`` (no terminal)."""
    return subprocess.run([sys.executable, "-m", "planrun", *args], cwd=cwd,
                          env=env or dict(os.environ), stdin=stdin, capture_output=True,
                          text=True, timeout=timeout, check=False)


def backup_project(base: Path, *, runtime_dest: bool = False) -> Path:
    """This repository's project in ``base/app`` with a grant for prune.

    ``runtime_dest``: prune's ``dest`` comes from ``{steps.prepare.output.dest}`` (known only
    at run time), as the plan shipped before issue 10.
    """
    app = base / "app"
    app.mkdir(parents=True)
    for name in ("tools.yaml", "backup_tools.py", "tree_tools.py"):
        shutil.copy(ROOT / name, app / name)
    shutil.copytree(ROOT / "plans", app / "plans")
    if runtime_dest:
        plan = app / "plans" / "nightly-backup.yaml"
        text = plan.read_text(encoding="utf-8")
        assert 'dest: "{params.dest}"\n      keep' in text
        plan.write_text(text.replace('dest: "{params.dest}"\n      keep',
                                     'dest: "{steps.prepare.output.dest}"\n      keep'),
                        encoding="utf-8")
    (app / "planrun.toml").write_text(GRANT_TOML, encoding="utf-8")
    data = base / "data"
    data.mkdir()
    (data / "f.txt").write_text("x\n", encoding="utf-8")
    return app


# --- bug 1: a step no grant can ever clear --------------------------------------------------


def test_static_checks_warn_when_no_grant_can_ever_clear_a_step(tmp_path: Path) -> None:
    app = backup_project(tmp_path, runtime_dest=True)
    params = ["-p", f"source={tmp_path / 'data'}", "-p", f"dest={tmp_path / 'b'}"]
    for args in (["policy", "check", "--strict"], ["validate", "--strict", "nightly-backup"]):
        proc = run(app, *args)
        assert proc.returncode == 3, proc
        assert "warning[ungrantable]" in proc.stdout
        assert "'prune'" in proc.stdout
        assert "nightly-prune" in proc.stdout
    # Without --strict it is a warning, not a failure.
    assert run(app, "policy", "check").returncode == 0
    for args in (["show", "nightly-backup"], ["execute", "nightly-backup", *params,
                                              "--dry-run"]):
        proc = run(app, *args)
        assert proc.returncode == 0, proc
        assert "warning[ungrantable]" in proc.stderr, proc
    shown = json.loads(run(app, "show", "nightly-backup", "--json").stdout)
    assert [w["code"] for w in shown["warnings"]] == ["ungrantable"]


def test_no_warning_without_a_grant_or_with_arguments_known_before_the_run(
        tmp_path: Path) -> None:
    app = backup_project(tmp_path)
    proc = run(app, "validate", "--strict")
    assert proc.returncode == 0, proc
    assert "ungrantable" not in proc.stdout
    # A runtime argument but no grant and no act class: no warning (a person clears it).
    bare = backup_project(tmp_path / "bare", runtime_dest=True)
    (bare / "planrun.toml").write_text("[policy]\nrequire_approval = []\n", encoding="utf-8")
    proc = run(bare, "validate", "--strict", "nightly-backup")
    assert proc.returncode == 0, proc


def test_shipped_plan_runs_unattended_under_a_grant(tmp_path: Path) -> None:
    app = backup_project(tmp_path)
    proc = run(app, "execute", "nightly-backup", "-p", f"source={tmp_path / 'data'}",
               "-p", "dest=backups", "--json")
    assert proc.returncode == 0, proc
    manifest = json.loads(proc.stdout)
    assert {s["id"]: s["approved_by"] for s in manifest["steps"]}["prune"] == "nightly-prune"
    assert len(list((app / "backups").glob("backup-*.tar.gz"))) == 1


# --- bug 2: why a grant did not apply ------------------------------------------------------


def test_approval_required_says_why_the_grant_did_not_apply(tmp_path: Path) -> None:
    app = backup_project(tmp_path, runtime_dest=True)
    params = ["-p", f"source={tmp_path / 'data'}", "-p", f"dest={tmp_path / 'b'}"]
    proc = run(app, "execute", "nightly-backup", *params)
    assert proc.returncode == 4, proc
    assert "error[approval_required]" in proc.stderr
    assert "grant 'nightly-prune' cannot check arguments only known at run time" in proc.stderr
    assert "give a policy grant that covers them" not in proc.stderr
    assert "ops@example.com" not in proc.stderr  # the details are for -v
    verbose = run(app, "execute", "nightly-backup", *params, "-v")
    assert verbose.returncode == 4
    assert "grant nightly-prune (class cleanup" in verbose.stderr
    assert '"dest": "{steps.prepare.output.dest}"' in verbose.stderr
    # Arguments outside the grant: the reason is the schema's.
    app2 = backup_project(tmp_path / "two")
    proc = run(app2, "execute", "nightly-backup", "-p", f"source={tmp_path / 'data'}",
               "-p", "dest=b", "-p", "keep=2")
    assert proc.returncode == 4
    assert "arguments leave grant 'nightly-prune': 2 is less than the minimum of 3" in proc.stderr


def test_approval_required_without_grants_still_suggests_one(tmp_path: Path) -> None:
    app = backup_project(tmp_path)
    (app / "planrun.toml").unlink()
    proc = run(app, "execute", "nightly-backup", "-p", f"source={tmp_path / 'data'}",
               "-p", "dest=b")
    assert proc.returncode == 4
    assert "give a policy grant that covers them" in proc.stderr
