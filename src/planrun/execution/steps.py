"""One step from ready to settled: conditions, blocked dependencies, arguments, keys.

A step the scheduler hands over is skipped (its condition is false, a dependency did not
succeed), failed before any call (a reference or argument that does not resolve, SPEC
§5), replayed (its idempotency key already succeeded), fanned out, or called.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from typing import Any

from .. import redact
from ..canonical import canonical_json
from ..errors import PlanrunError
from ..graph import ancestors
from ..journal import FINISHED
from ..journal.store import LeaseLost
from ..params import IndexRef, ItemRef, Placed, Ref, ResolveError, StepRef, resolve
from ..validation import CheckedStep
from .base import RunParts
from .common import (
    BEFORE_CALL,
    IN_JOURNAL,
    Later,
    Outcome,
    dependency_message,
    facets_of,
    idempotency_key,
    inject_fault,
    internal_error,
)


class Steps(RunParts):
    """The executor's part that takes one step from ready to settled."""

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
                                   self.run_id, self._secrets)
            self._fail_now(step, "internal", error["message"],
                           traceback=error["traceback"])

    async def _step(self, step: CheckedStep) -> None:
        inject_fault("prepare", step.id, seam=self._seam)
        if step.when is not None and not self._when(step):
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
        arguments, key, stored, args_digest = prepared
        if not self._gate(step, stored):
            return  # stays pending: awaiting a person, or denied (the run stops)
        self._slot_waiters[step.id] = step
        try:
            async with self._slots(step):
                self._slot_waiters.pop(step.id, None)
                if self.signal_exit is not None:
                    return  # stays pending
                if self.state[step.id].status == "skipped":
                    return  # skipped with the others waiting (below)
                if self._stopped_for(step):
                    self._skip_stopped_waiters(step)
                    return
                self._settle(step, await self._attempts(step, arguments, key, None,
                                                        args_digest))
        finally:
            self._slot_waiters.pop(step.id, None)

    def _skip_stopped_waiters(self, first: CheckedStep) -> None:
        """Skip ``first`` and every other step waiting for a slot that the stop skips.

        Each would skip itself as it gets its slot, one loop turn and one commit each (a
        plan of 3,000 steps took 3,000 commits after one failed). Skipped in one pass,
        deferred, they share one commit; their tasks then find them skipped.
        """
        reason, message = self._stop_reason(), self.stopping or ""
        self._skip(first.id, reason, message, defer=True)
        for sid, step in list(self._slot_waiters.items()):
            if self.state[sid].status == "pending" and self._stopped_for(step):
                self._skip(sid, reason, message, defer=True)

    def _when(self, step: CheckedStep) -> bool | None:
        """Evaluate the step's condition; False when the step was failed or skipped.

        None: a signal came while it was evaluated, which cut it short; the step stays
        pending (resume evaluates it again). The signal is handled before this returns.
        """
        from ..conditions import (
            ConditionError,
            ConditionStopped,
            evaluate,
            named_steps,
            reads_facets,
            reads_output,
        )

        assert step.when is not None
        poll = _LongCondition(self)
        try:
            # a condition that names the steps it reads gets only those (validation made
            # them ancestors): gathering every ancestor for each condition made a chain
            # of N steps with a when N x N (4,000 took 56 s instead of 4)
            named = named_steps(step.when)
            above = ancestors(step.id, self.plan.deps) if named is None \
                else named & self.state.keys()
            done = [sid for sid in above if self.state[sid].status in FINISHED]
            # only the outputs it may read are loaded: a condition on a step's facets
            # never reads its output, however large (issue 17); and only a step that
            # succeeded has an output (and facets): for the others the condition finds no
            # member (its words say so)
            done_ok = [sid for sid in done if self.state[sid].status in ("succeeded",
                                                                         "partial")]
            outputs = {sid: redact.reveal(self._output(sid), self.plan.params)
                       for sid in done_ok if reads_output(step.when, sid)}
            facets = {sid: redact.reveal(self._facets(sid), self.plan.params)
                      for sid in done_ok if self.plan.by_id[sid].raw.get("facets")
                      and reads_facets(step.when, sid)}
            go = evaluate(step.when, self.plan.params, outputs,
                          statuses={sid: self.state[sid].status for sid in above},
                          facets=facets, poll=poll)
        except redact.SecretMissing as exc:
            self._fail_now(step, "reference", str(exc))
            return False
        except ConditionError as exc:
            # the library's words may quote a value: masked, the expression kept
            self._fail_now(step, "condition", self._secrets.conceal_text(
                str(exc), keep=(repr(step.when), "cannot evaluate ", " gave ",
                                ", not true or false")))
            return False
        except ConditionStopped as stop:
            if stop.reason == "timeout":
                if self._deadline is not None:
                    self._deadline.cancel()  # it is taken here, once
                self._run_timeout()
                # failed, not skipped: the run did not do this step's work in its time
                # (its tool was never called)
                self._fail_now(step, "timeout", f"{self.stopping} while its condition "
                               "was evaluated")
                return False
            return None  # a signal (handled below): stays pending
        finally:
            poll.close()
        if not go:
            self._skip(step.id, "condition", f"when is false: {step.when}")
        return bool(go)

    def _prepare(self, step: CheckedStep, lookup: Callable[[Ref], Any], item: int | None
                 ) -> tuple[dict[str, Any], str, dict[str, Any], str] | Outcome:
        """Resolve and check a call's arguments and key.

        Returns an Outcome instead when no call is due (a failure before the call, or a
        replay of an already-succeeded key). Else (arguments, key, stored, digest): the
        values to call with, the key, the arguments in reference form (SPEC §7: what the
        key, the dispatch record's ``arguments_digest`` and an approval are computed over)
        and that digest (SHA-256 of their canonical JSON, written once for both).
        """
        if step.static:
            stored = step.arguments  # fully known at validation, and checked there
        else:
            try:
                stored = resolve(step.arguments, lookup, Placed("its arguments hold"))
            except ResolveError as exc:
                return Outcome("failed", error={"code": exc.code, "message": str(exc)})
        try:
            arguments = redact.reveal(stored, self.plan.params)
        except redact.SecretMissing as exc:
            return Outcome("failed", error={"code": "reference", "message": str(exc)})
        if not step.static:
            from ..tools import checking_with
            from ..validation import argument_problems

            with checking_with(self._secrets):  # a model's own words may quote a secret
                problems = argument_problems(step.tool, arguments, stored)
            if problems:
                return Outcome("failed", error={"code": "arguments", "message": "; ".join(
                    f"{p or '/'}: {m}" for p, m, _k in problems)})
        stored_json = canonical_json(stored)
        key = idempotency_key(plan=self.plan.name, root_run_id=self.root_run_id, step=step,
                              item=item, arguments=stored, arguments_json=stored_json)
        # A fresh run's keys are new (its own id is part of each), so only a resumed or
        # retried run can find one already succeeded — unless the tool's keys are the
        # plan's (``dedupe: plan``): then an earlier run's success is replayed, if younger
        # than ``dedupe_ttl``.
        plan_scoped = step.tool.entry.dedupe == "plan"
        done, output = (False, None) if self.fresh and not plan_scoped else \
            self.journal.succeeded_key(key, step.tool.dedupe_ttl_s)
        if done:
            self.journal.step_replayed(
                self.run_id, step.id, output, key, "idempotency key", item=item,
                facets=None if item is not None else facets_of(step.raw.get("facets"), output))
            return Outcome("succeeded", output=output, replayed=True)
        return arguments, key, stored, hashlib.sha256(stored_json.encode("utf-8")).hexdigest()

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

    def _facets(self, sid: str) -> Any:
        """The stored facets of a finished step (``{NAME: value}``), computed when missing.

        A step settled by ``planrun resolve --succeeded`` has none stored: they are
        computed from its output then.
        """
        stored = self.journal.step_facets(self.run_id, sid)
        if stored is not None:
            return stored.get("values", {})
        computed = facets_of(self.plan.by_id[sid].raw.get("facets"), self._output(sid))
        return {} if computed is None else computed["values"]

    def _output(self, sid: str) -> Any:
        """The output of step ``sid``, which a placeholder of a step after it reads.

        Raises:
            ResolveError: ``sid`` did not succeed (it failed, was skipped, …): it has no
                output (docs/plans.md), and a clean-up step (``run_if``) that refers to
                it fails with ``reference`` before its call, not called with ``null``
                (found by an attacker).
        """
        st = self.state[sid]
        if st.status not in ("succeeded", "partial"):
            raise ResolveError(f"{{steps.{sid}.output}}: step {sid!r} is {st.status}: only a "
                               "step that succeeded has an output (a clean-up step can "
                               f"read steps.{sid}.status in its when: condition)")
        if st.output is IN_JOURNAL:
            found = self.journal.step_output(self.run_id, sid)
            st.output = found[1] if found else None
        elif type(st.output) is Later:
            st.output = st.output.load()
        return st.output

    def _blocked(self, step: CheckedStep) -> tuple[str, str] | None:
        """(reason, message) when the outcome of the step's ancestors does not let it run.

        ``run_if`` (docs/plans.md "Clean-up and notify steps"): ``success`` — every
        dependency succeeded (one skipped by its condition skips this one by condition
        too); ``failure`` — some ancestor failed, ended ``indeterminate`` or was skipped
        for any reason but its condition, else skipped (reason ``condition``);
        ``always`` — never blocked. Every ancestor has finished by now (graph order).
        """
        mode = step.run_if
        if mode == "always":
            return None
        if mode == "failure":
            if self._wrong_above(step.id):
                return None
            return ("condition", "run_if is failure and no step it depends on failed or "
                    "was skipped")
        reason: tuple[str, str] | None = None
        for dep in step.depends_on:
            st = self.state[dep]
            if st.status in FINISHED:  # partial too: its items that succeeded go on
                continue
            if st.status == "skipped" and st.reason == "condition":
                reason = reason or ("condition", f"dependency {dep!r} was skipped by its "
                                    "condition")
                continue
            return ("dependency", dependency_message(dep, st.status))
        return reason

    def _wrong_above(self, sid: str) -> bool:
        """Whether a step ``sid`` depends on, directly or not, went wrong (:meth:`_went_wrong`).

        Asked once every such step has finished (graph order), so each step's answer is
        final and kept: a chain of N ``run_if: failure`` steps walked every ancestor of
        each (N x N: 8,000 took 13 s); now each step is looked at once.
        """
        memo = self._wrong_memo
        deps = self.plan.deps
        stack = [sid]
        while stack:
            cur = stack[-1]
            if cur in memo:
                stack.pop()
                continue
            unknown = [d for d in deps.get(cur, ()) if d not in memo]
            if unknown:
                stack.extend(unknown)
                continue
            memo[cur] = any(self._went_wrong(d) or memo[d] for d in deps.get(cur, ()))
            stack.pop()
        return memo[sid]

    def _went_wrong(self, sid: str) -> bool:
        """The step failed, ended indeterminate, or was skipped other than by condition."""
        st = self.state[sid]
        return st.status in ("failed", "indeterminate") or (
            st.status == "skipped" and st.reason != "condition")

    def _stopped_for(self, step: CheckedStep) -> bool:
        """The run is stopping and ``step`` may not start.

        A stop after a failure (no ``--keep-going``) does not hold back a ``run_if:
        failure | always`` step: clean-up is what it is for. A signal, the run's timeout
        or a lost lease stops every step.
        """
        if self.stopping is None:
            return False
        return (step.run_if == "success" or self.cancel_reason is not None
                or self.signal_exit is not None)

    def _skip(self, sid: str, reason: str, message: str, *, defer: bool = False) -> None:
        self.journal.step_skipped(self.run_id, sid, reason, message, defer=defer)
        st = self.state[sid]
        st.status, st.reason = "skipped", reason
        self._emit("skipped", sid, reason=reason, message=message)

    def _stop_reason(self) -> str:
        return self.cancel_reason[0] if self.cancel_reason else "stopped"

    def _stop(self, sid: str, status: str) -> None:
        if not self.keep_going and self.stopping is None:
            self.stopping = f"the run stopped after step {sid!r} {status}"

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


