"""Command calls never outlive planrun unnoticed (SPEC §12 "Executors", §7 "Leases").

Two mechanisms, each enough on its own for the common case, together closing the gaps:

- **Children die with planrun.** Each command leads its own process group. A *keeper*
  process (:class:`Keeper`, the script ``planrun/_watchdog.py``), started once per
  planrun process in a session of its own, is told the group of every running call; when
  planrun is gone, however it died (``kill -9`` of planrun alone included), the keeper
  sends SIGTERM to the groups still running, then SIGKILL after
  :data:`planrun.tools.KILL_GRACE_S` seconds. The child registers its own group with the
  keeper before it executes the command (in the fork, :meth:`Keeper.preexec`), so there
  is no instant at which a started command is unknown to the keeper.
- **resume finds what is still running.** The journal records each running call's group
  with its host, the boot it was started in, and its leader's start time
  (:func:`identify`). ``resume``, ``retry`` and ``resolve`` refuse with ``run_busy`` while
  a recorded group is alive (:func:`group_alive`), e.g. after the keeper itself was
  killed too.

What is *not* covered: a process that leaves its group on purpose (``setsid``,
``setpgid``) escapes both, as it escapes a terminal's job control. A command that exits
and leaves background processes behind has finished its call: those processes are its
own business, not a running call.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_PROC = Path("/proc")


#: The pid namespace of a Linux machine's own processes (the kernel's PROC_PID_INIT_INO).
_INIT_PID_NS = "pid:[4026531836]"


def boot_id() -> str | None:
    """This machine's boot id (Linux), or None where there is none to read.

    In a pid namespace that is not the machine's own (a container's), the namespace
    follows it (``BOOT pid:[INODE]``): a pid recorded there is not a pid of a process
    outside it, though the host name (the container shares the host's network) and the
    boot are the same (found by an attacker: a live holder's lease was taken over).
    """
    try:
        boot = (_PROC / "sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None
    try:
        space = os.readlink(_PROC / "self/ns/pid")
    except OSError:
        space = _INIT_PID_NS
    return boot if boot is None or space == _INIT_PID_NS else f"{boot} {space}"


def booted_at() -> float | None:
    """When this machine booted, in seconds since the epoch (Linux ``/proc/uptime``)."""
    import time

    try:
        return time.time() - float((_PROC / "uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def same_pids(recorded: str | None, since: float | None = None) -> bool | None:
    """Whether pids recorded with ``recorded`` (a :func:`boot_id`) name this process's pids.

    ``since``: when the record was last written (seconds since the epoch), if known. A
    record of another boot written after this machine booted is not of this machine's
    earlier boot: it comes from another machine with the same host name (a cloned VM),
    whose processes cannot be checked from here (found by an attacker: such a holder's
    live lease was taken as of a machine that restarted, and taken over at once).

    Returns:
        True: the same boot and pid namespace (or nothing recorded to tell); False: the
        machine restarted since (nothing of that boot runs); None: another pid namespace
        of this machine (another container), or another machine of the same name.
    """
    now = boot_id()
    if not recorded or not now or recorded == now:
        return True
    if recorded.split(" ", 1)[0] != now.split(" ", 1)[0]:
        booted = booted_at() if since is not None else None
        return None if booted is not None and since is not None and since > booted else False
    return None


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, start time in clock ticks since boot) of a pid, or None."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    try:
        # the command name (field 2) is in parentheses and may contain anything
        fields = text.rsplit(")", 1)[1].split()
        return fields[0], int(fields[2]), int(fields[19])
    except (IndexError, ValueError):
        return None


#: Test-only seam: ``PLANRUN_TEST_HOST=NAME`` makes this process say it runs on host NAME
#: (leases, recorded calls), so two processes on one machine act as two hosts sharing one
#: journal (SPEC §11).
HOST_ENV = "PLANRUN_TEST_HOST"


def host_name() -> str:
    """This machine's name as leases and recorded calls give it (``socket.gethostname()``).

    ``PLANRUN_TEST_HOST`` overrides it (a test seam, :data:`HOST_ENV`).
    """
    return os.environ.get(HOST_ENV) or socket.gethostname()


@dataclass(frozen=True)
class Group:
    """A running call's process group, as journaled (SPEC §12).

    Attributes:
        pgid: the process group id (the command's pid: it leads its group).
        host: :func:`host_name` of the machine it runs on.
        boot_id: that machine's boot id (Linux), or None.
        start_ticks: the leader's start time in clock ticks since boot (Linux
            ``/proc/PID/stat`` field 22), or None; with ``boot_id`` it tells a recorded
            group from a later one that got the same number.
        recorded_at: when it was journaled (seconds since the epoch), when read back: a
            group of another boot journaled after this machine booted is another
            machine's (:func:`same_pids`).
    """

    pgid: int
    host: str
    boot_id: str | None
    start_ticks: int | None
    recorded_at: float | None = None


def exited(pid: int) -> bool:
    """Whether ``pid`` is a process that has ended but not been reaped (a zombie; Linux).

    ``kill(pid, 0)`` succeeds for a zombie: its parent has not waited for it (a container
    whose first process reaps nothing), yet it does nothing any more.
    """
    found = _stat(pid)
    return found is not None and found[0] in ("Z", "X")


def identify(pid: int) -> Group:
    """The :class:`Group` led by ``pid`` (a command planrun just started)."""
    found = _stat(pid)
    return Group(pgid=pid, host=host_name(), boot_id=boot_id(),
                 start_ticks=found[2] if found else None)


def group_alive(group: Group) -> bool | None:
    """Whether anything of a recorded process group still runs.

    Returns:
        True / False for a group on this host; None for a group on another host (or in
        another pid namespace of this one), which cannot be checked from here.

    A number is only reused for a new group once every process of the old group is gone,
    so: the leader alive with the recorded start time → alive; a live process with that
    pid but another start time → the old group is gone; no leader → alive while some
    process (not a zombie) is still in the group.
    """
    if group.host != host_name():
        return None
    same = same_pids(group.boot_id, group.recorded_at)
    if same is not True:
        return same  # False: the machine restarted since; None: another pid space or host
    if not _PROC.is_dir():  # pragma: no cover - not Linux: the group id is all there is
        try:
            os.killpg(group.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    leader = _stat(group.pgid)
    if leader is not None and leader[0] not in ("Z", "X"):
        # another start time: the pid was given to a new process, the old group is gone
        return group.start_ticks is None or leader[2] == group.start_ticks
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            found = _stat(int(entry.name))
            if found is not None and found[1] == group.pgid and found[0] not in ("Z", "X"):
                return True
    return False


class Keeper:
    """The keeper process of this planrun process (see the module docstring).

    Started on first use; :meth:`close` ends it. Every method is a no-op when the keeper
    could not be started (no usable interpreter): the journal's record of running calls
    still keeps ``resume`` from running a step twice.
    """

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._fd: int | None = None
        self._failed = False
        self._pid = os.getpid()

    def start(self) -> None:
        """Start the keeper if it is not running yet (call from the thread that forks)."""
        if self._proc is not None or self._failed:
            return
        self._pid = os.getpid()
        try:
            from importlib import resources  # only for a watchdog (~2 ms of start-up)

            found = resources.files("planrun").joinpath("_watchdog.py")
            # The file itself when there is one: `ps` shows its path, not its 3,800
            # characters of source (a quarter of `ps aux` on a busy host, found by an
            # operator); its text only from a package that is no folder (a zip).
            script = [str(found)] if isinstance(found, Path) and found.is_file() else \
                ["-c", found.read_text(encoding="utf-8")]
            # -I -S: no site, no user paths, no environment: fast, and nothing of the
            # project can change what the keeper does.
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", *script, str(self._pid)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True, close_fds=True, cwd="/", env=_keeper_env())
        except (OSError, ValueError, subprocess.SubprocessError):
            self._failed = True
            return
        assert self._proc.stdin is not None
        self._fd = self._proc.stdin.fileno()

    def _send(self, text: bytes) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.write(self._fd, text)

    def preexec(self) -> None:
        """Run in the forked child before it executes the command (``preexec_fn``).

        The child leads its own group already; it tells the keeper so before the command
        can start anything, and gives up if planrun died in the meantime. Only plain
        system calls: the fork of a threaded process must not take locks.
        """
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.write(self._fd, b"+%d\n" % os.getpid())
        if os.getppid() != self._pid:
            os._exit(127)

    def add(self, pgid: int) -> None:
        """A call's group started (also told by :meth:`preexec`; telling twice is fine)."""
        self._send(b"+%d\n" % pgid)

    def remove(self, pgid: int) -> None:
        """A call's group ended (its leader was reaped)."""
        self._send(b"-%d\n" % pgid)

    @property
    def pid(self) -> int | None:
        """The keeper's pid, or None when it is not running."""
        return None if self._proc is None else self._proc.pid

    def close(self) -> None:
        """End the keeper: it ends the groups still listed (none after a clean run)."""
        proc, self._proc, self._fd = self._proc, None, None
        if proc is None:
            return
        assert proc.stdin is not None
        with contextlib.suppress(OSError):
            proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=2)


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to a process group; nothing when it is gone or not ours."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def describe(group: Group) -> dict[str, Any]:
    """A group as shown to people (``resume --explain``, ``run_busy`` details)."""
    return {"pgid": group.pgid, "host": group.host}


def _keeper_env() -> dict[str, str]:
    """The keeper's environment: planrun's, less what no child gets (:mod:`.childenv`)."""
    from . import childenv

    return childenv.child_env()
