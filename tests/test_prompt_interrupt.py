"""A Ctrl-C that lands while the approval table or question is being written is a denial.

The real-terminal tests (tests/test_approval_tty.py) press Ctrl-C once the question shows;
a signal that arrives a moment earlier — while the table renders, or between writing the
question and starting to read — used to escape as KeyboardInterrupt, so the run ended
interrupted (exit 130) instead of denied (exit 4); seen under load in CI. Here the
interrupt is raised exactly in that window by a stderr whose write or flush raises it
(the signal's own timing cannot be chosen in a test).
"""

from __future__ import annotations

import io
import sys

import pytest

from planrun.approval import ApprovalRequest
from planrun.ui import TerminalApprover


class _InterruptedStderr(io.StringIO):
    """stderr on which the n-th write (or the first flush after a question) raises ^C."""

    def __init__(self, on: str, after: int = 0) -> None:
        super().__init__()
        self.on, self.after = on, after
        self.writes = 0

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        self.writes += 1
        if self.on == "write" and self.writes > self.after:
            self.on = ""
            raise KeyboardInterrupt
        return super().write(text)

    def flush(self) -> None:
        if self.on == "flush" and "Approve" in self.getvalue():
            self.on = ""
            raise KeyboardInterrupt


def _request(step: str = "drop") -> ApprovalRequest:
    return ApprovalRequest(step_id=step, tool="delete_thing", intent=None,
                           arguments={"id": 1}, digest="0" * 64, reason="irreversible")


@pytest.mark.parametrize("on", ["flush", "write"])
def test_ctrl_c_while_asking_is_a_denial(monkeypatch: pytest.MonkeyPatch, on: str) -> None:
    err = _InterruptedStderr(on)
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))  # never read: ^C came first
    try:
        decisions = TerminalApprover().decide([_request(), _request("purge")])
    except KeyboardInterrupt:
        pytest.fail(f"the Ctrl-C on {on} escaped the prompt: the run would end interrupted")
    assert [(d.step_id, d.granted, d.reason) for d in decisions] == [
        ("drop", False, "interrupt")]


def test_an_answer_still_clears_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same approver without a ^C: the answer on stdin decides (the seam is inert)."""
    monkeypatch.setattr(sys, "stderr", _InterruptedStderr(""))
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    decisions = TerminalApprover().decide([_request()])
    assert [(d.step_id, d.granted, d.reason) for d in decisions] == [("drop", True, None)]
