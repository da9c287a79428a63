"""stdout and stderr while a run is driven: tools' writes with secrets masked (SPEC §7).

What a python tool writes — ``print``, ``sys.stderr``, ``logging``, ``os.write(2, …)``, a
child process it starts — is a value, and may echo a secret: it reaches planrun's stderr
with ``***`` for each spelling of a secret (:class:`planrun.redact.Secrets`). planrun's
own lines go past the masking (:func:`diagnostics`), so its words are never masked.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import re
import select
import sys
import threading
from collections.abc import Iterator
from typing import IO, Any

from .redact import MASK, Secrets


class Masker:
    """Masks secrets in a stream of text written in pieces.

    A piece that ends with the start of a secret is held back until the next piece shows
    whether the secret follows, so a secret written in two pieces is masked too.
    """

    def __init__(self, secrets: Secrets) -> None:
        self.forms = [f for f in secrets.forms if f]
        self._find = re.compile("|".join(map(re.escape, self.forms))) if self.forms else None
        self.held = ""

    def feed(self, text: str) -> str:
        """The next piece of text, masked; a possible start of a secret is held back."""
        if self._find is None:
            return text
        text = self.held + text
        keep = 0
        for n in range(min(len(text), max(map(len, self.forms)) - 1), 0, -1):
            tail = text[-n:]
            if any(f.startswith(tail) for f in self.forms):
                keep = n
                break
        # Mask only the matches that start before the held tail: one that starts inside it
        # may be the start of a longer secret (``abc`` then ``abcdef``).
        cut, done, shown = len(text) - keep, 0, []
        for m in self._find.finditer(text):
            if m.start() >= cut:
                break
            shown += [text[done:m.start()], MASK]
            done = m.end()
        cut = max(cut, done)
        self.held = text[cut:]
        return "".join(shown) + text[done:cut]

    def flush(self) -> str:
        """What is held back (the stream ends, or is flushed), masked."""
        held, self.held = self.held, ""
        return self._find.sub(MASK, held) if self._find is not None else held


class _MaskedWriter:
    """``sys.stdout``/``sys.stderr`` while a run is driven: tools' writes, masked."""

    def __init__(self, target: IO[str], secrets: Secrets, fileno: int | None) -> None:
        self._target = target
        self._masker = Masker(secrets)
        self._lock = threading.Lock()
        self._fileno = fileno

    def write(self, text: str) -> int:
        with self._lock:
            shown = self._masker.feed(text)
            if shown:
                self._target.write(shown)
            if "\n" in text:
                self._target.flush()
        return len(text)

    def flush(self) -> None:
        with self._lock:
            held = self._masker.flush()
            if held:
                self._target.write(held)
            self._target.flush()

    def fileno(self) -> int:
        if self._fileno is None:
            return self._target.fileno()
        return self._fileno

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


_diagnostics: IO[str] | None = None


def diagnostics() -> IO[str]:
    """Where planrun's own diagnostics go: stderr, past the masking of tools' writes."""
    return _diagnostics if _diagnostics is not None else sys.stderr


def _forward(read_fd: int, write_fd: int, masker: Masker, stop: threading.Event) -> None:
    """Copy a pipe to ``write_fd``, masking secrets, until EOF or ``stop`` and quiet."""
    decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")

    def send(text: str) -> None:
        data = text.encode("utf-8", "surrogateescape")
        while data:
            try:
                n = os.write(write_fd, data)
            except OSError:
                return  # stderr is gone: what tools write is dropped, never blocks them
            data = data[n:]

    while True:
        ready, _, _ = select.select([read_fd], [], [], 0.05)
        if not ready:
            if stop.is_set():
                break
            continue
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        send(masker.feed(decoder.decode(chunk)))
    send(masker.feed(decoder.decode(b"", final=True)) + masker.flush())


@contextlib.contextmanager
def masked_output(secrets: Secrets, until_exit: Any = None) -> Iterator[None]:
    """While a run is driven, mask secrets in whatever tools write to stdout and stderr.

    ``sys.stdout``/``sys.stderr`` become masking writers, and file descriptors 1 and 2 a
    pipe that a thread copies, masked, to the real stderr — so ``print``, ``logging``,
    ``os.write(2, …)`` and a python tool's child processes are all covered. planrun's own
    lines go through :func:`diagnostics` and are never masked. Nothing changes when there
    is no secret.

    ``until_exit()`` true at the end (python calls abandoned in threads, still running):
    stderr stays masked until the process exits; only stdout is given back.
    """
    global _diagnostics
    if not secrets or sys.stderr is None:  # no secret, or no stderr to reach at all
        yield
        return
    old_out, old_err, old_diag = sys.stdout, sys.stderr, _diagnostics
    with contextlib.suppress(Exception):
        old_out.flush()
        old_err.flush()
    try:
        fd_backed = old_err.fileno() == 2
    except (OSError, ValueError, AttributeError):
        fd_backed = False  # an in-memory stream (embedded, under a test harness)
    piped = _Piped.start(secrets)
    real: IO[str] = old_err
    if piped is not None and fd_backed:
        real = open(os.dup(piped.saved[1]), "w",  # noqa: SIM115 - closed at the end
                    encoding=getattr(old_err, "encoding", None) or "utf-8",
                    errors="backslashreplace", buffering=1)
    writer = _MaskedWriter(real, secrets, 2 if piped is not None else None)
    sys.stdout = sys.stderr = writer
    _diagnostics = real
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            writer.flush()
        keep = bool(until_exit and until_exit())
        sys.stdout = old_out
        if not keep:
            sys.stderr, _diagnostics = old_err, old_diag
        if piped is not None:
            piped.end(keep)
            if not keep and real is not old_err:
                with contextlib.suppress(Exception):
                    real.close()


class _Piped:
    """File descriptors 1 and 2 made a pipe that a thread copies, masked, to stderr."""

    def __init__(self, saved: tuple[int, int], read_fd: int, thread: threading.Thread,
                 stop: threading.Event) -> None:
        self.saved, self.read_fd, self.thread, self.stop = saved, read_fd, thread, stop

    @classmethod
    def start(cls, secrets: Secrets) -> _Piped | None:
        """Pipe fds 1 and 2 through the masking thread; None without descriptors."""
        try:
            saved = (os.dup(1), os.dup(2))
        except OSError:
            return None  # a closed descriptor: Python-level masking only
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 1)
        os.dup2(write_fd, 2)
        os.close(write_fd)
        stop = threading.Event()
        thread = threading.Thread(target=_forward, name="planrun-mask",
                                  args=(read_fd, saved[1], Masker(secrets), stop),
                                  daemon=True)
        thread.start()
        return cls(saved, read_fd, thread, stop)

    def end(self, keep: bool) -> None:
        """Give fd 1 back; and fd 2 too unless ``keep`` (stderr stays masked until exit)."""
        saved = self.saved
        if keep:
            os.dup2(saved[0], 1)
            os.close(saved[0])
            return
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        self.stop.set()
        self.thread.join(timeout=5)
        os.close(saved[0])
        if not self.thread.is_alive():
            os.close(self.read_fd)
            os.close(saved[1])
