"""Fits kept between processes (planrun.fits, issue 16): only fits, only for the same code.

Each test has its own ``HOME`` (conftest), so its own cache folder. A "later process" is
simulated in-process by forgetting what this one holds (:func:`planrun.fits.reset` and the
in-process memo); the real later processes are in ``test_startup_imports.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import platformdirs
import pytest

from conftest import Project, codes
from planrun import fits
from planrun.validation import arguments as memo
from planrun.validation.arguments import argument_problems

PLAN = """\
planrun: 1
goal: count
steps:
  - {id: a, tool: lister, arguments: {n: 3}}
"""


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    fits.reset()
    memo._FITS.clear()
    yield
    fits.reset()
    memo._FITS.clear()
    fits.checker.cache_clear()


def later_process() -> None:
    """Forget everything this process learnt, as a new process would not know it."""
    fits.reset()
    memo._FITS.clear()


def kept_lines() -> list[str]:
    folder = Path(platformdirs.user_cache_path("planrun"))
    files = sorted(folder.glob("fits-*.txt"))
    assert len(files) <= 1, files
    return files[0].read_text().split() if files else []


@pytest.fixture
def meta_checks(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every schema checked against the 2020-12 metaschema, in order."""
    from planrun import registry

    seen: list[Any] = []
    real = registry._schema_problems

    def counted(schema: Any) -> list[tuple[str, str]]:
        seen.append(schema)
        return real(schema)

    monkeypatch.setattr(registry, "_schema_problems", counted)
    return seen


def test_a_later_process_checks_nothing_it_found_to_fit(
        basic_project: Project, schema_checks: list[Any], meta_checks: list[Any]) -> None:
    report, plan = basic_project.check(PLAN)
    assert plan is not None, report
    assert schema_checks == [{"n": 3}]
    assert meta_checks  # every schema of the registry, once
    first_meta = len(meta_checks)
    lines = kept_lines()
    assert len(lines) == first_meta + 1  # the schemas and one arguments fit
    later_process()
    report, plan = basic_project.check(PLAN)
    assert plan is not None, report
    assert schema_checks == [{"n": 3}]  # not checked again
    assert len(meta_checks) == first_meta
    assert kept_lines() == lines  # nothing new to keep


def test_a_problem_is_never_kept(basic_project: Project, schema_checks: list[Any]) -> None:
    bad = PLAN.replace("{n: 3}", "{n: -1}")
    first, _ = basic_project.check(bad)
    schemas_only = kept_lines()
    later_process()
    second, _ = basic_project.check(bad)
    assert codes(first) == codes(second) == ["arguments"]
    assert [i.message for i in first.issues] == [i.message for i in second.issues]
    assert schema_checks == [{"n": -1}, {"n": -1}]
    assert kept_lines() == schemas_only


def test_a_broken_schema_is_reported_by_every_process(project: Project) -> None:
    project.write("tools.yaml", """\
        tools:
          t:
            python: os:getcwd
            arguments: {type: object, properties: {n: {type: integr}}}
        """)
    for _ in range(2):
        later_process()
        _, issues = project.registry()
        assert [i.code for i in issues] == ["registry"]
        assert "integr" in issues[0].message
    assert kept_lines() == []


def test_another_contract_is_checked_again(basic_project: Project,
                                           schema_checks: list[Any]) -> None:
    basic_project.check(PLAN)
    tools = basic_project.root / "tools.yaml"
    tools.write_text(tools.read_text().replace("n: {type: integer, minimum: 0}",
                                               "n: {type: integer, minimum: 5}"))
    later_process()
    report, plan = basic_project.check(PLAN)
    assert plan is None
    assert codes(report) == ["arguments"]
    assert "minimum" in report.issues[0].message
    assert schema_checks == [{"n": 3}, {"n": 3}]


def test_a_damaged_file_costs_a_check_and_never_skips_one(
        basic_project: Project, schema_checks: list[Any]) -> None:
    basic_project.check(PLAN)
    path = next(Path(platformdirs.user_cache_path("planrun")).glob("fits-*.txt"))
    lines = path.read_text().split()
    # every fit cut short, upper-cased, padded or glued to the next: none is a fit any more
    path.write_text("".join(f"{x[:-1]}\n{x.upper()}\n {x}\n{x}{x}\n\0garbage\n"
                            for x in lines))
    later_process()
    report, plan = basic_project.check(PLAN)
    assert plan is not None, report
    assert schema_checks == [{"n": 3}, {"n": 3}]


