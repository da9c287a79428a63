"""planrun.parse_cache: the data of a YAML plan or registry kept between processes.

A later process is simulated in-process by loading the file again (the cache is a file:
nothing of it is held in memory); the real later processes, which then import no PyYAML,
are in ``test_startup_imports.py``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from planrun import parse_cache, yamltext
from planrun.loading import DocumentError, load_file

PLAN = """\
planrun: 1
goal: "kept: ünïcode, numbers, order"
steps:
  - {id: s1, tool: noop, arguments: {n: 1, f: 0.1, big: 123456789012345678901234567890}}
  - {id: s2, tool: noop, depends_on: [s1], arguments: {neg: -0.0, e: 1.0e+300, t: true}}
  - id: s3
    tool: noop
    arguments: {z: 1, a: 2, m: null, octal: 0o17, text: "yes", list: [1, "2", 3.5]}
"""


def kept_files() -> list[Path]:
    folder = Path(os.environ["HOME"]) / ".cache" / "planrun"
    return sorted(folder.glob("parsed-*.json")) if folder.is_dir() else []


@pytest.fixture
def no_yaml(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parsing YAML text fails the test (the data must come from the kept file)."""
    def never(*_args: Any) -> Any:
        raise AssertionError("the YAML text was parsed again")

    monkeypatch.setattr(yamltext, "parse_yaml", never)


def write(tmp_path: Path, text: str, name: str = "plan.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_the_second_load_reads_the_kept_data_exactly(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, PLAN)
    first = load_file(path, keep=True)
    assert len(kept_files()) == 1
    def never(*_args: Any) -> Any:
        raise AssertionError("the YAML text was parsed again")

    monkeypatch.setattr(yamltext, "parse_yaml", never)
    again = load_file(path, keep=True)
    assert again.data == first.data
    # the same keys in the same order, the same types (JSON keeps -0.0, big ints, floats)
    assert list(again.data["steps"][2]["arguments"]) == ["z", "a", "m", "octal", "text",
                                                          "list"]
    args = again.data["steps"][1]["arguments"]
    assert repr(args["neg"]) == "-0.0"
    assert args["e"] == 1.0e300
    assert again.data["steps"][0]["arguments"]["big"] == 123456789012345678901234567890
    assert type(again.data["steps"][0]["arguments"]["n"]) is int
    assert again.kind == "yaml"
    assert again.text == first.text


def test_a_kept_document_still_locates_its_issues(tmp_path: Path) -> None:
    path = write(tmp_path, PLAN)
    first = load_file(path, keep=True)
    again = load_file(path, keep=True)  # the kept data; the text is composed on demand
    for ptr in ("/steps/2/arguments/text", "/steps/1/depends_on/0", "/goal", "/nowhere"):
        assert again.locate(ptr) == first.locate(ptr), ptr
        assert again.locate_key(ptr) == first.locate_key(ptr), ptr
    assert again.locate("/steps/2/arguments/text")[0] == 8


def test_an_edited_text_is_parsed_again(tmp_path: Path) -> None:
    path = write(tmp_path, PLAN)
    load_file(path, keep=True)
    write(tmp_path, PLAN.replace("n: 1,", "n: 2,"))
    assert load_file(path, keep=True).data["steps"][0]["arguments"]["n"] == 2
    assert len(kept_files()) == 2


@pytest.mark.parametrize("text", [
    PLAN + "x: &a {k: 1}\ny: *a\n",  # an anchor: aliases are shared objects
    "planrun: 1\ngoal: g\nparams:\n  token: {type: string, secret: true, default: hunter2}\n"
    "steps: []\n",  # a secret parameter's default may be its value
], ids=["anchor", "secret"])
def test_what_is_never_kept(tmp_path: Path, text: str) -> None:
    doc = load_file(write(tmp_path, text), keep=True)
    assert doc.data is not None
    assert kept_files() == []


def test_a_parameters_file_is_never_kept(tmp_path: Path) -> None:
    load_file(write(tmp_path, "region: eu\ntoken: hunter2\n", "params.yaml"))
    assert kept_files() == []


def test_a_text_with_an_error_is_not_kept_and_fails_every_time(tmp_path: Path) -> None:
    path = write(tmp_path, "planrun: 1\nsteps: [\n")
    for _ in range(2):
        with pytest.raises(DocumentError) as caught:
            load_file(path, keep=True)
        assert caught.value.issues[0].code == "syntax"
    dup = write(tmp_path, "a: 1\na: 2\n", "dup.yaml")
    for _ in range(2):
        with pytest.raises(DocumentError) as caught:
            load_file(dup, keep=True)
        assert caught.value.issues[0].code == "duplicate_key"
    assert kept_files() == []


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "not-json"])
def test_a_damaged_file_costs_a_parse_never_a_wrong_read(tmp_path: Path, damage: str) -> None:
    path = write(tmp_path, PLAN)
    first = load_file(path, keep=True).data
    (kept,) = kept_files()
    raw = kept.read_bytes()
    check, _, body = raw.partition(b"\n")
    kept.write_bytes({
        "flip": check + b"\n" + body.replace(b'"n":1', b'"n":7'),
        "truncate": raw[: len(raw) // 2],
        "empty": b"",
        "not-json": check + b"\n" + b"{not json",
    }[damage])
    assert load_file(path, keep=True).data == first  # parsed again …
    assert kept.read_bytes() == raw  # … and kept again


def test_a_symlink_or_fifo_in_its_place_is_never_read(tmp_path: Path) -> None:
    path = write(tmp_path, PLAN)
    first = load_file(path, keep=True).data
    (kept,) = kept_files()
    kept.unlink()
    decoy = write(tmp_path, "x\n{}", "decoy.json")
    kept.symlink_to(decoy)
    assert load_file(path, keep=True).data == first
    kept.unlink()
    os.mkfifo(kept)
    assert parse_cache.get(PLAN)[1] is parse_cache.MISSING  # never opened for reading
    assert load_file(path, keep=True).data == first  # never waits on the FIFO …
    assert kept.is_file()  # … and a regular file took its place


def test_a_folder_others_may_write_is_not_used(tmp_path: Path) -> None:
    folder = Path(os.environ["HOME"]) / ".cache" / "planrun"
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    path = write(tmp_path, PLAN)
    load_file(path, keep=True)
    assert kept_files() == []


def test_another_parser_s_files_go_and_the_count_is_bounded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = Path(os.environ["HOME"]) / ".cache" / "planrun"
    folder.mkdir(parents=True, mode=0o700)
    stale = folder / ("parsed-0000000000000000-" + "0" * 64 + ".json")
    stale.write_text("x\n{}")
    monkeypatch.setattr(parse_cache, "MAX_FILES", 3)
    for n in range(5):
        load_file(write(tmp_path, PLAN.replace("n: 1,", f"n: {n},")), keep=True)
    assert not stale.exists()
    assert len(kept_files()) == 3
    # the newest are kept: the last plan is read back without a parse
    monkeypatch.setattr(yamltext, "parse_yaml", lambda *_a: pytest.fail("parsed again"))
    assert load_file(tmp_path / "plan.yaml", keep=True).data["steps"][0]["arguments"][
        "n"] == 4


def test_json_files_are_not_kept(tmp_path: Path) -> None:
    load_file(write(tmp_path, '{"planrun": 1, "goal": "g", "steps": []}', "plan.json"),
              keep=True)
    assert kept_files() == []
