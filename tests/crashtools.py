"""Side-effect counting tools for the process-level tests (crash, resume, signals, leases).

This file is copied into each test's project folder and registered in its ``tools.yaml``;
planrun imports it (``python: crashtools:record``) or runs it as a command
(``python crashtools.py record``). It is never imported by the tests themselves.

Every real call appends one JSON line to the effects log (``$CRASH_EFFECTS``, else
``effects.log`` in the current folder), written with one ``write`` and ``fsync``'d before
the tool returns, so a line in the log means "the effect happened" even if planrun is
SIGKILLed the next instant, and no line means it did not. A line is::

    {"event": "call", "effect": "fan#1", "run": RUN_ID, "key": IDEMPOTENCY_KEY,
     "attempt": 1, "pid": PID, "output": {"effect": "fan#1", "args": {...}}}

``effect`` is the step id, or ``STEP#N`` for fan-out item N; ``output`` is exactly what the
call returns (so an operator can hand it to ``planrun resolve --succeeded --output``).
Markers written before a call blocks use ``"event": "start"``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

#: Environment variable naming the effects log.
EFFECTS_ENV = "CRASH_EFFECTS"
#: A waiting tool gives up after this many seconds (a hang guard, never reached in a pass).
WAIT_LIMIT_S = 60.0


def _effects() -> Path:
    return Path(os.environ.get(EFFECTS_ENV) or "effects.log")


def log(entry: dict[str, Any]) -> None:
    """Append one line to the effects log and fsync it."""
    data = (json.dumps(entry, sort_keys=True) + "\n").encode()
    fd = os.open(_effects(), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _where() -> dict[str, Any]:
    """The current call's identity, from ``planrun.context()`` or a command's environment."""
    try:
        import planrun

        c = planrun.context()
        run, step, item, key, attempt = (c.run_id, c.step_id, c.item_index,
                                         c.idempotency_key, c.attempt)
    except (ImportError, LookupError):
        env = os.environ
        run, step = env["PLANRUN_RUN_ID"], env["PLANRUN_STEP_ID"]
        item = int(env["PLANRUN_ITEM_INDEX"]) if "PLANRUN_ITEM_INDEX" in env else None
        key, attempt = env["PLANRUN_IDEMPOTENCY_KEY"], int(env["PLANRUN_ATTEMPT"])
    effect = step if item is None else f"{step}#{item}"
    return {"effect": effect, "run": run, "key": key, "attempt": attempt, "pid": os.getpid()}


def _call(args: dict[str, Any]) -> dict[str, Any]:
    where = _where()
    output = {"effect": where["effect"], "args": args}
    log({"event": "call", **where, "output": output})
    return output


def _wait_file(name: str) -> None:
    deadline = time.monotonic() + WAIT_LIMIT_S
    while not Path(name).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} never appeared")
        time.sleep(0.02)


def record(**kwargs: Any) -> dict[str, Any]:
    """One effect; returns ``{"effect": ..., "args": kwargs}``."""
    return _call(kwargs)


def wait(file: str, **kwargs: Any) -> dict[str, Any]:
    """Log a start marker, wait until ``file`` exists (project folder), then one effect."""
    log({"event": "start", **_where()})
    _wait_file(file)
    return _call({"file": file, **kwargs})


def flaky(file: str, **kwargs: Any) -> dict[str, Any]:
    """One effect; then fail unless ``file`` exists (the effect is logged either way)."""
    out = _call({"file": file, **kwargs})
    if not Path(file).exists():
        raise RuntimeError(f"{file} is not there yet")
    return out


def gate(fix: str, hold: str, **kwargs: Any) -> dict[str, Any]:
    """Log a start marker; fail unless ``fix`` exists; else wait for ``hold``, one effect."""
    log({"event": "start", **_where()})
    if not Path(fix).exists():
        raise RuntimeError(f"{fix} is not there yet")
    _wait_file(hold)
    return _call({"fix": fix, "hold": hold, **kwargs})


def fail_first(hold: str, **kwargs: Any) -> dict[str, Any]:
    """Log a start marker, wait for ``hold``; attempt 1 then fails, later ones succeed."""
    where = _where()
    log({"event": "start", **where})
    _wait_file(hold)
    if where["attempt"] == 1:
        raise RuntimeError("the first attempt fails")
    return _call({"hold": hold, **kwargs})


def barrier(room: str, parties: int, **kwargs: Any) -> dict[str, Any]:
    """Succeed only once ``parties`` runs are inside at the same time (proves overlap)."""
    where = _where()
    folder = Path(room)
    folder.mkdir(exist_ok=True)
    (folder / f"{where['run']}-{where['effect']}").touch()
    deadline = time.monotonic() + WAIT_LIMIT_S
    while len(list(folder.iterdir())) < parties:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(list(folder.iterdir()))} of {parties} arrived")
        time.sleep(0.02)
    return _call({"room": room, "parties": parties, **kwargs})


def main(argv: list[str]) -> int:
    """Command mode: ``record`` (arguments as JSON on stdin) or ``sleep SECONDS``."""
    verb = argv[0]
    if verb == "record":
        args = json.load(sys.stdin)
        print(json.dumps(_call(args)))
        return 0
    if verb == "sleep":
        log({"event": "start", **_where()})
        time.sleep(float(argv[1]))
        print(json.dumps(_call({"slept": float(argv[1])})))
        return 0
    print(f"unknown verb {verb}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
