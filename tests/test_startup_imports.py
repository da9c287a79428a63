"""Start-up import budget: what ``--help``, ``validate`` and ``execute`` must not import.

Not a timing (timings are in benchmarks/): the modules a real ``planrun`` process holds at
exit. Each entry of a budget is a cost measured with ``python -X importtime`` (issue 16):
pydantic and its plugin loader (``importlib.metadata``, ``email``) ~100 ms, cel-python and
lark ~0.2 s plus its parser, jsonschema ~40 ms, rich, asyncio and sqlite3 on commands that
do not run anything. ``validate`` and ``execute`` check a plan's steps, head and tools
without ``planrun.models`` (:mod:`planrun.formats`: pydantic judges only what the plain
check cannot accept, and an ``accepts`` contract is a pydantic model), and Typer's own
value conversion (``typer._adapters``, a pydantic ``TypeAdapter`` per parameter) is
replaced by planrun.cli.coercion on every command: a plan without an ``accepts`` tool
loads no pydantic at all (it is in the ``validate`` and ``execute`` budgets).
``platform``, ``uuid``, ``shellingham`` and ``subprocess`` are imported by Typer itself
when it loads, so they
are not in the budgets. The command modules of ``planrun.cli`` other than the one that
runs are not imported either: the root group converts only the command that runs (Typer's
conversion of all 27 commands took ~40 ms of every start).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PROBE = textwrap.dedent("""
    import atexit, json, sys
    def report():
        sys.stderr.write("MODULES:" + json.dumps(sorted(sys.modules)) + "\\n")
        built = sys.modules["planrun.cli.app"]._BUILT
        def conversions(cmd):
            out = {p.name: type(p._runtime_param).__name__ for p in cmd.params}
            for name, sub in getattr(cmd, "commands", {}).items():
                out.update({name + " " + k: v for k, v in conversions(sub).items()})
            return out
        sys.stderr.write("CONVERSIONS:" + json.dumps(
            {name: conversions(cmd) for name, cmd in built.items()}) + "\\n")
    atexit.register(report)
    from planrun.cli import main
    sys.argv = ["planrun", *sys.argv[1:]]
    main()
""")

TOOLS = """\
tools:
  noop:
    description: Does nothing
    python: bench_tools:noop
    arguments: {type: object, properties: {n: {type: integer}}, required: [n],
                additionalProperties: false}
"""
CHAIN = """\
planrun: 1
goal: three no-op steps
steps:
  - {id: s1, tool: noop, arguments: {n: 1}}
  - {id: s2, tool: noop, depends_on: [s1], arguments: {n: 2}}
  - {id: s3, tool: noop, depends_on: [s2], arguments: {n: 3}}
