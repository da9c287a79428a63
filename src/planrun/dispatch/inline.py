"""Quick sync python calls made on the event loop's thread, without a thread hop.

Handing a sync python call to a worker thread and its result back to the event loop
costs two thread wake-ups: measured on a 2-core machine, ~0.1 ms of CPU a call, a third
of what a 1,000-step chain of no-op tools spent per step (``benchmarks/README.md``,
issue 16). The local dispatcher (:mod:`planrun.dispatch.local`) therefore calls a sync
python tool on the loop's own thread once it has seen that the tool is quick, when that
cannot hold anything else up:

- every call of the tool so far in this run ended within :data:`QUICK_S` (the first one
  is made in a thread, as before; one that took longer sends the tool back to threads
  for the rest of the run: :class:`Quick`);
- no other call is under way (in a thread, a child process, or an ``async def`` tool):
  while the loop is busy with a call, nothing else can become ready;
- the call has no ``timeout`` and the run none either (a timeout must be able to cut a
  call short, and only a call in a thread can be left behind);
- the run is driven on the main thread (signals are handled there only).

If a quick tool nevertheless blocks on one call, Ctrl-C and SIGTERM keep their meaning
(SPEC §5, ``docs/journal-and-resume.md``): the first signal gives the call the run's grace
period and a second Ctrl-C ends it at once (:class:`Interruptible`, which raises
:class:`Cut` inside the call; the step is journaled ``indeterminate``, as a cancelled call
in a thread is, and nothing is left running).
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal's own: ~2 us less a call (enums)
import asyncio
import signal
import threading
from types import FrameType, TracebackType
from typing import Any

#: Seconds: a sync python tool whose every call in the run ended within this is quick.
QUICK_S = 0.005


class Quick:
    """Which tools of a run are quick (every call so far ended within :data:`QUICK_S`).

    A tool is unknown until its first call ended; one call over the limit makes it slow
    for the rest of the run (a tool that blocks once may block again).
    """

    def __init__(self) -> None:
        self._seen: dict[str, bool] = {}

    def __contains__(self, tool: str) -> bool:
        return self._seen.get(tool, False)

    def took(self, tool: str, seconds: float) -> None:
        """Record that a call of ``tool`` ended after ``seconds`` (wall)."""
        if seconds >= QUICK_S:
            self._seen[tool] = False
        else:
            self._seen.setdefault(tool, True)


class Cut(BaseException):
    """Raised inside a call on the loop's thread to end it (a signal, see the module).

    A ``BaseException``, so a tool's ``except Exception`` does not swallow it.
    """


def on_main_thread() -> bool:
    """Whether this is the main thread (where signal handlers run and may be set)."""
    return threading.current_thread() is threading.main_thread()


class Interruptible:
    """While a call runs on the loop's thread: what SIGINT and SIGTERM do to it.

    The scheduler's own handlers (``loop.add_signal_handler``) run only when the loop
    does, which it does not while a call holds its thread. So for the call's duration
    these Python handlers take SIGINT and SIGTERM instead (the loop's wakeup fd is set
    aside, so the loop does not hear of them twice), on the main thread:

    - the first SIGINT or SIGTERM arms a timer of ``grace_s`` seconds (``SIGALRM``,
      ``setitimer``); when it fires the call is cut — the grace the scheduler gives a
      call in a thread (SPEC §5);
    - a second SIGINT cuts the call at once (a second Ctrl-C cancels what runs).

    Cutting raises :class:`Cut` where the call is. Every SIGINT and SIGTERM taken is in
    :attr:`received`, in order, for the scheduler to handle once the call has ended (the
    dispatcher hands them over before it reports the call's end, so the run's state knows
    of them first). The swap happens with the signals blocked, so none is lost or taken
    twice; the previous handlers and wakeup fd are put back, and the timer disarmed, on
    exit.
    """

    _SIGNALS = (int(signal.SIGINT), int(signal.SIGTERM), int(signal.SIGALRM))
    _MASK = frozenset(_SIGNALS)

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        #: SIGINT / SIGTERM taken during the call, in order.
        self.received: list[int] = []
        self._armed = False
        self._active = False
        self._previous: list[Any] = []
        self._wakeup = -1

    def __enter__(self) -> Interruptible:
        blocked = _signal.pthread_sigmask(signal.SIG_BLOCK, self._MASK)
        try:
            self._previous = [_signal.signal(s, self._on_signal) for s in self._SIGNALS]
            self._wakeup = signal.set_wakeup_fd(-1)
            self._active = True
        finally:
            _signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        return self

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum != signal.SIGALRM:
            self.received.append(signum)
        if not self._active:
            return
        if signum == signal.SIGALRM or (signum == signal.SIGINT and len(self.received) > 1):
            self._active = False
            raise Cut(signal.Signals(signum).name)
        if not self._armed:
            self._armed = True
            signal.setitimer(signal.ITIMER_REAL, max(self.grace_s, 0.001))

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        blocked = _signal.pthread_sigmask(signal.SIG_BLOCK, self._MASK)
        try:
            self._active = False
            if self._armed:
                signal.setitimer(signal.ITIMER_REAL, 0)
            signal.set_wakeup_fd(self._wakeup)
            for s, previous in zip(self._SIGNALS, self._previous, strict=True):
                _signal.signal(s, previous)
        finally:
            _signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


class LoopAside:
    """While a call runs on the loop's thread: no running event loop is set.

    So a sync tool may call ``asyncio.run()`` as it may in a worker thread (asyncio
    refuses to start a loop where one is running). Put back on exit.
    """

    def __enter__(self) -> LoopAside:
        self._loop = asyncio.get_running_loop()
        asyncio._set_running_loop(None)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        asyncio._set_running_loop(self._loop)
        # a tool's asyncio.run() leaves the thread's current loop unset; give it back
        asyncio.set_event_loop(self._loop)
