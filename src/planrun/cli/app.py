"""The Typer application: root options, the commands in help order, and :func:`main`.

The root group (:class:`LazyGroup`) converts a command for the parser, and imports its
module, only when it runs or its help is shown. Its own parameters and those of each
converted command convert their values with :mod:`.coercion` (plain Python), not with
Typer's pydantic adapters.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, MutableMapping
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperGroup

from .. import __version__
from .coercion import install as install_coercion
from .options import Shell

if TYPE_CHECKING:
    # typer's click (vendored from typer 0.29 on): only its types are named here.
    from typer import _click as click

# The commands, in the order `planrun --help` lists them: name -> (module of planrun.cli,
# function; a group for "policy"). A command is converted for the parser (and its module
# imported) only when it is run or its help is shown: converting all 27 of them, a Typer
# signature walk each, took ~40 ms of every start (issue 16); `planrun --help` lists them
# from their docstrings without converting them.
_COMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("plans", "validate"), "execute": ("run", "execute"),
    "resume": ("run", "resume"), "approve": ("approvals", "approve"),
    "deny": ("approvals", "deny"), "resolve": ("run", "resolve"), "retry": ("run", "retry"),
    "unlock": ("maintenance", "unlock"), "show": ("plans", "show"),
    "graph": ("plans", "graph"), "tools": ("plans", "tools"), "schema": ("plans", "schema"),
    "init": ("plans", "init"), "plan": ("planning", "plan"),
    "repair": ("repair", "repair"),  # issue 13 (SPEC §10)
    "import": ("importing", "import_plan"),  # issue 17: seed-format plans
    "completion": ("app", "completion"),  # hidden
    "status": ("read", "status"), "runs": ("read", "runs"), "log": ("read", "log"),
    "output": ("read", "output"), "report": ("read", "report"), "plans": ("plans", "plans"),
    "prune": ("maintenance", "prune_runs"), "forget": ("maintenance", "forget"),
    "mcp": ("agents", "mcp"),  # serve agents over MCP (optional extra)
    "policy": ("plans", "policy_check"),  # the group `policy` of one command, `check`
}
_HIDDEN = frozenset({"completion"})
_POLICY_HELP = "Inspect the [policy] of planrun.toml."
#: Commands converted so far in this process (shared by every conversion of ``app``).
_BUILT: dict[str, click.Command] = {}


def _function(name: str) -> Callable[..., None]:
    import importlib

    module, attr = _COMMANDS[name]
    fn: Callable[..., None] = getattr(importlib.import_module(f"{__package__}.{module}"), attr)
    return fn


def _sub_app(**kwargs: Any) -> typer.Typer:
    """A Typer app with the root's settings, to convert one command or group."""
    return typer.Typer(add_completion=False, pretty_exceptions_enable=False,
                       rich_markup_mode=None, **kwargs)


def _build(name: str) -> click.Command:
    """The parser's command ``name`` (Typer's conversion, as ``app.command()`` makes it)."""
    import typer.main

    cmd = _BUILT.get(name)
    if cmd is not None:
        return cmd
    fn = _function(name)
    if name == "policy":
        policy_app = _sub_app(help=_POLICY_HELP, no_args_is_help=True)
        policy_app.command("check")(fn)
        cmd = typer.main.get_group(policy_app)
        cmd.name = name
    else:
        one = _sub_app()
        one.command(name, hidden=name in _HIDDEN)(fn)
        cmd = typer.main.get_command(one)
    install_coercion(cmd)  # its values converted without pydantic (issue 16)
    _BUILT[name] = cmd
    return cmd


class _Commands(MutableMapping[str, Any]):
    """The root group's commands: every name is listed; a command is converted on lookup."""

    def __init__(self) -> None:
        self._added: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        if name in self._added:
            return self._added[name]
        if name not in _COMMANDS:
            raise KeyError(name)
        return _build(name)

    def __setitem__(self, name: str, cmd: click.Command) -> None:
        self._added[name] = cmd

    def __delitem__(self, name: str) -> None:
        del self._added[name]

    def __iter__(self) -> Iterator[str]:
        yield from _COMMANDS
        yield from (n for n in self._added if n not in _COMMANDS)

    def __len__(self) -> int:
        return len(_COMMANDS) + sum(1 for n in self._added if n not in _COMMANDS)


