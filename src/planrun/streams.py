"""stdout and stderr that can never change an outcome (SPEC §5, principle 6).

Writing to stdout or stderr is a report, never part of a run: a stream that is closed
(``2>&-``), a pipe whose reader has exited (``| head -1``), a full disk or a terminal that
hung up must not turn a completed run into exit 1, an ``approval_required`` into a
traceback, or stop a run half way. :func:`harden` (called first thing by the console
entry point) makes that so for the whole process:

- fds 0, 1 and 2 are always open: a closed one is filled with ``/dev/null`` (so neither
  Python's ``sys.stdout is None`` nor a journal file opened on fd 2 can happen);
- ``SIGPIPE`` is ignored (and ignored again before each write, should code planrun ran,
  such as a tool, have restored its default), so a broken pipe is an error on the write,
  never a silent death;
- ``sys.stdout`` and ``sys.stderr`` become :class:`SafeStream` wrappers: the first write or
  flush that fails points the file descriptor at ``/dev/null`` and the output is dropped
  from then on — by planrun, by rich, by the interpreter's final flush, and by any child
  that inherits the descriptor.

:func:`stdout_to_stderr` is the other half of "only results on stdout": user code (tool
modules imported while loading the registry, pydantic models, tool calls) runs with
stdout pointed at stderr, at the Python level and at the file-descriptor level.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
from collections.abc import Iterator
from typing import IO, Any, cast


def _open_fd(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _to_devnull(fd: int) -> None:
    """Point ``fd`` at ``/dev/null`` (for reading and writing); ignore failures."""
    try:
        null = os.open(os.devnull, os.O_RDWR)
    except OSError:
        return
    try:
        if null != fd:
            os.dup2(null, fd)
    except OSError:
        pass
    finally:
        if null != fd:
            os.close(null)


def _keep_sigpipe_ignored() -> None:
    """SIGPIPE stays ignored, whatever code that ran since did with it (main thread only)."""
    if hasattr(signal, "SIGPIPE") and signal.getsignal(signal.SIGPIPE) != signal.SIG_IGN:
        with contextlib.suppress(ValueError, OSError, TypeError):
            signal.signal(signal.SIGPIPE, signal.SIG_IGN)


class SafeStream(io.TextIOBase):
    """A text stream whose write and flush never raise (see the module docstring).

    Args:
        stream: the real text stream (``sys.stdout`` or ``sys.stderr`` as Python made it).
        fd: its file descriptor (1 or 2), redirected to ``/dev/null`` on the first failure.
    """

    def __init__(self, stream: IO[str], fd: int) -> None:
        super().__init__()
        self._stream = stream
        self._fd = fd
        #: True once a write failed: the output goes to ``/dev/null`` from then on.
        self.broken = False

    def _drop(self) -> None:
        self.broken = True
        _to_devnull(self._fd)
        with contextlib.suppress(OSError, ValueError):
            self._stream.flush()  # whatever was buffered now goes to /dev/null

    def write(self, text: str) -> int:  # noqa: D102 - io.TextIOBase
        if self.broken:
            return len(text)
        _keep_sigpipe_ignored()  # a broken pipe must be an error here, not a silent death
        try:
            return self._stream.write(text)
        except (OSError, ValueError):
            self._drop()
            return len(text)

    def flush(self) -> None:  # noqa: D102 - io.TextIOBase
        if self.broken:
            return
        _keep_sigpipe_ignored()
        try:
            self._stream.flush()
        except (OSError, ValueError):
            self._drop()

    def writable(self) -> bool:  # noqa: D102 - io.TextIOBase
        return True

    def isatty(self) -> bool:  # noqa: D102 - io.TextIOBase
        try:
            return not self.broken and self._stream.isatty()
        except (OSError, ValueError):
            return False

    def fileno(self) -> int:  # noqa: D102 - io.TextIOBase
        return self._fd

    def close(self) -> None:  # noqa: D102 - the standard streams are never closed
        self.flush()

    @property
    def closed(self) -> bool:  # noqa: D102 - io.TextIOBase
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]  # noqa: D102
        return str(getattr(self._stream, "encoding", None) or "utf-8")

    @property
    def errors(self) -> str | None:  # type: ignore[override]  # noqa: D102
        return cast("str | None", getattr(self._stream, "errors", None))

    @property
    def buffer(self) -> Any:  # noqa: D102 - the binary layer, for code that wants bytes
        return getattr(self._stream, "buffer", None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def harden() -> None:
    """Make this process's stdout and stderr safe to write to (see the module docstring).

    Idempotent. Called by :func:`planrun.cli.main` before anything is printed.
    """
    if hasattr(signal, "SIGPIPE"):
        with contextlib.suppress(ValueError, OSError):  # not the main thread: leave it
            signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    for fd in (0, 1, 2):
        if not _open_fd(fd):
            _to_devnull(fd)
    for name, fd in (("stdout", 1), ("stderr", 2)):
        current = getattr(sys, name)
        if isinstance(current, SafeStream):
            continue
        if current is None:  # the descriptor was closed when Python started
            current = open(fd, "w", buffering=1 if fd == 2 else -1,  # noqa: SIM115
                           encoding="utf-8", errors="backslashreplace", closefd=False)
        setattr(sys, name, SafeStream(current, fd))


def drop_broken() -> None:
    """Point fd 1 and fd 2 at ``/dev/null`` when what they write to has no reader any more.

    A pipe whose reader has gone (an MCP client that disconnected, ``2>&1 | head -1``
    after ``head`` exited) makes every write to it fail with ``EPIPE``: a python tool that
    writes to file descriptor 1 or 2 itself (``os.write``, a C library, a child process
    it starts) failed with ``BrokenPipeError`` — the run's outcome changed because nobody
    read stderr (found by an attacker). Called before tools run, as :class:`SafeStream`
    does on planrun's own first failed write; a regular file, a terminal, ``/dev/null``
    and a pipe that is still read are left as they are.
    """
    import select

    if not hasattr(select, "poll"):
        return
    poller = select.poll()
    for fd in (1, 2):
        poller.register(fd, select.POLLOUT)
    try:
        ready = poller.poll(0)
    except OSError:
        return
    for fd, events in ready:
        if events & (select.POLLERR | select.POLLHUP) and not events & select.POLLNVAL:
            _to_devnull(fd)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """While user code runs, whatever it prints goes to stderr.

    stdout is for results only (the manifest, ``--json``, a ``--format json`` report), so a
    tool module that prints when imported, or a chatty model or tool, cannot corrupt it.
    Redirects both ``sys.stdout`` and file descriptor 1; the disposition of ``SIGPIPE`` is
    restored afterwards, whatever the code did with it.
    """
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    drop_broken()
    pipe = signal.getsignal(signal.SIGPIPE) if hasattr(signal, "SIGPIPE") else None
    try:
        saved: int | None = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no descriptors (embedded): redirect the Python level only
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)
        if pipe is not None and signal.getsignal(signal.SIGPIPE) != pipe:
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(signal.SIGPIPE, pipe)
