"""Our copies of the acceptance cases match ``../shared/cases`` when it is there."""

from __future__ import annotations

from pathlib import Path

import pytest

from .runner import CASES_DIR, FIXTURES_DIR

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_CASES = REPO_ROOT.parent / "shared" / "cases"
SHARED_FIXTURES = SHARED_CASES / "_fixtures"
REFRESH = "refresh them as tests/acceptance/README.md says"


@pytest.fixture
def shared_cases() -> Path:
    if not SHARED_CASES.is_dir():
        pytest.skip(f"{SHARED_CASES} is absent (not a full workspace checkout): nothing to compare")
    return SHARED_CASES


def _differing(pairs: dict[str, tuple[Path, Path]]) -> list[str]:
    return sorted(name for name, (ours, theirs) in pairs.items()
                  if ours.read_bytes() != theirs.read_bytes())


def test_same_cases(shared_cases: Path) -> None:
    theirs = {path.parent.name for path in shared_cases.glob("*/case.yaml")}
    ours = {path.stem for path in CASES_DIR.glob("*.yaml")}
    assert ours == theirs, (
        f"missing here: {sorted(theirs - ours)}; only here: {sorted(ours - theirs)}; {REFRESH}"
    )


def test_case_files_identical(shared_cases: Path) -> None:
    pairs = {
        path.parent.name: (CASES_DIR / f"{path.parent.name}.yaml", path)
        for path in shared_cases.glob("*/case.yaml")
        if (CASES_DIR / f"{path.parent.name}.yaml").exists()
    }
    differing = _differing(pairs)
    assert not differing, f"cases differ from the shared ones: {differing}; {REFRESH}"


def test_fixtures_identical(shared_cases: Path) -> None:
    theirs = {path.name for path in SHARED_FIXTURES.iterdir() if path.is_file()}
    ours = {path.name for path in FIXTURES_DIR.iterdir() if path.is_file()}
    assert ours == theirs, f"fixture files: ours {sorted(ours)}, shared {sorted(theirs)}; {REFRESH}"
    pairs = {name: (FIXTURES_DIR / name, SHARED_FIXTURES / name) for name in theirs}
    differing = _differing(pairs)
    assert not differing, f"fixtures differ from the shared ones: {differing}; {REFRESH}"
