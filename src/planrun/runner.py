"""Driving a journaled run: clearing approvals and running the executor to its end.

Shared by ``execute``, ``resume`` and ``retry`` (SPEC §5, §6) so that they end the same
way, with the same manifest and exit statuses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from . import redact
from .approval import ApprovalRequest, Decision, clear
from .errors import EXIT_SIGINT, ApprovalError
from .journal import Journal
from .params import UNKNOWN
from .paths import Settings
from .validation import CheckedPlan

if TYPE_CHECKING:
    from .dispatch.base import Dispatcher


def stored_params(plan: CheckedPlan) -> dict[str, Any]:
    """Parameter values as journaled, in reference form: a secret is a reference."""
    return {k: (redact.reference(k) if k in plan.secret_params
                else None if v is UNKNOWN else redact.escape_value(v))
            for k, v in plan.params.items()}


#: Former names (before secrets became references): what is journaled, and how it prints.
masked_params = stored_params
SECRET_MASK = redact.MASK


def contracts(plan: CheckedPlan) -> dict[str, Any]:
    """The contracts of the tools a plan uses, as journaled with the run."""
    out: dict[str, Any] = {}
    for s in plan.steps:
        t = s.tool
        out[t.name] = {
            "kind": t.kind, "contract": t.contract, "irreversible": t.entry.irreversible,
            "idempotent": t.entry.idempotent, "key_arguments": t.entry.key_arguments,
            "command": t.entry.command, "python": t.entry.python,
        }
    return out


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


@contextlib.contextmanager
def internal_guard(journal: Journal, run_id: str) -> Iterator[None]:
    """Turn an unexpected exception (a bug) into a ``failed`` run (SPEC §5).

    Wraps everything a command does with a journaled run (clearing approvals, running its
    steps, recording its status). A :class:`~planrun.errors.PlanrunError` passes through
    unchanged; any other exception ends the run ``failed`` — unless it already ended — with
    a ``run_finished`` event carrying ``error`` (code ``internal``) and the traceback (shown
    only by ``planrun log RUN --tracebacks``).

    Raises:
        InternalError: code ``internal``, exit 1, with the run's manifest when it can be read.
    """
    from .errors import InternalError, PlanrunError
    from .executor import internal_error

    try:
        yield
    except PlanrunError:
        raise
    except Exception as exc:
        error = internal_error(exc, "", run_id)
        plain = {k: v for k, v in error.items() if k != "traceback"}
        result = None
        try:
            if journal.run_row(run_id)["status"] in ("running", "interrupted"):
                journal.finish_run(run_id, "failed", {"error": plain,
                                                      "traceback": error["traceback"]})
            from . import manifest

            result = manifest.build(journal, run_id)
            abandoned = getattr(exc, "planrun_abandoned", 0)
            if abandoned:
                result["_abandoned_calls"] = abandoned
        except Exception:  # the journal cannot take it: the run stays resumable
            result = None
        raise InternalError(f"run {run_id} failed: {plain['message']}", manifest=result,
            details={"run_id": run_id, "type": error["type"]}) from None


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
                    whole_run: Sequence[ApprovalRequest] | None = None) -> None:
    """Clear every request (journaling each decision) or raise :class:`ApprovalError`.

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

    Raises:
        ApprovalError: ``approval_required`` (nobody to ask) or ``approval_denied``.
    """
    from .executor import inject_fault

    for r in requests:
        journal.add_event(run_id, "approval_required", step_id=r.step_id,
                          data={"tool": r.tool, "digest": r.digest, "reason": r.reason})
    inject_fault("approval")
    by_step = {r.step_id: r for r in requests}
    escalated: dict[str, str] = {}
    granted = _grants(journal, run_id, plan, policy, requests, whole_run, escalated)
    for d in granted:
        record_decision(journal, run_id, by_step[d.step_id], d)
    done = {d.step_id for d in granted}
    requests = [r for r in requests if r.step_id not in done]
    if not requests:
        return
    try:
        decisions = clear(requests, approve=approve, approve_all=approve_all,
                          approver=approver)
    except ApprovalError as exc:
        for d in exc.details or []:
            record_decision(journal, run_id, by_step[d.step_id], d)
        _deny(journal, run_id, on_deny, "approval_required")
        cleared = {d.step_id for d in exc.details or []}
        left = [r.step_id for r in requests if r.step_id not in cleared]
        reasons = [f"{sid}: {escalated[sid]}" for sid in left if sid in escalated]
        if not reasons:
            raise
        # Say why the grants there are did not apply (also in `planrun log`), instead of
        # suggesting a grant as if none existed (issue 10, bug 2); -v: what was compared.
        flags = " ".join(f"--approve {sid}" for sid in left)
        raise ApprovalError(
            f"{exc.message}; no grant cleared them — " + "; ".join(reasons),
            code="approval_required",
            hint=f"Clear them with {flags}, or --approve-all, or run on a terminal to be "
            "asked; for unattended runs, change the grant or the step so that the grant "
            f"can check the step's arguments before the run (planrun log {run_id} shows "
            "this too; -v shows the grants and arguments compared).",
            details=_grant_details(policy, plan, left)) from None
    for d in decisions:
        record_decision(journal, run_id, by_step[d.step_id], d)
    denied = [d for d in decisions if not d.granted]
    asked = {d.step_id for d in decisions}
    missing = [r.step_id for r in requests if r.step_id not in asked]
    if denied or missing:
        _deny(journal, run_id, on_deny, "approval_denied")
        first = denied[0] if denied else None
        why = f" ({first.reason})" if first and first.reason else ""
        step = first.step_id if first else missing[0]
        raise ApprovalError(f"step {step!r} was not approved{why}; nothing ran",
                            code="approval_denied",
                            hint=f"Run again and answer y, or pass --approve {step}.")


def _deny(journal: Journal, run_id: str, on_deny: str | None, reason: str) -> None:
    if on_deny is not None:
        journal.finish_run(run_id, on_deny, {"reason": reason})


def record_decision(journal: Journal, run_id: str, request: ApprovalRequest,
                    d: Decision) -> None:
    """Journal one decision (who, how, the digest of the arguments it is bound to)."""
    journal.record_approval(run_id=run_id, step_id=d.step_id, tool=request.tool,
                            digest=request.digest, granted=d.granted, decided_by=d.decided_by,
                            method=d.method, reason=d.reason)


def drive(journal: Journal, settings: Settings, plan: CheckedPlan, *, run_id: str,
          root_run_id: str, owner: str, max_parallel: int, keep_going: bool,
          state: dict[str, Any] | None = None, progress: Any = None,
          fresh: bool = False, also_leased: list[str] | None = None,
          dispatcher: Dispatcher | None = None) -> dict[str, Any]:
    """Run the run's pending steps to the end, record its status, return its manifest.

    ``dispatcher`` makes the calls (default: a
    :class:`~planrun.dispatch.local.LocalDispatcher`, which runs python tools in the
    project folder with their prints on stderr, SPEC §2).

    The manifest carries two private keys for the CLI: ``_exit`` (130/143 when
    interrupted) and ``_abandoned_calls`` (python calls left running in threads).
    """
    from . import manifest
    from .executor import Executor, inject_fault

    executor = Executor(journal=journal, plan=plan, run_id=run_id, root_run_id=root_run_id,
                        project=settings.project, max_parallel=max_parallel,
                        keep_going=keep_going, progress=progress, owner=owner,
                        state=state or {}, pools=settings.pools, fresh=fresh,
                        also_leased=also_leased or [], dispatcher=dispatcher)
    try:
        status = executor.run()
    except Exception as exc:
        # python calls left running in threads: the CLI must not wait for them at exit
        exc.planrun_abandoned = executor.abandoned  # type: ignore[attr-defined]
        raise
    inject_fault("finish")
    journal.finish_run(run_id, status)
    result = manifest.build(journal, run_id)
    if status == "interrupted":
        result["_exit"] = executor.signal_exit or EXIT_SIGINT
    if executor.abandoned:
        result["_abandoned_calls"] = executor.abandoned
    return result
