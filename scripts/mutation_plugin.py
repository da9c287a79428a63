"""pytest plugin for scripts/mutation.py: fewer hypothesis examples per mutant.

A mutant is run against the fast suites hundreds of times; 20 examples per property (the
suites' own profile keeps hypothesis's default of 100) keep a module's run in minutes.
A mutant that only a rarer example would catch then shows up as a survivor to look at.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """Load the ``mutation`` hypothesis profile after the suites' conftest loaded theirs."""
    settings.register_profile(
        "mutation", deadline=None, max_examples=20, database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    settings.load_profile("mutation")
