"""The CEL parser cache (planrun.conditions.install_cel_parser): same parser, built once."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import celpy
import lark
import pytest
from celpy import celparser

from planrun import conditions

EXPRESSIONS = [
    "params.keep > 3 && steps.a.output.ok",
    'params["x"] in ["a", "b"] || !true',
    "steps.list.output.files.all(f, f.size < 1024) ? 1 : 2",
    "size(params.name) == 0u + 1 - 2.5 * 3 / 4 % 5",
    "has(steps.a.output.b) && type(params.n) == int && false",
]
BROKEN = ["params.x >", "1 +* 2", "'unterminated"]


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    return folder


@pytest.fixture
def fresh_parser() -> Iterator[None]:
    """No parser installed before the test; the process's own one put back after it."""
    saved = celparser.CELParser.CEL_PARSER
    celparser.CELParser.CEL_PARSER = None
    try:
        yield
    finally:
        celparser.CELParser.CEL_PARSER = saved


def celpy_own_trees() -> tuple[list[object], list[str]]:
    """Trees and parse errors of cel-python's own parser, built as cel-python builds it."""
    saved = celparser.CELParser.CEL_PARSER
    celparser.CELParser.CEL_PARSER = None
    try:
        return _parse_all()
    finally:
        celparser.CELParser.CEL_PARSER = saved


def shape(node: object) -> object:
    """A tree as plain data: (rule name, children) and (token type, text, line, column).

    A parser loaded by ``Lark.load`` names rules with ``Token('RULE', name)``, a ``str``
    equal to the name the built parser uses: the same for lark's and celpy's dispatch.
    """
    if isinstance(node, lark.Tree):
        return (str(node.data), [shape(c) for c in node.children])
    assert isinstance(node, lark.Token)
    return (node.type, str(node), node.line, node.column)


def _parse_all() -> tuple[list[object], list[str]]:
    env = celpy.Environment()
    trees = [shape(env.compile(e)) for e in EXPRESSIONS]
    errors = []
    for e in BROKEN:
        with pytest.raises(celparser.CELParseError) as info:
            env.compile(e)
        errors.append(str(info.value))
    return trees, errors


def test_the_cached_parser_parses_as_cel_python_does(fresh_parser: None,
                                                     cache_dir: Path) -> None:
    expected = celpy_own_trees()
    written = conditions.install_cel_parser(cache_dir)
    assert written is not None
    assert written.is_file()
    assert _parse_all() == expected  # built here, saved
    celparser.CELParser.CEL_PARSER = None
    assert conditions.install_cel_parser(cache_dir) == written
    assert _parse_all() == expected  # loaded from the file


def test_a_second_process_loads_the_file_instead_of_building(
        fresh_parser: None, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = conditions.install_cel_parser(cache_dir)
    celparser.CELParser.CEL_PARSER = None

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("the parser was built again")

    monkeypatch.setattr(lark.Lark, "__init__", no_build)
    assert conditions.install_cel_parser(cache_dir) == path
    assert isinstance(celparser.CELParser.CEL_PARSER, lark.Lark)
    assert conditions.evaluate("params.n > 1", {"n": 2}, {}) is True


def test_a_damaged_or_foreign_keyed_file_is_rebuilt(fresh_parser: None, cache_dir: Path) -> None:
    path = conditions.install_cel_parser(cache_dir)
    assert path is not None
    path.write_bytes(b"not the key\n\x80garbage")
    celparser.CELParser.CEL_PARSER = None
    assert conditions.install_cel_parser(cache_dir) == path
    assert _parse_all() == celpy_own_trees()
    assert path.read_bytes().split(b"\n", 1)[0] != b"not the key"
    key = path.read_bytes().split(b"\n", 1)[0]
    path.write_bytes(key + b"\n\x80truncated pickle")
    celparser.CELParser.CEL_PARSER = None
    assert conditions.install_cel_parser(cache_dir) == path
    assert _parse_all() == celpy_own_trees()
    assert [p.name for p in cache_dir.iterdir()] == [path.name]  # no temporary file left


def test_a_folder_others_may_write_is_not_used(fresh_parser: None, cache_dir: Path) -> None:
    shared = cache_dir / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    assert conditions.install_cel_parser(shared) is None
    assert list(shared.iterdir()) == []
    assert celparser.CELParser.CEL_PARSER is None  # cel-python builds its own
    assert _parse_all() == celpy_own_trees()


def test_the_cache_goes_to_the_user_cache_folder(fresh_parser: None, cache_dir: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_dir))
    path = conditions.install_cel_parser()
    assert path is not None
    assert path.parent == cache_dir / "planrun"
