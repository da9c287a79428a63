"""A value must become exactly one argv element, never code or a flag (SPEC §2): commands
whose placeholders could reach an interpreter's program text, options or program position
are registry errors, however the interpreter is reached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planrun.issues import Issue
from planrun.registry import ToolRegistry, load_registry

CONTRACT = {"type": "object", "properties": {"x": {"type": "string"}, "f": {"type": "string"}},
            "required": ["x", "f"], "additionalProperties": False}

REFUSED = [
    ["sh", "-c", "echo {x}"],
    ["bash", "-e", "-c", "echo {x}"],
    ["bash", "-o", "pipefail", "-c", "echo {x}"],
    ["bash", "--rcfile", "/dev/null", "-c", "echo {x}"],
    ["env", "-C", "/tmp", "sh", "-c", "echo {x}"],
    ["timeout", "10", "sh", "-c", "echo {x}"],
    ["find", ".", "-exec", "sh", "-c", "echo {x}", "{{}}", ";"],
    ["env", "-S", "sh -c {x}"],
    ["python3", "-Ic", "print('{x}')"],
    ["python3", "-W", "ignore", "-c", "print('{x}')"],
    ["perl", "-le", "print '{x}'"],
    ["perl", "-I", "/tmp", "-e", "print '{x}'"],
    ["node", "--eval={x}"],
    ["su", "-c", "echo {x}"],
    ["{f}", "-c", "echo hi"],
    ["sh", "{f}", "echo {x}"],
    ["python3", "{f}"],
]

ALLOWED = [
    ["sh", "-c", 'echo "$1"', "sh", "{x}"],
    ["find", ".", "-exec", "sh", "-c", 'echo "$1"', "sh", "{x}", ";"],
    ["tar", "-czf", "{x}", "-C", "{f}", "."],
    ["python3", "script.py", "{x}"],
    ["grep", "-e", "{x}", "file.txt"],
]


def _write(tmp_path: Path, argv: list[str]) -> tuple[ToolRegistry, list[Issue]]:
    tools = {"tools": {"t": {"command": argv, "arguments": CONTRACT}}}
    path = tmp_path / "tools.yaml"
    path.write_text(json.dumps(tools))  # JSON is YAML
    return load_registry(path)


@pytest.mark.parametrize("argv", REFUSED, ids=[" ".join(a) for a in REFUSED])
def test_placeholders_that_could_become_code_are_refused(tmp_path: Path,
                                                         argv: list[str]) -> None:
    registry, issues = _write(tmp_path, argv)
    assert issues, argv
    assert {i.code for i in issues} == {"registry"}, issues
    assert all(i.line is not None for i in issues)
    assert "t" not in registry


@pytest.mark.parametrize("argv", ALLOWED, ids=[" ".join(a) for a in ALLOWED])
def test_placeholders_as_plain_arguments_are_fine(tmp_path: Path, argv: list[str]) -> None:
    registry, issues = _write(tmp_path, argv)
    assert issues == []
    assert "t" in registry