class LazyGroup(TyperGroup):
    """Typer's root group, converting only the command that runs (or whose help is shown).

    Listing the commands (``planrun --help``) uses each command's docstring, as Typer does,
    through a stand-in that has only the name, help and hidden flag.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        added, self.commands = self.commands, _Commands()
        self.commands.update(added)  # any registered on `app` itself (``app.command()``)
        self._listing = False

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """Typer's parsing, the root's own values converted without pydantic (issue 16).

        Installed here, not in ``__init__``: Typer appends ``--install-completion`` and
        ``--show-completion`` after the group is made.
        """
        install_coercion(self, ctx)
        return super().parse_args(ctx, args)

    def resolve_command(self, ctx: click.Context,
                        args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        """Typer's, the command's help option converting its value without pydantic."""
        name, cmd, rest = super().resolve_command(ctx, args)
        if cmd is not None:
            install_coercion(cmd, ctx)
        return name, cmd, rest

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command name, in help order (nothing converted)."""
        return list(self.commands)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command ``cmd_name``, converted now (a stand-in while listing), or None."""
        if self._listing and cmd_name in _COMMANDS and cmd_name not in _BUILT:
            return _stand_in(cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The help's list of commands, from stand-ins of those not converted yet."""
        self._listing = True
        try:
            super().format_commands(ctx, formatter)
        finally:
            self._listing = False


def _stand_in(name: str) -> click.Command:
    """A command with only the name, help and hidden flag of ``name`` (for listing)."""
    import inspect

    from typer.core import TyperCommand

    doc = _POLICY_HELP if name == "policy" else inspect.getdoc(_function(name))
    return TyperCommand(name, help=doc, hidden=name in _HIDDEN, rich_markup_mode=None)


def command(name: str) -> click.Command | None:
    """The parser's command ``name`` (converted now if it was not yet), or None."""
    return _build(name) if name in _COMMANDS else None


app = typer.Typer(
    name="planrun",
    help="Validate, approve, run and resume plans of tool calls, journaled in SQLite or "
    "PostgreSQL.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    add_completion=True,
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"planrun {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
    project: Annotated[str | None, typer.Option(
        "-C", "--project", help="Project folder (also accepted after the command).",
        metavar="DIR")] = None,
    journal: Annotated[str | None, typer.Option(
        "--journal", help="Journal location: a file path or a postgresql:// URL (also "
        "accepted after the command).", metavar="PATH|URL")] = None,
) -> None:
    """Validate, approve, run and resume plans of tool calls, journaled in SQLite or PostgreSQL."""
    # Given before the command, they act like the environment: an option given after the
    # command still wins (flag > environment > planrun.toml).
    if project is not None:
        os.environ["PLANRUN_PROJECT"] = project
    if journal is not None:
        os.environ["PLANRUN_JOURNAL"] = journal


def completion(
    shell: Annotated[Shell, typer.Argument(help="bash, zsh or fish.")],
) -> None:
    """Print the shell completion script (the files in completions/ are this output)."""
    from typer._completion_shared import get_completion_script

    script = get_completion_script(prog_name="planrun", complete_var="_PLANRUN_COMPLETE",
                                   shell=shell.value).rstrip("\n") + "\n"
    if shell is Shell.zsh:
        # Installed in $fpath as `_planrun`, zsh runs this file on the first Tab: complete
        # that Tab too, not only the following ones.
        script += ('if [[ "${funcstack[1]}" == "_planrun" ]]; then\n'
                   '  _planrun_completion "$@"\nfi\n')
    sys.stdout.write(script)


#: Common flags that may also be given before the command name (``planrun -q execute``).
_MOVABLE = {"-q", "--quiet", "-v", "--verbose", "--no-color", "--json"}


def common_flags_after_command(argv: list[str]) -> list[str]:
    """``argv`` with the common flags given before the command moved after its name.

    ``-C``/``--journal`` before the command are the root's own options; ``-q``, ``-v``,
    ``--no-color`` and ``--json`` mean the same before the command as after it (SPEC §9
    lists them as common options). A flag the command does not take is left where it
    was, so the parser reports it as usual.
    """
    i = 0
    before: list[str] = []
    rest = list(argv)
    while i < len(rest):
        word = rest[i]
        if word in ("-C", "--project", "--journal"):
            i += 2
            continue
        if word in _MOVABLE:
            before.append(rest.pop(i))
            continue
        if word.startswith("-"):
            i += 1
            continue
        break
    if not before or i >= len(rest):
        return argv
    sub = command(rest[i])
    takes = {opt for p in getattr(sub, "params", []) for opt in getattr(p, "opts", [])}
    moved = [w for w in before if w in takes]
    if len(moved) != len(before):
        return argv
    return rest[:i + 1] + moved + rest[i + 1:]
