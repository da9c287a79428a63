"""Clearing a run's steps before they run: grants first, then a person (SPEC §6).

Every decision is journaled with who made it, how, and the digest of the arguments it is
bound to. Grants are checked against the policy and the clock of this moment; steps no
grant clears are asked of the person at the terminal (``approver``) or cleared by
``--approve``/``--approve-all``; otherwise :class:`~planrun.errors.ApprovalError` (exit 4).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .approval import ApprovalRequest, Decision, clear
from .errors import ApprovalError
from .journal import Journal
from .validation import CheckedPlan


def covered(plan: CheckedPlan, requests: Sequence[ApprovalRequest]) -> list[Any]:
    """Per step to clear, its argument objects as known before the run.

    Fan-out: one per item of a literal ``for_each``. None where a value is only known at
    run time.
    """
    from .params import IndexRef, ItemRef, Ref, ResolveError, dig, has_templates, resolve
    from .policy import Covered

    out = []
    for r in requests:
        step = plan.by_id[r.step_id]
        calls: list[dict[str, Any]] | None
        if step.for_each is None:
            calls = None if has_templates(step.arguments) else [step.arguments]
        elif isinstance(step.for_each, list) and not has_templates(step.for_each):
            calls = []
            for idx, item in enumerate(step.for_each):
                def lookup(ref: Ref, item: Any = item, idx: int = idx) -> Any:
                    if isinstance(ref, ItemRef):
                        return dig(item, ref.path, "item")
                    if isinstance(ref, IndexRef):
                        return idx
                    raise ResolveError("known only at run time")
                try:
                    calls.append(resolve(step.arguments, lookup))
                except ResolveError:
                    calls = None
                    break
        else:
            calls = None
        out.append(Covered(step_id=r.step_id, tool=r.tool, calls=calls))
    return out


def _grants(journal: Journal, run_id: str, plan: CheckedPlan | None, policy: Any,
            requests: Sequence[ApprovalRequest],
            whole_run: Sequence[ApprovalRequest] | None = None,
            escalated: dict[str, str] | None = None) -> list[Decision]:
    """Decisions made by grants; ``autonomy_escalated`` for the steps they do not clear.

    ``whole_run`` lists every step of the run that needs clearing (default: ``requests``):
    a grant's ``max_total`` sums over all of them, also the ones a resumed run already ran.
    ``escalated`` (if given) receives step id → why no grant cleared it, for the steps
    that a grant names (or whose class is ``act`` or ``escalate``).
    """
    from .policy import grant_for

    if policy is None or plan is None:
        return []
    cover = covered(plan, whole_run if whole_run is not None else requests)
    out = []
    for r in requests:
        if r.reason == "escalate":
            why = "its class escalates to a person"
            journal.add_event(run_id, "autonomy_escalated", step_id=r.step_id,
                              data={"tool": r.tool, "why": why})
            if escalated is not None:
                escalated[r.step_id] = why
            continue
        grant, why = grant_for(policy, cover, r.step_id)
        if grant is not None:
            out.append(Decision(r.step_id, True, grant.id, "grant", why))
        elif r.reason == "act" or policy.grants:
            journal.add_event(run_id, "autonomy_escalated", step_id=r.step_id,
                              data={"tool": r.tool, "why": why})
            if escalated is not None:
                escalated[r.step_id] = why
    return out


def _grant_details(policy: Any, plan: CheckedPlan | None, step_ids: Sequence[str]
                   ) -> list[str]:
    """What ``-v`` adds to ``approval_required``: each grant considered, each step's arguments.

    One line each: ``grant ID: tool|class …, expires …, arguments SCHEMA``; ``step ID
    arguments: {…}`` (run-time placeholders as written).
    """
    import json

    from .params import as_written

    lines: list[str] = []
    if policy is None or plan is None:
        return lines
    for sid in step_ids:
        step = plan.by_id.get(sid)
        if step is None:
            continue
        cls = policy.class_of(step.tool.name)
        lines.append(f"step {sid} ({step.tool.name}"
                     + (f", class {cls[0]} = {cls[1]}" if cls else "") + ") arguments: "
                     + json.dumps(as_written(step.arguments), sort_keys=True))
        if step.for_each is not None:
            lines.append(f"step {sid} for_each: "
                         + json.dumps(as_written(step.for_each), sort_keys=True))
        for g in policy.grants:
            if g.tool == step.tool.name or (cls is not None and g.cls == cls[0]):
                names = f"tool {g.tool}" if g.tool else f"class {g.cls}"
                lines.append(f"grant {g.id} ({names}, expires {g.expires.isoformat()}, "
                             f"granted by {g.granted_by}) arguments: "
                             + json.dumps(g.arguments, sort_keys=True, default=str))
    return lines


def clear_approvals(journal: Journal, run_id: str, requests: Sequence[ApprovalRequest],
                    approve: set[str], approve_all: bool, approver: Any,
                    *, on_deny: str | None, plan: CheckedPlan | None = None,
                    policy: Any = None,
                    whole_run: Sequence[ApprovalRequest] | None = None,
                    defer: bool = False) -> list[ApprovalRequest]:
    """Clear every request (journaling each decision) or raise :class:`ApprovalError`.

    With ``defer`` (``--defer-approval``, SPEC §10), steps that nobody can clear now (no
    terminal, no flag, no grant) do not fail the run: it is left ``awaiting_approval``
    (its lease released, nothing run) and those steps are returned.

    Args:
        journal: the journal (its ``owner`` holds the run's lease).
        run_id: the run.
        requests: the steps to clear.
        approve: step ids given with ``--approve``.
        approve_all: ``--approve-all``.
        approver: asks a person on a terminal, or None.
        on_deny: the run status to set on a denial (``denied`` for a new run), or None to
            leave the run's status as it is (a resume stays resumable).
        plan: the plan (for what grants would cover).
        policy: the policy whose grants may clear steps unattended.
        whole_run: every step of the run that needs clearing, when ``requests`` are only
            some of them (a resume): a grant's ``max_total`` counts them all.
        defer: leave the run ``awaiting_approval`` instead of failing when nobody can
            be asked.

    Returns:
        The requests left waiting for a person (only with ``defer``; else empty).

    Raises:
        ApprovalError: ``approval_required`` (nobody to ask) or ``approval_denied``.
    """
    from .executor import inject_fault

    # The records of one clearing are written in few transactions, not one a step (a
    # plan of 1,000 irreversible steps run with --approve-all made 2,000 commits): the
    # requests with what grants cleared, before anyone is asked; then the decisions,
    # with the run's end when they end it.
    for r in requests:
        # intent and arguments (run-time placeholders as written, secrets as references):
        # what `planrun approve` shows the person later (SPEC §10)
        journal.add_event(run_id, "approval_required", step_id=r.step_id,
                          data={"tool": r.tool, "digest": r.digest, "reason": r.reason,
                                "intent": r.intent, "arguments": r.arguments}, defer=True)
    journal.flush()
    inject_fault("approval")
    by_step = {r.step_id: r for r in requests}
    escalated: dict[str, str] = {}
    granted = _grants(journal, run_id, plan, policy, requests, whole_run, escalated)
    for d in granted:
        record_decision(journal, run_id, by_step[d.step_id], d, defer=True)
    journal.flush()
    done = {d.step_id for d in granted}
    requests = [r for r in requests if r.step_id not in done]
    if not requests:
        return []
    try:
        decisions = clear(requests, approve=approve, approve_all=approve_all,
                          approver=approver)
    except ApprovalError as exc:
        for d in exc.details or []:
            record_decision(journal, run_id, by_step[d.step_id], d, defer=True)
        if defer:
            cleared = {d.step_id for d in exc.details or []}
            left = [r for r in requests if r.step_id not in cleared]
            journal.finish_run(run_id, "awaiting_approval", {
                "reason": "approval_required", "waiting": [r.step_id for r in left]})
            return left
        _deny(journal, run_id, on_deny, "approval_required")
        journal.flush()
        raise _unattended_error(exc, run_id, requests, escalated, policy, plan) from None
    for d in decisions:
        record_decision(journal, run_id, by_step[d.step_id], d, defer=True)
    denied = [d for d in decisions if not d.granted]
    asked = {d.step_id for d in decisions}
    missing = [r.step_id for r in requests if r.step_id not in asked]
    if denied or missing:
        _deny(journal, run_id, on_deny, "approval_denied")
        journal.flush()
        first = denied[0] if denied else None
        why = f" ({first.reason})" if first and first.reason else ""
        step = first.step_id if first else missing[0]
        raise ApprovalError(f"step {step!r} was not approved{why}; nothing ran",
                            code="approval_denied",
                            hint=f"Run again and answer y, or pass --approve {step}.",
                            run_id=run_id)
    journal.flush()
    return []


def _unattended_error(exc: ApprovalError, run_id: str, requests: Sequence[ApprovalRequest],
                      escalated: dict[str, str], policy: Any, plan: CheckedPlan | None
                      ) -> ApprovalError:
    """``exc`` (nobody to ask), or, where grants named steps left, why none cleared them.

    Says why the grants there are did not apply (also in ``planrun log``), instead of
    suggesting a grant as if none existed (issue 10, bug 2); ``-v``: what was compared.
    """
    cleared = {d.step_id for d in exc.details or []}
    left = [r.step_id for r in requests if r.step_id not in cleared]
    reasons = [f"{sid}: {escalated[sid]}" for sid in left if sid in escalated]
    if not reasons:
        exc.run_id = run_id
        return exc
    flags = " ".join(f"--approve {sid}" for sid in left)
    from .policy import UNCHECKABLE

    if any(marker in why for why in reasons for marker in UNCHECKABLE):
        unattended = ("change the grant or the step so that the grant can check the "
                      "step's arguments (from parameters before the run, or with approve: "
                      "resolved when it is reached)")
    else:  # the grant could check them, and they are outside it (found by an operator)
        unattended = "give values the grant allows, or widen the grant in planrun.toml"
    return ApprovalError(
        f"{exc.message}; no grant cleared them — " + "; ".join(reasons),
        code="approval_required",
        hint=f"Clear them with {flags}, or --approve-all, or run on a terminal to be "
        f"asked; for unattended runs, {unattended} (planrun log {run_id} shows "
        "this too; -v shows the grants and arguments compared).",
        details=_grant_details(policy, plan, left), run_id=run_id)


def _deny(journal: Journal, run_id: str, on_deny: str | None, reason: str) -> None:
    if on_deny is not None:
        journal.finish_run(run_id, on_deny, {"reason": reason})


def record_decision(journal: Journal, run_id: str, request: ApprovalRequest,
                    d: Decision, *, defer: bool = False) -> None:
    """Journal one decision (who, how, the digest of the arguments it is bound to).

    ``defer``: in the journal's next write transaction, not one of its own.
    """
    journal.record_approval(run_id=run_id, step_id=d.step_id, tool=request.tool,
                            digest=request.digest, granted=d.granted, decided_by=d.decided_by,
                            method=d.method, reason=d.reason, defer=defer)
