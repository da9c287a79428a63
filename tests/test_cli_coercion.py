"""planrun's conversion of command-line values (planrun.cli.coercion) against Typer's own.

The oracle is Typer 0.29's own ``build_runtime_param(descriptor)`` (a pydantic
``TypeAdapter``): for every parameter of every command (walked through the lazy root
group, help options and the root's own options included), each sample value converts to
exactly what Typer gives, or planrun's converter declines and Typer's own decides. The
fast path must actually be installed (else pydantic comes back silently at every start),
and bad values on the real command line give Typer's message and exit status 2.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
import typer.main
from hypothesis import given, settings
from hypothesis import strategies as st
from typer import _click as click
from typer._coercion import build_runtime_param

from planrun.cli import coercion
from test_startup_imports import CHAIN, TOOLS

APP = importlib.import_module("planrun.cli.app")


def walk() -> Iterator[tuple[str, Any, click.Context]]:
    """(command path, parameter, its context) for every parameter of every command."""
    root = typer.main.get_command(APP.app)  # the root group, completion options included
    root_ctx = click.Context(root, info_name="planrun", help_option_names=["-h", "--help"])
    assert coercion.install(root, root_ctx) > 0
    for param in root.get_params(root_ctx):
        yield "planrun", param, root_ctx
    for name in APP._COMMANDS:
        cmd = APP._build(name)
        coercion.install(cmd, root_ctx)
        ctx = click.Context(cmd, parent=root_ctx, info_name=name)
        for param in cmd.get_params(ctx):
            yield name, param, ctx
        for sub_name, sub in getattr(cmd, "commands", {}).items():
            sub_ctx = click.Context(sub, parent=ctx, info_name=sub_name)
            for param in sub.get_params(sub_ctx):
                yield f"{name} {sub_name}", param, sub_ctx


PARAMS = list(walk())

STRINGS = ["", "a", "last", "-", " x ", "a b", "1", "é", "\udcff", "\x00", "--x"]
INTS = ["0", "1", "-1", "7", "-0", "007", " 7", "7 ", "+7", "1_000", "1.0", "1e3", "x", "",
        "0x10", "\u0661", "1000", "1001", "999999999999999999", "1000000000000000000",
        "9223372036854775807", "9223372036854775808", "-9223372036854775809"]
FLOATS = ["0", "1", "-1", "1.5", "-1.5", ".5", "5.", "1e3", "inf", "-inf", "nan", "-0",
          "0.1", "00.5", "1_0.5", " 1", "x", "", "999999999.9999999", "1000000000",
          "1000000000.0", "1000000000.0000001", "123456789012345.123456789012345",
          "1234567890123456.5"]
PATHS = ["", "a", "a/b", "/etc", "/etc/hostname", "-", "~", "\x00", "\udcff", "/nonexistent/x"]
BOOLS: list[Any] = [True, False, "true", "0", "yes", "", "maybe"]
LISTS: list[Any] = [(), ("a",), ("a", "b"), ["x", "y"], ("\udcff",), ("", "-"), "a"]


def samples(annotation: Any) -> list[Any]:
    """Sample raw values for a parameter of ``annotation`` (as Typer's descriptor has it)."""
    if get_origin(annotation) is list:
        (item,) = get_args(annotation)
        return [*LISTS, tuple(samples(item)[:4])]
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        values = [m.value for m in annotation]
        return [*values, *(str(v).upper() for v in values), *list(annotation), "bogus", ""]
    table: dict[Any, list[Any]] = {str: STRINGS, int: INTS, float: FLOATS, Path: PATHS,
                                   bool: BOOLS}
    return table[annotation]


#: Values the fast path must decide itself (else it would hand every value to pydantic).
def happy(annotation: Any) -> list[Any]:
    if get_origin(annotation) is list:
        return [(), ("a", "b")]
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return [next(iter(annotation)).value]
    table: dict[Any, list[Any]] = {str: ["a", ""], int: ["1", "7"], float: ["1.5", "2"],
                                   Path: ["a/b"], bool: [True]}
    return table[annotation]


def outcome(runtime: Any, value: Any, param: Any, ctx: click.Context) -> tuple[Any, ...]:
    """What converting ``value`` gives: the value (type and repr) or the error's message."""
    try:
        result = runtime.coerce(value, param=param, ctx=ctx)
    except Exception as exc:
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        return ("error", type(exc).__name__, message)
    items = [type(x).__name__ for x in result] if isinstance(result, (list, tuple)) else None
    return ("ok", type(result).__name__, repr(result), items)


def ident(item: tuple[str, Any, click.Context]) -> str:
    return f"{item[0]}:{item[1].name}"


def test_every_parameter_of_every_command_gets_the_fast_path() -> None:
    """A new kind of annotation (or a Typer that changed shape) must be noticed here."""
    cls = coercion._param_class()
    assert cls is not None, "Typer is not as planrun.cli.coercion expects"
    missing = [ident(item) for item in PARAMS if type(item[1]._runtime_param) is not cls]
    assert missing == []
    assert {ident(item) for item in PARAMS} >= {"planrun:project", "planrun:help",
                                                "planrun:install_completion",
                                                "validate:plans", "execute:max_parallel",
                                                "policy check:fmt", "import:file"}


@pytest.mark.parametrize("item", PARAMS, ids=ident)
def test_each_value_converts_as_typer_converts_it(
        item: tuple[str, Any, click.Context]) -> None:
    _, param, ctx = item
    fast = param._runtime_param
    typer_own = build_runtime_param(param.type_descriptor)
    annotation = param.type_descriptor.annotation
    for value in [None, *samples(annotation)]:
        expected = outcome(typer_own, value, param, ctx)
        assert outcome(fast, value, param, ctx) == expected, value
        try:
            decided = fast.convert(value, param, ctx)
        except Exception:
            decided = coercion._UNDECIDED
        if decided is not coercion._UNDECIDED:  # else Typer's own decided (checked above)
            assert expected[0] == "ok", value
            assert ("ok", type(decided).__name__, repr(decided)) == expected[:3], value
    for value in happy(annotation):
        if param.multiple or param.nargs == -1 or not isinstance(value, tuple):
            assert fast.convert(value, param, ctx) is not coercion._UNDECIDED, value


#: The numeric parameters, one of each (type, min, max).
NUMERIC = list({(p.type_descriptor.annotation, p.type_descriptor.parameter_info.min,
                 p.type_descriptor.parameter_info.max): (p, ctx)
                for _, p, ctx in PARAMS
                if p.type_descriptor.annotation in (int, float)}.values())
NUMBERISH = st.from_regex(r"\A[-+ ]?[0-9_]{0,21}(\.[0-9_]{0,17})?([eE][-+]?[0-9]{1,3})?\Z")


def test_the_numeric_parameters_are_sampled() -> None:
    kinds = {p.type_descriptor.annotation for p, _ in NUMERIC}
    assert kinds == {int, float}
    assert len(NUMERIC) >= 4


@settings(deadline=None, max_examples=300)
@given(value=st.one_of(NUMBERISH, st.text(max_size=24),
                       st.integers(-(10**20), 10**20).map(str),
                       st.floats(allow_nan=False).map(repr)))
def test_numbers_convert_as_typer_converts_them(value: str) -> None:
    for param, ctx in NUMERIC:
        typer_own = build_runtime_param(param.type_descriptor)
        assert outcome(param._runtime_param, value, param, ctx) == outcome(
            typer_own, value, param, ctx), (param.name, value)


def test_the_fast_path_needs_typer_as_it_is(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A Typer whose RuntimeParam has other fields gets nothing installed, and no crash."""
    from typer import _coercion

    @dataclasses.dataclass(frozen=True)
    class Other:
        annotation: Any

    def numbers(n: int, name: str = "x") -> None:
        typer.echo(f"{n + 1} {name}")

    one = APP._sub_app()
    one.command("numbers")(numbers)
    cmd = typer.main.get_command(one)
    monkeypatch.setattr(_coercion, "RuntimeParam", Other)
    monkeypatch.setattr(coercion, "_fast_class", [])
    assert coercion.install(cmd) == 0
    params: list[Any] = cmd.params
    assert all(p._runtime_param is None for p in params)
    assert coercion.install(object()) == 0
    monkeypatch.undo()  # Typer as it is: the fast path, and the command runs the same
    assert coercion.install(cmd) == len(cmd.params)
    cmd.main(["41", "--name", "y"], standalone_mode=False)
    assert capsys.readouterr().out == "42 y\n"


# --- the real command line -------------------------------------------------------------------

# the 3-step project of the start-up budget test (one copy of its tools and plan)
#: planrun as Typer alone would run it: nothing of planrun.cli.coercion installed.
TYPER_ONLY = textwrap.dedent("""
    import atexit, sys
    from planrun.cli import main
    sys.modules["planrun.cli.app"].install_coercion = lambda *args, **kwargs: 0
    atexit.register(lambda: sys.stderr.write(
        "\\nADAPTERS:%s" % ("typer._adapters" in sys.modules)))
    sys.argv = ["planrun", *sys.argv[1:]]
    main()
""")
#: (argv, exit status): bad values, and good ones the fast path leaves to Typer.
CASES = [
    (["runs", "--limit", "0"], 2),
    (["runs", "--limit", "x"], 2),
    (["runs", "--limit", "99999999999999999999"], 2),
    (["runs", "--limit", " 5"], 0),
    (["runs", "--status", "bogus"], 2),
    (["runs", "--status", "FAILED"], 2),
    (["execute", "chain", "--approval-timeout", "nan"], 2),
    (["execute", "chain", "--max-parallel", "0"], 2),
    (["graph", "chain", "--format", "nope"], 2),
    (["completion", "tcsh"], 2),
    (["-C", ".", "runs", "--limit", "1_0"], 0),
]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "plans").mkdir()
    (tmp_path / "tools.yaml").write_text(TOOLS)
    (tmp_path / "bench_tools.py").write_text("def noop(n):\n    return None\n")
    (tmp_path / "plans" / "chain.yaml").write_text(CHAIN)
    return tmp_path


def run(root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], cwd=root, env=os.environ.copy(),
                          capture_output=True, text=True, timeout=120, check=False,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(("argv", "status"), CASES, ids=lambda x: " ".join(map(str, x))
                         if isinstance(x, list) else str(x))
def test_the_command_line_answers_as_typer_alone(project: Path, argv: list[str],
                                                 status: int) -> None:
    ours = run(project, "-m", "planrun", *argv)
    typers = run(project, "-c", TYPER_ONLY, *argv)
    stderr, _, adapters = typers.stderr.rpartition("\nADAPTERS:")
    assert adapters == "True"  # the reference did go through Typer's pydantic adapters
    assert (ours.returncode, ours.stdout, ours.stderr) == (typers.returncode, typers.stdout,
                                                           stderr)
    assert ours.returncode == status, ours.stderr
    if status == 2:
        assert ours.stderr.startswith("planrun: error[usage]: Invalid value for "), ours.stderr
        assert "Traceback" not in ours.stderr
