"""The scheduler: dispatch, outcomes, retries, timeouts, conditions (SPEC §5).

An asyncio loop over :class:`graphlib.TopologicalSorter` (``get_ready()`` / ``done()``):
steps whose dependencies succeeded are dispatched, ties broken by the order steps are
written in; at most ``max_parallel`` calls run at once. Every step follows *record, then
call, then record*: the dispatch record (``running`` + idempotency key) commits before the
tool is called, the outcome (``succeeded`` with output / ``failed`` with error) commits
after it. All journal writes happen on the loop's thread: one writer.
"""

from __future__ import annotations

import asyncio
import contextlib
import graphlib
import heapq
import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import procs, redact
from .canonical import digest
from .errors import EXIT_SIGINT, EXIT_SIGTERM, PlanrunError
from .journal import Journal
from .journal.store import LeaseLost, lease_ttl
from .params import IndexRef, ItemRef, Ref, ResolveError, StepRef, resolve
from .tools import CallTimeout, StepContext, ToolFailure, call_command, call_python
from .validation import CheckedPlan, CheckedStep

Progress = Callable[[str, str, dict[str, Any]], None]

#: Seconds running calls get to finish after the first SIGINT/SIGTERM (SPEC §5).
GRACE_S = 10.0
#: Test-only seam: ``PLANRUN_TEST_CRASH=POINT:STEP[,POINT:STEP...]`` makes the process
#: SIGKILL itself at a named point of a step (``STEP#N``: of fan-out item N), so crash
#: tests are deterministic.
#: POINT is ``dispatch`` (after the dispatch record commits), ``call`` (after the tool
#: returned, before the outcome record) or ``outcome`` (after the outcome record commits).
CRASH_ENV = "PLANRUN_TEST_CRASH"
CRASH_POINTS = ("dispatch", "call", "outcome")
#: Default bound on fan-out items (SPEC §3 ``max_items``).
MAX_ITEMS = 10_000
#: Where a step (or item) can be when it fails before its tool is called: never
#: dispatched, or left ``running``/``indeterminate`` by a crash and being dispatched again
#: (a changed contract or an unresolvable reference fails it then, SPEC §5).
BEFORE_CALL = ("pending", "running", "indeterminate")


#: Test-only seam: ``PLANRUN_TEST_INTERNAL=POINT[:STEP][,...]`` raises an unexpected
#: exception (a stand-in for a bug in planrun) at a named point, so that tests can show
#: that no bug leaves a run ``running`` (SPEC §5). POINT is ``prepare`` (before a step's
#: dispatch record), ``dispatch`` (after it commits, before the call), ``call`` (after the
#: tool returned), ``schedule`` (the scheduler, about to dispatch the step, outside any
#: step's own handling) — these take a STEP (``STEP#N``: fan-out item N; without one, the
#: first step to get there) —, ``approval`` (while clearing approvals, after the run is
#: journaled) or ``finish`` (after the steps ran, before the run's status is recorded).
INTERNAL_ENV = "PLANRUN_TEST_INTERNAL"


def inject_fault(point: str, step: str | None = None, item: int | None = None) -> None:
    """Raise the test seam's stand-in bug when ``PLANRUN_TEST_INTERNAL`` names this point.

    Raises:
        RuntimeError: the seam names ``point`` (and ``step``, or ``step#item``).
    """
    raw = os.environ.get(INTERNAL_ENV)
    if not raw:
        return
    names = {point} if step is None else {point, f"{point}:{step}"} | (
        {f"{point}:{step}#{item}"} if item is not None else set())
    if names & {part.strip() for part in raw.split(",")}:
        raise RuntimeError(f"injected internal error at {sorted(names)[-1]} "
                           f"({INTERNAL_ENV})")


def internal_error(exc: BaseException, where: str, run_id: str) -> dict[str, Any]:
    """The journaled error of an unexpected exception in planrun: code ``internal``.

    ``message`` names the exception type and text (never the traceback, which goes to
    ``traceback`` and is shown only by ``planrun log RUN --tracebacks``). Both are in
    reference form: a secret value they quote is stored as a reference (SPEC §7).
    """
    import traceback

    try:
        text = redact.conceal_text(str(exc))
    except Exception:
        text = "<the exception's message could not be read>"
    what = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    try:
        tb = redact.conceal_text("".join(traceback.format_exception(exc)))
    except Exception:
        tb = what
    return {"code": "internal", "type": type(exc).__name__,
            "message": f"unexpected error in planrun{where} ({what[:500]}); this is a bug "
            f"in planrun — `planrun log {run_id} --tracebacks` shows where", "traceback": tb}
