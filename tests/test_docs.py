"""The README's tables are the public interface: they must match the code exactly."""

from __future__ import annotations

import re
from pathlib import Path

from planrun.errors import EXIT_CODES
from planrun.issues import ISSUE_CODES
from planrun.journal import EVENT_KINDS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _table_after(heading: str) -> dict[str, str]:
    """Rows ``| key | meaning |`` of the first table after a ``## heading``."""
    section = README.split(f"## {heading}\n", 1)[1]
    rows: dict[str, str] = {}
    started = False
    for line in section.splitlines():
        if line.startswith("|"):
            started = True
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells[0] in ("code", "---") or set(cells[0]) <= {"-"}:
                continue
            rows[cells[0].strip("`")] = cells[1]
        elif started:
            break
    return rows


def test_issue_code_table_matches_code() -> None:
    table = _table_after("Validation")
    assert table == ISSUE_CODES


def test_exit_code_table_matches_code() -> None:
    table = {int(k): v for k, v in _table_after("Exit codes").items()}
    assert table == EXIT_CODES


def test_readme_starts_with_the_two_fresh_machine_commands() -> None:
    blocks = re.findall(r"```sh\n(.*?)```", README, flags=re.S)
    first, second = blocks[0].strip(), blocks[1].strip()
    assert "pip install -e ." in first
    assert "planrun execute nightly-backup" in first
    assert "--approve prune" in first
    assert "pip install -e '.[test]'" in second
    assert second.endswith("python -m pytest")


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "python -m pytest" in ci
    assert "ruff check" in ci
    assert "mypy" in ci
    # the README's command runs every suite: no marker is left out by default
    addopts = (ROOT / "pyproject.toml").read_text(encoding="utf-8").split("addopts = ", 1)[1]
    assert " -m " not in addopts.splitlines()[0]


def test_event_kinds_are_the_specs() -> None:
    # SPEC §7 lists the event kinds; a new kind must be added there first.
    assert set(EVENT_KINDS) == {
        "planned", "plan_refused", "approval_required", "approval_granted", "approval_denied",
        "autonomy_escalated", "autonomy_refused", "step_started", "step_succeeded",
        "step_failed", "step_retried", "step_skipped", "step_replayed", "run_interrupted",
        "run_resumed", "run_finished", "indeterminate_resolved",
        "plan_proposed",  # SPEC §10: a planner's answer, one per round
        "replanned",  # SPEC §10: a repair's revision became a child run
    }


def test_error_code_table_matches_code() -> None:
    from planrun.errors import ERROR_CODES

    section = README.split("| error code | exit | meaning |\n", 1)[1]
    rows = {}
    for line in section.splitlines()[1:]:
        if not line.startswith("|"):
            break
        code, exit_status, meaning = (c.strip() for c in line.strip().strip("|").split("|"))
        rows[code.strip("`")] = (int(exit_status), meaning)
    assert rows == ERROR_CODES


def test_every_error_code_raised_in_the_code_is_documented() -> None:
    from planrun.errors import ERROR_CODES

    raised = set()
    for path in (ROOT / "src" / "planrun").rglob("*.py"):
        raised |= set(re.findall(r'code="([a-z_]+)"', path.read_text(encoding="utf-8")))
    assert raised <= set(ERROR_CODES) | set(ISSUE_CODES), raised - set(ERROR_CODES) - set(
        ISSUE_CODES)
