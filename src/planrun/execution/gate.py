"""Clearing a step with its resolved arguments, at dispatch (``approve: resolved``).

A step (or tool) with ``approve: resolved`` whose arguments come from earlier outputs is
not cleared before the run with its placeholders showing: it is cleared here, just
before its dispatch record, with the values it will be called with (reference form:
a secret stays a reference, shown as ``***``). In order:

1. a person's decision (``prompt`` | ``flag``) journaled for this step and bound to the
   digest of these resolved arguments and the tool as registered (``planrun approve``,
   or an earlier answer) clears it; so does a ``--approve``/``--approve-all`` decision
   journaled before the run (bound to the arguments as written: a flag clears whatever
   the values turn out to be);
2. a grant of the policy of this moment that these values satisfy clears it;
3. ``--approve STEP`` / ``--approve-all`` of this command clear it;
4. on a terminal, the person is asked now (the same table and question as before a run);
   a denial stops the run, which ends ``denied`` (exit 4);
5. otherwise the step stays ``pending``, no new step starts, and the run ends
   ``awaiting_approval`` (exit 4) with the resolved values in its ``approval_required``
   event, for ``planrun approve RUN`` to show; ``planrun resume RUN`` continues.

Decisions bound to other values (the upstream output changed before a resume) do not
clear the step: it is asked about again. See docs/approvals-and-policy.md.
"""

from __future__ import annotations

import signal
from typing import Any

from ..approval import ApprovalRequest, Decision, tool_identity, user_name
from ..canonical import digest
from ..validation import CheckedStep
from .base import RunParts


def resolved_request(step: CheckedStep, stored: dict[str, Any]) -> ApprovalRequest:
    """The request of ``step`` about to be called with ``stored`` (reference form)."""
    return ApprovalRequest(step_id=step.id, tool=step.tool.name, intent=step.intent,
                           arguments=stored,
                           digest=digest({"arguments": stored,
                                          "tool": tool_identity(step.tool)}),
                           reason=step.approval_reason or "irreversible", resolved=True)


class Gate(RunParts):
    """The executor's part that clears ``approve: resolved`` steps at dispatch."""

    approver: Any
    approve: frozenset[str]
    approve_all: bool
    awaiting: list[str]
    denied: Decision | None
    _swallow_sigint: bool

    def _gate(self, step: CheckedStep, stored: dict[str, Any]) -> bool:
        """True when ``step`` may be dispatched with ``stored``; else it stays pending."""
        if not step.deferred_approval:
            return True
        from ..approval import request_for
        from ..clearance import record_decision

        req = resolved_request(step, stored)
        written = request_for(step).digest
        for a in self.journal.approval_records(self.run_id):
            if a.step_id == step.id and a.granted and (
                    (a.method != "grant" and a.digest == req.digest)
                    or (a.method == "flag" and a.digest == written)):
                return True
        self.journal.add_event(self.run_id, "approval_required", step_id=step.id,
                               data={"tool": req.tool, "digest": req.digest,
                                     "reason": req.reason, "intent": req.intent,
                                     "arguments": req.arguments, "resolved": True})
        decision = self._grant_decision(step, req)
        if decision is None and (self.approve_all or step.id in self.approve):
            decision = Decision(step.id, True, user_name(), "flag")
        if decision is None and self.approver is not None:
            decision = self._ask(req)
        if decision is None:
            self.awaiting.append(step.id)
            self._emit("awaiting", step.id, tool=req.tool)
            return False
        record_decision(self.journal, self.run_id, req, decision)
        if not decision.granted:
            self.denied = self.denied or decision
            self.stopping = self.stopping or f"step {step.id!r} was not approved"
            self.cancel_reason = self.cancel_reason or ("approval_denied", self.stopping)
            return False
        return True

    def _grant_decision(self, step: CheckedStep, req: ApprovalRequest) -> Decision | None:
        """A grant's decision on the resolved values, else None (``autonomy_escalated``)."""
        policy = self.plan.policy
        if policy is None or req.reason == "escalate":
            return None
        from ..approval import request_for
        from ..clearance import covered
        from ..policy import Covered, grant_for

        others = [request_for(s) for s in self.plan.steps
                  if s.approval_reason and s.id != step.id]
        cover = [*covered(self.plan, others),
                 Covered(step_id=step.id, tool=req.tool, calls=[req.arguments])]
        grant, why = grant_for(policy, cover, step.id)
        if grant is not None:
            return Decision(step.id, True, grant.id, "grant", why)
        if req.reason == "act" or policy.grants:
            self.journal.add_event(self.run_id, "autonomy_escalated", step_id=step.id,
                                   data={"tool": req.tool, "why": why})
        return None

    def _ask(self, req: ApprovalRequest) -> Decision:
        """Ask the person on the terminal; Ctrl-C at the prompt is a denial (SPEC §6)."""
        self.journal.flush()  # what ran so far is durable before a long wait
        self._emit("pause", req.step_id)  # a live display would draw over the question
        loop = self._loop
        from ..dispatch.local import real_stdin

        handled = loop.remove_signal_handler(signal.SIGINT)  # restores KeyboardInterrupt
        try:
            with real_stdin():  # tools run with stdin at end-of-file; the person does not
                asked = self.approver.decide([req])
        finally:
            if handled:  # (not on a run driven off the main thread)
                loop.add_signal_handler(signal.SIGINT, self._on_signal, signal.SIGINT)
        if not asked:
            return Decision(req.step_id, False, user_name(), "prompt", "not asked")
        if asked[0].reason == "interrupt":
            # the loop still hears of that Ctrl-C (its wakeup fd): it was an answer
            self._swallow_sigint = True
        return asked[0]  # type: ignore[no-any-return]
