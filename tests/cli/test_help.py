"""The command line, help, version, and each command's help
(SPEC §4, §5, §8, §9; through ``typer.testing.CliRunner``)."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

import planrun
from planrun.cli import app

from .support import (
    invoke,
)


def test_help_lists_the_commands() -> None:
    result = invoke(None, "--help")
    assert result.exit_code == 0
    for command in ("validate", "execute", "resume", "resolve", "retry", "unlock", "status",
                    "runs", "log", "output", "report"):
        assert re.search(rf"^\s+{command}\s", result.stdout, re.M), command


def test_help_lists_the_other_commands_of_the_spec() -> None:
    result = invoke(None, "--help")
    for command in ("show", "graph", "tools", "schema", "init"):
        assert re.search(rf"^\s+{command}\s", result.stdout, re.M), command


def test_no_arguments_shows_the_help() -> None:
    result = CliRunner().invoke(app, [])
    assert "execute" in result.output
    assert "Traceback" not in result.output


def test_version() -> None:
    result = invoke(None, "--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"planrun {planrun.__version__}"


@pytest.mark.parametrize("command", ["validate", "execute", "status", "runs", "log", "output",
                                     "report"])
def test_each_command_has_help(command: str) -> None:
    result = invoke(None, command, "--help")
    assert result.exit_code == 0
    assert "--journal" in result.stdout
    assert "--project" in result.stdout


@pytest.mark.parametrize("width", [50, 80, 200])
def test_the_help_lists_the_commands_as_typer_converting_all_of_them_would(
        width: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The root group converts a command only when it runs; ``--help`` lists the others
    from stand-ins. The listing is the one of a group of every command fully converted."""
    import importlib

    import typer.main

    app_module = importlib.import_module("planrun.cli.app")  # (planrun.cli.app is the app)

    monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.setattr(app_module, "_BUILT", {})  # nothing converted yet
    lazy = CliRunner().invoke(app, ["--help"])
    group = typer.main.get_command(app)
    for name in group.list_commands(None):  # type: ignore[attr-defined]
        app_module.command(name)  # every command converted: no stand-in is used
    full = CliRunner().invoke(app, ["--help"])
    assert lazy.exit_code == full.exit_code == 0
    assert lazy.stdout == full.stdout
    assert not re.search(r"^\s+completion\s", lazy.stdout, re.M)  # hidden
    assert re.search(r"^\s+policy\s+Inspect the \[policy\]", lazy.stdout, re.M)


def test_a_command_registered_on_the_app_itself_is_kept_and_listed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import typer

    def hello() -> None:
        """Say hello."""
        typer.echo("hello")

    monkeypatch.setattr(app, "registered_commands", list(app.registered_commands))
    app.command("hello")(hello)
    assert CliRunner().invoke(app, ["hello"]).stdout == "hello\n"
    assert re.search(r"^\s+hello\s+Say hello\.", CliRunner().invoke(app, ["--help"]).stdout,
                     re.M)
