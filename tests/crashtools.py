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
import signal
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


async def block(file: str, **kwargs: Any) -> dict[str, Any]:
    """An ``async def`` tool that blocks the event loop (``time.sleep``) until ``file`` exists.

    What a careless async tool does; planrun's lease must survive it.
    """
    log({"event": "start", **_where()})
    _wait_file(file)
    return _call({"file": file, **kwargs})


def kill_planrun(**kwargs: Any) -> dict[str, Any]:
    """A python tool that SIGKILLs the planrun process it runs in, after its effect."""
    out = _call(kwargs)
    os.kill(os.getpid(), signal.SIGKILL)
    return out


def _hold_lock(effect: str) -> Any:
    """Lock ``<effect>.lock``; log an ``overlap`` line when another live copy holds it.

    Two copies of one call running at once is exactly what must never happen: the lock
    (released by the kernel when its holder dies) makes it visible.
    """
    import fcntl

    fh = open(f"{effect}.lock", "a")  # noqa: SIM115 - held until this process exits
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log({"event": "overlap", **_where()})
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
    return fh


def _wait_call(argv: list[str]) -> int:
    """``wait FILE [AFTER] [--once-per-key]``: see :func:`main`."""
    once = "--once-per-key" in argv
    files = [a for a in argv if not a.startswith("--")]
    where = _where()
    log({"event": "start", **where})
    lock = _hold_lock(where["effect"])
    _wait_file(files[0])
    output = {"effect": where["effect"], "args": {"file": files[0]}}
    done = once and any(e.get("key") == where["key"] for e in _entries()
                        if e["event"] == "call")
    if not done:  # an idempotent effect is done once per key, however often it is asked
        log({"event": "call", **where, "output": output})
    log({"event": "done", **where})
    if len(files) > 1:
        _wait_file(files[1])
    print(json.dumps(output))
    lock.close()
    return 0


def _entries() -> list[dict[str, Any]]:
    path = _effects()
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def main(argv: list[str]) -> int:
    """Command mode.

    ``record`` (arguments as JSON on stdin); ``sleep SECONDS``; ``wait FILE [AFTER]
    [--once-per-key]`` (start marker, lock, wait for FILE, the effect — only once per
    idempotency key with ``--once-per-key`` — then wait for AFTER); ``spawn ARGS...``
    (the same as ``wait`` in a child process of the same group, which the command waits
    for: the effect is a grandchild's of planrun); ``kill-parent`` (the effect, then
    SIGKILL to planrun).
    """
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
    if verb == "wait":
        return _wait_call(argv[1:])
    if verb == "spawn":
        import subprocess

        log({"event": "leader", **_where()})
        return subprocess.call([sys.executable, __file__, "wait", *argv[1:]])
    if verb == "kill-parent":
        _call({})
        os.kill(os.getppid(), signal.SIGKILL)
        return 0
    print(f"unknown verb {verb}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
