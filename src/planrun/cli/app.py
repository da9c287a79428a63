"""The Typer application: root options, the commands in help order, and :func:`main`."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Annotated

import typer

from .. import __version__
from . import agents, approvals, importing, maintenance, planning, plans, read, repair, run
from .options import Shell

app = typer.Typer(
    name="planrun",
    help="Validate, approve, run and resume plans of tool calls, journaled in SQLite.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    add_completion=True,
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
        "--journal", help="Journal location, a file path (also accepted after the command).",
        metavar="PATH")] = None,
) -> None:
    """Validate, approve, run and resume plans of tool calls, journaled in SQLite."""
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


# The commands, in the order `planrun --help` lists them.
_FIRST: tuple[Callable[..., None], ...] = (
    plans.validate, run.execute, run.resume, approvals.approve, approvals.deny,
    run.resolve, run.retry, maintenance.unlock,
    plans.show, plans.graph, plans.tools, plans.schema, plans.init, planning.plan)
_THEN: tuple[Callable[..., None], ...] = (
    read.status, read.runs, read.log, read.output, read.report, plans.plans)
for _command in _FIRST:
    app.command()(_command)
app.command()(repair.repair)  # issue 13 (SPEC §10)
app.command("import")(importing.import_plan)  # issue 17: seed-format plans
app.command(hidden=True)(completion)
policy_app = typer.Typer(help="Inspect the [policy] of planrun.toml.", no_args_is_help=True)
app.add_typer(policy_app, name="policy")
policy_app.command("check")(plans.policy_check)
for _command in _THEN:
    app.command()(_command)
app.command("prune")(maintenance.prune_runs)
app.command()(maintenance.forget)
app.command()(agents.mcp)  # serve agents over MCP (optional extra)

#: Common flags that may also be given before the command name (``planrun -q execute``).
_MOVABLE = {"-q", "--quiet", "-v", "--verbose", "--no-color", "--json"}


def common_flags_after_command(argv: list[str]) -> list[str]:
    """``argv`` with the common flags given before the command moved after its name.

    ``-C``/``--journal`` before the command are the root's own options; ``-q``, ``-v``,
    ``--no-color`` and ``--json`` mean the same before the command as after it (SPEC §9
    lists them as common options). A flag the command does not take is left where it
    was, so the parser reports it as usual.
    """
    import typer.main

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
    group = typer.main.get_command(app)
    sub = getattr(group, "commands", {}).get(rest[i])
    takes = {opt for p in getattr(sub, "params", []) for opt in getattr(p, "opts", [])}
    moved = [w for w in before if w in takes]
    if len(moved) != len(before):
        return argv
    return rest[:i + 1] + moved + rest[i + 1:]
