"""Runs waiting for a person: ``planrun approve`` and ``planrun deny`` (SPEC §10).

``execute --defer-approval`` (and ``resume --defer-approval``) leave a run
``awaiting_approval`` when a step needs a person and none is at hand; nothing has run. A
person decides later, from the journal alone:

- :func:`approve` journals decisions exactly as ``execute`` does (step, tool, digest of the
  arguments and of the tool as registered, ``granted``, ``decided_by``, ``method``
  ``prompt`` | ``flag``, time, reason). The digest is the one journaled with the step's
  ``approval_required`` event, so a decision covers what the person was shown: ``resume``
  reuses it only while the run's plan and the tool's registration still give that digest
  (SPEC §6), and asks again otherwise.
- :func:`deny` journals a denial for every waiting step and ends the run ``denied``.

Both take the run's lease for the time they write (as ``resume`` does): a second
``approve`` or a ``resume`` racing them is refused with ``run_busy`` (exit 5).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from .approval import ApprovalRequest, Decision, user_name
from .errors import ApprovalError, RunError, UsageError
from .journal import Journal

#: The status of a run left waiting for a person (SPEC §10).
AWAITING = "awaiting_approval"


def waiting(journal: Journal, run_id: str) -> list[ApprovalRequest]:
    """The run's steps that still wait for a person's decision, in plan order.

    A step waits when its latest ``approval_required`` event (step, tool, digest, reason,
    intent, arguments) has no granted decision with the same digest, and the step has not
    run (status ``pending``). A person's decision counts whenever it was made (``resume``
    reuses it); a grant's only when made after that event, since grants are checked again
    at each resume (one expired since clears nothing).
    """
    latest: dict[str, dict[str, Any]] = {}
    asked_at: dict[str, str] = {}
    for e in journal.iter_events(run_id, kinds=("approval_required",)):
        if e.kind == "approval_required" and e.step and isinstance(e.data, dict):
            latest[e.step] = e.data
            asked_at[e.step] = e.ts
    if not latest:
        return []
    granted = {(a.step_id, a.digest) for a in journal.approval_records(run_id)
               if a.granted and (a.method != "grant"
                                 or a.decided_at >= asked_at.get(a.step_id, ""))}
    out = []
    for row in journal.steps(run_id):
        data = latest.get(row.step_id)
        if data is None or row.status != "pending":
            continue
        dig = str(data.get("digest") or "")
        if (row.step_id, dig) in granted:
            continue
        args = data.get("arguments")
        out.append(ApprovalRequest(
            step_id=row.step_id, tool=str(data.get("tool") or row.tool),
            intent=data.get("intent") if isinstance(data.get("intent"), str) else None,
            arguments=args if isinstance(args, dict) else {}, digest=dig,
            reason=str(data.get("reason") or "irreversible"),
            resolved=data.get("resolved") is True))
    return out


def _shown(r: ApprovalRequest) -> str:
    """``STEP (TOOL)``, and for a step asked at dispatch its resolved arguments (masked)."""
    if not r.resolved:
        return f"{r.step_id} ({r.tool})"
    import json

    from . import redact

    return (f"{r.step_id} ({r.tool}) with arguments "
            + json.dumps(redact.display(r.arguments), ensure_ascii=False, sort_keys=True))


def commands(run_id: str, steps: Sequence[str]) -> dict[str, str]:
    """The commands that clear an awaiting run: ``approve``, ``deny``, ``resume``."""
    named = " ".join(steps) if steps else "--all"
    return {"approve": f"planrun approve {run_id} {named}",
            "deny": f"planrun deny {run_id}",
            "resume": f"planrun resume {run_id}"}


def summary(journal: Journal, run_id: str) -> dict[str, Any]:
    """What the manifest of an awaiting run adds (key ``approval``).

    ``{"waiting": [{"step", "tool", "reason"}], "approve", "deny", "resume"}`` — the
    commands as a person types them.
    """
    left = waiting(journal, run_id)
    return {"waiting": [{"step": r.step_id, "tool": r.tool, "reason": r.reason}
                        for r in left],
            **commands(run_id, [r.step_id for r in left])}


@contextlib.contextmanager
def _held(journal: Journal, ref: str, verb: str) -> Iterator[str]:
    """The awaiting run's id, its lease held for the block (released after).

    Raises:
        RunError: ``unknown_run``; ``run_busy`` (a live process holds the lease);
            ``not_awaiting_approval`` (the run is not ``awaiting_approval``) (exit 5).
    """
    from .journal.store import lease_owner

    run_id = journal.resolve_run_id(ref)
    status = journal.run(run_id).status
    if status != AWAITING:
        raise _not_awaiting(run_id, status, verb)
    owner = lease_owner()
    try:
        journal.take_lease(run_id, owner, statuses=(AWAITING,))
    except RunError as exc:
        if exc.code == "run_not_resumable":  # another process decided meanwhile
            raise _not_awaiting(run_id, journal.run(run_id).status, verb) from None
        raise
    try:
        yield run_id
    finally:
        journal.release_lease(run_id, owner)


def _not_awaiting(run_id: str, status: str, verb: str) -> RunError:
    hint = {"denied": "It was denied; start a new run with planrun execute.",
            "running": f"It is running (or was resumed); watch it with planrun log {run_id} "
            "--follow.",
            "interrupted": f"Continue it with planrun resume {run_id} (it asks for what "
            "is missing)."}.get(status, "Only a run left waiting by --defer-approval can be "
                                "decided this way.")
    return RunError(f"run {run_id} is {status}, not awaiting_approval; there is nothing "
                    f"to {verb}", code="not_awaiting_approval", hint=hint)


def approve(journal: Journal, ref: str, steps: Sequence[str] = (), *,
            approve_all: bool = False, approver: Any = None,
            reason: str | None = None) -> dict[str, Any]:
    """Decide on the steps an awaiting run waits for (``planrun approve``).

    Args:
        journal: the journal, open for writing.
        ref: a run id or unique prefix.
        steps: step ids to approve (``planrun approve RUN STEP ...``); a step that needs
            no approval (or is approved already) is harmless.
        approve_all: approve every waiting step (``--all``).
        approver: asks a person (only on a terminal); used when neither ``steps`` nor
            ``approve_all`` is given. Stops at the first denial.
        reason: journaled with each decision made here (``--reason``).

    Returns:
        ``{"run_id", "status", "approved": [step ids], "already": [step ids named that
        were not waiting], "waiting": [step ids still waiting], "next"}``.

    Raises:
        UsageError: ``unknown_step`` — a named step is not a step of the run (exit 2).
        ApprovalError: ``approval_required`` — nothing named and nobody to ask;
            ``approval_denied`` — the person said no: the run is now ``denied`` (exit 4).
        RunError: ``unknown_run``, ``run_busy``, ``not_awaiting_approval`` (exit 5).
    """
    from .clearance import record_decision

    run_id = journal.resolve_run_id(ref)
    status = journal.run(run_id).status
    if status != AWAITING:
        raise _not_awaiting(run_id, status, "approve")
    known = {r.step_id for r in journal.steps(run_id)}
    unknown = [s for s in steps if s not in known]
    if unknown:
        raise UsageError(f"run {run_id} has no step {unknown[0]!r}", code="unknown_step",
                         hint=f"Its steps: {', '.join(sorted(known))}.")
    left = waiting(journal, run_id)
    decisions: list[Decision]
    if approve_all or steps:
        who = user_name()
        decisions = [Decision(r.step_id, True, who, "flag", reason) for r in left
                     if approve_all or r.step_id in steps]
    elif not left:
        decisions = []
    elif approver is None:
        names = ", ".join(_shown(r) for r in left)
        cmd = commands(run_id, [r.step_id for r in left])
        raise ApprovalError(
            f"run {run_id} waits for approval of {names} and there is no terminal to "
            "ask on", code="approval_required",
            hint=f"Name the steps: {cmd['approve']} (or --all); or {cmd['deny']}.",
            details={"run_id": run_id, "waiting": [r.step_id for r in left]})
    else:
        _not_driven(journal, run_id)  # do not ask about a run another process drives
        # The person is asked without the lease held (an answer may take minutes); the
        # decisions are written under it, for the steps that still wait as they were shown.
        decisions = approver.decide(left)
        if reason is not None:
            decisions = [Decision(d.step_id, d.granted, d.decided_by, d.method,
                                  d.reason or reason) for d in decisions]
    shown = {r.step_id: r for r in left}
    with _held(journal, run_id, "approve"):
        now_left = {r.step_id: r for r in waiting(journal, run_id)}
        written = [d for d in decisions if d.step_id in now_left
                   and now_left[d.step_id].digest == shown[d.step_id].digest]
        # one transaction for the decisions (and a denied run's end), as deny does
        for d in written:
            record_decision(journal, run_id, now_left[d.step_id], d, defer=True)
        denied = [d for d in written if not d.granted]
        if not denied:
            journal.flush()
        if denied:
            journal.finish_run(run_id, "denied", {"reason": "approval_denied",
                                                  "by": denied[0].decided_by})
            why = f" ({denied[0].reason})" if denied[0].reason else ""
            raise ApprovalError(
                f"step {denied[0].step_id!r} of run {run_id} was not approved{why}; the "
                "run is denied and nothing ran", code="approval_denied",
                hint="Start a new run with planrun execute to try again.",
                details={"run_id": run_id})
        approved = [d.step_id for d in written]
        still = [sid for sid in now_left if sid not in approved]
    _crash_seam()
    nxt = (commands(run_id, still)["approve"] if still
           else commands(run_id, [])["resume"])
    return {"run_id": run_id, "status": AWAITING, "approved": approved,
            "already": [s for s in steps if s not in shown], "waiting": still,
            "next": nxt}


def _crash_seam() -> None:
    """Test seam: ``PLANRUN_TEST_CRASH=approved:ANY`` SIGKILLs this process here.

    Its decisions are journaled and the lease released; the run is not resumed yet. (Not
    one of the executor's per-step crash points, which the crash matrix walks.)
    """
    import os
    import signal

    from .execution.common import CRASH_ENV

    parts = os.environ.get(CRASH_ENV, "").split(",")
    if any(p.strip().partition(":")[0] == "approved" for p in parts):
        os.kill(os.getpid(), signal.SIGKILL)


def _not_driven(journal: Journal, run_id: str) -> None:
    """Raise ``run_busy`` when a live process holds the run's lease now."""
    lease = journal.lease(run_id)
    if lease is not None and lease.driven():
        raise RunError(f"run {run_id} is being decided or driven by another process "
                       f"({lease.owner})", code="run_busy",
                       hint="Wait for it to finish, then look at planrun status "
                       f"{run_id}.")


def deny(journal: Journal, ref: str, *, reason: str | None = None) -> str:
    """Deny an awaiting run (``planrun deny``): the run ends ``denied``; returns its id.

    Every step still waiting gets a denial (``approvals`` row with ``granted`` 0, method
    ``flag``, an ``approval_denied`` event), even one approved before: the person's last
    word is no.

    Raises:
        RunError: ``unknown_run``, ``run_busy``, ``not_awaiting_approval`` (exit 5).
    """
    from .clearance import record_decision

    with _held(journal, ref, "deny") as run_id:
        who = user_name()
        left = waiting(journal, run_id) or _asked(journal, run_id)
        # the denials and the run's end in one transaction: killed between them, the run
        # stayed waiting with some of its steps denied (found by an attacker)
        for r in left:
            record_decision(journal, run_id, r, Decision(r.step_id, False, who, "flag",
                                                         reason or "denied"), defer=True)
        journal.finish_run(run_id, "denied", {"reason": "approval_denied", "by": who,
                                              **({"why": reason} if reason else {})})
        return run_id


def _asked(journal: Journal, run_id: str) -> list[ApprovalRequest]:
    """Every pending step the run asked a person about (its latest request per step)."""
    latest: dict[str, ApprovalRequest] = {}
    for e in journal.iter_events(run_id, kinds=("approval_required",)):
        if e.kind == "approval_required" and e.step and isinstance(e.data, dict):
            latest[e.step] = ApprovalRequest(
                step_id=e.step, tool=str(e.data.get("tool") or ""), intent=None,
                arguments={}, digest=str(e.data.get("digest") or ""),
                reason=str(e.data.get("reason") or "irreversible"))
    pending = {r.step_id for r in journal.steps(run_id) if r.status == "pending"}
    return [r for sid, r in latest.items() if sid in pending]