def test_a_folder_others_may_write_is_not_used(basic_project: Project,
                                               schema_checks: list[Any]) -> None:
    folder = Path(platformdirs.user_cache_path("planrun"))
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    for _ in range(2):
        later_process()
        basic_project.check(PLAN)
    assert schema_checks == [{"n": 3}, {"n": 3}]
    assert list(folder.iterdir()) == []


def test_a_fit_file_past_its_size_is_started_afresh(
        basic_project: Project, schema_checks: list[Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    basic_project.check(PLAN)
    monkeypatch.setattr(fits, "MAX_BYTES", 10)
    later_process()
    basic_project.check(PLAN)
    assert schema_checks == [{"n": 3}, {"n": 3}]
    assert len(kept_lines()) > 1  # written again from this check


def test_the_checker_changes_with_the_code_and_voids_the_old_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "lib" / "fakechecker"
    package.mkdir(parents=True)
    source = package / "__init__.py"
    source.write_text("X = 1\n")
    (package / "sub").mkdir()
    (package / "sub" / "rules.json").write_text("{}")
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    monkeypatch.setattr(fits, "CHECKER_PACKAGES", ("fakechecker",))
    fits.checker.cache_clear()
    first = fits.checker()
    fits.checker.cache_clear()
    assert fits.checker() == first  # nothing changed: the same
    fits.learn(fits.key("schema", "{}"))
    fits.save()
    folder = Path(platformdirs.user_cache_path("planrun"))
    assert [p.name for p in folder.iterdir()] == [f"fits-{first}.txt"]
    for change in (lambda: os.utime(source, ns=(1, 1)),
                   lambda: (package / "sub" / "rules.json").write_text('{"a": 1}'),
                   lambda: (package / "new.py").write_text("")):
        change()
        fits.checker.cache_clear()
        later_process()
        now = fits.checker()
        assert now != first
        assert not fits.known(fits.key("schema", "{}"))
        assert [p.name for p in folder.iterdir()] == []  # the old checker's file is gone
        fits.learn(fits.key("schema", "{}"))
        fits.save()
        first = now


def test_processes_at_once_keep_each_others_fits() -> None:
    """Four processes learning and saving at once: every line of each is in the file."""
    import subprocess

    script = ("import sys; from planrun import fits\n"
              "for round in range(20):\n"
              "    for i in range(50):\n"
              "        fits.learn(fits.key('schema', sys.argv[1], str(round), str(i)))\n"
              "    fits.save()\n")
    procs = [subprocess.Popen([sys.executable, "-c", script, f"p{n}"]) for n in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    expected = {fits.key("schema", f"p{n}", str(r), str(i))
                for n in range(4) for r in range(20) for i in range(50)}
    lines = kept_lines()
    assert len(lines) == len(expected)
    assert set(lines) == expected


@pytest.fixture
def strict_tool(project: Project) -> Any:
    project.write("tools.yaml", """\
        tools:
          t:
            python: os:getcwd
            arguments:
              type: object
              properties:
                "1": {type: integer}
                xs: {type: array}
              required: ["1"]
        """)
    registry, issues = project.registry()
    assert issues == []
    return registry["t"]


@pytest.mark.parametrize(("fits_first", "not_the_same"), [
    ({"1": 3}, {1: 3}),                        # an int key is not the string key
    ({"1": 3, "xs": [1]}, {"1": 3, "xs": (1,)}),  # jsonschema's array is a list
    ({"1": 3}, {"1": True}),                   # bool is not integer
    ({"1": 3}, {"1": 3.0}),                    # strict integer refuses 3.0
])
def test_values_a_check_tells_apart_never_share_a_fit(
        strict_tool: Any, fits_first: dict[Any, Any], not_the_same: dict[Any, Any]) -> None:
    assert argument_problems(strict_tool, fits_first) == []
    assert argument_problems(strict_tool, not_the_same) != []
    later_process()
    assert argument_problems(strict_tool, not_the_same) != []


def test_the_fits_module_loads_nothing_heavy() -> None:
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", "import sys, planrun.fits, planrun.validation.arguments; "
         "print(sorted(m for m in sys.modules if m.split('.')[0] in "
         "('jsonschema', 'referencing', 'platformdirs')))"],
        capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- found by attack (helper report, issue 16): each failed before its fix ---------------

NFC, NFD = "\u00e9", "e\u0301"


def say_tools(value: str) -> str:
    return ("tools:\n  say:\n    command: [echo, '{x}']\n    arguments:\n"
            "      type: object\n      required: [x]\n"
            f"      properties: {{x: {value}}}\n")


@pytest.mark.parametrize(("fits_it", "refuses_it", "arg"), [
    (f'{{const: "{NFC}"}}', f'{{const: "{NFD}"}}', f'"{NFC}"'),  # no Unicode normalising
    # the float 9223372036854775809.0 is 2^63: 2^63 + 1 is over it (multipleOf 2.0 and 2
    # were the pair once, when jsonschema divided in floats; planrun's multipleOf is exact)
    ("{type: integer, maximum: 9223372036854775809}",
     "{type: integer, maximum: 9223372036854775809.0}", "9223372036854775809"),
])
def test_a_contract_edit_that_normalising_would_hide_is_checked_again(
        project: Project, fits_it: str, refuses_it: str, arg: str) -> None:
    plan = f"planrun: 1\ngoal: g\nsteps:\n  - {{id: a, tool: say, arguments: {{x: {arg}}}}}\n"
    project.write("tools.yaml", say_tools(refuses_it))
    cold, _ = project.check(plan, registry=project.registry()[0])
    assert codes(cold) == ["arguments"]
    later_process()
    project.write("tools.yaml", say_tools(fits_it))
    _, fitted = project.check(plan, registry=project.registry()[0])
    assert fitted is not None
    for _ in range(2):  # in this process, and in a later one
        project.write("tools.yaml", say_tools(refuses_it))
        warm, _ = project.check(plan, registry=project.registry()[0])
        assert codes(warm) == ["arguments"]
        later_process()


def test_a_contract_with_format_keeps_no_fit_for_later_processes(project: Project) -> None:
    """Most formats are asserted only when an optional package is importable."""
    project.write("tools.yaml", say_tools("{type: string, format: date-time}"))
    plan = "planrun: 1\ngoal: g\nsteps:\n  - {id: a, tool: say, arguments: {x: yesterday}}\n"
    _, checked = project.check(plan, registry=project.registry()[0])
    assert checked is not None  # no date-time package here: the format is not asserted
    schema_lines = kept_lines()  # the schema itself is valid whatever is installed
    assert len(schema_lines) == 1
    later_process()
    project.check(plan, registry=project.registry()[0])
    assert kept_lines() == schema_lines


@pytest.mark.parametrize("secret", [True, False])
def test_a_secret_value_leaves_no_hash_in_the_file(project: Project, secret: bool) -> None:
    from planrun.validation.arguments import _fit_key
    from planrun.validation.plan import ParamInput

    project.write("tools.yaml", say_tools("{type: string, minLength: 4}"))
    plan = (f"planrun: 1\ngoal: g\nparams:\n  token: {{type: string, secret: {secret}}}\n"
            "steps:\n  - {id: a, tool: say, arguments: {x: '{params.token}'}}\n")
    registry = project.registry()[0]
    report, checked = project.check(plan, registry=registry,
                                    given=ParamInput(cli={"token": "hunter2"}))
    assert checked is not None, report
    key = _fit_key(registry["say"], {"x": "hunter2"})
    assert key is not None
    assert key[1] == "value"  # minLength: checked by value, so the line would hash it
    assert (fits.key("arguments", *key) in kept_lines()) is not secret


@pytest.mark.parametrize("special", ["fifo", "dev-zero", "symlink"])
def test_a_fits_file_that_is_no_regular_file_is_never_read_or_written(
        basic_project: Project, tmp_path: Path, special: str) -> None:
    folder = Path(platformdirs.user_cache_path("planrun"))
    folder.mkdir(parents=True, mode=0o700)
    path = folder / f"fits-{fits.checker()}.txt"
    victim = tmp_path / "victim"
    victim.write_text("")
    if special == "fifo":
        os.mkfifo(path)
    elif special == "dev-zero":
        path.symlink_to("/dev/zero")
    else:
        path.symlink_to(victim)
    code = ("import sys; sys.path[:0] = sys.argv[1:]\n"
            "from pathlib import Path\nfrom planrun import fits\n"
            "from planrun.registry import load_registry\n"
            "load_registry(Path('tools.yaml'))\nfits.save()\n")
    done = subprocess.run([sys.executable, "-c", code, *sys.path], cwd=basic_project.root,
                          timeout=60, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == ""


def test_a_file_another_process_just_made_is_not_removed_as_another_checker_s(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race of four processes at once, made certain: the file appears between this
    process's "is it there?" and its removal of other checkers' files."""
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    mine = folder / f"fits-{fits.checker()}.txt"
    mine.write_text(fits.key("schema", "made by another process") + "\n")
    stale = folder / "fits-0000000000000000.txt"
    stale.write_text("")
    real_exists = Path.exists
    monkeypatch.setattr(Path, "exists",
                        lambda self, **kw: False if self == mine else real_exists(self, **kw))
    assert fits._file(folder) == mine
    assert real_exists(mine)
    assert not real_exists(stale)


@pytest.mark.parametrize("spelling", [
    'pin: {type: string, secret: true, default: "SECRET"}',
    'pin: {type: string, secret: true, enum: ["SECRET", "other"]}',
    'pin: {secret: true, const: "SECRET"}',
    'pin: {type: string, secret: yes, default: "SECRET"}',  # not a boolean: kept as secret
])
def test_no_kept_fit_depends_on_a_secret_parameters_schema(basic_project: Project,
                                                            spelling: str) -> None:
    """A secret's schema may hold its value: nothing to guess it from in the cache folder.

    The same plan with two values of the secret leaves the same lines (found by a fresh
    helper: a four-digit default was recovered from its schema's fit by trying all 10,000).
    """
    plan = PLAN.replace("goal: count\n", "goal: count\nparams:\n  " + spelling + "\n")
    kept = []
    for value in ("4821", "4822"):
        later_process()
        basic_project.check(plan.replace("SECRET", value))
        kept.append(sorted(kept_lines()))
        folder = Path(platformdirs.user_cache_path("planrun"))
        assert not [p for p in folder.iterdir() if value in p.read_text(errors="replace")]
    assert kept[0] == kept[1]
    assert kept[0]  # the registry's own schemas are still kept


TAKE = """\
tools:
  take:
    python: os:getcwd
    arguments: {type: object, properties: {v: {}}, required: [v], additionalProperties: false}
"""


@pytest.mark.parametrize(("declared", "values"), [
    ("{type: array, secret: true}", ('["a"]', '["a", "b"]')),
    ("{type: object, secret: true}", ("{k: 1}", "{j: 1}")),
    ("{type: number, secret: true}", ("1", "1.5")),
    ("{type: string, secret: true}", ("a", "bb")),
])
@pytest.mark.parametrize("given", ["default", "-p"])
def test_no_kept_fit_depends_on_a_secret_argument(project: Project, declared: str,
                                                  values: tuple[str, str], given: str) -> None:
    """Arguments holding a secret keep no fit, also none keyed by their shape: a shape
    tells a list's length, an object's keys, an integer from a float (found by a fresh
    helper: a shape fit confirmed a guessed secret)."""
    import yaml

    from planrun.validation import ParamInput

    project.write("tools.yaml", TAKE)
    kept = []
    for value in values:
        later_process()
        decl = declared if given == "-p" else declared[:-1] + f", default: {value}}}"
        plan = ("planrun: 1\ngoal: take\nparams:\n  s: " + decl
                + "\nsteps:\n  - {id: b, tool: take, arguments: {v: \"{params.s}\"}}\n")
        parsed = yaml.safe_load(value)
        inp = ParamInput(file_values={"s": parsed}) if given == "-p" else None
        report, checked = project.check(plan, registry=project.registry()[0], given=inp)
        assert checked is not None, report
        kept.append(sorted(kept_lines()))
    assert kept[0] == kept[1]
    assert kept[0]  # the registry's own schemas are still kept
