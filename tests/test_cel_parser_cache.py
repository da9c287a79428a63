"""The CEL parser kept by lark's cache (planrun.conditions.install_cel_parser, issue 16)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import celpy
import lark
import pytest
from celpy import celparser

from planrun import conditions
from planrun_cli import CliProject

EXPRESSIONS = [
    "params.keep > 3 && steps.a.output.ok",
    'params["x"] in ["a", "b"] || !true',
    "steps.a.output.files.all(f, f.size < 1024) ? 1 : 2",
    "size(params.name) == 0u + 1 - 2.5 * 3 / 4 % 5",
    "has(steps.a.output.b) && type(params.keep) == int && false",
]
BROKEN = ["params.x >", "1 +* 2", "'unterminated"]


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    return folder


@pytest.fixture
def no_parser() -> Iterator[None]:
    """No CEL parser in this process at the start; the process's own put back after."""
    saved = celparser.CELParser.CEL_PARSER
    celparser.CELParser.CEL_PARSER = None
    try:
        yield
    finally:
        celparser.CELParser.CEL_PARSER = saved


def shape(node: object) -> object:
    """A tree as plain data: (rule, children) and (token type, text, line, column)."""
    if isinstance(node, lark.Tree):
        return (str(node.data), [shape(c) for c in node.children])
    assert isinstance(node, lark.Token)
    return (node.type, str(node), node.line, node.column)


def parse_all() -> tuple[list[object], list[str]]:
    """Trees and syntax errors of the parser installed now, through cel-python."""
    env = celpy.Environment()
    trees = [shape(env.compile(e)) for e in EXPRESSIONS]
    errors = []
    for e in BROKEN:
        with pytest.raises(celparser.CELParseError) as info:
            env.compile(e)
        errors.append(str(info.value))
    return trees, errors


def cel_python_own() -> tuple[list[object], list[str]]:
    """What cel-python's own parser (built as cel-python builds it) gives."""
    celparser.CELParser.CEL_PARSER = None
    try:
        return parse_all()
    finally:
        celparser.CELParser.CEL_PARSER = None


def no_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building a parser from the grammar fails from now on (only loading works)."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the parser was built from the grammar")

    monkeypatch.setattr(lark.Lark, "_build_parser", refuse)


def test_the_kept_parser_parses_as_cel_python_does(no_parser: None, cache_dir: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    expected = cel_python_own()
    path = conditions.install_cel_parser(cache_dir)
    assert path == conditions.cel_parser_cache(cache_dir)
    assert path.is_file()
    assert parse_all() == expected  # built here and kept
    celparser.CELParser.CEL_PARSER = None
    no_build(monkeypatch)
    assert conditions.install_cel_parser(cache_dir) == path
    assert parse_all() == expected  # loaded from the file, not built


def test_the_file_is_named_by_the_versions(cache_dir: Path) -> None:
    name = conditions.cel_parser_cache(cache_dir).name
    assert f"lark{lark.__version__}" in name
    assert "celpy0." in name or "celpy1." in name


@pytest.mark.parametrize("damage", [b"", b"not a lark cache\n", b"truncated"])
def test_a_damaged_file_is_built_again_and_replaced(no_parser: None, cache_dir: Path,
                                                    damage: bytes,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    expected = cel_python_own()
    path = conditions.cel_parser_cache(cache_dir)
    conditions.install_cel_parser(cache_dir)
    good = path.read_bytes()
    path.write_bytes(good[: len(good) // 2] if damage == b"truncated" else damage)
    celparser.CELParser.CEL_PARSER = None
    assert conditions.install_cel_parser(cache_dir) == path
    assert parse_all() == expected
    celparser.CELParser.CEL_PARSER = None
    no_build(monkeypatch)  # the damaged file was written anew: the next one loads it
    conditions.install_cel_parser(cache_dir)
    assert parse_all() == expected


def test_a_folder_others_may_write_is_not_used(no_parser: None, tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o777)
    assert conditions.install_cel_parser(folder) is None
    assert celparser.CELParser.CEL_PARSER is not None  # built as cel-python builds it
    assert list(folder.iterdir()) == []


def test_a_condition_compiles_after_cel_pythons_parser_was_reset() -> None:
    # cel-python keeps its parser in a class attribute; a test (or another library) that
    # sets it back to None must not leave planrun's kept Environment without a grammar
    # ("No grammar loaded" in every later compile in the process).
    assert conditions.evaluate("params.n > 1", {"n": 2}, {}) is True
    celparser.CELParser.CEL_PARSER = None
    assert conditions.evaluate("params.n > 2 && true", {"n": 3}, {}) is True
    assert conditions.evaluate("params.n < 0 || false", {"n": 3}, {}) is False


def test_a_second_process_uses_the_file_the_first_wrote(cli: CliProject) -> None:
    cli.tools("""
        tools:
          record:
            description: records its call
            python: crashtools:record
            arguments: {type: object}
    """)
    cli.plan("cond", """
        planrun: 1
        goal: a step with a condition
        params:
          n: {type: integer, default: 2}
        steps:
          - id: a
            tool: record
            when: params.n > 1
    """)
    # fresh interpreters: a fork of the warm test server has its parser already
    first = cli.run("validate", "cond", real=True)
    assert first.returncode == 0, first.stderr
    kept = list((Path.home() / ".cache" / "planrun").glob("cel-parser-*.lark"))
    assert len(kept) == 1
    written = kept[0].stat().st_mtime_ns
    second = cli.run("validate", "cond", real=True)
    assert second.returncode == 0, second.stderr
    assert kept[0].stat().st_mtime_ns == written  # read, not written again
    assert second.stdout == first.stdout
