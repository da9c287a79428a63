"""Shell completion: the words of the command line being completed, and the callbacks.

Callbacks read the project (plans, the journal) through :mod:`planrun.api`, read-only, and
never fail loudly: any problem completes nothing.
"""

from __future__ import annotations

import os
from typing import Any

#: Options that take a value (to find the positional words of a command line).
_VALUED = {"-C", "--project", "--journal", "-p", "--param", "--params-file", "--approve",
           "--approval-timeout", "--max-parallel", "--format", "--output", "--reason",
           "--item", "--plan", "--status", "--limit", "--older-than", "--from"}


def complete_plans(ctx: Any, args: list[str], incomplete: str) -> list[str]:
    """Plan names of the project (its -C DIR, else found from here); empty on any problem."""
    try:
        from .. import api

        return [n for n in api.plan_names(_ctx_settings(args)) if n.startswith(incomplete)]
    except Exception:  # completion must never fail loudly
        return []


def _completion_words() -> list[str]:
    """The words of the command line being completed, before the one under the cursor.

    Typer hands completion callbacks no words, so they are read as its shell classes read
    them: ``COMP_WORDS``/``COMP_CWORD`` (bash) or ``_TYPER_COMPLETE_ARGS`` (zsh, fish).
    """
    import shlex

    def split(text: str) -> list[str]:
        lexer = shlex.shlex(text, posix=True)
        lexer.whitespace_split = True
        lexer.commenters = ""
        out: list[str] = []
        try:
            for token in lexer:
                out.append(token)
        except ValueError:  # an unclosed quote: what was read so far
            out.append(lexer.token)
        return out

    if "COMP_WORDS" in os.environ:
        words = split(os.environ["COMP_WORDS"])
        try:
            return words[1:int(os.environ.get("COMP_CWORD", len(words)))]
        except ValueError:
            return words[1:]
    text = os.environ.get("_TYPER_COMPLETE_ARGS", "")
    words = split(text)[1:]
    return words if text.endswith(" ") else words[:-1]


def _words(args: list[str] | None) -> tuple[dict[str, list[str]], list[str]]:
    """(option → values, positional words after the command) of a partial command line.

    Completion parses on its own: a trailing option still missing its value makes the
    parser drop every parameter it had read.
    """
    options: dict[str, list[str]] = {}
    positional: list[str] = []
    words = list(args or []) or _completion_words()
    i = 0
    while i < len(words):
        w = words[i]
        if w.startswith("-") and "=" in w and w.startswith("--"):
            name, _, value = w.partition("=")
            options.setdefault(name, []).append(value)
        elif w in _VALUED:
            if i + 1 < len(words):
                options.setdefault(w, []).append(words[i + 1])
            i += 1
        elif not w.startswith("-"):
            positional.append(w)
        i += 1
    return options, positional[1:]  # the first positional word is the command


def _ctx_settings(args: list[str] | None) -> Any:
    """The settings a completed command line would use: its -C/--project and --journal.

    Given before the command or after it; else the environment and planrun.toml.
    """
    from .. import api

    options, _ = _words(args)
    projects = options.get("-C", []) + options.get("--project", [])
    journals = options.get("--journal", [])
    project = projects[-1] if projects else None
    journal = journals[-1] if journals else None
    return api.load_settings(project=project, journal=journal)


def complete_runs(ctx: Any, args: list[str], incomplete: str) -> list[str]:
    """Recent run ids of the project from the journal (read-only; empty on any problem).

    ``resume``: only runs it can continue (``interrupted``, ``running`` or
    ``awaiting_approval``); ``retry``: only failed ones; ``approve``, ``deny``: only runs
    ``awaiting_approval``.
    """
    try:
        from .. import api

        settings = _ctx_settings(args)
        wanted = {"resume": ("interrupted", "running", "awaiting_approval"),
                  "retry": ("failed",),
                  "repair": ("failed",),
                  "resolve": ("interrupted", "running", "failed"),
                  "approve": ("awaiting_approval",),
                  "deny": ("awaiting_approval",)}.get(
            getattr(getattr(ctx, "command", None), "name", ""))
        rows = api.runs(settings, limit=200)
        return [r["run_id"] for r in rows if r["run_id"].startswith(incomplete)
                and (wanted is None or r["status"] in wanted)][:50]
    except Exception:  # completion must never fail loudly
        return []


def _plan_steps_and_params(ctx: Any, args: list[str]
                           ) -> tuple[list[str], list[str], list[str]]:
    """(step ids, steps needing approval, parameter names) for completion.

    Of the plan on the command line (``execute PLAN``) or of the run (``resume RUN``,
    ``retry RUN``, ``output RUN``; default the latest).
    """
    from .. import api

    settings = _ctx_settings(args)
    command = getattr(getattr(ctx, "command", None), "name", "")
    _, positional = _words(args)
    if command in ("execute", "show", "validate", "graph"):
        if not positional:
            return [], [], []
        return api.plan_outline(settings, plan=positional[0])
    ref = positional[0] if (positional and command != "output") or len(
        positional) > 1 else "last"
    return api.plan_outline(settings, run=ref)


def complete_approve(ctx: Any, args: list[str], incomplete: str) -> list[str]:
    """Step ids for ``--approve``: those needing approval first, then the others."""
    try:
        ids, needs, _ = _plan_steps_and_params(ctx, args)
        given = set(_words(args)[0].get("--approve", []))
        ordered = needs + [i for i in ids if i not in needs]
        return [i for i in ordered if i.startswith(incomplete) and i not in given]
    except Exception:  # completion must never fail loudly
        return []


def complete_param(ctx: Any, args: list[str], incomplete: str) -> list[str]:
    """``NAME=`` for ``-p``: the plan's declared parameters not given yet."""
    try:
        _, _, names = _plan_steps_and_params(ctx, args)
        options = _words(args)[0]
        given = {p.partition("=")[0] for p in options.get("-p", []) + options.get(
            "--param", [])}
        return [f"{n}=" for n in names if f"{n}=".startswith(incomplete) and n not in given]
    except Exception:  # completion must never fail loudly
        return []


def complete_run_steps(ctx: Any, args: list[str], incomplete: str) -> list[str]:
    """Step ids of the run named on the command line (``output RUN <Tab>``)."""
    try:
        ids, _, _ = _plan_steps_and_params(ctx, args)
        return [i for i in ids if i.startswith(incomplete)]
    except Exception:  # completion must never fail loudly
        return []
