"""The project's own acceptance-style cases (``project/*.yaml``), one test each.

Same format and runner as the shared cases (``../cases``, see ``../README.md``), but these
files belong to this repository: they check features the shared set does not cover yet
(planners, repair, waiting for a person). Edit them freely.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..runner import case_paths, run_case

HERE = Path(__file__).resolve().parent
CASES = case_paths(HERE)


@pytest.mark.parametrize("case_path", [pytest.param(p, id=p.stem) for p in CASES])
def test_project_case(case_path: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    run_case(case_path, work)


@pytest.mark.parametrize("case_path", [pytest.param(p, id=p.stem) for p in CASES])
def test_project_case_on_postgres(case_path: Path, tmp_path: Path, pg_url: str) -> None:
    """The same case with a PostgreSQL journal (a fresh database; SPEC §11)."""
    work = tmp_path / "work"
    work.mkdir()
    run_case(case_path, work, journal=pg_url)


def test_project_cases_are_present() -> None:
    assert CASES, f"no case files in {HERE}"
