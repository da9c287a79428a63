"""The case runner itself: it must fail what should fail, not only pass what should pass.

These cases run small Python snippets instead of planrun (``planrun`` stands for the
interpreter here), so they are fast and do not depend on planrun's state.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .runner import (
    Case,
    CaseFailure,
    CaseFileError,
    CaseRunner,
    expand_argv,
    find_path,
    is_subset,
)

PY = (sys.executable,)
LOG_CALL = "import os; open(os.environ['CASE_DIR'] + '/calls.log', 'a').write('{}\\n')"


def run(tmp_path: Path, *steps: dict[str, Any], files: dict[str, str] | None = None) -> None:
    CaseRunner(tmp_path, planrun=PY).run(Case("t", "", files or {}, list(steps)))


def test_find_path() -> None:
    data = {"plans": [{"issues": [{"code": "a"}, {"code": "b"}]}], "m": {"x": 1, "y": 2}}
    assert find_path(data, "plans.0.issues.*.code") == ["a", "b"]
    assert find_path(data, "plans.-1.issues.1.code") == ["b"]
    assert find_path(data, "m.*") == [1, 2]
    assert find_path(data, "plans.5") == []
    assert find_path(data, "") == [data]


def test_is_subset_is_type_strict() -> None:
    assert is_subset({"a": 1}, {"a": 1, "b": 2})
    assert not is_subset({"a": 1}, {"a": True})
    assert not is_subset({"a": 1}, {"a": 1.0})
    assert not is_subset([1], [1, 2])
    assert is_subset({"l": [{"x": 1}]}, {"l": [{"x": 1, "y": 0}]})


def test_expand_argv() -> None:
    argv = expand_argv("planrun status ${run} '${PLANRUN} x' ${other}", ["py", "-m", "p"],
                       {"run": "r1"})
    assert argv == ["py", "-m", "p", "status", "r1", "py -m p x", "${other}"]


def test_a_passing_case(tmp_path: Path) -> None:
    run(
        tmp_path,
        {"run": ["planrun", "-c", "import json; print(json.dumps({'id': 'r7', 'n': 2}))"],
         "exit": 0, "stdout_json": {"id": "r7"}, "json_equals": {"n": 2},
         "json_matches": {"id": "^r\\d$"}, "save": {"run": "id"}},
        {"run": ["planrun", "-c", "import sys; print(sys.argv[1])", "got ${run}"],
         "stdout_has": ["got r7"]},
        {"write": {"sub/go": "x"}},
        {"sleep": 0.01},
        {"run": ["planrun", "-c", LOG_CALL.format("a first")], "calls": {"a": 1, "b": 0},
         "file_has": {"calls.log": ["a first\n"]}, "files_exist": ["sub/go", "casetools.py"],
         "files_absent": ["nope"]},
    )


def test_case_files_win_over_fixtures(tmp_path: Path) -> None:
    run(tmp_path, {"run": ["planrun", "-c", "pass"]}, files={"tools.yaml": "mine\n"})
    assert (tmp_path / "tools.yaml").read_text() == "mine\n"
    assert (tmp_path / "casetools.py").exists()


def test_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANRUN_PROJECT", "/elsewhere")
    code = ("import os; e = os.environ; "
            "print(e['PLANRUN_JOURNAL'], e['NO_COLOR'], e['COLUMNS'], e.get('PLANRUN_PROJECT'), "
            "e['EXTRA'])")
    run(tmp_path, {"run": ["planrun", "-c", code], "env": {"EXTRA": 5},
                   "stdout_has": [f"{tmp_path}/journal.sqlite3 1 200 None 5"]})


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ({"exit": 0}, "exited 3, expected [0]"),
        ({"exit": [1, 2]}, "exited 3"),
        ({"stdout_has": ["nothing"]}, "stdout lacks 'nothing'"),
        ({"stderr_has": ["out"]}, "stderr lacks 'out'"),
        ({"output_lacks": ["err"]}, "output contains 'err'"),
        ({"stdout_json": {"ok": 1}}, "JSON does not contain"),
        ({"json_equals": {"ok": 1}}, "JSON ok = [True], expected 1"),
        ({"json_includes": {"l.*": [3]}}, "lacks 3"),
        ({"json_matches": {"l": "x"}}, "does not match"),
        ({"save": {"v": "l.*"}}, "cannot save one value"),
        ({"calls": {"a": 2}}, "a was called 0 times, expected 2"),
        ({"file_has": {"calls.log": ["x"]}}, "calls.log does not exist"),
        ({"files_exist": ["nope"]}, "nope does not exist"),
        ({"files_absent": ["casetools.py"]}, "casetools.py exists but must not"),
    ],
)
def test_failed_expectations(tmp_path: Path, step: dict[str, Any], message: str) -> None:
    code = ("import json, sys; print(json.dumps({'ok': True, 'l': [1, 2]})); "
            "print('err', file=sys.stderr); sys.exit(3)")
    with pytest.raises(CaseFailure) as failure:
        run(tmp_path, {"run": ["planrun", "-c", code], **step})
    assert message in str(failure.value)


def test_a_traceback_fails(tmp_path: Path) -> None:
    with pytest.raises(CaseFailure, match="printed a traceback"):
        run(tmp_path, {"run": ["planrun", "-c", "1/0"], "exit": 1})
    run(tmp_path, {"run": ["planrun", "-c", "1/0"], "exit": 1, "traceback_ok": True})


def test_file_lacks_covers_sidecar_files(tmp_path: Path) -> None:
    with pytest.raises(CaseFailure, match=re.escape("journal.sqlite3-wal contains 'secret'")):
        run(tmp_path, {"write": {"journal.sqlite3-wal": "a secret"}},
            {"run": ["planrun", "-c", "pass"], "file_lacks": {"journal.sqlite3": ["secret"]}})


def test_stdin_and_no_stdin(tmp_path: Path) -> None:
    echo = "import sys; print(repr(sys.stdin.read()))"
    run(tmp_path, {"run": ["planrun", "-c", echo], "stdin": "hi", "stdout_has": ["'hi'"]},
        {"run": ["planrun", "-c", echo], "stdout_has": ["''"]})


def test_a_hang_fails_quickly(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(CaseFailure, match="hung"):
        run(tmp_path, {"run": ["planrun", "-c", "import time; time.sleep(30)"], "timeout": 0.2})
    assert time.monotonic() - started < 10


def test_kill_when(tmp_path: Path) -> None:
    code = LOG_CALL.format("c-start") + "; import time; time.sleep(30)"
    run(tmp_path, {"run": ["planrun", "-c", code], "timeout": 20,
                   "kill_when": {"calls_has": "c-start", "signal": "KILL"},
                   "exit": 137, "calls": {"c-start": 1}})


def test_background_and_wait(tmp_path: Path) -> None:
    waiter = ("import os, time\n"
              "while not os.path.exists('go'): time.sleep(0.01)\n"
              "print('went')")
    run(tmp_path,
        {"run": ["planrun", "-c", waiter], "background": "w", "timeout": 20,
         "stdout_has": ["went"], "exit": 0},
        {"write": {"go": ""}},
        {"wait": "w"})
    with pytest.raises(CaseFailure, match="background w"):
        run(tmp_path, {"run": ["planrun", "-c", "pass"], "background": "w", "exit": 1},
            {"wait": "w"})


def test_tty(tmp_path: Path) -> None:
    prompt = ("import sys; assert sys.stdin.isatty(); "
              "answer = input('Approve drop? [y/N] '); print('answer=' + answer)")
    run(tmp_path, {"run": ["planrun", "-c", prompt], "tty": True, "timeout": 20,
                   "expect": [["(?i)approve.*drop", "y"]], "exit": 0,
                   "output_has": ["answer=y"]})
    with pytest.raises(CaseFailure, match="never saw 'nothing like this'"):
        run(tmp_path, {"run": ["planrun", "-c", prompt], "tty": True, "timeout": 0.5,
                       "expect": [["nothing like this", "y"]]})


@pytest.mark.parametrize(
    "step",
    [
        {"run": "x", "exitt": 0},
        {"run": "x", "kill_when": {"calls_has": "a", "signal": "NOPE"}},
        {"wait": "never-started"},
        {"sleep": 1, "write": {}},
        {"frobnicate": 1},
    ],
)
def test_malformed_steps(tmp_path: Path, step: dict[str, Any]) -> None:
    with pytest.raises(CaseFileError):
        run(tmp_path, step)
