"""A run id prefix means the same on every journal backend (SPEC §11).

SQLite's ``LIKE`` ignores the case of ASCII letters and PostgreSQL's does not: ``planrun
status BEEF0000`` found the run on an SQLite journal and no run on a PostgreSQL one (found
by an attacker comparing the two). A prefix is now compared case-insensitively on both,
as SQLite always did (run ids are lowercase hex: no two differ only in case), and ``%``
and ``_`` in it are letters, not wildcards.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from planrun.errors import RunError
from planrun.journal import Journal, now


def _runs(journal: Journal, ids: list[str]) -> None:
    for run_id in ids:
        journal.create_run(run={
            "run_id": run_id, "root_run_id": run_id, "plan_name": "p", "plan_json": "{}",
            "digest": "d", "revision": 1, "params_json": "{}", "contracts_json": "{}",
            "status": "completed", "created_at": now(), "finished_at": now()}, steps=[])


def test_a_prefix_resolves_alike_on_every_backend(journal_location: Path | str) -> None:
    with Journal(journal_location, write=True) as journal:
        _runs(journal, ["beef00000000cafe", "beef11110000cafe", "abcdef0123456789"])
        assert journal.resolve_run_id("beef0") == "beef00000000cafe"
        assert journal.resolve_run_id("BEEF0") == "beef00000000cafe"
        assert journal.resolve_run_id("ABCDEF0123456789") == "abcdef0123456789"
        with pytest.raises(RunError, match="ambiguous"):
            journal.resolve_run_id("BeeF")
        for literal in ("ab_d", "abc%", "beef%", "____"):
            with pytest.raises(RunError, match="no run"):
                journal.resolve_run_id(literal)
