"""Shared fixtures and helpers for planrun's tests.

Every test runs isolated (the idea of pypa/hatch ``tests/conftest.py``): its own journal
(``PLANRUN_JOURNAL`` in ``tmp_path``), its own ``HOME``, ``NO_COLOR=1``, a fixed ``COLUMNS``,
no other ``PLANRUN_*`` variable from the caller's environment, the current folder in
``tmp_path``, ``sys.path`` restored, and python tool modules written by the test forgotten
afterwards (so two tests may use the same module name with different code).

Helpers write a small project (``tools.yaml``, ``plans/``, python tool modules,
``planrun.toml``) into ``tmp_path`` and run the loaders and checks on it.
"""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from harness import asset
from planrun.issues import Issue, PlanReport, Report
from planrun.loading import Document, parse_text
from planrun.paths import Settings, load_settings
from planrun.registry import ToolRegistry, load_registry
from planrun.validation import CheckedPlan, ParamInput, check_plan
from planrun_cli import CliProject

# The isolation fixture is function-scoped and autouse; sharing it between the examples of
# one hypothesis test is intended. No deadline: the first example pays for imports.
hypothesis_settings.register_profile(
    "planrun",
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "planrun"))

_XDG = ("XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME")


@pytest.fixture(autouse=True)
def isolation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Isolate one test from the caller's environment and from other tests."""
    for name in list(os.environ):
        if name.startswith("PLANRUN_"):
            monkeypatch.delenv(name)
    for name in (*_XDG, "FORCE_COLOR", "CLICOLOR_FORCE"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PLANRUN_JOURNAL", str(tmp_path / "journal.sqlite3"))
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    root = str(tmp_path)
    for name, module in list(sys.modules.items()):
        if (getattr(module, "__file__", None) or "").startswith(root):
            del sys.modules[name]
    importlib.invalidate_caches()


# --- a project on disk --------------------------------------------------------------------

#: A python module with the tools of :data:`BASIC_TOOLS`.
BASIC_MODULE = '''
def echo(**kwargs):
    return kwargs


def lister(**kwargs):
    return {"files": ["a", "b"], "n": 2}
'''

#: A registry used by most validation tests. Line numbers of this text are not relied on.
BASIC_TOOLS = asset("registries/basic.yaml")


def dedent(text: str) -> str:
    """``textwrap.dedent`` without the leading newline of a triple-quoted literal."""
    return textwrap.dedent(text).lstrip("\n")


@dataclass
class Project:
    """A project folder in ``tmp_path``: ``tools.yaml``, ``plans/``, modules, config."""

    root: Path

    @property
    def plans(self) -> Path:
        """The plans folder (created on first write)."""
        return self.root / "plans"

    def write(self, relative: str, text: str | bytes) -> Path:
        """Write a file under the project folder (text is dedented)."""
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(dedent(text), encoding="utf-8")
        return path

    def write_tools(self, text: str = BASIC_TOOLS, *, module: str | None = BASIC_MODULE,
                    module_name: str = "basictools") -> Path:
        """Write ``tools.yaml`` (and the python module its tools import)."""
        if module is not None:
            self.write_module(module_name, module)
        return self.write("tools.yaml", text)

    def write_module(self, name: str, source: str) -> Path:
        """Write a python module beside ``tools.yaml``."""
        path = self.write(f"{name}.py", source)
        sys.modules.pop(name, None)
        importlib.invalidate_caches()
        return path

    def write_plan(self, name: str, text: str, suffix: str = ".yaml") -> Path:
        """Write ``plans/<name><suffix>``."""
        return self.write(f"plans/{name}{suffix}", text)

    def write_config(self, text: str) -> Path:
        """Write ``planrun.toml``."""
        return self.write("planrun.toml", text)

    def settings(self, **kwargs: Any) -> Settings:
        """Settings with this folder as the project (``-C``)."""
        return load_settings(project=self.root, **kwargs)

    def registry(self) -> tuple[ToolRegistry, list[Issue]]:
        """Load ``tools.yaml`` as planrun does."""
        settings = self.settings()
        return load_registry(settings.registry, settings.pools)

    def good_registry(self) -> ToolRegistry:
        """The registry, asserting it has no issue."""
        registry, issues = self.registry()
        assert issues == [], issues
        return registry

    def check(self, text: str, *, kind: str = "yaml", given: ParamInput | None = None,
              concrete: bool | None = None, file: str = "plans/p.yaml",
              registry: ToolRegistry | None = None,
              settings: Settings | None = None) -> tuple[PlanReport, CheckedPlan | None]:
        """Parse ``text`` (dedented) and run :func:`check_plan` on it."""
        doc = parse_text(dedent(text), kind=kind, file=file)
        return check_document(doc, registry or self.good_registry(),
                              settings or self.settings(), given=given, concrete=concrete)


def check_document(doc: Document, registry: ToolRegistry, settings: Settings, *,
                   given: ParamInput | None = None,
                   concrete: bool | None = None) -> tuple[PlanReport, CheckedPlan | None]:
    """:func:`check_plan` with the plan name hint planrun would use."""
    return check_plan(doc, registry, settings, given, concrete=concrete, name_hint="p")


@pytest.fixture
def sqlite_commits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry for each SQLite write transaction this process makes from now on."""
    from planrun.journal.backends import sqlite as backend

    commits: list[int] = []
    real = backend.SqliteBackend.transaction

    def counted(self: Any, conn: Any) -> Any:
        commits.append(1)
        return real(self, conn)

    monkeypatch.setattr(backend.SqliteBackend, "transaction", counted)
    return commits


@pytest.fixture
def project(tmp_path: Path) -> Project:
    """An empty project folder (``tmp_path/project``)."""
    root = tmp_path / "project"
    root.mkdir()
    return Project(root)


@pytest.fixture
def basic_project(project: Project) -> Project:
    """A project with :data:`BASIC_TOOLS` registered."""
    project.write_tools()
    return project


# --- looking at reports ----------------------------------------------------------------


def codes(report: PlanReport | Report | list[Issue]) -> list[str]:
    """The issue codes of a report, in order."""
    return [i.code for i in _issues(report)]


def only(report: PlanReport | Report | list[Issue], code: str) -> list[Issue]:
    """The issues with ``code``."""
    return [i for i in _issues(report) if i.code == code]


def one(report: PlanReport | Report | list[Issue], code: str) -> Issue:
    """The single issue with ``code`` (fails when there are none or several)."""
    found = only(report, code)
    assert len(found) == 1, f"expected one {code!r} issue, got {_issues(report)}"
    return found[0]


def _issues(report: PlanReport | Report | list[Issue]) -> list[Issue]:
    if isinstance(report, Report):
        return report.all_issues()
    if isinstance(report, PlanReport):
        return report.issues
    return list(report)


# --- the real planrun process ---------------------------------------------------------------


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[CliProject]:
    """A project run through the real ``planrun`` process (see ``tests/planrun_cli.py``).

    ``tests/crashtools.py`` is copied in; its effects log is ``tmp_path/effects.log``
    (``CRASH_EFFECTS``). Every process group the test started is killed afterwards.
    """
    project = CliProject.create(tmp_path)
    monkeypatch.setenv("CRASH_EFFECTS", str(project.effects))
    try:
        yield project
    finally:
        project.cleanup()


# --- running plans in-process ---------------------------------------------------------------


def execute_plan(project: Project, plan: str, params: dict[str, Any] | None = None,
                 **kwargs: Any) -> dict[str, Any]:
    """Run ``plan`` through :func:`planrun.api.execute` (native parameter values).

    Returns the manifest; ``kwargs`` go to ``api.execute`` (``approve``, ``approver``,
    ``max_parallel``, ``keep_going`` …).
    """
    from planrun import api

    result = api.execute(project.settings(), plan, ParamInput(file_values=dict(params or {})),
                         **kwargs)
    assert isinstance(result, api.RunOutcome), result
    return result.manifest


def run_events(project: Project, run_id: str, kind: str | None = None) -> list[dict[str, Any]]:
    """The run's journaled events in order (only those of ``kind`` when given)."""
    from planrun import api

    _run_id, events = api.log(project.settings(), run_id)
    return [e for e in events if kind is None or e["kind"] == kind]


def by_step(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A manifest's steps by id."""
    return {s["id"]: s for s in manifest["steps"]}


# --- journal backends: SQLite and PostgreSQL (SPEC §11) --------------------------------------
#
# ``journal_location`` is a journal location per backend: ``"sqlite"`` (a file in
# ``tmp_path``) and ``"postgres"`` (a fresh database on a throw-away cluster that listens on
# a Unix socket only, started once per test process; ``tests/pgcluster.py``). It also sets
# ``PLANRUN_JOURNAL``, so the real CLI uses it. The PostgreSQL tests are marked
# ``postgres``; tests marked ``sqlite`` (they look at the SQLite file) are not collected
# for PostgreSQL. They are skipped only when no PostgreSQL server is installed (`.ci/run`
# installs one).

BACKENDS = ("sqlite", "postgres")


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Any]:
    """A throw-away PostgreSQL cluster for this test process (removed at the end)."""
    from pgcluster import Cluster, server_bindir

    bindir = server_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL server installed (no initdb/pg_ctl/postgres in "
                    "/usr/lib/postgresql/*/bin, pg_config --bindir or PATH); "
                    "`.ci/run` installs the OS package")
    pytest.importorskip("psycopg", reason="psycopg 3 is not installed (pip install -e '.[test]')")
    cluster = Cluster.start(bindir)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pg_url(request: pytest.FixtureRequest, pg_cluster: Any) -> str:
    """The URL of a fresh, empty PostgreSQL journal database (one per test)."""
    return str(pg_cluster.database(request.node.name))


@pytest.fixture(params=BACKENDS)
def journal_location(request: pytest.FixtureRequest, tmp_path: Path,
                     monkeypatch: pytest.MonkeyPatch) -> Path | str:
    """A fresh journal location of each backend, also set as ``PLANRUN_JOURNAL``."""
    location: Path | str
    if request.param == "postgres":
        location = str(request.getfixturevalue("pg_url"))
    else:
        location = tmp_path / "journal.sqlite3"
    monkeypatch.setenv("PLANRUN_JOURNAL", str(location))
    return location


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the PostgreSQL variants ``postgres``; drop those of tests marked ``sqlite``."""
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        on_pg = callspec is not None and callspec.params.get("journal_location") == "postgres"
        if on_pg or "pg_url" in getattr(item, "fixturenames", ()):
            if item.get_closest_marker("sqlite") is not None and on_pg:
                dropped.append(item)
                continue
            item.add_marker(pytest.mark.postgres)
        keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


# --- the argument-check memo (planrun.validation.arguments) ----------------------------


@pytest.fixture
def empty_memo() -> Iterator[None]:
    """The memo of argument fits, empty before and after the test (and none kept)."""
    from planrun import fits
    from planrun.validation import arguments as memo

    memo._FITS.clear()
    fits.reset()
    yield
    memo._FITS.clear()
    fits.reset()


@pytest.fixture
def schema_checks(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every instance a tool's JSON Schema validator checks, in order."""
    from planrun.registry import ToolSpec

    seen: list[Any] = []
    real = ToolSpec.validator.func  # type: ignore[attr-defined]

    class Counted:
        def __init__(self, validator: Any) -> None:
            self.validator = validator

        def iter_errors(self, instance: Any) -> Any:
            seen.append(instance)
            return self.validator.iter_errors(instance)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.validator, name)

    monkeypatch.setattr(ToolSpec, "validator", property(lambda self: Counted(real(self))))
    return seen