#: Default bound on re-dispatches of a call cut short by a crash (SPEC §5 ``max_recoveries``).
MAX_RECOVERIES = 3


def _crash_points() -> frozenset[tuple[str, str]]:
    raw = os.environ.get(CRASH_ENV, "")
    out = set()
    for part in raw.split(","):
        point, _, step = part.strip().partition(":")
        if point in CRASH_POINTS and step:
            out.add((point, step))
    return frozenset(out)


def idempotency_key(*, plan: str, root_run_id: str, step: CheckedStep, item: int | None,
                    arguments: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of {plan, root run, step, item, tool, arguments} (SPEC §7).

    ``arguments`` are in reference form (:mod:`planrun.redact`): a secret counts by its
    parameter's name, never its value. With ``key_arguments`` only those arguments count.
    """
    keys = step.tool.entry.key_arguments
    args = {k: arguments.get(k) for k in keys} if keys is not None else arguments
    return digest({"plan": plan, "root_run_id": root_run_id, "step": step.id, "item": item,
                   "tool": step.tool.name, "arguments": args})


def _ancestors(plan: CheckedPlan, step: CheckedStep) -> set[str]:
    out: set[str] = set()
    frontier = list(step.depends_on)
    while frontier:
        sid = frontier.pop()
        if sid not in out:
            out.add(sid)
            frontier.extend(plan.deps.get(sid, ()))
    return out


def _listing(indices: list[int], most: int = 10) -> str:
    shown = ", ".join(map(str, indices[:most]))
    return shown + (f" and {len(indices) - most} more" if len(indices) > most else "")


class _Heartbeat(threading.Thread):
    """Renews the run's lease from a thread of its own, on a journal connection of its own.

    The event loop may be blocked by a tool (an ``async def`` tool that calls
    ``time.sleep``): the lease must not depend on tools behaving (SPEC §7 "Leases").
    When the lease is found taken, ``on_lost`` is called from this thread, once.
    """

    def __init__(self, path: Path | str, run_ids: list[str], owner: str,
                 on_lost: Callable[[], None]) -> None:
        super().__init__(name="planrun-lease", daemon=True)
        self.path, self.run_ids, self.owner, self.on_lost = path, run_ids, owner, on_lost
        self.ttl = lease_ttl()
        self.stopped = threading.Event()

    def run(self) -> None:
        journal: Journal | None = None
        try:
            while not self.stopped.wait(self.ttl / 3):
                try:
                    if journal is None:
                        journal = Journal(self.path, write=True)
                    held = [journal.renew_lease(rid, self.owner, ttl=self.ttl)
                            for rid in self.run_ids]
                except Exception:  # a busy or failing journal: try again at the next beat
                    continue
                if not held[0]:
                    if not self.stopped.is_set():
                        self.on_lost()
                    return
        finally:
            if journal is not None:
                with contextlib.suppress(Exception):
                    journal.close()

    def stop(self) -> None:
        """Stop renewing (returns at once; the thread ends at its next beat)."""
        self.stopped.set()


class _Slots:
    """Acquire semaphores in a fixed order (pool first, then the run's limit)."""

    def __init__(self, sems: list[asyncio.Semaphore], journal: Journal) -> None:
        self.sems = sems
        self.journal = journal
        self.held: list[asyncio.Semaphore] = []

    async def __aenter__(self) -> None:
        if any(sem.locked() for sem in self.sems):
            self.journal.flush()  # about to wait: no outcome may sit uncommitted meanwhile
        try:
            for sem in self.sems:
                await sem.acquire()
                self.held.append(sem)
        except BaseException:
            await self.__aexit__()
            raise

    async def __aexit__(self, *exc: object) -> None:
        while self.held:
            self.held.pop().release()


#: A step output kept in the journal (a fan-out's list), loaded when a reference needs it.
IN_JOURNAL: Any = object()


@dataclass
class Outcome:
    """How one call (or a replay, or a failure before the call) ended."""

    status: str
    output: Any = None
    error: dict[str, Any] | None = None
    replayed: bool = False


@dataclass
class StepState:
    """What the scheduler knows of one step during a run."""

    status: str = "pending"
    output: Any = None
    reason: str | None = None


@dataclass
class Executor:
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
    stopping: str | None = None
    cancel_reason: tuple[str, str] | None = None
    abandoned: int = 0
    signal_exit: int | None = None
    lost: bool = False
    #: Tool calls running now (each fan-out item is one).
    _calls: int = 0

    def run(self) -> str:
        """Run to the end.

        Returns:
            The run status: ``completed`` | ``failed`` | ``interrupted`` (then
            :attr:`signal_exit` is 130 or 143).
        """
        for s in self.plan.steps:
            self.state.setdefault(s.id, StepState())
        self._crash = _crash_points()
        self._keeper = procs.Keeper()
        self._groups: set[int] = set()
        pool = ThreadPoolExecutor(max_workers=self.max_parallel,
                                  thread_name_prefix="planrun-tool")
        try:
            asyncio.run(self._main(pool))
        except LeaseLost:
            self.lost = True
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            self._keeper.close()
        if self.lost:
            self.journal.drop_deferred()
            holder = self.journal.lease_holder(self.run_id)
            lost = LeaseLost(
                f"run {self.run_id}: this process lost the run's lease to "
                f"{holder or 'nobody'}; its calls were cancelled and it journals nothing more",
                hint=f"See what the run is doing with planrun status {self.run_id}.")
            lost.abandoned_calls = self.abandoned  # type: ignore[attr-defined]
            raise lost
        if self.signal_exit is not None:
            if any(st.status not in ("succeeded", "failed", "skipped")
                   for st in self.state.values()):
                return "interrupted"
            # Every call finished within the grace period and nothing is left to run: the
            # run ends as what it is, not "interrupted" (issue 10, bug 6).
            self.signal_exit = None
        bad = any(st.status in ("failed", "indeterminate") for st in self.state.values())
        return "failed" if bad else "completed"

    def _crash_at(self, point: str, sid: str, item: int | None = None) -> None:
        if self._crash and ((point, sid) in self._crash
                            or (item is not None and (point, f"{sid}#{item}") in self._crash)):
            if point == "outcome":
                self.journal.flush()  # the point is "after the outcome record commits"
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    # --- signals and the lease ----------------------------------------------------------

    def _on_signal(self, signum: int) -> None:
        if self.signal_exit is None:
            self.signal_exit = EXIT_SIGINT if signum == signal.SIGINT else EXIT_SIGTERM
            self.stopping = "interrupted"
            n = self._calls  # tool calls, fan-out items each (not steps)
            self._emit("interrupt", "", running=n, grace_s=self.grace_s)
            if self._running:
                self._grace = asyncio.get_running_loop().call_later(
                    self.grace_s, self._cancel_running)
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

    def _lease_taken(self) -> None:
        """From the heartbeat thread: the lease is gone. End our commands' groups now.

        The loop may be blocked by a tool; the calls are cancelled on it when it runs.
        """
        for pgid in list(self._groups):
            procs.signal_group(pgid, signal.SIGTERM)
        with contextlib.suppress(RuntimeError):  # the loop already closed: the run ended
            self._loop.call_soon_threadsafe(self._on_lease_lost)

    def _on_lease_lost(self) -> None:
        """Another process has the run: stop, cancel every call, write nothing more."""
        if self.lost:
            return
        self.lost = True
        self.stopping = "the run's lease was taken by another process"
        self.cancel_reason = ("lease_lost", self.stopping)
        self._emit("lease_lost", "")
        self._cancel_running()

    def _emit(self, kind: str, sid: str, **info: Any) -> None:
        if self.progress is not None:
            try:
                self.progress(kind, sid, info)
            except Exception:
                # The display is a report, never part of the run (SPEC §5: output never
                # changes an outcome): a display that fails is switched off.
                self.progress = None

    async def _main(self, pool: ThreadPoolExecutor) -> None:
        self._pool = pool
        self._batch: asyncio.Future[None] | None = None
        self._sem = asyncio.Semaphore(self.max_parallel)
        self._pools = {name: asyncio.Semaphore(n) for name, n in self.pools.items()}
        self._running: dict[asyncio.Task[None], str] = {}
        loop = self._loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self._on_signal, signum)
        beat = None
        if self.owner:
            beat = _Heartbeat(self.journal.path, [self.run_id, *self.also_leased], self.owner,
                              self._lease_taken)
            beat.start()
        deadline = (loop.call_later(self.plan.timeout, self._run_timeout)
                    if self.plan.timeout else None)
        try:
            await self._schedule()
        except Exception as exc:
            if not isinstance(exc, PlanrunError) and self._running:
                # A bug in the scheduler: the calls under way are cut short, journaled
                # indeterminate with code ``internal`` (their effect is unknown).
                self.cancel_reason = ("internal", "planrun hit an unexpected error")
                for task in self._running:
                    task.cancel()
                await asyncio.gather(*self._running, return_exceptions=True)
            raise
        finally:
            if beat is not None:
                beat.stop()
                beat.join(timeout=2.0)  # it closes its journal connection
            if deadline is not None:
                deadline.cancel()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)
            if not self.lost:
                self.journal.flush()

    async def _schedule(self) -> None:
        sorter = graphlib.TopologicalSorter(self.plan.deps)
        sorter.prepare()
        heap: list[tuple[int, str]] = []
        running = self._running
        by_id = self.plan.by_id
        while sorter.is_active():
            for sid in sorter.get_ready():
                heapq.heappush(heap, (by_id[sid].index, sid))
            while heap and self.signal_exit is None and not self.lost:
                _, sid = heapq.heappop(heap)
                inject_fault("schedule", sid)
                st = self.state[sid]
                if st.status in ("succeeded", "skipped", "failed", "indeterminate"):
                    sorter.done(sid)
                    continue
                blocked = self._blocked(by_id[sid])
                if blocked is not None:
                    self._skip(sid, *blocked)
                    sorter.done(sid)
                    continue
                if self.stopping is not None:
                    self._skip(sid, self._stop_reason(), self.stopping)
                    sorter.done(sid)
                    continue
                task = asyncio.create_task(self._run_step(by_id[sid]))
                running[task] = sid
            if not running:
                if self.signal_exit is not None or self.lost:
                    return  # interrupted: what was not dispatched stays pending
                continue
            if self.journal.pending_writes:
                # Let the tasks just created write their dispatch records (which carry the
                # deferred outcomes in the same commit), then commit whatever is left
                # before waiting on calls that may take long.
                await asyncio.sleep(0)
                try:
                    self.journal.flush()
                except LeaseLost:
                    self._on_lease_lost()
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=lambda t: by_id[running[t]].index):
                sid = running.pop(task)
                if task.exception() is not None:
                    # a journal error (or a bug): stop the other calls, then report it once
                    for other in running:
                        other.cancel()
                    await asyncio.gather(*running, return_exceptions=True)
                    task.result()
                sorter.done(sid)

    def _blocked(self, step: CheckedStep) -> tuple[str, str] | None:
        """(reason, message) when a dependency did not succeed."""
        reason: tuple[str, str] | None = None
        for dep in step.depends_on:
            st = self.state[dep]
            if st.status == "succeeded":
                continue
            if st.status == "skipped" and st.reason == "condition":
                reason = reason or ("condition", f"dependency {dep!r} was skipped by its "
                                    "condition")
                continue
            return ("dependency", f"dependency {dep!r} {st.status}")
        return reason

    def _skip(self, sid: str, reason: str, message: str) -> None:
        self.journal.step_skipped(self.run_id, sid, reason, message)
        st = self.state[sid]
        st.status, st.reason = "skipped", reason
        self._emit("skipped", sid, reason=reason, message=message)

    async def _commit_dispatch(self, sid: str, key: str, item: int | None) -> None:
        """Commit the dispatch records of every call starting now, in one transaction.

        Calls that become ready at the same moment (fan-out workers, independent steps)
        share one durable commit; none of them is called before it is done.
        """
        if self._batch is None:
            loop = asyncio.get_running_loop()
            self._batch = loop.create_future()
            loop.call_soon(self._flush_batch)
        batch = self._batch
        try:
            await asyncio.shield(batch)
        except asyncio.CancelledError:
            # cancelled before the call started: once the record is written, take it back
            def withdraw(done: asyncio.Future[None]) -> None:
                if not done.cancelled() and done.exception() is None:
                    self.journal.withdraw_dispatch(self.run_id, sid, key, item)

            if batch.done():
                withdraw(batch)
            else:
                batch.add_done_callback(withdraw)
            raise

    def _flush_batch(self) -> None:
        batch, self._batch = self._batch, None
        if batch is None or batch.done():
            return
        try:
            self.journal.flush()
        except BaseException as exc:
            batch.set_exception(exc)
        else:
            batch.set_result(None)

    def _stop_reason(self) -> str:
        return self.cancel_reason[0] if self.cancel_reason else "stopped"

    def _stop(self, sid: str, status: str) -> None:
        if not self.keep_going and self.stopping is None:
            self.stopping = f"the run stopped after step {sid!r} {status}"

    def _lookup(self, step: CheckedStep, item: Any = None, index: int | None = None
                ) -> Callable[[Ref], Any]:
        values = self.plan.params

        def lookup(ref: Ref) -> Any:
            try:
                if isinstance(ref, StepRef):
                    return redact.follow(self._output(ref.step), ref.path,
                                         f"steps.{ref.step}.output", values)
                if isinstance(ref, ItemRef):
                    return redact.follow(item, ref.path, "item", values)
            except redact.SecretMissing as exc:
                raise ResolveError(str(exc)) from None
            if isinstance(ref, IndexRef):
                return index
            raise ResolveError(f"unexpected placeholder {ref.source()}")
        return lookup

    def _output(self, sid: str) -> Any:
        st = self.state[sid]
        if st.output is IN_JOURNAL:
            found = self.journal.step_output(self.run_id, sid)
            st.output = found[1] if found else None
        return st.output

    def _fail_now(self, step: CheckedStep, code: str, message: str,
                  expect: str | tuple[str, ...] = BEFORE_CALL,
                  traceback: str | None = None) -> None:
        """Fail a step before its tool is called (no dispatch record).

        The step is pending, or is being dispatched again after a crash (SPEC §5: a
        run-time check that fails then fails the step with its code, never the journal).
        """
        error = {"code": code, "message": message}
        if traceback:
            error["traceback"] = traceback
        self.journal.step_finished(self.run_id, step.id, status="failed", key=None,
                                   error=error, expect=expect)
        self.state[step.id].status = "failed"
        self._emit("failed", step.id, error={"code": code, "message": message})
        self._stop(step.id, "failed")

    def _settle(self, step: CheckedStep, outcome: Outcome) -> None:
        """Record a plain step's outcome in memory (the journal already has it)."""
        st = self.state[step.id]
        st.status = outcome.status
        if outcome.status == "succeeded":
            st.output = outcome.output
            self._emit("replayed" if outcome.replayed else "succeeded", step.id)
        elif outcome.status in ("failed", "indeterminate"):
            self._emit(outcome.status, step.id, error=outcome.error)
            code = (outcome.error or {}).get("code")
            self._stop(step.id, "failed" if outcome.status == "failed" else "timed out"
                       if code == "timeout" else "ended with an unknown effect")
        elif outcome.status == "pending":
            st.status = "pending"  # journaled pending too: resume runs it

    async def _run_step(self, step: CheckedStep) -> None:
        try:
            await self._step(step)
        except asyncio.CancelledError:
            # Cancelled before its call was dispatched, or between attempts: the journal
            # holds it as pending, so resume runs it.
            return
        except LeaseLost:
            # The journal refused a write: another process has the run. Stop everything.
            self._on_lease_lost()
        except PlanrunError:
            raise  # the journal is unusable or the lease is lost: the run cannot go on
        except Exception as exc:
            # A bug while handling the step, before its tool was called (a bug after the
            # dispatch is settled in _attempts): the step fails with code ``internal`` and
            # the run stops as on any failure (SPEC §5), never left ``running``.
            error = internal_error(exc, f" while handling step {step.id!r}",
                                   self.run_id)
            self._fail_now(step, "internal", error["message"],
                           traceback=error["traceback"])

    async def _step(self, step: CheckedStep) -> None:
        inject_fault("prepare", step.id)
        if step.when is not None:
            from .conditions import ConditionError, evaluate

            try:
                outputs = {sid: redact.reveal(self._output(sid), self.plan.params)
                           for sid, st in self.state.items()
                           if st.status == "succeeded" and sid in _ancestors(self.plan, step)}
                go = evaluate(step.when, self.plan.params, outputs)
            except redact.SecretMissing as exc:
                self._fail_now(step, "reference", str(exc))
                return
            except ConditionError as exc:
                # the library's words may quote a value: masked, the expression kept
                self._fail_now(step, "condition", redact.conceal_text(
                    str(exc), keep=(repr(step.when), "cannot evaluate ", " gave ",
                                    ", not true or false")))
                return
            if not go:
                self._skip(step.id, "condition", f"when is false: {step.when}")
                return
        if step.for_each is not None:
            await self._fan_out(step)
            return
        prepared = self._prepare(step, self._lookup(step), None)
        if isinstance(prepared, Outcome):
            if prepared.status == "failed":
                assert prepared.error is not None
                self._fail_now(step, prepared.error["code"], prepared.error["message"])
            else:
                self._settle(step, prepared)
            return
        arguments, key = prepared
        async with self._slots(step):
            if self.signal_exit is not None:
                return  # stays pending
            if self.stopping is not None:
                self._skip(step.id, self._stop_reason(), self.stopping)
                return
            self._settle(step, await self._attempts(step, arguments, key, None))

    def _prepare(self, step: CheckedStep, lookup: Callable[[Ref], Any], item: int | None
                 ) -> tuple[dict[str, Any], str] | Outcome:
        """Resolve and check a call's arguments and key.

        Returns an Outcome instead when no call is due (a failure before the call, or a
        replay of an already-succeeded key). The arguments returned are the values to call
        with; the key is computed over their reference form (SPEC §7).
        """
        if step.static:
            stored = step.arguments  # fully known at validation, and checked there
        else:
            try:
                stored = resolve(step.arguments, lookup)
            except ResolveError as exc:
                return Outcome("failed", error={"code": "reference", "message": str(exc)})
        try:
            arguments = redact.reveal(stored, self.plan.params)
        except redact.SecretMissing as exc:
            return Outcome("failed", error={"code": "reference", "message": str(exc)})
        if not step.static:
            from .validation import argument_problems

            problems = argument_problems(step.tool, arguments, stored)
            if problems:
                return Outcome("failed", error={"code": "arguments", "message": "; ".join(
                    f"{p or '/'}: {m}" for p, m, _k in problems)})
        key = idempotency_key(plan=self.plan.name, root_run_id=self.root_run_id, step=step,
                              item=item, arguments=stored)
        # A fresh run's keys are new (its own id is part of each), so only a resumed or
        # retried run can find one already succeeded.
        done, output = (False, None) if self.fresh else self.journal.succeeded_key(key)
        if done:
            self.journal.step_replayed(self.run_id, step.id, output, key, "idempotency key",
                                       item=item)
            return Outcome("succeeded", output=output, replayed=True)
        return arguments, key

    async def _fan_out(self, step: CheckedStep) -> None:
        """One call per item of ``for_each``, each journaled on its own (SPEC §3).

        Items are dispatched in index order by at most ``max_parallel`` workers; item
        outputs stay in the journal and the step's output (the ordered list of them) is
        assembled there, so memory does not grow with the number of items.
        """
        try:
            source = redact.expand(resolve(step.for_each, self._lookup(step)),
                                   self.plan.params)
        except (ResolveError, redact.SecretMissing) as exc:
            self._fail_now(step, "reference", str(exc))
            return
        if not isinstance(source, list):
            self._fail_now(step, "for_each", f"for_each gave {type(source).__name__}, not a "
                           "list")
            return
        limit = step.raw.get("max_items") or MAX_ITEMS
        if len(source) > limit:
            self._fail_now(step, "max_items", f"for_each gave {len(source):,} items, more "
                           f"than max_items ({limit:,}); nothing was run (never truncated)")
            return
        statuses = self.journal.fanout_begin(self.run_id, step.id, len(source))
        self.state[step.id].status = "running"
        self._emit("started", step.id, items=len(source),
                   done=sum(1 for st in statuses if st == "succeeded"))
        failed: list[tuple[int, dict[str, Any]]] = []
        unknown: list[int] = []
        stop_on_error = (step.raw.get("on_item_error") or "fail") == "fail"
        halted = False
        left = 0

        async def one(idx: int) -> None:
            nonlocal halted, left
            status = statuses[idx]
            if status == "succeeded":
                return
            if status in ("failed", "skipped"):
                failed.append((idx, {"code": "failed", "message": "failed in an earlier "
                                     "attempt of this run"}))
                return
            if halted or self.stopping is not None or self.signal_exit is not None:
                left += 1
                return  # stays pending
            try:
                inject_fault("prepare", step.id, idx)
                prepared = self._prepare(step, self._lookup(step, source[idx], idx), idx)
            except PlanrunError:
                raise
            except Exception as exc:  # a bug before the item's call: the item fails
                prepared = Outcome("failed", error=internal_error(
                    exc, f" while handling item {idx} of step {step.id!r}", self.run_id))
            if isinstance(prepared, Outcome):
                outcome = prepared
                if outcome.status == "failed":
                    self.journal.step_finished(self.run_id, step.id, status="failed",
                                               key=None, error=outcome.error,
                                               expect=BEFORE_CALL, item=idx)
            else:
                async with self._slots(step):
                    if halted or self.stopping is not None or self.signal_exit is not None:
                        left += 1
                        return  # stays pending
                    outcome = await self._attempts(step, prepared[0], prepared[1], idx)
            if outcome.status == "pending":
                left += 1
                return
            self._emit("item_done", step.id, index=idx, status=outcome.status)
            if outcome.status == "failed":
                assert outcome.error is not None
                failed.append((idx, outcome.error))
                halted = halted or stop_on_error
            elif outcome.status == "indeterminate":
                unknown.append(idx)
                halted = True

        indices = iter(range(len(source)))

        async def worker() -> None:
            for idx in indices:  # shared: items are taken in index order
                await one(idx)
            self.journal.flush()  # this worker waits no more: commit its last outcome

        width = min(step.raw.get("max_parallel") or self.max_parallel, len(source)) or 1
        await asyncio.gather(*(worker() for _ in range(width)))
        error: dict[str, Any]
        if unknown:
            error = {"code": "indeterminate", "message": f"item(s) {_listing(unknown)} have an "
                     "unknown effect"}
            self.journal.step_finished(self.run_id, step.id, status="indeterminate", key=None,
                                       error=error)
            self._settle(step, Outcome("indeterminate", error=error))
        elif failed:
            failed.sort()
            first = failed[0][1].get("message", "")
            error = {"code": "items_failed",
                     "message": f"item(s) {_listing([i for i, _ in failed])} failed; item "
                     f"{failed[0][0]}: {first}",
                     "items": [{"index": i, "code": e.get("code"), "message": e.get("message")}
                               for i, e in failed[:100]]}
            self.journal.step_finished(self.run_id, step.id, status="failed", key=None,
                                       error=error)
            self._settle(step, Outcome("failed", error=error))
        elif left and self.signal_exit is not None:
            pass  # interrupted: the step stays running with items pending; resume finishes it
        elif left:
            error = {"code": "stopped", "message": f"{self.stopping}; {left} item(s) were not "
                     "run"}
            self.journal.step_finished(self.run_id, step.id, status="failed", key=None,
                                       error=error)
            self._settle(step, Outcome("failed", error=error))
        else:
            self.journal.fanout_succeeded(self.run_id, step.id)
            st = self.state[step.id]
            st.status, st.output = "succeeded", IN_JOURNAL
            self._emit("succeeded", step.id)

    def _slots(self, step: CheckedStep) -> _Slots:
        """The step's pool (if any), then one of the run's ``max_parallel`` slots."""
        pool = step.raw.get("pool") or step.tool.entry.pool
        return _Slots(([self._pools[pool]] if pool in self._pools else []) + [self._sem],
                      self.journal)

    async def _attempts(self, step: CheckedStep, arguments: dict[str, Any], key: str,
                        item: int | None) -> Outcome:
        """Call the tool until it succeeds or its retries are spent; journal every attempt.

        Record, then call, then record: the dispatch record commits before the call, the
        outcome after it.
        """
        policy = step.retries
        max_attempts = int(policy["max_attempts"])
        where = step.id if item is None else f"{step.id}#{item}"
        journal, run_id = self.journal, self.run_id
        attempt = 0
        if not self.fresh:
            status, attempt, recoveries = journal.dispatch_state(run_id, step.id, item)
            limit = step.raw.get("max_recoveries")
            limit = MAX_RECOVERIES if limit is None else int(limit)
            if status == "running" and recoveries >= limit:
                # Left running by a crash once more than max_recoveries allows: a tool that
                # kills planrun must not be called forever (SPEC §5 "Attempts").
                exhausted = {"code": "recovery_exhausted",
                             "message": f"its call was cut short by a crash {recoveries + 1} "
                             f"time(s) ({attempt} attempt(s)); max_recoveries is {limit}, so "
                             "it is not dispatched again"}
                journal.step_finished(run_id, step.id, status="failed", key=key,
                                      error=exhausted, item=item)
                return Outcome("failed", error=exhausted)
        while True:
            attempt += 1
            journal.step_started(run_id, step.id, attempt=attempt, key=key,
                                 root_run_id=self.root_run_id, item=item, defer=True)
            await self._commit_dispatch(step.id, key, item)
            if item is None:
                self.state[step.id].status = "running"
            if item is None:
                self._emit("started", step.id, attempt=attempt)
            else:
                self._emit("item_started", step.id, index=item, attempt=attempt)
            self._crash_at("dispatch", step.id, item)
            ctx = StepContext(run_id=run_id, step_id=step.id, item_index=item,
                              idempotency_key=key, attempt=attempt)
            try:
                inject_fault("dispatch", step.id, item)
                self._calls += 1
                stderr: list[str] = []
                try:
                    output = await self._call(step, arguments, ctx, stderr)
                finally:
                    self._calls -= 1
                self._crash_at("call", step.id, item)
                inject_fault("call", step.id, item)
                error = self._check_output(step, output)
            except asyncio.CancelledError:
                if step.tool.kind == "python":
                    self.abandoned += 1
                how = "abandoned" if step.tool.kind == "python" else "cancelled"
                code, why = self.cancel_reason or ("interrupted", "the run was interrupted")
                error = {"code": code,
                         "message": f"call {how} because {why}; its effect is unknown"}
                journal.step_finished(run_id, step.id, status="indeterminate", key=None,
                                      error=error, item=item)
                return Outcome("indeterminate", error=error)
            except CallTimeout as exc:
                error = exc.error
                if step.tool.kind == "python":
                    self.abandoned += 1
                if not step.tool.entry.idempotent:
                    journal.step_finished(run_id, step.id, status="indeterminate", key=None,
                                          error=error, item=item)
                    return Outcome("indeterminate", error=error)
            except ToolFailure as exc:
                error = exc.error
            except PlanrunError:
                raise
            except Exception as exc:
                # A bug in planrun after the dispatch record: whether the tool's effect
                # happened is not known, so the call is indeterminate (code ``internal``)
                # and the run stops as on a failure (SPEC §5).
                error = internal_error(exc, f" while calling step {where!r}", run_id)
                journal.step_finished(run_id, step.id, status="indeterminate", key=None,
                                      error=error, item=item)
                return Outcome("indeterminate", error=error)
            if error is None:
                output = redact.conceal(output)  # a secret it echoes is stored as a reference
                # A command that succeeded but wrote on stderr: its tail is kept with the
                # step_succeeded event (planrun log) and shown with -v (issue 10, bug 7).
                journal.step_finished(run_id, step.id, status="succeeded", key=key,
                                      output=output, item=item, defer=True,
                                      event_data={"stderr_tail": stderr[-1]}
                                      if stderr else None)
                if stderr:
                    self._emit("stderr", where, text=stderr[-1])
                self._crash_at("outcome", step.id, item)
                return Outcome("succeeded", output=output)
            codes = policy.get("on_exit_codes")
            retryable = error.get("code") in ("tool_error", "exit_status", "timeout") and (
                codes is None or error.get("exit_code") in codes)
            if attempt < max_attempts and retryable:
                delay = float(policy["backoff_s"]) * (2 ** (attempt - 1))
                journal.step_retried(run_id, step.id, attempt, error, delay, item=item)
                self._emit("retried", where, attempt=attempt, error=error)
                if self.signal_exit is None and delay:
                    await asyncio.sleep(delay)
                if self.signal_exit is not None:
                    return Outcome("pending")  # interrupted: no new attempt; resume runs it
                continue
            journal.step_finished(run_id, step.id, status="failed", key=key, error=error,
                                  item=item, defer=True)
            self._crash_at("outcome", step.id, item)
            return Outcome("failed", error=error)

    async def _call(self, step: CheckedStep, arguments: dict[str, Any],
                    ctx: StepContext, stderr: list[str] | None = None) -> Any:
        if step.tool.kind == "python":
            return await call_python(step.tool, arguments, ctx, self._pool, step.timeout)
        # The command's group is known to the keeper from before it runs, and journaled
        # as soon as it started, until its leader was reaped (SPEC §12).
        self._keeper.start()
        groups: list[procs.Group] = []

        def started(proc: asyncio.subprocess.Process) -> None:
            group = procs.identify(proc.pid)
            groups.append(group)
            self._groups.add(group.pgid)
            self._keeper.add(group.pgid)
            self.journal.record_call(self.run_id, ctx.step_id, ctx.item_index, group)

        try:
            return await call_command(step.tool, arguments, ctx, self.project, step.timeout,
                                      on_start=started, preexec=self._keeper.preexec,
                                      on_stderr=None if stderr is None else stderr.append)
        finally:
            for group in groups:
                self._groups.discard(group.pgid)
                self._keeper.remove(group.pgid)
                self.journal.end_call(self.run_id, group)

    @staticmethod
    def _check_output(step: CheckedStep, output: Any) -> dict[str, Any] | None:
        """None when ``output`` is JSON data that fits the tool's ``output_schema``."""
        try:
            text = json.dumps(output, ensure_ascii=False, allow_nan=False)
            if not text.isascii():
                text.encode("utf-8")
        except (TypeError, ValueError) as exc:
            return {"code": "output", "message": f"tool {step.tool.name!r} returned a value "
                    f"that is not JSON data: {exc}"}
        except RecursionError:
            return {"code": "output", "message": f"tool {step.tool.name!r} returned a value "
                    "nested too deeply to store"}
        except UnicodeEncodeError:
            return {"code": "output", "message": f"tool {step.tool.name!r} returned text that "
                    "is not valid Unicode (an undecodable file name?); return it as text "
                    "that can be encoded in UTF-8"}
        validator = step.tool.output_validator
        if validator is not None:
            errors = [e.message for e in validator.iter_errors(output)]
            if errors:
                return {"code": "output", "message": f"tool {step.tool.name!r} output does "
                        f"not match its output_schema: {redact.conceal_text(errors[0])}"}
        return None