"""
WHEN = CHAIN.replace("arguments: {n: 3}}", "arguments: {n: 3}, when: 'true'}")

#: Nothing --help needs: the plan machinery and every heavy library.
HELP_BUDGET = ["pydantic", "pydantic_core", "celpy", "lark", "rich", "email",
               "importlib.metadata", "jsonschema", "yaml", "asyncio", "sqlite3",
               "planrun.api", "planrun.models", "planrun.validation", "planrun.execution"]
#: The command modules of the CLI; each command below may import only its own.
CLI_COMMANDS = ["planrun.cli.agents", "planrun.cli.approvals", "planrun.cli.importing",
                "planrun.cli.maintenance", "planrun.cli.planning", "planrun.cli.plans",
                "planrun.cli.read", "planrun.cli.repair", "planrun.cli.run"]
#: validate reads and checks plans (yaml, jsonschema) but runs nothing.
VALIDATE_BUDGET = ["celpy", "lark", "rich", "asyncio", "sqlite3", "planrun.models",
                   "pydantic", "pydantic_core", "email", "importlib.metadata",
                   "planrun.execution", "planrun.dispatch", "planrun.journal",
                   "planrun.approval", "planrun.policy",
                   *(m for m in CLI_COMMANDS if m != "planrun.cli.plans")]
#: execute of a plan without `when` off a terminal: no CEL, no rich, no extras' libraries,
#: no facets machinery for a plan that declares none.
EXECUTE_BUDGET = ["celpy", "lark", "rich", "psycopg", "distributed", "dask", "mcp",
                  "planrun.models", "pydantic", "pydantic_core", "planrun.facets",
                  "planrun.report", "planrun.importing", "planrun.planners",
                  *(m for m in CLI_COMMANDS if m not in ("planrun.cli.run",
                                                         "planrun.cli.planning"))]


def loaded(root: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=root, env=os.environ.copy(),
                          capture_output=True, text=True, timeout=120, check=False,
                          stdin=subprocess.DEVNULL)
    line = [x for x in proc.stderr.splitlines() if x.startswith("MODULES:")][-1]
    return proc, set(json.loads(line.removeprefix("MODULES:")))


def over_budget(modules: set[str], budget: list[str]) -> list[str]:
    return sorted(m for m in modules
                  if any(m == b or m.startswith(b + ".") for b in budget))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "plans").mkdir()
    (tmp_path / "tools.yaml").write_text(TOOLS)
    (tmp_path / "bench_tools.py").write_text("def noop(n):\n    return None\n")
    (tmp_path / "plans" / "chain.yaml").write_text(CHAIN)
    (tmp_path / "plans" / "when.yaml").write_text(WHEN)
    return tmp_path


def test_help_imports_nothing_heavy(project: Path) -> None:
    proc, modules = loaded(project, "--help")
    assert proc.returncode == 0, proc.stderr
    assert "validate" in proc.stdout
    assert over_budget(modules, HELP_BUDGET) == []


def test_version_and_runs_need_no_cel_and_no_rich(project: Path) -> None:
    for args in (["--version"], ["runs"]):
        proc, modules = loaded(project, *args)
        assert proc.returncode == 0, proc.stderr
        assert over_budget(modules, ["celpy", "lark", "rich", "asyncio"]) == [], args
    # --version is the root's own option: no command is converted, none of their modules
    assert over_budget(modules_of(project, "--version"), CLI_COMMANDS) == []


def modules_of(root: Path, *args: str) -> set[str]:
    proc, modules = loaded(root, *args)
    assert proc.returncode == 0, proc.stderr
    return modules


def test_a_command_and_its_help_convert_only_that_command(project: Path) -> None:
    """``planrun show --help`` and ``planrun runs`` load their own command module only."""
    assert over_budget(modules_of(project, "show", "--help"),
                       [m for m in CLI_COMMANDS if m != "planrun.cli.plans"]) == []
    assert over_budget(modules_of(project, "runs"),
                       [m for m in CLI_COMMANDS if m != "planrun.cli.read"]) == []


def test_validate_of_a_plan_without_when_stays_in_budget(project: Path) -> None:
    proc, modules = loaded(project, "validate", "chain")
    assert proc.returncode == 0, proc.stderr
    assert "jsonschema" in modules  # the probe sees what validation loads
    assert over_budget(modules, VALIDATE_BUDGET) == []


def test_execute_of_a_plan_without_when_stays_in_budget(project: Path) -> None:
    proc, modules = loaded(project, "execute", "chain", "--max-parallel", "2")
    assert proc.returncode == 0, proc.stderr
    assert "asyncio" in modules
    assert over_budget(modules, EXECUTE_BUDGET) == []


#: What a process that finds every check's verdict kept (planrun.fits) need not load.
CONTRACT_LIBRARIES = ["jsonschema", "referencing", "jsonschema_specifications", "attrs",
                      "attr", "rpds", "re2"]


def test_validate_and_execute_again_load_no_jsonschema(project: Path) -> None:
    """The second process of an unchanged plan and registry learns every fit from the first."""
    assert "jsonschema" in modules_of(project, "validate", "chain")  # the first must check
    assert over_budget(modules_of(project, "validate", "chain"), CONTRACT_LIBRARIES) == []
    assert over_budget(modules_of(project, "execute", "chain"), CONTRACT_LIBRARIES) == []
    # another value of the same shape: the contract looks only at shapes, so it fits too
    (project / "plans" / "chain.yaml").write_text(CHAIN.replace("{n: 3}", "{n: 30}"))
    assert over_budget(modules_of(project, "execute", "chain"), CONTRACT_LIBRARIES) == []
    # a value that breaks the contract is judged by jsonschema, in every process
    (project / "plans" / "chain.yaml").write_text(CHAIN.replace("{n: 3}", "{n: '3'}"))
    for _ in range(2):
        proc, modules = loaded(project, "validate", "chain")
        assert proc.returncode == 3, proc.stderr
        assert "error[arguments]" in proc.stdout
        assert "jsonschema" in modules
    (project / "plans" / "chain.yaml").write_text(CHAIN)
    # another contract: every check of its tool again
    (project / "tools.yaml").write_text(TOOLS.replace("{type: integer}",
                                                      "{type: integer, minimum: 0}"))
    assert "jsonschema" in modules_of(project, "validate", "chain")


def test_resume_after_a_kill_loads_no_jsonschema(project: Path) -> None:
    """The fits of a run's validation are kept before it runs: its resume needs none."""
    (project / "tools.yaml").write_text(TOOLS.replace(
        "python: bench_tools:noop", "python: bench_tools:noop\n    idempotent: true"))
    killed = subprocess.run([sys.executable, "-m", "planrun", "execute", "chain"], cwd=project,
                            env={**os.environ, "PLANRUN_TEST_CRASH": "dispatch:s2"},
                            capture_output=True, text=True, timeout=120, check=False,
                            stdin=subprocess.DEVNULL)
    assert killed.returncode == -9, killed.stderr
    proc, modules = loaded(project, "resume")
    assert proc.returncode == 0, proc.stderr
    assert "3/3 succeeded" in proc.stdout + proc.stderr
    assert over_budget(modules, CONTRACT_LIBRARIES) == []
    # the registry's data was kept when execute parsed it (planrun.parse_cache): no PyYAML
    assert over_budget(modules, ["yaml", "planrun.yamltext"]) == []