class _LongCondition:
    """The ``poll`` of a step's condition, while it holds the loop's thread.

    :func:`~planrun.conditions.evaluate` calls it every
    :data:`~planrun.conditions.POLL_EVERY` steps: only an evaluation that takes a while.

    At its first call it commits what is deferred (a step's success waiting to share the
    next commit: a crash during the evaluation would lose it) and takes SIGINT and
    SIGTERM (:class:`~planrun.dispatch.inline.Noted`); then, and at each call, a signal
    taken or the run's ``timeout`` past stops the evaluation. :meth:`close` hands the
    signals to the scheduler.
    """

    def __init__(self, run: Steps) -> None:
        self.run = run
        self.noted: Any = None

    def __call__(self) -> str | None:
        run = self.run
        if self.noted is None:
            from ..dispatch.inline import Noted

            self.noted = Noted()
            if run.journal.pending_writes and not run.lost:
                run.journal.flush()  # LeaseLost and journal errors: raised as they are
            if run._hears_signals:
                self.noted.open()
        if self.noted.received:
            return "signal"
        deadline = run._deadline
        if deadline is not None and not deadline.cancelled() \
                and run._loop.time() >= deadline.when():
            return "timeout"
        return None

    def close(self) -> None:
        """Put the signal handlers back, and hand the signals taken to the scheduler."""
        if self.noted is None:
            return
        self.noted.close()
        import time

        now = time.monotonic()
        for signum, at in self.noted.received:
            self.run._on_signal(signum, now - at)
        self.noted.received.clear()

