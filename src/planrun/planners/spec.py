"""Which planner to ask: ``cmd:ARGV``, ``python:module:callable``, or ``[planners.NAME]``.

SPEC §10. A ``--planner`` value is one of:

- ``cmd:ARGV``: a command line, split like a shell would (:func:`shlex.split`) but run
  without one;
- ``python:module:callable``: a callable, its module imported with the project folder
  first on ``sys.path`` (as ``python:`` tools are);
- ``NAME``: the ``[planners.NAME]`` table of ``planrun.toml``, with ``command = [...]``
  or ``python = "module:callable"``, and optional ``timeout`` (seconds, default 300) and
  ``max_rounds`` (default: 3, below ``--max-rounds``).

A malformed value is a usage error (exit 2); a ``[planners.NAME]`` table that is not
right is a configuration error (code ``config``, exit 3).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import Refused, UsageError
from ..issues import Issue, Report, did_you_mean

#: Seconds a planner may take per round unless its table says otherwise (SPEC §10).
DEFAULT_TIMEOUT_S = 300.0
#: Rounds unless ``--max-rounds`` or the planner's table says otherwise (SPEC §10).
DEFAULT_MAX_ROUNDS = 3
#: Keys of a ``[planners.NAME]`` table.
TABLE_KEYS = ("command", "python", "timeout", "max_rounds")
_TARGET = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*")


@dataclass(frozen=True)
class Planner:
    """A planner, ready to be asked (see :mod:`planrun.planners.invoke`).

    Attributes:
        label: how it was named (the ``--planner`` value), for messages and the journal.
        argv: the command (``cmd:`` or ``command =``), or None.
        target: ``module:callable`` (``python:`` or ``python =``), or None.
        folder: the project folder: the command's working folder, the first import path.
        timeout: seconds per round (> 0).
        max_rounds: the table's ``max_rounds``, or None.
    """

    label: str
    folder: Path
    argv: tuple[str, ...] | None = None
    target: str | None = None
    timeout: float = DEFAULT_TIMEOUT_S
    max_rounds: int | None = None


def _config_error(settings: Any, message: str) -> Refused:
    from ..paths import shown_path

    file = shown_path(settings.config_file) if settings.config_file else None
    issue = Issue(code="config", message=message, file=file)
    return Refused(f"{file or 'planrun.toml'}: {message}", code="config",
                   report=Report(issues=[issue]))


def _target_ok(value: Any) -> bool:
    return isinstance(value, str) and _TARGET.fullmatch(value) is not None


def resolve_planner(settings: Any, value: str) -> Planner:
    """The planner a ``--planner`` value names (SPEC §10).

    Args:
        settings: the invocation's :class:`~planrun.paths.Settings` (``planners``, the
            project folder).
        value: ``cmd:ARGV``, ``python:module:callable`` or a ``[planners]`` name.

    Raises:
        UsageError: the value is malformed (empty command, unbalanced quotes, no
            ``module:callable``) or names no ``[planners.NAME]`` table (exit 2).
        Refused: the ``[planners.NAME]`` table is not right (code ``config``, exit 3).
    """
    folder = Path(settings.project)
    if value.startswith("cmd:"):
        try:
            argv = shlex.split(value[4:])
        except ValueError as exc:
            raise UsageError(f"--planner {value!r}: the command cannot be split ({exc})",
                             hint="Quote as a shell would: cmd:'python3 my planner.py'.",
                             ) from None
        if not argv:
            raise UsageError(f"--planner {value!r}: no command after 'cmd:'",
                             hint="Write --planner 'cmd:PROGRAM ARGS...'.")
        return Planner(label=value, folder=folder, argv=tuple(argv))
    if value.startswith("python:"):
        target = value[7:]
        if not _target_ok(target):
            raise UsageError(f"--planner {value!r}: write python:module:callable",
                             hint="e.g. --planner python:my_planner:plan")
        return Planner(label=value, folder=folder, target=target)
    tables = settings.planners or {}
    if value not in tables:
        known = ", ".join(sorted(tables)) or "none"
        raise UsageError(f"--planner {value!r}: not cmd:ARGV, python:module:callable, or a "
                         f"[planners] name in planrun.toml.{did_you_mean(value, tables)}",
                         hint=f"Planners in planrun.toml: {known}.")
    return _from_table(settings, value, tables[value], folder)


def _from_table(settings: Any, name: str, table: Any, folder: Path) -> Planner:
    where = f"[planners.{name}]"
    if not isinstance(table, dict):
        raise _config_error(settings, f"{where} must be a table")
    unknown = sorted(set(table) - set(TABLE_KEYS))
    if unknown:
        raise _config_error(settings, f"{where}: unknown key(s) {', '.join(unknown)}; "
                            f"known: {', '.join(TABLE_KEYS)}"
                            + "".join(did_you_mean(u, TABLE_KEYS) for u in unknown))
    command, python = table.get("command"), table.get("python")
    if (command is None) == (python is None):
        raise _config_error(settings, f"{where} needs exactly one of command = [...] or "
                            "python = \"module:callable\"")
    if command is not None and not (isinstance(command, list) and command and all(
            isinstance(a, str) for a in command) and command[0]):
        raise _config_error(settings, f"{where}: command must be a non-empty list of "
                            "strings (the argv; no shell)")
    if python is not None and not _target_ok(python):
        raise _config_error(settings, f"{where}: python must be \"module:callable\", not "
                            f"{python!r}")
    timeout = table.get("timeout", DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not (
            0 < timeout <= 1e9):
        raise _config_error(settings, f"{where}: timeout must be a number of seconds > 0, "
                            f"not {timeout!r}")
    rounds = table.get("max_rounds")
    if rounds is not None and (isinstance(rounds, bool) or not isinstance(rounds, int)
                               or not 1 <= rounds <= 1000):
        raise _config_error(settings, f"{where}: max_rounds must be an integer from 1 to "
                            f"1000, not {rounds!r}")
    return Planner(label=name, folder=folder,
                   argv=tuple(command) if command is not None else None, target=python,
                   timeout=float(timeout), max_rounds=rounds)
