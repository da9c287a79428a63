"""Sync python calls made on the event loop's thread, without a thread hop.

Handing a sync python call to a worker thread and its result back to the event loop
costs two thread wake-ups: measured on a 2-core machine, ~0.1 ms of CPU a call, a third
of what a 1,000-step chain of no-op tools spent per step (``benchmarks/README.md``,
issue 16). A python tool whose registry entry says ``blocking: false`` — each call
returns at once and keeps nothing bound to a thread — is therefore called on the loop's
own thread by the local dispatcher (:mod:`planrun.dispatch.local`), unless:

- the call or the run has a ``timeout`` (a timeout must be able to leave a call behind,
  which only a call in a thread can be);
- the run is not driven on the main thread (signals are handled there only);
- the tool is ``async def`` (it runs on the loop anyway).

Nothing is guessed: a tool without that declaration always runs in a thread. A tool that
blocks after all holds up the whole run while it does (other calls, retries, progress);
Ctrl-C and SIGTERM still act on it (:class:`Interruptible`): the first gives the call the
run's grace period, a second Ctrl-C ends it at once, by raising :class:`Cut` inside it —
so a call blocked in C code (``os.system``) is ended only when it returns to Python. A
cut call is journaled ``indeterminate`` whatever it did with the ``Cut``; one that catches
it and goes on ends the process as a crash would (:meth:`Interruptible._give_up`).
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal's own: ~2 us less a call (enums)
import asyncio
import contextlib
import os
import signal
import threading
import time
from types import FrameType, TracebackType
from typing import Any


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

    Cutting raises :class:`Cut` where the call is (:attr:`cut` tells). A call that
    catches it and goes on gets one more grace period; then, or at the next SIGINT or
    SIGTERM, the process ends at once, as a crash would (:meth:`_give_up`). A SIGALRM
    that is not this timer's (a tool's own ``signal.alarm``) is ignored.

    Every SIGINT and SIGTERM taken is in :attr:`received` with the monotonic time it
    came, for the scheduler to handle once the call has ended (the dispatcher hands them
    over before it reports the call's end, so the run's state knows of them first, and
    the run's grace period counts from the signal, not from the hand-over). The swap
    happens with the signals blocked, so none is lost or taken twice. :meth:`close` puts
    the previous handlers and wakeup fd back and disarms the timer; it may be called
    again (a signal may cut short its first call, at its entry).
    """

    _SIGNALS = (int(signal.SIGINT), int(signal.SIGTERM), int(signal.SIGALRM))
    _MASK = frozenset(_SIGNALS)

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        #: (signal number, ``time.monotonic()``) of each SIGINT / SIGTERM taken, in order.
        self.received: list[tuple[int, float]] = []
        #: Whether :class:`Cut` was raised in the call (it ended, or should have).
        self.cut = False
        self._armed = False
        self._active = False
        self._open = False
        self._previous: list[Any] = []
        self._wakeup = -1

    def open(self) -> None:
        """Take SIGINT, SIGTERM and SIGALRM (the loop's wakeup fd set aside)."""
        blocked = _signal.pthread_sigmask(signal.SIG_BLOCK, self._MASK)
        try:
            self._previous = [_signal.signal(s, self._on_signal) for s in self._SIGNALS]
            self._wakeup = signal.set_wakeup_fd(-1)
            self._open = self._active = True
        finally:
            _signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def __enter__(self) -> Interruptible:
        self.open()
        return self

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGALRM:
            if not self._armed:
                return  # not our timer
        else:
            self.received.append((signum, time.monotonic()))
        if not self._active:
            return
        if self.cut:  # the call caught its Cut and went on: it will not end
            self._give_up()
        if signum == signal.SIGALRM or (signum == signal.SIGINT and len(self.received) > 1):
            self._cut()  # the grace ran out; or Ctrl-C after a first signal: at once
        if not self._armed:
            self._armed = True
            signal.setitimer(signal.ITIMER_REAL, max(self.grace_s, 0.001))

    def _cut(self) -> None:
        """Raise :class:`Cut` in the call; it gets one more grace period to end."""
        self.cut = True
        self._armed = True
        signal.setitimer(signal.ITIMER_REAL, max(self.grace_s, 0.001))
        raise Cut("the call was cut short by a signal")

    def _give_up(self) -> None:
        """End the process now: the call caught its :class:`Cut` and did not end.

        As a crash would: what was committed stays, the step stays ``running`` in the
        journal, and ``planrun resume`` settles it (SPEC §5). Exit 130 after a Ctrl-C,
        else 143.
        """
        from .. import masking

        with contextlib.suppress(Exception):
            out = masking.diagnostics()
            out.write("planrun: a call made on the event loop's thread (a tool declared "
                      "'blocking: false') went on after it was cut short; exiting now "
                      "without waiting for it: its step stays 'running' in the journal, "
                      "and `planrun resume` settles it\n")
            out.flush()
        os._exit(130 if any(s == signal.SIGINT for s, _ in self.received) else 143)

    def close(self) -> None:
        """Put the handlers, the wakeup fd and the timer back (again: nothing)."""
        if not self._open:
            return
        blocked = _signal.pthread_sigmask(signal.SIG_BLOCK, self._MASK)
        try:
            self._active = False
            if self._armed:
                signal.setitimer(signal.ITIMER_REAL, 0)
            signal.set_wakeup_fd(self._wakeup)
            for s, previous in zip(self._SIGNALS, self._previous, strict=True):
                _signal.signal(s, previous)
            self._open = False
        finally:
            _signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class Noted:
    """While planrun's own work holds the loop's thread: SIGINT and SIGTERM only noted.

    A ``when`` that takes long to evaluate (:mod:`planrun.conditions`) holds the loop, so
    its handlers do not run. For that while these take SIGINT and SIGTERM (the loop's
    wakeup fd set aside, as :class:`Interruptible` does, so the loop does not hear of
    them twice) and only add them to :attr:`received`; the work looks there and ends
    itself, and the scheduler handles them then. On the main thread only.
    """

    _SIGNALS = (int(signal.SIGINT), int(signal.SIGTERM))
    _MASK = frozenset(_SIGNALS)

    def __init__(self) -> None:
        #: (signal number, ``time.monotonic()``) of each SIGINT / SIGTERM taken, in order.
        self.received: list[tuple[int, float]] = []
        self._open = False
        self._previous: list[Any] = []
        self._wakeup = -1

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.received.append((signum, time.monotonic()))

    def open(self) -> None:
        """Take SIGINT and SIGTERM (the loop's wakeup fd set aside)."""
        blocked = _signal.pthread_sigmask(signal.SIG_BLOCK, self._MASK)
        try:
            self._previous = [_signal.signal(s, self._on_signal) for s in self._SIGNALS]
            self._wakeup = signal.set_wakeup_fd(-1)
            self._open = True
        finally:
            _signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def close(self) -> None:
        """Put the handlers and the wakeup fd back (again: nothing)."""
        if not self._open:
            return
        blocked = _signal.pthread_sigmask(signal.SIG_BLOCK, self._MASK)
        try:
            signal.set_wakeup_fd(self._wakeup)
            for s, previous in zip(self._SIGNALS, self._previous, strict=True):
                _signal.signal(s, previous)
            self._open = False
        finally:
            _signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


class LoopAside:
    """While a call runs on the loop's thread: no event loop, running or current.

    So a sync tool may call ``asyncio.run()`` as it may in a worker thread (asyncio
    refuses to start a loop where one is running), and ``asyncio.get_event_loop()``
    raises as it does there, instead of giving planrun's own. Put back by :meth:`close`.
    """

    def open(self) -> None:
        """Set the loop aside."""
        self._loop = asyncio.get_running_loop()
        asyncio._set_running_loop(None)
        asyncio.set_event_loop(None)

    def close(self) -> None:
        """Give the thread its loop back (running and current)."""
        asyncio._set_running_loop(self._loop)
        asyncio.set_event_loop(self._loop)
