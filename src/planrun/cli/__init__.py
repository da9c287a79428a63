"""The ``planrun`` command line (Typer): parse, call :mod:`planrun.api`, render.

Rendering is :mod:`planrun.ui`.
No SQL, no jsonschema, no business logic here: the package imports only ``api``, ``ui``,
``errors`` (the types it turns into exit statuses), ``__version__`` and, at start-up,
``streams`` (the process's own stdout/stderr; importing ``ui`` there would slow every
start). Heavy modules are imported inside the commands that need them so that
``planrun --help`` starts fast, and the root group converts (and imports the module of)
only the command that runs (:class:`.app.LazyGroup`). Every
:class:`~planrun.errors.PlanrunError` becomes one message on stderr and the exit status of
SPEC §9; anything else is a bug and shows a traceback.

Modules: :mod:`.app` (the application, root options, command order), :mod:`.options`
(shared options), :mod:`.guard` (errors to exit statuses), :mod:`.run` (execute, resume,
retry, resolve), :mod:`.read` (status, runs, log, output), :mod:`.maintenance` (prune,
forget, unlock), :mod:`.plans` (validate, show, graph, tools, schema, init, plans,
policy check), :mod:`.completion` (shell completion).
"""

from __future__ import annotations

import re
import sys

import typer

from .app import app, common_flags_after_command
from .guard import AbandonedExit

__all__ = ["app", "main"]

_froze: list[bool] = []


def main() -> None:
    """Console-script entry point.

    Command-line mistakes caught by the parser get the same one-line form as every other
    user error (``planrun: error[usage]: …``, exit 2).
    """
    import contextlib
    import gc
    import os

    from typer.exceptions import TyperException

    if not _froze:
        # What is loaded so far (Typer, the standard library) lives as long as the
        # process: the collector need not walk it again on each of the ~100 collections
        # the rest of the start-up triggers (~5 ms of `validate`, issue 16). Once per
        # process (tests call main() many times in one process).
        gc.freeze()
        _froze.append(True)

    # Text that is not UTF-8 (a lone surrogate from an undecodable byte) is printed as a
    # backslash escape, never an exception: printing must not change an outcome.
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(OSError, ValueError):  # e.g. a socket: cannot seek
                reconfigure(errors="backslashreplace")
    from ..streams import harden

    harden()  # a closed or broken stdout/stderr never changes an outcome (SPEC §5)
    try:
        code = app(args=common_flags_after_command(sys.argv[1:]), prog_name="planrun",
                   standalone_mode=False)
    except AbandonedExit as exc:
        # Python tool calls still run in threads (a timed-out call, or a run whose lease
        # was lost): a normal exit would wait for them, maybe forever. Only here, at the
        # outermost layer, is the process ended without waiting (streams flushed before).
        os._exit(exc.code if isinstance(exc.code, int) else 1)
    except KeyboardInterrupt:
        # Ctrl-C outside a run (while loading or validating): nothing was started.
        sys.stderr.write("planrun: interrupted\n")
        raise SystemExit(130) from None
    except TyperException as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            sys.stdout.write(exc.format_message() + "\n")
            raise SystemExit(0) from None
        ctx = getattr(exc, "ctx", None)
        where = ctx.command_path if ctx is not None else "planrun"
        sys.stderr.write(f"planrun: error[usage]: {_plain(exc.format_message())}\n"
                         f"  See: {where} --help\n")
        raise SystemExit(getattr(exc, "exit_code", 2)) from None
    except typer.Abort:
        sys.stderr.write("planrun: interrupted\n")
        raise SystemExit(130) from None
    raise SystemExit(code if isinstance(code, int) else 0)


#: pydantic's words in Typer's messages (it converts values with pydantic) as planrun's.
_PYDANTIC_WORDS = (
    (re.compile(r"Value error, "), ""),
    (re.compile(r"Input should be greater than or equal to (\S+)"), r"must be at least \1"),
    (re.compile(r"Input should be less than or equal to (\S+)"), r"must be at most \1"),
    (re.compile(r"Input should be greater than (\S+)"), r"must be more than \1"),
    (re.compile(r"Input should be less than (\S+)"), r"must be less than \1"),
    (re.compile(r"Input should be a valid integer(, unable to parse string as an integer)?"),
     "must be a whole number"),
    (re.compile(r"Input should be a valid number(, unable to parse string as a number)?"),
     "must be a number"),
)


def _plain(message: str) -> str:
    """A usage message without pydantic's wording.

    Found by a fresh operator: ``--limit 0`` said "Input should be greater than or equal
    to 1", ``--status bogus`` began "Value error, ".
    """
    for pattern, words in _PYDANTIC_WORDS:
        message = pattern.sub(words, message)
    return message
