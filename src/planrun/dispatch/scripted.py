"""A dispatcher that calls nothing: each step's outcomes are given in advance (tests).

With it a test drives the real scheduler and journal through outcomes that are hard to
cause with real tools — a worker lost mid-call, a call that hangs until its timeout —
and sees in what order, and how many at once, calls were made.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..tools import CallTimeout, ToolFailure
from .base import Call, CallLost, Dispatcher, Watch


@dataclass(frozen=True)
class Succeed:
    """Return ``output`` after ``seconds`` (0: at the loop's next turn)."""

    output: Any = None
    seconds: float = 0.0


@dataclass(frozen=True)
class Fail:
    """Fail as a command exiting with ``exit_code`` (code ``exit_status``)."""

    exit_code: int = 1
    message: str = "scripted failure"


@dataclass(frozen=True)
class Hang:
    """Run until cancelled, or until the call's timeout (then ``CallTimeout``)."""


@dataclass(frozen=True)
class Lost:
    """The worker running the call is gone after ``seconds`` (``CallLost``)."""

    seconds: float = 0.0


Scripted = Succeed | Fail | Hang | Lost


class ScriptedDispatcher(Dispatcher):
    """Ends each call as scripted for its step (or ``STEP#ITEM``), attempt by attempt.

    Args:
        script: ``STEP`` or ``STEP#ITEM`` → an outcome, or a list of outcomes for attempt
            1, 2, … (the last one repeats). A fan-out item without an entry of its own
            takes its step's.
        default: the outcome of a call the script does not name.

    Attributes:
        calls: every call made, in the order they started.
        running: calls running now. most: the most that ran at once.
    """

    def __init__(self, script: Mapping[str, Scripted | Sequence[Scripted]] | None = None,
                 default: Scripted = Succeed()) -> None:
        self.script = dict(script or {})
        self.default = default
        self.calls: list[Call] = []
        self.running = 0
        self.most = 0
        self.abandoned = 0

    def outcome(self, call: Call) -> Scripted:
        """The scripted outcome of ``call`` (by its step or item, and its attempt)."""
        entry = self.script.get(call.where, self.script.get(call.context.step_id,
                                                            self.default))
        if isinstance(entry, Sequence):
            return entry[min(call.context.attempt, len(entry)) - 1]
        return entry

    def made(self, step: str) -> list[Call]:
        """The calls made for ``step`` (its items', for a fan-out), in order."""
        return [c for c in self.calls if c.context.step_id == step]

    async def call(self, call: Call, watch: Watch) -> Any:
        """Play the scripted outcome (see :meth:`Dispatcher.call`)."""
        self.calls.append(call)
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            return await self._play(self.outcome(call), call)
        finally:
            self.running -= 1

    @staticmethod
    async def _play(outcome: Scripted, call: Call) -> Any:
        if isinstance(outcome, Succeed):
            await asyncio.sleep(outcome.seconds)
            return outcome.output
        if isinstance(outcome, Fail):
            await asyncio.sleep(0)
            raise ToolFailure({"code": "exit_status", "exit_code": outcome.exit_code,
                               "message": f"{call.tool} exited with status "
                               f"{outcome.exit_code}: {outcome.message}"})
        if isinstance(outcome, Lost):
            await asyncio.sleep(outcome.seconds)
            raise CallLost(f"the worker running {call.where} is gone")
        try:
            await asyncio.wait_for(asyncio.Event().wait(), call.timeout)
        except TimeoutError:
            raise CallTimeout({"code": "timeout", "message": "call ran past its timeout of "
                               f"{call.timeout} s"}) from None
        raise AssertionError("unreachable")  # pragma: no cover
