"""Fan-out: one call per item of ``for_each``, each journaled on its own (SPEC §3).

Items are dispatched in index order by at most ``max_parallel`` workers; item outputs stay
in the journal and the step's output (the ordered list of them) is assembled there, so
memory does not grow with the number of items.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import redact
from ..errors import PlanrunError
from ..journal.records import dumps
from ..params import Placed, ResolveError, resolve
from ..tools import MAX_OUTPUT_BYTES
from ..validation import CheckedStep
from .base import RunParts
from .common import (
    BEFORE_CALL,
    IN_JOURNAL,
    MAX_ITEMS,
    Outcome,
    inject_fault,
    internal_error,
    listing,
)

#: ``on_item_error`` modes under which failed items leave the step ``partial`` (issue 17).
PARTIAL_MODES = ("skip", "collect")


@dataclass(eq=False)
class _Items:
    """How a fan-out's items went so far (shared by its workers)."""

    source: list[Any]
    statuses: list[str]
    stop_on_error: bool
    failed: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    unknown: list[int] = field(default_factory=list)
    halted: bool = False
    left: int = 0


class FanOut(RunParts):
    """The executor's part that runs a ``for_each`` step's items."""

    async def _fan_out(self, step: CheckedStep) -> None:
        """Run the step's items; settle the step when they are all done (or halted)."""
        source = self._fan_source(step)
        if source is None:
            return
        statuses = self.journal.fanout_begin(self.run_id, step.id, len(source))
        self.state[step.id].status = "running"
        self._emit("started", step.id, items=len(source),
                   done=sum(1 for st in statuses if st == "succeeded"))
        items = _Items(source, statuses,
                       stop_on_error=(step.raw.get("on_item_error") or "fail") == "fail")
        indices = iter(range(len(source)))

        async def worker() -> None:
            for idx in indices:  # shared: items are taken in index order
                await self._fan_item(step, items, idx)
            self.journal.flush()  # this worker waits no more: commit its last outcome

        width = min(step.raw.get("max_parallel") or self.max_parallel, len(source)) or 1
        workers = [asyncio.ensure_future(worker()) for _ in range(width)]
        try:
            await asyncio.gather(*workers)
        except BaseException:
            # One worker's error (the journal cannot be written, the lease is lost) ends
            # the step: the others are cancelled and have ended before it goes on, so that
            # none is left to fail again at the loop's shutdown, each logged with its
            # traceback (found by an attacker whose journal's disk filled up).
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            raise
        self._fan_finish(step, items)

    def _fan_source(self, step: CheckedStep) -> list[Any] | None:
        """The items of ``for_each``, or None when the step failed (it is journaled)."""
        try:
            source = redact.expand(resolve(step.for_each, self._lookup(step),
                                           Placed("its for_each holds")),
                                   self.plan.params)
        except ResolveError as exc:
            self._fail_now(step, "for_each" if exc.code != "reference" else exc.code,
                           str(exc))
            return None
        except redact.SecretMissing as exc:
            self._fail_now(step, "reference", str(exc))
            return None
        if not isinstance(source, list):
            self._fail_now(step, "for_each", f"for_each gave {type(source).__name__}, not a "
                           "list")
            return None
        limit = step.raw.get("max_items") or MAX_ITEMS
        if len(source) > limit:
            self._fail_now(step, "max_items", f"for_each gave {len(source):,} items, more "
                           f"than max_items ({limit:,}); nothing was run (never truncated)")
            return None
        return source

    def _halting(self, step: CheckedStep, items: _Items) -> bool:
        return items.halted or self._stopped_for(step) or self.signal_exit is not None

    async def _fan_item(self, step: CheckedStep, items: _Items, idx: int) -> None:
        status = items.statuses[idx]
        if status == "succeeded":
            return
        if status in ("failed", "skipped"):
            items.failed.append((idx, {"code": "failed", "message": "failed in an earlier "
                                       "attempt of this run"}))
            return
        if self._halting(step, items):
            items.left += 1
            return  # stays pending
        prepared = self._prepare_item(step, items, idx)
        if isinstance(prepared, Outcome):
            outcome = prepared
            if outcome.status == "failed":
                self.journal.step_finished(self.run_id, step.id, status="failed",
                                           key=None, error=outcome.error,
                                           expect=BEFORE_CALL, item=idx)
        else:
            async with self._slots(step):
                if self._halting(step, items):
                    items.left += 1
                    return  # stays pending
                outcome = await self._attempts(step, prepared[0], prepared[1], idx,
                                               prepared[3])
        self._fan_note(step, items, idx, outcome)

    def _prepare_item(self, step: CheckedStep, items: _Items, idx: int
                      ) -> tuple[dict[str, Any], str, dict[str, Any], str] | Outcome:
        try:
            inject_fault("prepare", step.id, idx, self._seam)
            return self._prepare(step, self._lookup(step, items.source[idx], idx), idx)
        except PlanrunError:
            raise
        except Exception as exc:  # a bug before the item's call: the item fails
            return Outcome("failed", error=internal_error(
                exc, f" while handling item {idx} of step {step.id!r}", self.run_id,
                self._secrets))

    def _fan_note(self, step: CheckedStep, items: _Items, idx: int, outcome: Outcome) -> None:
        """Count one item's outcome (and halt the others when it calls for it)."""
        if outcome.status == "pending":
            items.left += 1
            return
        self._emit("item_done", step.id, index=idx, status=outcome.status)
        if outcome.status == "failed":
            assert outcome.error is not None
            items.failed.append((idx, outcome.error))
            items.halted = items.halted or items.stop_on_error
        elif outcome.status == "indeterminate":
            items.unknown.append(idx)
            items.halted = True

    def _fan_finish(self, step: CheckedStep, items: _Items) -> None:
        """Journal and settle the step from its items' outcomes.

        ``on_item_error`` decides what failed items do once every item ran: ``fail`` and
        ``continue`` fail the step; ``skip`` and ``collect`` make it ``partial`` (its
        output without the failed items, or with an error object in their place), unless
        no item succeeded at all, which fails it as ``continue`` would. An item whose
        effect is unknown makes the step ``indeterminate`` whatever the mode.
        """
        error: dict[str, Any]
        mode = step.raw.get("on_item_error") or "fail"
        if items.unknown:
            error = {"code": "indeterminate", "message": f"item(s) {listing(items.unknown)} "
                     "have an unknown effect"}
            self._fan_settle(step, "indeterminate", error)
        elif items.failed and not (mode in PARTIAL_MODES and items.left):
            failed = sorted(items.failed)
            every = len(failed) == len(items.source)
            error = self._items_error(step, failed, every and mode in PARTIAL_MODES)
            if mode in PARTIAL_MODES and not every:
                self._fan_partial(step, mode, error, len(items.source))
            else:
                self._fan_settle(step, "failed", error)
        elif items.left and self.signal_exit is not None:
            pass  # interrupted: the step stays running with items pending; resume finishes it
        elif items.left:
            error = {"code": "stopped", "message": f"{self.stopping}; {items.left} item(s) "
                     "were not run"}
            self._fan_settle(step, "failed", error)
        elif (too_large := self._too_large(step)) is not None:
            self._fan_settle(step, "failed", too_large)
        else:
            self.journal.fanout_succeeded(self.run_id, step.id,
                                          facets=self._fan_facets(step))
            st = self.state[step.id]
            st.status, st.output = "succeeded", IN_JOURNAL
            self._emit("succeeded", step.id)

    def _items_error(self, step: CheckedStep, failed: list[tuple[int, dict[str, Any]]],
                     every: bool) -> dict[str, Any]:
        """``items_failed``: which items failed, the first one's message, the first 100.

        The errors are the journal's (an item that failed in an earlier process of this run
        has its own error there).
        """
        self.journal.flush()
        journaled = {e["index"]: e for e in self.journal.item_errors(
            self.run_id, step.id, limit=100).get(step.id, [])}
        shown = [journaled.get(i) or {"index": i, "code": e.get("code"),
                                      "message": e.get("message")} for i, e in failed[:100]]
        first = shown[0]
        note = " (every item failed, so the step fails whatever on_item_error says)" \
            if every else ""
        return {"code": "items_failed",
                "message": f"item(s) {listing([i for i, _ in failed])} failed{note}; item "
                f"{first['index']}: {first.get('message') or ''}",
                "items": shown}

    def _fan_partial(self, step: CheckedStep, mode: str, error: dict[str, Any],
                     count: int) -> None:
        """Some items failed, ``on_item_error`` is ``skip`` or ``collect``: ``partial``.

        ``collect``: each failed item's place in the output holds ``{"item_error":
        {"index", "code", "message"}}``.
        """
        collected = None
        if mode == "collect":
            collected = [(i, {"item_error": {"index": i, "code": e.get("code"),
                                             "message": e.get("message")}})
                         for i, e in self._failed_items(step, count)]
        too_large = self._too_large(step, [obj for _, obj in collected or ()])
        if too_large is not None:
            self._fan_settle(step, "failed", too_large)
            return
        self.journal.fanout_finished(
            self.run_id, step.id, status="partial",
            keep="succeeded" if mode == "skip" else "all", error=error,
            collected=collected, facets=self._fan_facets(step))
        st = self.state[step.id]
        st.status, st.output = "partial", IN_JOURNAL
        self._emit("partial", step.id, error={"code": error["code"],
                                              "message": error["message"]})

    def _too_large(self, step: CheckedStep, collected: Sequence[Any] = ()
                   ) -> dict[str, Any] | None:
        """The ``output`` error of a fan-out whose items' outputs are too much together.

        A step's output is at most :data:`~planrun.tools.MAX_OUTPUT_BYTES` (64 MiB) as
        JSON, one call's or a fan-out's list of its items' outputs (and ``collected``
        error objects) alike: past it, the list is not assembled (the journal's database
        could not store it beyond 1 GB, and every step reading it would hold it in
        memory) and the step fails, its items still ``succeeded``. None: it fits.
        """
        self.journal.flush()
        size, count = self.journal.item_output_bytes(self.run_id, step.id)
        count += len(collected)
        size += sum(len(dumps(obj).encode()) for obj in collected) + max(count - 1, 0) + 2
        if size <= MAX_OUTPUT_BYTES:
            return None
        return {"code": "output",
                "message": f"the outputs of its {count:,} items are {size:,} bytes as JSON "
                f"together; a step's output is at most {MAX_OUTPUT_BYTES:,} bytes (64 MiB), "
                "a fan-out's list of its items' outputs too: once the tool returns less (a "
                "file's path, say), run the plan anew (retry would replay the items that "
                "succeeded)"}

    def _failed_items(self, step: CheckedStep, count: int
                      ) -> list[tuple[int, dict[str, Any]]]:
        """(index, journaled error) of every failed item of the step (of ``count``)."""
        found = self.journal.item_errors(self.run_id, step.id, limit=count)
        return [(e["index"], e) for e in found.get(step.id, [])]

    def _fan_facets(self, step: CheckedStep) -> dict[str, Any] | None:
        """The step's facets over its items that succeeded (None: it declares none)."""
        from ..facets import compute, spec_of

        spec = spec_of(step.raw.get("facets"))
        if spec is None or not spec.facets:
            return None
        self.journal.flush()
        return compute(spec, self.journal.item_outputs(self.run_id, step.id), fanout=True)

    def _fan_settle(self, step: CheckedStep, status: str, error: dict[str, Any]) -> None:
        self.journal.step_finished(self.run_id, step.id, status=status, key=None, error=error)
        self._settle(step, Outcome(status, error=error))
