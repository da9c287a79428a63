"""The state the scheduler's parts share, declared once for the type checker.

:class:`~planrun.execution.scheduler.Executor` is assembled from parts (scheduling, steps,
fan-out, attempts), each a class of its own over this state; the methods one part calls
on another are declared here and defined in the part that owns them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..dispatch.base import Dispatcher
from ..journal import Journal
from ..params import Ref
from ..redact import Secrets
from ..validation import CheckedPlan, CheckedStep
from .common import BEFORE_CALL, Outcome, Progress, Slots, StepState


class RunParts:
    """Attributes and cross-part methods of an executor (see the module docstring)."""

    journal: Journal
    plan: CheckedPlan
    run_id: str
    root_run_id: str
    project: Path
    max_parallel: int
    keep_going: bool
    state: dict[str, StepState]
    progress: Progress | None
    fresh: bool
    stopping: str | None
    cancel_reason: tuple[str, str] | None
    signal_exit: int | None
    lost: bool
    _calls: int
    _dispatcher: Dispatcher
    _secrets: Secrets
    _crash: frozenset[tuple[str, str]]
    #: ``PLANRUN_TEST_INTERNAL`` as read when the run started (None: read at each point).
    _seam: str | None
    _sem: asyncio.Semaphore
    _pools: dict[str, asyncio.Semaphore]
    _batch: asyncio.Future[None] | None
    _batch_timer: asyncio.TimerHandle | None
    _running: dict[asyncio.Task[None], str]
    #: The commit of deferred records the scheduler asked for after its last dispatch
    #: (``Executor._commit_pending``), until it runs or a dispatch commit makes it moot.
    _commit_soon: asyncio.Handle | None
    #: Steps whose task waits for a slot (pool or ``max_parallel``), in dispatch order.
    _slot_waiters: dict[str, CheckedStep]
    _loop: asyncio.AbstractEventLoop
    _grace: asyncio.TimerHandle
    #: The run's ``timeout`` timer, while it is armed.
    _deadline: asyncio.TimerHandle | None
    #: The loop took SIGINT and SIGTERM (the run is driven on the main thread).
    _hears_signals: bool
    #: step id → whether a step it depends on went wrong (``Steps._wrong_above``), for
    #: steps whose ancestors have all finished
    _wrong_memo: dict[str, bool]

    def _run_timeout(self) -> None:
        raise NotImplementedError

    def _emit(self, kind: str, sid: str, **info: Any) -> None:
        raise NotImplementedError

    def _on_lease_lost(self) -> None:
        raise NotImplementedError

    def _stopped_for(self, step: CheckedStep) -> bool:
        raise NotImplementedError

    def _on_signal(self, signum: int, ago_s: float = 0.0) -> None:
        raise NotImplementedError

    def _gate(self, step: CheckedStep, stored: dict[str, Any]) -> bool:
        raise NotImplementedError

    def _crash_at(self, point: str, sid: str, item: int | None = None) -> None:
        raise NotImplementedError

    def _fail_now(self, step: CheckedStep, code: str, message: str,
                  expect: str | tuple[str, ...] = BEFORE_CALL,
                  traceback: str | None = None) -> None:
        raise NotImplementedError

    def _settle(self, step: CheckedStep, outcome: Outcome) -> None:
        raise NotImplementedError

    def _lookup(self, step: CheckedStep, item: Any = None, index: int | None = None
                ) -> Callable[[Ref], Any]:
        raise NotImplementedError

    def _prepare(self, step: CheckedStep, lookup: Callable[[Ref], Any], item: int | None
                 ) -> tuple[dict[str, Any], str, dict[str, Any], str] | Outcome:
        raise NotImplementedError

    def _slots(self, step: CheckedStep) -> Slots:
        raise NotImplementedError

    async def _attempts(self, step: CheckedStep, arguments: dict[str, Any], key: str,
                        item: int | None, args_digest: str) -> Outcome:
        raise NotImplementedError

    async def _fan_out(self, step: CheckedStep) -> None:
        raise NotImplementedError
