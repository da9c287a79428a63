"""The shared acceptance cases (``cases/*.yaml``), one test each."""

from __future__ import annotations

from pathlib import Path

import pytest

from .runner import CASES_DIR, case_paths, run_case

#: Cases for features still to come, as ``{"c17-fan-out": "issue 4: fan-out"}``: strict
#: xfails, so they turn into failures once they pass (then drop the entry). Empty since
#: resume (issue 3, c11) and fan-out (issue 4, c17) landed.
PENDING: dict[str, str] = {}
SLOW: frozenset[str] = frozenset({"c11-crash-resume"})


def _param(path: Path) -> object:
    marks: list[pytest.MarkDecorator] = []
    if path.stem in PENDING:
        marks.append(pytest.mark.xfail(strict=True, reason=PENDING[path.stem]))
    if path.stem in SLOW:
        marks.append(pytest.mark.slow)
    return pytest.param(path, id=path.stem, marks=marks)


CASES = case_paths()


@pytest.mark.parametrize("case_path", [_param(path) for path in CASES])
def test_case(case_path: Path, tmp_path: Path) -> None:
    # A folder of its own: tests/conftest.py puts a HOME folder into tmp_path.
    work = tmp_path / "work"
    work.mkdir()
    run_case(case_path, work)


@pytest.mark.parametrize("case_path", [_param(path) for path in CASES])
def test_case_on_postgres(case_path: Path, tmp_path: Path, pg_url: str) -> None:
    """The same case with a PostgreSQL journal (a fresh database; SPEC §11)."""
    work = tmp_path / "work"
    work.mkdir()
    run_case(case_path, work, journal=pg_url)


def test_cases_are_present() -> None:
    assert CASES, f"no case files in {CASES_DIR}"


def test_marked_cases_exist() -> None:
    names = {path.stem for path in CASES}
    stale = (set(PENDING) | SLOW) - names
    assert not stale, f"marks name cases that do not exist: {sorted(stale)}"