def test_an_unchanged_yaml_plan_and_registry_are_not_parsed_again(project: Path) -> None:
    """The second process reads the kept data of both texts; an edited text is parsed."""
    assert "yaml" in modules_of(project, "validate", "chain")  # the first parses
    assert over_budget(modules_of(project, "validate", "chain"), ["yaml"]) == []
    assert over_budget(modules_of(project, "execute", "chain"), ["yaml"]) == []
    (project / "plans" / "chain.yaml").write_text(CHAIN.replace("{n: 3}", "{n: 4}"))
    assert "yaml" in modules_of(project, "validate", "chain")
    assert over_budget(modules_of(project, "validate", "chain"), ["yaml"]) == []
    # a plan with a problem is parsed (kept data), then composed to locate the problem
    (project / "plans" / "chain.yaml").write_text(CHAIN.replace("{n: 3}", "{n: '3'}"))
    for _ in range(2):
        proc, _modules = loaded(project, "validate", "chain")
        assert proc.returncode == 3, proc.stderr
        assert "chain.yaml:6:" in proc.stdout, proc.stdout


def conversions(proc: subprocess.CompletedProcess[str]) -> dict[str, dict[str, str]]:
    """The class converting each parameter's value, per command converted in ``proc``."""
    line = [x for x in proc.stderr.splitlines() if x.startswith("CONVERSIONS:")][-1]
    found: dict[str, dict[str, str]] = json.loads(line.removeprefix("CONVERSIONS:"))
    return found


@pytest.mark.parametrize(("args", "status"), [
    (["validate", "chain"], 0), (["execute", "chain"], 0), (["runs", "--limit", "3"], 0),
    (["-C", ".", "status", "--journal", "j.sqlite3"], 5),  # no run yet: exit 5
    (["policy", "check"], 0)], ids=lambda x: " ".join(x) if isinstance(x, list) else str(x))
def test_commands_convert_their_values_without_typers_pydantic_adapters(
        project: Path, args: list[str], status: int) -> None:
    """Typer 0.29 converts each value with a pydantic TypeAdapter (typer._adapters)."""
    proc, modules = loaded(project, *args)
    assert proc.returncode == status, proc.stderr
    assert over_budget(modules, ["typer._adapters"]) == []
    command = args[2] if args[0] == "-C" else args[0]
    params = conversions(proc)[command]
    assert params  # the converted command's parameters …
    assert set(params.values()) == {"PlanrunParam"}  # … all use planrun's conversion
    if command in ("runs", "status"):  # no plan models either: no pydantic at all
        assert over_budget(modules, ["pydantic", "pydantic_core"]) == []


def test_a_plan_with_when_loads_cel_but_still_no_rich(project: Path) -> None:
    proc, modules = loaded(project, "execute", "when")
    assert proc.returncode == 0, proc.stderr
    assert "celpy" in modules
    assert over_budget(modules, ["rich"]) == []


def test_a_plan_that_breaks_the_step_rules_is_judged_by_pydantic(project: Path) -> None:
    (project / "plans" / "bad.yaml").write_text(CHAIN.replace("{n: 2}}", "{n: 2}, retry: 2}"))
    proc, modules = loaded(project, "validate", "bad")
    assert proc.returncode == 3, proc.stderr
    assert "unknown field 'retry'" in proc.stdout + proc.stderr
    assert "pydantic" in modules


def test_a_step_only_the_model_accepts_is_checked_by_it_and_passes(project: Path) -> None:
    """An int beyond 64 bits in ``max_recoveries``: not certain without pydantic, valid."""
    (project / "plans" / "big.yaml").write_text(
        CHAIN.replace("{n: 3}}", "{n: 3}, max_recoveries: 100000000000000000000}"))
    proc, modules = loaded(project, "validate", "big")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "planrun.models" in modules


ACCEPTS_TOOLS = TOOLS + """\
  typed:
    python: typed_tools:run
    accepts: typed_tools:Args
"""
TYPED_TOOLS = """\
from pydantic import BaseModel

class Args(BaseModel):
    n: int

def run(n):
    return {"doubled": 2 * n}
"""


def test_a_registry_with_an_accepts_contract_loads_pydantic_and_works(project: Path) -> None:
    (project / "tools.yaml").write_text(ACCEPTS_TOOLS)
    (project / "typed_tools.py").write_text(TYPED_TOOLS)
    (project / "plans" / "typed.yaml").write_text(
        "planrun: 1\ngoal: a typed call\nsteps:\n  - {id: t, tool: typed, arguments: {n: 4}}\n")
    for args in (["validate", "typed"], ["execute", "typed"]):
        proc, modules = loaded(project, *args)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "pydantic" in modules, args
    (project / "plans" / "typed.yaml").write_text(
        "planrun: 1\ngoal: a typed call\nsteps:\n  - {id: t, tool: typed, arguments: {n: x}}\n")
    proc, _ = loaded(project, "validate", "typed")
    assert proc.returncode == 3, proc.stdout + proc.stderr
