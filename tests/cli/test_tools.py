"""The command line, ``planrun tools``: the catalog, and ``--allowed``, what a planner may use
(SPEC §2, §6, §10; real processes through ``tests/harness.py``)."""

from __future__ import annotations

import json
from typing import Any

from conftest import Project
from harness import run_planrun


def _tools(proj: Project, *args: str) -> Any:
    res = run_planrun("tools", "--json", *args, cwd=proj.root)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_tools_json_lists_the_whole_registry(proj: Project) -> None:
    proj.write_config('[policy]\nallowed_tools = ["echo"]\n')
    assert [t["name"] for t in _tools(proj)] == ["boom", "chatty", "echo"]


def test_tools_allowed_is_the_registry_within_the_allowlist(proj: Project) -> None:
    proj.write_config('[policy]\nallowed_tools = ["echo", "boom"]\n')
    every = {t["name"]: t for t in _tools(proj)}
    allowed = _tools(proj, "--allowed")
    assert [t["name"] for t in allowed] == ["boom", "echo"]
    # the same shape as `tools --json`, entry for entry
    assert allowed == [every["boom"], every["echo"]]


def test_tools_allowed_leaves_out_refused_classes(proj: Project) -> None:
    proj.write_config('[policy.classes.danger]\ntools = ["boom"]\nlevel = "refuse"\n'
                      '[policy.classes.careful]\ntools = ["chatty"]\nlevel = "escalate"\n')
    assert [t["name"] for t in _tools(proj, "--allowed")] == ["chatty", "echo"]


def test_tools_allowed_without_a_policy_is_every_tool(proj: Project) -> None:
    assert _tools(proj, "--allowed") == _tools(proj)


def test_tools_allowed_in_text(proj: Project) -> None:
    proj.write_config('[policy]\nallowed_tools = ["chatty"]\n')
    res = run_planrun("tools", "--allowed", cwd=proj.root)
    assert res.returncode == 0, res.stderr
    assert "chatty" in res.stdout
    assert "echo" not in res.stdout


def test_tools_says_which_tools_are_called_on_the_loop_thread(proj: Project) -> None:
    tools = (proj.root / "tools.yaml").read_text()
    proj.write("tools.yaml", tools.replace("  echo:\n", "  echo:\n    blocking: false\n", 1))
    rows = {t["name"]: t for t in _tools(proj)}
    assert rows["echo"]["blocking"] is False
    assert rows["boom"]["blocking"] is True
    res = run_planrun("tools", cwd=proj.root)
    assert res.returncode == 0, res.stderr
    line = next(x for x in res.stdout.splitlines() if x.startswith("echo "))
    assert "non-blocking" in line, res.stdout
    assert "ignored" not in line, res.stdout
    # with a timeout of its own, its calls run in threads all the same: said so
    proj.write("tools.yaml", tools.replace("  echo:\n", "  echo:\n    blocking: false\n"
                                           "    timeout: 5\n", 1))
    res = run_planrun("tools", cwd=proj.root)
    line = next(x for x in res.stdout.splitlines() if x.startswith("echo "))
    assert "non-blocking (ignored: timeout)" in line, res.stdout
