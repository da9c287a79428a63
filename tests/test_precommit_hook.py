"""The pre-commit hook of ``.pre-commit-hooks.yaml``, run as pre-commit would run it.

pre-commit is not a dependency, so the test does what ``pre-commit run`` does for a hook
with ``pass_filenames: true``: it picks the changed files that match the hook's ``files``
pattern (paths relative to the repository root, ``re.search``) and runs the hook's
``entry`` (read from the file, never hard-coded) plus its ``args`` and those file names,
in the repository root, with the hook's ``planrun`` on ``PATH``.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
HOOKS_FILE = ROOT / ".pre-commit-hooks.yaml"

TOOLS = """\
tools:
  say:
    command: ["echo", "{text}"]
    arguments:
      type: object
      properties:
        text: {type: string}
      required: [text]
      additionalProperties: false
"""

GOOD = """\
planrun: 1
goal: Say hello
steps:
  - id: hello
    tool: say
    arguments: {text: hello}
"""

BAD = """\
planrun: 1
goal: Say hello, with a typo and a number where text belongs
steps:
  - id: hello
    tool: sya
    arguments: {text: hello}
  - id: again
    tool: say
    arguments: {text: 2}
"""

GOOD_JSON = '{"planrun": 1, "goal": "Say hi", "steps": [{"id": "hi", "tool": "say", ' \
    '"arguments": {"text": "hi"}}]}\n'


def _hook() -> dict[str, Any]:
    hooks = yaml.safe_load(HOOKS_FILE.read_text(encoding="utf-8"))
    found = [h for h in hooks if h.get("id") == "planrun-validate"]
    assert len(found) == 1, hooks
    return dict(found[0])


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A project with one good and one bad plan, plus files the hook must not get."""
    root = tmp_path / "repo"
    (root / "plans").mkdir(parents=True)
    (root / "tools.yaml").write_text(TOOLS, encoding="utf-8")
    (root / "plans" / "good.yaml").write_text(GOOD, encoding="utf-8")
    (root / "plans" / "bad.yml").write_text(BAD, encoding="utf-8")
    (root / "plans" / "hi.json").write_text(GOOD_JSON, encoding="utf-8")
    (root / "plans" / "README.md").write_text("notes\n", encoding="utf-8")
    (root / "README.md").write_text("project\n", encoding="utf-8")
    return root


def run_hook(repo: Path, changed: list[str], args: list[str] | None = None
             ) -> subprocess.CompletedProcess[str] | None:
    """What ``pre-commit run`` does with these changed files (None: the hook is skipped).

    ``args`` replaces the hook's ``args``, as ``args:`` in ``.pre-commit-config.yaml`` does.
    """
    hook = _hook()
    if args is not None:
        hook["args"] = args
    files = [f for f in changed if re.search(hook.get("files", ""), f)
             and not re.search(hook.get("exclude", "^$"), f)]
    if not files:
        return None
    argv = [*shlex.split(hook["entry"]), *hook.get("args", [])]
    if hook.get("pass_filenames", True):
        argv += files
    # The hook's environment provides `planrun` on PATH: here, the planrun under test.
    bin_dir = repo.parent / "hook-bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "planrun"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m planrun "$@"\n',
                    encoding="utf-8")
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run(argv, cwd=repo, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_hook_is_defined_as_documented() -> None:
    hook = _hook()
    assert hook["entry"] == "planrun validate"
    assert hook["language"] == "python"
    assert hook["pass_filenames"] is True
    pattern = re.compile(hook["files"])
    for path in ("plans/a.yaml", "plans/a.yml", "plans/a.json", "plans/sub/a.yaml"):
        assert pattern.search(path), path
    for path in ("tools.yaml", "planrun.toml", "plans/README.md", "other/plans/a.yaml",
                 "plans/a.yaml.bak"):
        assert not pattern.search(path), path


def test_a_bad_plan_fails_the_hook_with_its_issues(repo: Path) -> None:
    result = run_hook(repo, ["README.md", "tools.yaml", "plans/bad.yml"])
    assert result is not None
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert result.returncode == 3, out
    issues = re.findall(r"^plans/bad\.yml:(\d+):(\d+): error\[(\w+)\]: ", result.stdout, re.M)
    assert ("5", "11", "unknown_tool") in issues, out
    assert ("9", "23", "arguments") in issues, out
    assert "README" not in out


def test_good_plans_pass_the_hook(repo: Path) -> None:
    result = run_hook(repo, ["plans/good.yaml", "plans/hi.json", "plans/README.md"])
    assert result is not None
    assert result.returncode == 0, result.stdout + result.stderr
    assert "plans/good.yaml: ok" in result.stdout
    assert "plans/hi.json: ok" in result.stdout
    assert "2 plan(s) checked, 2 ok" in result.stdout


def test_one_bad_plan_among_good_ones_fails_the_hook(repo: Path) -> None:
    result = run_hook(repo, ["plans/good.yaml", "plans/bad.yml"])
    assert result is not None
    assert result.returncode == 3, result.stdout + result.stderr
    assert "plans/good.yaml: ok" in result.stdout
    assert "plans/bad.yml:5:11: error[unknown_tool]" in result.stdout


def test_the_hook_is_skipped_without_plan_files(repo: Path) -> None:
    assert run_hook(repo, ["README.md", "tools.yaml", "plans/README.md"]) is None


def test_the_hook_with_github_annotations(repo: Path) -> None:
    # `args: [--format, github]` in .pre-commit-config.yaml, e.g. for pre-commit in CI.
    result = run_hook(repo, ["plans/bad.yml"], args=["--format", "github"])
    assert result is not None
    assert result.returncode == 3, result.stdout + result.stderr
    assert result.stdout.startswith(
        "::error file=plans/bad.yml,line=5,col=11,title=planrun unknown_tool::"), result.stdout
