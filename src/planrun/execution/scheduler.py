"""The scheduler: the run's loop, signals, the lease and the run's timeout (SPEC §5).

An asyncio loop over :class:`graphlib.TopologicalSorter` (``get_ready()`` / ``done()``):
steps whose dependencies succeeded are dispatched, ties broken by the order steps are
written in (:class:`planrun.graph.ReadyQueue`); at most ``max_parallel`` calls run at
once. A step's task, as it ends, dispatches what became ready (no waiting scheduler).
Every step follows *record, then call, then record*: the dispatch record
(``running`` + idempotency key) commits before the tool is called, the outcome
(``succeeded`` with output / ``failed`` with error) commits after it. All journal writes
happen on the loop's thread: one writer. Calls are made by a
:class:`~planrun.dispatch.Dispatcher` (default: :class:`~planrun.dispatch.local.LocalDispatcher`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..dispatch.base import Dispatcher
from ..dispatch.inline import on_main_thread
from ..errors import EXIT_SIGINT, EXIT_SIGTERM, PlanrunError
from ..graph import ReadyQueue
from ..journal import Journal
from ..journal.store import LeaseLost
from ..redact import Secrets
from ..validation import CheckedPlan, CheckedStep
from .attempts import Attempts
from .common import (
    GRACE_S,
    INTERNAL_ENV,
    Heartbeat,
    Progress,
    StepState,
    crash_points,
    inject_fault,
)
from .fanout import FanOut
from .gate import Gate
from .steps import Steps

_DONE = ("succeeded", "partial", "skipped", "failed", "indeterminate")


@dataclass(eq=False)
class Executor(Steps, FanOut, Attempts, Gate):
    """Runs the pending steps of one journaled run.

    Args:
        journal: the journal (open for writing).
        plan: the checked plan.
        run_id: the run.
        root_run_id: the first run of its lineage (part of idempotency keys).
        project: the project folder (commands run there).
        max_parallel: calls running at once.
        keep_going: after a failure, go on with steps that do not depend on it.
        state: known step states (succeeded steps are not run again).
        progress: optional callback ``(kind, step_id, info)`` for display.
        owner: this process's lease owner string (renewed while running), or None.
        pools: concurrency pools, NAME → most calls at once (``[pools]``).
        fresh: a new run (not resumed or retried): no idempotency key can exist yet.
        also_leased: other runs whose lease this process holds and renews (a retry holds
            its parent's).
        grace_s: seconds running calls get after the first SIGINT/SIGTERM.
        dispatcher: what makes the calls (default: a
            :class:`~planrun.dispatch.local.LocalDispatcher` for ``project``).
        approver: asks a person on the terminal about ``approve: resolved`` steps at
            dispatch (:mod:`.gate`), or None (they leave the run awaiting approval).
        approve: step ids of ``--approve`` (they clear such steps at dispatch).
        approve_all: ``--approve-all``.
    """

    journal: Journal
    plan: CheckedPlan
    run_id: str
    root_run_id: str
    project: Path
    max_parallel: int = 4
    keep_going: bool = False
    state: dict[str, StepState] = field(default_factory=dict)
    progress: Progress | None = None
    owner: str | None = None
    pools: dict[str, int] = field(default_factory=dict)
    fresh: bool = False
    also_leased: list[str] = field(default_factory=list)
    grace_s: float = GRACE_S
    dispatcher: Dispatcher | None = None
    approver: Any = None
    approve: frozenset[str] = frozenset()
    approve_all: bool = False
    #: ``approve: resolved`` steps left waiting for a person (they stay pending).
    awaiting: list[str] = field(default_factory=list)
    #: the denial of an ``approve: resolved`` step at dispatch, if any.
    denied: Any = None
    stopping: str | None = None
    cancel_reason: tuple[str, str] | None = None
    signal_exit: int | None = None
    lost: bool = False
    #: Why this process gave the lease up (it could not renew it), or None (:meth:`_lease_taken`).
    lost_why: str | None = None
    #: Tool calls running now (each fan-out item is one).
    _calls: int = 0
    #: a Ctrl-C was a denial at a prompt (:mod:`.gate`): not an interruption.
    _swallow_sigint: bool = False
    #: ``PLANRUN_TEST_INTERNAL`` as read when the run started (:func:`~.common.inject_fault`).
    _seam: str | None = None

    def __post_init__(self) -> None:
        if self.dispatcher is None:
            from ..dispatch.local import LocalDispatcher

            tools = {s.tool.name: s.tool for s in self.plan.steps}
            # no call on the loop's thread when the run's timeout may have to cut it
            self.dispatcher = LocalDispatcher(self.project, tools, self.max_parallel,
                                              inline=not self.plan.timeout,
                                              grace_s=self.grace_s)
        self._dispatcher = self.dispatcher
        self._secrets = Secrets.of_plan(self.plan)

    @property
    def abandoned(self) -> int:
        """Python calls left running in threads (cancelled or timed out)."""
        return self._dispatcher.abandoned

    def run(self) -> str:
        """Run to the end.

        Returns:
            The run status: ``completed`` | ``failed`` | ``interrupted`` (then
            :attr:`signal_exit` is 130 or 143) | ``awaiting_approval`` (:attr:`awaiting`
            names the steps) | ``denied`` (:attr:`denied` is the decision).

        Raises:
            LeaseLost: another process took the run's lease (``abandoned_calls`` set).
        """
        for s in self.plan.steps:
            self.state.setdefault(s.id, StepState())
        # A run resumed after a step failed goes on stopping for that failure (unless
        # --keep-going): only its clean-up steps start, as in the run that never crashed
        # (resume started every ordinary step left pending; found by an attacker).
        failed = next((s.id for s in self.plan.steps
                       if self.state[s.id].status in ("failed", "indeterminate")), None)
        if failed is not None:
            self._stop(failed, "failed" if self.state[failed].status == "failed"
                       else "ended with an unknown effect")
        self._crash = crash_points()
        self._seam = os.environ.get(INTERNAL_ENV, "")  # read once a run (inject_fault)
        try:
            with self._dispatcher.session(self._secrets):
                asyncio.run(self._main())
        except LeaseLost:
            self.lost = True
        if self.lost:
            raise self._lease_lost_error()
        if self.signal_exit is not None:
            if any(st.status not in ("succeeded", "partial", "failed", "skipped")
                   for st in self.state.values()):
                return "interrupted"
            # Every call finished within the grace period and nothing is left to run: the
            # run ends as what it is, not "interrupted" (issue 10, bug 6).
            self.signal_exit = None
        if self.denied is not None:
            return "denied"
        if self.awaiting:
            return "awaiting_approval"
        # partial steps (issue 17) are finished, not failures: a run whose steps all
        # succeeded, were partial or were skipped is completed
        bad = any(st.status in ("failed", "indeterminate") for st in self.state.values())
        return "failed" if bad else "completed"

    def _lease_lost_error(self) -> LeaseLost:
        self.journal.drop_deferred()
        if self.lost_why is not None:
            lost = LeaseLost(
                f"run {self.run_id}: this process gave the run up before its lease could "
                f"run out: {self.lost_why}; its calls were cancelled and it journals "
                "nothing more", run_id=self.run_id,
                hint=f"Once the journal answers again, planrun resume {self.run_id} "
                "continues it (planrun status shows what is unfinished).")
            lost.abandoned_calls = self.abandoned  # type: ignore[attr-defined]
            return lost
        try:
            holder = self.journal.lease_holder(self.run_id)
        except PlanrunError:
            holder = None
        taken = (f"lost the run's lease to {holder}" if holder else
                 "no longer holds the run's lease (it was released or ran out)")
        lost = LeaseLost(
            f"run {self.run_id}: this process {taken}; its calls were cancelled and it "
            "journals nothing more", run_id=self.run_id,
            hint=f"See what the run is doing with planrun status {self.run_id}.")
        lost.abandoned_calls = self.abandoned  # type: ignore[attr-defined]
        return lost

    def _crash_at(self, point: str, sid: str, item: int | None = None) -> None:
        if self._crash and ((point, sid) in self._crash
                            or (item is not None and (point, f"{sid}#{item}") in self._crash)):
            if point == "outcome":
                self.journal.flush()  # the point is "after the outcome record commits"
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    # --- signals and the lease ----------------------------------------------------------

    def _on_signal(self, signum: int, ago_s: float = 0.0) -> None:
        """SIGINT / SIGTERM: stop, give running calls the grace period, or cancel them.

        ``ago_s``: seconds since the signal came, for one taken while a call held the
        loop's thread (:mod:`planrun.dispatch.inline`): the grace period started then.
        """
        if signum == signal.SIGINT and self._swallow_sigint:
            self._swallow_sigint = False
            return
        if self.signal_exit is None:
            self.signal_exit = EXIT_SIGINT if signum == signal.SIGINT else EXIT_SIGTERM
            self.stopping = "interrupted"
            n = self._calls  # tool calls, fan-out items each (not steps)
            self._emit("interrupt", "", running=n, grace_s=self.grace_s)
            if self._running:
                self._grace = asyncio.get_running_loop().call_later(
                    max(0.0, self.grace_s - ago_s), self._cancel_running)
        elif signum == signal.SIGINT:
            self._emit("cancel", "", running=self._calls)
            self._cancel_running()

    def _run_timeout(self) -> None:
        """The plan's whole-run ``timeout`` ran out: stop and cancel what is running."""
        self.stopping = f"the run's timeout of {self.plan.timeout} s ran out"
        self.cancel_reason = ("timeout", self.stopping)
        self._emit("timeout", "", running=self._calls)
        self._cancel_running()

    def _cancel_running(self) -> None:
        for task in self._running:
            task.cancel()

    def _lease_taken(self, why: str | None = None) -> None:
        """From the heartbeat thread: the lease is gone. End our commands' groups now.

        ``why``: None when another process (or nobody) holds it now; else why this
        process gave it up (it could not be renewed). The loop may be blocked by a tool;
        the calls are cancelled on it when it runs.
        """
        self.lost_why = why
        self._dispatcher.end_all()
        with contextlib.suppress(RuntimeError):  # the loop already closed: the run ended
            self._loop.call_soon_threadsafe(self._on_lease_lost)

    def _on_lease_lost(self) -> None:
        """Another process has the run: stop, cancel every call, write nothing more."""
        if self.lost:
            return
        self.lost = True
        self.stopping = ("the run's lease was taken by another process"
                         if self.lost_why is None else "this process gave up the run's lease")
        self.cancel_reason = ("lease_lost", self.stopping)
        self._emit("lease_lost", "", why=self.lost_why)
        self._cancel_running()

    def _emit(self, kind: str, sid: str, **info: Any) -> None:
        if self.progress is not None:
            try:
                self.progress(kind, sid, info)
            except Exception:
                # The display is a report, never part of the run (SPEC §5: output never
                # changes an outcome): a display that fails is switched off.
                self.progress = None

    # --- the loop -----------------------------------------------------------------------

    async def _main(self) -> None:
        self._batch = None
        self._batch_timer = None
        self._sem = asyncio.Semaphore(self.max_parallel)
        self._pools = {name: asyncio.Semaphore(n) for name, n in self.pools.items()}
        self._running = {}
        self._commit_soon = None
        self._slot_waiters = {}
        self._wrong_memo = {}
        loop = self._loop = asyncio.get_running_loop()
        # Signals reach the main thread only (and only there may handlers be set): a run
        # driven on another thread (an embedding application's) leaves them to it.
        signals = (signal.SIGINT, signal.SIGTERM) if on_main_thread() else ()
        for signum in signals:
            loop.add_signal_handler(signum, self._on_signal, signum)
        self._hears_signals = bool(signals)
        beat = None
        if self.owner:
            beat = Heartbeat(self.journal.path, [self.run_id, *self.also_leased], self.owner,
                             self._lease_taken)
            beat.start()
        deadline = self._deadline = (loop.call_later(self.plan.timeout, self._run_timeout)
                                     if self.plan.timeout else None)
        try:
            await self._schedule()
        except Exception as exc:
            if not isinstance(exc, PlanrunError) and self._running:
                # A bug in the scheduler: the calls under way are cut short, journaled
                # indeterminate with code ``internal`` (their effect is unknown).
                self.cancel_reason = ("internal", "planrun hit an unexpected error")
                self._cancel_running()
                await asyncio.gather(*self._running, return_exceptions=True)
            raise
        finally:
            if beat is not None:
                beat.stop()
                beat.join(timeout=2.0)  # it closes its journal connection
            if deadline is not None:
                deadline.cancel()
            for signum in signals:
                loop.remove_signal_handler(signum)
            if not self.lost:
                self.journal.flush()

    async def _schedule(self) -> None:
        """Dispatch the ready steps, then wait until the run has nothing left to dispatch.

        A step's task, as it ends, marks its step done and dispatches the steps that became
        ready in the same turn of the loop (:meth:`_task`, :meth:`_dispatch`): no waiting
        scheduler to wake and no ``asyncio.wait`` over every running task at each
        completion (two loop turns and a callback per running task, a step; issue 16).

        Raises:
            PlanrunError: a step's task raised it (the journal is unusable, the lease was
                lost); the other tasks are cancelled and awaited first.
            Exception: a bug while dispatching (:func:`~.common.inject_fault` ``schedule``);
                :meth:`_main` cancels the calls under way.
        """
        self._sorter = self.plan.take_sorter()
        self._ready = ReadyQueue(self._positions())
        self._ended = self._loop.create_future()
        self._dispatch()
        try:
            await self._ended
        except PlanrunError:
            # a journal error (or a lost lease): stop the other calls, then report it once
            running = self._running
            for other in running:
                other.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            raise

    def _dispatch(self) -> None:
        """Start a task for each ready step (written order), until one runs or none is left.

        Settles the steps that need no task (:meth:`_settled_before`) on the way; ends the
        run's wait (:attr:`_ended`) when nothing runs and nothing more can be dispatched
        (every step done, or the run stopping, interrupted or awaiting a person).
        """
        sorter, ready, running = self._sorter, self._ready, self._running
        while sorter.is_active():
            ready.add(sorter.get_ready())
            while ready and self.signal_exit is None and not self.lost and not self.awaiting:
                sid = ready.pop()
                inject_fault("schedule", sid, seam=self._seam)
                if self._settled_before(sid):
                    sorter.done(sid)
                else:
                    task = self._loop.create_task(self._task(self.plan.by_id[sid]))
                    running[task] = sid
                    task.add_done_callback(self._task_gone)
            if running:
                if self.journal.pending_writes:
                    # Let the tasks just created write their dispatch records (which carry
                    # the deferred outcomes in the same commit), then commit what is left.
                    self._commit_soon = self._loop.call_soon(self._commit_pending)
                return
            if self.signal_exit is not None or self.lost or self.awaiting:
                break  # interrupted or awaiting: what was not dispatched stays pending
        self._end()

    async def _task(self, step: CheckedStep) -> None:
        """One step's task: run it, then dispatch what its end made ready."""
        await self._run_step(step)
        if self._ended.done():
            return  # the run is ending (an error): nothing more is dispatched
        task = asyncio.current_task()
        assert task is not None
        del self._running[task]
        self._sorter.done(step.id)
        try:
            self._dispatch()
        except BaseException as exc:
            self._end(exc)

    def _task_gone(self, task: asyncio.Task[None]) -> None:
        """Done callback of a step's task: a task that did not end by itself ends the wait.

        A task that raised (a :class:`PlanrunError`, or a bug) ends the run's wait with its
        exception; one cancelled before it ever ran counts as done (its step stays pending).
        """
        if task not in self._running or self._ended.done():
            return
        sid = self._running.pop(task)
        if task.cancelled():
            self._sorter.done(sid)
            try:
                self._dispatch()
            except BaseException as exc:
                self._end(exc)
            return
        raised = task.exception()
        if raised is not None:
            self._running[task] = sid  # awaited with the others while the run ends
            self._end(raised)

    def _end(self, exc: BaseException | None = None) -> None:
        if not self._ended.done():
            if exc is None:
                self._ended.set_result(None)
            else:
                self._ended.set_exception(exc)

    def _positions(self) -> dict[str, int]:
        return {s.id: s.index for s in self.plan.steps}

    def _settled_before(self, sid: str) -> bool:
        """True when the ready step needs no task: done already, blocked, or stopped."""
        if self.state[sid].status in _DONE:
            return True
        blocked = self._blocked(self.plan.by_id[sid])
        # Deferred: the steps a failure blocks or stops share one commit (5,000 of them
        # took 5,000). They are skipped in this one pass, with no wait in between, and
        # committed when it ends; a crash before that leaves them pending, as a crash
        # halfway through the pass did when each committed on its own.
        if blocked is not None:
            self._skip(sid, *blocked, defer=True)
            return True
        if self._stopped_for(self.plan.by_id[sid]):
            self._skip(sid, self._stop_reason(), self.stopping or "", defer=True)
            return True
        return False

    def _commit_pending(self) -> None:
        """Commit what is deferred before waiting on calls that may take long."""
        self._commit_soon = None
        if self.journal.pending_writes and not self.lost:
            try:
                self.journal.flush()
            except LeaseLost:
                self._on_lease_lost()
            except BaseException as exc:
                self._end(exc)
