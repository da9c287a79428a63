"""The command line, usage errors (exit 2), bad -p values, a bad planrun.toml (exit 3)
(SPEC §4, §5, §8, §9; through ``typer.testing.CliRunner``)."""

from __future__ import annotations

import pytest

from conftest import Project

from .support import (
    as_json,
    calls,
    invoke,
)


@pytest.mark.parametrize("args", [
    ["validate", "--format", "xml"],
    ["execute"],
    ["execute", "hello", "--max-parallel", "0"],
    ["runs", "--limit", "0"],
    ["nosuchcommand"],
    ["resolve", "abcdef123456", "greet"],
    ["resolve", "abcdef123456", "greet", "--succeeded", "--failed"],
], ids=lambda a: " ".join(a))
def test_usage_errors_exit_2(proj: Project, args: list[str]) -> None:
    result = invoke(proj, *args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert calls(proj) == []


def test_param_without_equals_is_a_usage_error(proj: Project) -> None:
    result = invoke(proj, "execute", "hello", "-p", "who")
    assert result.exit_code == 2
    assert "NAME=VALUE" in result.stderr
    assert calls(proj) == []


@pytest.mark.parametrize(("param", "code"), [("times=2.0", "param_type"),
                                             ("nope=1", "param_unknown")])
def test_bad_param_values_are_refused(proj: Project, param: str, code: str) -> None:
    result = invoke(proj, "execute", "hello", "-p", param)
    assert result.exit_code == 3
    assert code in result.stderr
    assert calls(proj) == []


@pytest.mark.parametrize("toml", ["bogus_key = 1\n", "max_parallel = 'four'\n", "[[[\n"])
@pytest.mark.parametrize("command", [["execute", "hello"], ["validate"], ["runs"]])
def test_a_bad_planrun_toml_exits_3_with_code_config(proj: Project, toml: str,
                                                     command: list[str]) -> None:
    proj.write_config(toml)
    result = invoke(proj, *command)
    assert result.exit_code == 3, result.output
    assert "error[config]" in result.output
    assert "planrun.toml" in result.output
    assert calls(proj) == []


def test_a_bad_planrun_toml_in_json(proj: Project) -> None:
    proj.write_config("bogus_key = 1\n")
    result = invoke(proj, "execute", "hello", "--json")
    assert result.exit_code == 3
    out = as_json(result)
    assert out["ok"] is False
    assert out["error"]["code"] == "config"
