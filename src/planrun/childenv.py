"""What planrun's child processes get of its environment (SPEC §7, §11).

A child process starts with a copy of its parent's environment, which anyone who may read
``/proc/PID/environ`` (the same user, root, a ``ps e``) sees for as long as it lives —
also after the child took a variable out of ``os.environ``. So what a child must not know
is never in the environment it *starts* with:

- ``PLANRUN_PARAM_*``: a tool receives a parameter only as an argument (SPEC §7);
- ``PLANRUN_JOURNAL`` when it is a URL that carries a password (SPEC §11: "a password in
  the URL is never printed or journaled"; ``planrun --journal URL COMMAND`` puts the URL
  there);
- ``PGPASSWORD`` while this process journals to PostgreSQL (the journal's password as
  libpq reads it).

Every child planrun starts — a command tool (:func:`planrun.tools.run_command`), a planner
(:mod:`planrun.planners.invoke`), the keeper (:class:`planrun.procs.Keeper`) — is given
:func:`child_env`. The processes a library starts for planrun (Dask's worker processes,
which a nanny may start again at any time while the cluster lives; multiprocessing's
helpers) inherit the process's environment as it is then: for as long as they may be
started, :func:`hidden` takes the variables out of ``os.environ`` (the local dispatcher's
session, a local Dask cluster's life) and keeps them here, where planrun's own readers
find them (:func:`getenv`, :func:`param_variables`; the PostgreSQL backend gives a kept
``PGPASSWORD`` to libpq as the connection's password).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator, Mapping

#: Parameters given in the environment: ``PLANRUN_PARAM_<NAME>`` (SPEC §7).
PARAM_ENV_PREFIX = "PLANRUN_PARAM_"

_LOCK = threading.Lock()
#: Variables :func:`hidden` took out of ``os.environ``, while any :func:`hidden` is open.
_KEPT: dict[str, str] = {}
_DEPTH = [0]
#: Whether this process resolved (and so may journal to) a PostgreSQL journal.
_PG_JOURNAL = [False]


def note_journal(location: object) -> None:
    """Settings resolved ``location`` as this command's journal (a path or a URL).

    From then on, a PostgreSQL journal's ``PGPASSWORD`` is kept from children.
    """
    if str(location).startswith(("postgresql://", "postgres://")):
        _PG_JOURNAL[0] = True


def _carries_password(url: str) -> bool:
    from .journal.backends import shown_location

    return "://" in url and shown_location(url) != url


def hidden_names(environ: Mapping[str, str] | None = None) -> list[str]:
    """The names in ``environ`` (default ``os.environ``) that children never get."""
    env = os.environ if environ is None else environ
    names = [k for k in env if k.startswith(PARAM_ENV_PREFIX)]
    if _carries_password(env.get("PLANRUN_JOURNAL", "")):
        names.append("PLANRUN_JOURNAL")
    if "PGPASSWORD" in env and (
            _PG_JOURNAL[0] or "planrun.journal.backends.postgres" in sys.modules
            or env.get("PLANRUN_JOURNAL", "").startswith(("postgresql://", "postgres://"))):
        names.append("PGPASSWORD")
    return names


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child planrun starts: its own, less :func:`hidden_names`.

    ``extra`` (e.g. ``PLANRUN_RUN_ID``) is added last.
    """
    drop = set(hidden_names())
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra or {})
    return env


@contextlib.contextmanager
def hidden() -> Iterator[None]:
    """For the block, :func:`hidden_names` are not in ``os.environ`` (kept here).

    Re-entrant and thread-safe: the variables come back when the last block open ends
    (what was set in between under the same names is overwritten by the kept values).
    """
    with _LOCK:
        for name in hidden_names():
            _KEPT[name] = os.environ.pop(name)
        _DEPTH[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH[0] -= 1
            if _DEPTH[0] == 0:
                os.environ.update(_KEPT)
                _KEPT.clear()


def getenv(name: str) -> str | None:
    """``os.environ[name]``, or the value :func:`hidden` keeps for it now (else None)."""
    value = os.environ.get(name)
    if value is None:
        with _LOCK:
            value = _KEPT.get(name)
    return value


def param_variables() -> dict[str, str]:
    """Every ``PLANRUN_PARAM_*`` variable given to this process (also while hidden)."""
    with _LOCK:
        merged = {**_KEPT, **os.environ}
    return {k: v for k, v in merged.items() if k.startswith(PARAM_ENV_PREFIX)}
