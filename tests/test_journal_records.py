"""Journal records made in bulk (``step_records``) are the records the ``__init__`` makes.

``step_records`` builds each ``StepRecord`` without the frozen dataclass's ``__init__``
(issue 16: a 10,000-step resume reads 10,000 rows); this checks that nothing is missed:
every field is set, with the value the ``__init__`` would give, and the record stays
frozen, equal and lazily parsed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planrun.journal.records import StepRecord, step_records

NAMES = ("run_id", "step_id", "position", "tool", "status", "attempts", "idempotency_key",
         "error_json", "skip_reason", "started_at", "finished_at", "replayed", "approved_by",
         "output_json", "recoveries", "facets_json")
TEXT = st.none() | st.text(max_size=5)


@given(row=st.tuples(st.text(max_size=4), st.text(max_size=4), st.integers(0, 99),
                     st.text(max_size=4), st.sampled_from(["pending", "succeeded"]),
                     st.integers(0, 5), TEXT, st.none() | st.just('{"code":"x"}'), TEXT,
                     TEXT, TEXT, st.integers(0, 1), TEXT,
                     st.none() | st.sampled_from(['{"a":[1,2]}', '"é"', "3"]),
                     st.none() | st.integers(0, 3),
                     st.none() | st.just('{"values":{"n":1}}')),
       old_journal=st.booleans())
def test_bulk_records_equal_the_records_of_the_init(row: tuple[Any, ...],
                                                    old_journal: bool) -> None:
    names = NAMES[:-2] if old_journal else NAMES  # columns of an unmigrated journal
    got = step_records(names, [row[:len(names)]])[0]
    v = dict(zip(names, row, strict=False))
    import json

    text = v["output_json"]
    want = StepRecord(
        run_id=v["run_id"], step_id=v["step_id"], position=v["position"], tool=v["tool"],
        status=v["status"], attempts=v["attempts"],
        recoveries=(v.get("recoveries") or 0) if not old_journal else 0,
        idempotency_key=v["idempotency_key"],
        error=None if v["error_json"] is None else json.loads(v["error_json"]),
        skip_reason=v["skip_reason"], started_at=v["started_at"],
        finished_at=v["finished_at"], replayed=bool(v["replayed"]),
        approved_by=v["approved_by"], output_bytes=len(text.encode()) if text else 0,
        facets=None if old_journal or v["facets_json"] is None else json.loads(
            v["facets_json"]), _output_text=text)
    assert got == want
    assert repr(got) == repr(want)
    assert {f.name: getattr(got, f.name) for f in dataclasses.fields(StepRecord)} == {
        f.name: getattr(want, f.name) for f in dataclasses.fields(StepRecord)}
    assert got.output == want.output
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.status = "failed"  # type: ignore[misc]
