"""The keeper of one planrun process's command calls (run as ``python -I -S <this file>``).

Started by :class:`planrun.procs.Keeper` in a session of its own (so neither a signal to
planrun's process group nor a terminal's Ctrl-C reaches it), with planrun's pid as its
only argument. It reads lines ``+PGID`` / ``-PGID`` on stdin: the process groups of the
command calls that are running. When planrun is gone — stdin reaches end-of-file (every
copy of the pipe's write end is closed, however planrun died) or its parent pid changed
(planrun died while something it forked still holds the pipe) — it sends SIGTERM to every
group still listed, waits up to :data:`GRACE_S` seconds for them to go, SIGKILLs what is
left, and exits. A planrun that ends normally has no group listed: the keeper just exits.

This file imports nothing from planrun and only the standard library: it runs without
``site`` so that it starts fast and cannot be affected by the project's modules.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

#: Seconds the groups get between SIGTERM and SIGKILL (planrun's ``KILL_GRACE_S``).
GRACE_S = 5.0
#: Seconds between checks that planrun is still this process's parent.
POLL_S = 0.2


def _signal(pgid: int, sig: int) -> bool:
    """Send ``sig`` to a group; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _apply(line: bytes, groups: set[int]) -> None:
    op, text = line[:1], line[1:].strip()
    if not text.isdigit():
        return
    pgid = int(text)
    if pgid <= 1:
        return  # never signal "every process" or init, whatever arrives on the pipe
    if op == b"+":
        groups.add(pgid)
    elif op == b"-":
        groups.discard(pgid)


def _drain(fd: int, buf: bytes, groups: set[int]) -> tuple[bytes, bool]:
    """Read what is there; returns (unfinished line, end-of-file reached)."""
    try:
        data = os.read(fd, 65536)
    except BlockingIOError:
        return buf, False
    except OSError:
        return buf, True
    if not data:
        return buf, True
    buf += data
    *lines, buf = buf.split(b"\n")
    for line in lines:
        _apply(line, groups)
    return buf, False


def _end(groups: set[int]) -> None:
    for pgid in list(groups):
        if not _signal(pgid, signal.SIGTERM):
            groups.discard(pgid)
    deadline = time.monotonic() + GRACE_S
    while groups and time.monotonic() < deadline:
        time.sleep(0.05)
        for pgid in list(groups):
            if not _signal(pgid, 0):
                groups.discard(pgid)
    for pgid in groups:
        _signal(pgid, signal.SIGKILL)


def main(argv: list[str]) -> int:
    """Watch planrun (pid ``argv[0]``) and end its calls' groups when it is gone."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    parent = int(argv[0]) if argv and argv[0].isdigit() else os.getppid()
    groups: set[int] = set()
    buf = b""
    fd = sys.stdin.fileno()
    while True:
        ready, _, _ = select.select([fd], [], [], POLL_S)
        if ready:
            buf, eof = _drain(fd, buf, groups)
            if eof:
                break
        if os.getppid() != parent:
            os.set_blocking(fd, False)
            while True:  # take in what planrun wrote before it died
                buf, eof = _drain(fd, buf, groups)
                if eof or not select.select([fd], [], [], 0)[0]:
                    break
            break
    _end(groups)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
