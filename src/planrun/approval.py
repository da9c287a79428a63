"""Clearing the steps that need a person, before the first step runs (SPEC §6).

The executor never asks anybody itself: :func:`clear` receives an :class:`Approver` (the
CLI builds the interactive one on a terminal; tests use a scripted one). Without a
terminal only ``--approve STEP``, ``--approve-all`` (or, later, a matching grant) clear a
step; anything left is refused at once with exit 4 — planrun never waits on a stdin that
is not a terminal.
"""

from __future__ import annotations

import getpass
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .canonical import digest
from .errors import ApprovalError
from .params import as_written


@dataclass(frozen=True)
class ApprovalRequest:
    """One step to clear.

    Attributes:
        step_id: the step.
        tool: its tool.
        intent: the step's intent (for people), or None.
        arguments: arguments as they will be called, run-time placeholders as written.
        digest: SHA-256 of the canonical JSON of ``arguments`` and of the tool as
            registered (:func:`tool_identity`): the decision is bound to both.
        reason: why it needs a person (``irreversible``, ``policy`` …).
        resolved: ``arguments`` are the resolved values, asked at dispatch
            (``approve: resolved``), not the arguments as written before the run.
    """

    step_id: str
    tool: str
    intent: str | None
    arguments: dict[str, Any]
    digest: str
    reason: str
    resolved: bool = False


@dataclass(frozen=True)
class Decision:
    """A decision on one :class:`ApprovalRequest`.

    Attributes:
        step_id: the step decided on.
        granted: cleared or not.
        decided_by: the OS user name (or a grant id).
        method: ``prompt`` | ``flag`` | ``grant``.
        reason: why (``timeout``, ``eof``, ``interrupt``, ``answered no`` …) or None.
    """

    step_id: str
    granted: bool
    decided_by: str
    method: str
    reason: str | None = None


class Approver(Protocol):
    """Something that asks a person.

    Decides on each request, in order; may stop at the first denial (the rest are then
    not asked).
    """

    def decide(self, requests: Sequence[ApprovalRequest]) -> list[Decision]:
        """Return one decision per request asked (a prefix of ``requests``)."""
        ...


def user_name() -> str:
    """The OS user name recorded as ``decided_by``."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        return "unknown"


def tool_identity(tool: Any) -> dict[str, Any]:
    """The tool as registered, as far as an approval is bound to it (SPEC §6).

    Its name, contract (``arguments``, or the JSON Schema of the ``accepts`` model and the
    model's target), what runs (``command`` argv or ``python`` target) and where (``cwd``).
    A decision made for one of these does not clear another: ``resume`` asks again.
    """
    entry = tool.entry
    return {"name": tool.name, "contract": tool.contract, "command": entry.command,
            "python": entry.python, "accepts": entry.accepts, "cwd": entry.cwd}


def request_for(step: Any) -> ApprovalRequest:
    """The :class:`ApprovalRequest` of a :class:`~planrun.validation.CheckedStep`."""
    shown = as_written(step.arguments)
    return ApprovalRequest(step_id=step.id, tool=step.tool.name, intent=step.intent,
                           arguments=shown,
                           digest=digest({"arguments": shown,
                                          "tool": tool_identity(step.tool)}),
                           reason=step.approval_reason or "irreversible")


def cleared_before(step: Any, approve: set[str] | Sequence[str], approve_all: bool) -> bool:
    """True when ``step`` needs clearing before the run (not only at dispatch).

    Every step that needs a person, except an ``approve: resolved`` one
    (``step.deferred_approval``), which is cleared with its resolved arguments at dispatch
    — unless ``--approve STEP`` / ``--approve-all`` clear it up front, as for any step.
    """
    return bool(step.approval_reason) and (
        not step.deferred_approval or approve_all or step.id in approve)


def clear(requests: Sequence[ApprovalRequest], *, approve: set[str], approve_all: bool,
          approver: Approver | None) -> list[Decision]:
    """Decide every request: flags first, then the approver for what is left.

    Args:
        requests: the steps that need clearance, in plan order.
        approve: step ids given with ``--approve``.
        approve_all: ``--approve-all``.
        approver: asks a person (only on a terminal), or None when nobody can be asked.

    Returns:
        The decisions made, in order (flags, then answers). A denial, if any, is last.

    Raises:
        ApprovalError: ``approval_required`` when steps are left and nobody can be asked;
            ``details`` holds the decisions made so far.
    """
    who = user_name()
    decisions = [Decision(r.step_id, True, who, "flag") for r in requests
                 if approve_all or r.step_id in approve]
    left = [r for r in requests if not (approve_all or r.step_id in approve)]
    if not left:
        return decisions
    if approver is None:
        names = ", ".join(f"{r.step_id} ({r.tool})" for r in left)
        flags = " ".join(f"--approve {r.step_id}" for r in left)
        raise ApprovalError(
            f"step(s) need approval and there is no terminal to ask on: {names}",
            code="approval_required",
            hint=f"Clear them with {flags}, or --approve-all, or run on a terminal to be "
            "asked (or give a policy grant that covers them).",
            details=decisions)
    return decisions + approver.decide(left)


class ScriptedApprover:
    """An approver answering from a fixed mapping of step id → bool (tests, embedding)."""

    def __init__(self, answers: dict[str, bool], who: str = "script") -> None:
        self.answers = answers
        self.who = who

    def decide(self, requests: Sequence[ApprovalRequest]) -> list[Decision]:
        """Answer each request from the mapping (missing: denied); stop at a denial."""
        out = []
        for r in requests:
            ok = self.answers.get(r.step_id, False)
            out.append(Decision(r.step_id, ok, self.who, "prompt",
                                None if ok else "answered no"))
            if not ok:
                break
        return out
