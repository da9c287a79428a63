"""Attempts: one call's dispatch record, the call, its outcome, and its retries (SPEC §5).

Record, then call, then record: the dispatch record commits before the call (calls that
start together share one commit), the outcome after it. The call itself is made by the
executor's :class:`~planrun.dispatch.Dispatcher`; how it ends decides what is journaled:
succeeded, failed (retried while the step's ``retries`` allow), or ``indeterminate`` when
its effect is unknown (cancelled, a non-idempotent call timed out, its worker was lost, a
bug in planrun after the dispatch).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from .. import redact
from ..dispatch.base import CALL_LOST, Call, CallLost, Watch
from ..errors import PlanrunError
from ..loading import MAX_DEPTH, too_deep
from ..tools import MAX_OUTPUT_BYTES, CallCutShort, StepContext, ToolFailure
from ..validation import CheckedStep
from .base import RunParts
from .common import MAX_RECOVERIES, Outcome, Slots, facets_of, inject_fault, internal_error

#: How long a dispatch commit waits for other calls' outcomes while calls run (seconds).
COMMIT_WINDOW_S = 0.0002

#: An output is written once, as the journal writes it (``records.dumps``: compact, not
#: ASCII-escaped): that shows it is JSON data, and the journal takes the text.
_OUTPUT_TEXT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False,
                                allow_nan=False)
#: Outputs that are already what the journal gives back (a str, int, float, bool or None
#: reads back as itself: no need to parse its JSON; a subclass such as an IntEnum is not).
_AS_JOURNALED = frozenset({str, int, float, bool, type(None)})


class Attempts(RunParts):
    """The executor's part that calls a tool until it succeeds or its retries are spent."""

    def _slots(self, step: CheckedStep) -> Slots:
        """The step's pool (if any), then one of the run's ``max_parallel`` slots."""
        pool = step.raw.get("pool") or step.tool.entry.pool
        return Slots(([self._pools[pool]] if pool in self._pools else []) + [self._sem],
                     self.journal)

    async def _attempts(self, step: CheckedStep, arguments: dict[str, Any], key: str,
                        item: int | None, args_digest: str) -> Outcome:
        """Call the tool until it succeeds or its retries are spent; journal every attempt.

        ``args_digest``: the digest of the arguments in reference form (``_prepare``),
        journaled with each dispatch record.
        """
        attempt = 0
        if not self.fresh:
            attempt, exhausted = self._recovered(step, key, item)
            if exhausted is not None:
                return exhausted
        while True:
            attempt += 1
            await self._dispatched(step, key, item, attempt, args_digest)
            call = Call(step.tool.name, arguments, StepContext(
                run_id=self.run_id, step_id=step.id, item_index=item, idempotency_key=key,
                attempt=attempt), step.timeout, self._secrets)
            ended = await self._call_once(step, call)
            if isinstance(ended, Outcome):
                return ended
            outcome = await self._after_error(step, call, ended)
            if outcome is not None:
                return outcome

    def _recovered(self, step: CheckedStep, key: str, item: int | None
                   ) -> tuple[int, Outcome | None]:
        """(attempts made so far, the failure when the call may not be dispatched again).

        Left running by a crash once more than ``max_recoveries`` allows: a tool that kills
        planrun must not be called forever (SPEC §5 "Attempts").
        """
        status, attempt, recoveries = self.journal.dispatch_state(self.run_id, step.id, item)
        limit = step.raw.get("max_recoveries")
        limit = MAX_RECOVERIES if limit is None else int(limit)
        if status != "running" or recoveries < limit:
            return attempt, None
        exhausted = {"code": "recovery_exhausted",
                     "message": f"its call was cut short by a crash {recoveries + 1} "
                     f"time(s) ({attempt} attempt(s)); max_recoveries is {limit}, so "
                     "it is not dispatched again"}
        self.journal.step_finished(self.run_id, step.id, status="failed", key=key,
                                   error=exhausted, item=item)
        return attempt, Outcome("failed", error=exhausted)

    async def _dispatched(self, step: CheckedStep, key: str, item: int | None,
                          attempt: int, args_digest: str | None = None) -> None:
        """Journal the dispatch record and wait for its commit (record, then call)."""
        self.journal.step_started(self.run_id, step.id, attempt=attempt, key=key,
                                  root_run_id=self.root_run_id, item=item, defer=True,
                                  arguments_digest=args_digest,
                                  idempotent=step.tool.entry.idempotent)
        await self._commit_dispatch(step.id, key, item)
        if item is None:
            self.state[step.id].status = "running"
            self._emit("started", step.id, attempt=attempt)
        else:
            self._emit("item_started", step.id, index=item, attempt=attempt)
        self._crash_at("dispatch", step.id, item)

    async def _call_once(self, step: CheckedStep, call: Call) -> Outcome | dict[str, Any]:
        """Make the call; its outcome when it ended the attempts, else its error."""
        item, where = call.context.item_index, call.where
        stderr: list[str] = []
        try:
            inject_fault("dispatch", step.id, item, self._seam)
            self._calls += 1
            try:
                output = await self._dispatcher.call(call, self._watch(call, stderr))
            finally:
                self._calls -= 1
            self._crash_at("call", step.id, item)
            inject_fault("call", step.id, item, self._seam)
            output, error, text = self._check_output(step, output)
        except asyncio.CancelledError:
            how = "abandoned" if self._dispatcher.abandons(call) else "cancelled"
            code, why = self.cancel_reason or ("interrupted", "the run was interrupted")
            return self._unknown(call, {"code": code, "message": f"call {how} because "
                                        f"{why}; its effect is unknown"})
        except CallCutShort as exc:  # a timeout, an output bound: killed mid-call
            if not step.tool.entry.idempotent:
                return self._unknown(call, exc.error)
            return exc.error
        except ToolFailure as exc:
            return exc.error
        except CallLost as exc:
            return self._unknown(call, {"code": CALL_LOST, "message": "the worker running "
                                        f"the call was lost ({exc}); its effect is unknown"})
        except PlanrunError:
            raise
        except Exception as exc:
            # A bug in planrun after the dispatch record: whether the tool's effect
            # happened is not known, so the call is indeterminate (code ``internal``)
            # and the run stops as on a failure (SPEC §5).
            return self._unknown(call, internal_error(exc, f" while calling step {where!r}",
                                                      self.run_id, self._secrets))
        if error is not None:
            return error
        return self._succeeded(step, call, output, stderr, text)

    def _watch(self, call: Call, stderr: list[str]) -> Watch:
        """Journal a command's process group while it runs; keep its stderr tail."""
        journal, run_id, ctx = self.journal, self.run_id, call.context
        return Watch(
            started=lambda group: journal.record_call(run_id, ctx.step_id, ctx.item_index,
                                                      group),
            ended=lambda group: journal.end_call(run_id, group), stderr=stderr.append,
            signalled=self._on_signal)

    def _unknown(self, call: Call, error: dict[str, Any]) -> Outcome:
        """Journal the call ``indeterminate``: its effect is not known."""
        self.journal.step_finished(self.run_id, call.context.step_id, status="indeterminate",
                                   key=None, error=error, item=call.context.item_index)
        return Outcome("indeterminate", error=error)

    def _succeeded(self, step: CheckedStep, call: Call, output: Any,
                   stderr: list[str], text: str | None = None) -> Outcome:
        """Journal the success (deferred: it joins the next commit).

        ``text``: the output's journal JSON (:meth:`_check_output`); written as it is when
        the reference form of the output is the output itself.
        """
        item = call.context.item_index
        if self._secrets or text is None or redact.text_may_hold_marks(text):
            # a secret it echoes is stored as a reference, a marker character escaped
            output, text = self._secrets.conceal(output), None
        # A command that succeeded but wrote on stderr: its tail is kept with the
        # step_succeeded event (planrun log) and shown with -v (issue 10, bug 7).
        facets = None if item is not None else facets_of(step.raw.get("facets"), output)
        self.journal.step_finished(self.run_id, step.id, status="succeeded",
                                   key=call.context.idempotency_key, output=output, item=item,
                                   output_json=text, defer=True, facets=facets,
                                   event_data={"stderr_tail": stderr[-1]} if stderr else None)
        if stderr:
            self._emit("stderr", call.where, text=stderr[-1])
        self._crash_at("outcome", step.id, item)
        return Outcome("succeeded", output=output)

    async def _after_error(self, step: CheckedStep, call: Call, error: dict[str, Any]
                           ) -> Outcome | None:
        """Retry (None: call again) or journal the failure; ``pending`` when interrupted."""
        policy = step.retries
        attempt, item = call.context.attempt, call.context.item_index
        codes = policy.get("on_exit_codes")
        retryable = error.get("code") in ("tool_error", "exit_status", "timeout") and (
            codes is None or error.get("exit_code") in codes)
        if attempt < int(policy["max_attempts"]) and retryable:
            delay = float(policy["backoff_s"]) * (2 ** (attempt - 1))
            self.journal.step_retried(self.run_id, step.id, attempt, error, delay, item=item)
            self._emit("retried", call.where, attempt=attempt, error=error)
            if self.signal_exit is None and delay:
                await asyncio.sleep(delay)
            if self.signal_exit is not None:
                return Outcome("pending")  # interrupted: no new attempt; resume runs it
            return None
        self.journal.step_finished(self.run_id, step.id, status="failed",
                                   key=call.context.idempotency_key, error=error, item=item,
                                   defer=True)
        self._crash_at("outcome", step.id, item)
        return Outcome("failed", error=error)

    async def _commit_dispatch(self, sid: str, key: str, item: int | None) -> None:
        """Commit the dispatch records of every call starting now, in one transaction.

        Calls that become ready at the same moment (fan-out workers, independent steps)
        share one durable commit; none of them is called before it is done. While other
        calls run, the commit waits up to :data:`COMMIT_WINDOW_S` (0.2 ms, about one
        commit) for them, and no longer than until none runs: a fan-out of instant calls
        on 4 slots then commits 4 items at a time instead of 2 (W2: 511 commits for 2,000
        items in 4 runs of 5, against 1,010 in 3 of 5 before; issue 16). The run's only
        task (a chain) commits at once: nobody could join (7.7 % fewer instructions a chain
        step, ``benchmarks/README.md``).
        """
        if (item is None and self._batch is None and not self._calls
                and len(self._running) == 1):
            # The run's only task (a chain's next step): no other record can join this
            # commit, so it is made now, without a future and a turn of the loop. It
            # carries what the scheduler's commit after the dispatch would have, so that
            # one is not made (it would commit this call's outcome alone, a commit more).
            self.journal.flush()
            if self._commit_soon is not None:
                self._commit_soon.cancel()
                self._commit_soon = None
            return
        loop = asyncio.get_running_loop()
        if self._batch is None:
            self._batch = loop.create_future()
            if self._calls:
                # Other calls are under way: those that end in the next moment put their
                # outcomes and their successors' dispatch records into this commit too (a
                # group-commit window, as PostgreSQL's commit_delay with commit_siblings).
                self._batch_timer = loop.call_later(COMMIT_WINDOW_S, self._flush_batch)
            else:
                loop.call_soon(self._flush_batch)
        elif not self._calls and self._batch_timer is not None:
            # nothing runs any more: no other outcome is coming, commit now
            self._batch_timer.cancel()
            self._batch_timer = None
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
        if self._batch_timer is not None:
            self._batch_timer.cancel()
            self._batch_timer = None
        batch, self._batch = self._batch, None
        if batch is None or batch.done():
            return
        try:
            self.journal.flush()
        except BaseException as exc:
            batch.set_exception(exc)
        else:
            batch.set_result(None)

    def _check_output(self, step: CheckedStep, output: Any
                      ) -> tuple[Any, dict[str, Any] | None, str | None]:
        """(the output as JSON data, None, its JSON text) when it fits the tool's contract.

        Else (the output, the error, None). The text is what the journal writes for it
        (:func:`planrun.journal.records.dumps`: compact, UTF-8). The output goes on as the
        journal keeps it — read back from its JSON — so a step after it sees in this run
        what it would see on resume: ``{1: "x"}`` is ``{"1": "x"}`` (JSON keys are
        strings; a key ``1`` was skipped by the contract's ``properties: {"1": ...}`` and
        written as ``"1"`` on a command's stdin), a tuple is a list, an ``IntEnum`` an
        integer.
        """
        name = step.tool.name
        try:
            text = _OUTPUT_TEXT.encode(output)
            if not text.isascii():
                text.encode("utf-8")
        except (TypeError, ValueError) as exc:
            return output, {"code": "output", "message": f"tool {name!r} returned a value "
                            f"that is not JSON data: {exc}"}, None
        except RecursionError:
            return output, {"code": "output", "message": f"tool {name!r} returned a value "
                            "nested too deeply to store"}, None
        except UnicodeEncodeError:
            return output, {"code": "output", "message": f"tool {name!r} returned text that "
                            "is not valid Unicode (an undecodable file name?); return it as "
                            "text that can be encoded in UTF-8"}, None
        # an output is journaled, read back by resume and shown: as a command's stdout,
        # at most MAX_OUTPUT_BYTES (64 MiB) as JSON, whichever tool made it
        if len(text) > MAX_OUTPUT_BYTES // 4 and len(text.encode()) > MAX_OUTPUT_BYTES:
            return output, {"code": "output", "message": f"tool {name!r} returned a value "
                            f"of more than {MAX_OUTPUT_BYTES:,} bytes as JSON; return "
                            "less, or write it to a file and return its path"}, None
        # planrun's own walks over an output (masking, facets, canonical JSON) recurse: an
        # output json could still write but nested deeper than a plan may be is refused
        # the same way (a value that deep takes at least two characters a level)
        if len(text) > 2 * MAX_DEPTH and too_deep(output):
            return output, {"code": "output", "message": f"tool {name!r} returned a value "
                            f"nested too deeply to store (more than {MAX_DEPTH} levels)"}, None
        if type(output) not in _AS_JOURNALED:  # anything else is read back from its JSON
            output = json.loads(text)
            # Keys that are one JSON text ({1: "a", "1": "b"}) would lose a value unseen;
            # else the text of what was read back is the text (the same as a str key's).
            if _OUTPUT_TEXT.encode(output) != text:
                return output, {"code": "output", "message": f"tool {name!r} returned an "
                                "object with two keys that are the same JSON text (such as "
                                "1 and \"1\"): one of the values would be lost"}, None
        validator = step.tool.output_validator
        if validator is not None:
            errors = [e.message for e in validator.iter_errors(output)]
            if errors:
                return output, {"code": "output", "message": f"tool {name!r} output does "
                                "not match its output_schema: "
                                f"{self._secrets.conceal_text(errors[0])}"}, None
        return output, None, text
