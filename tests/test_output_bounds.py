"""A command that writes without end is killed at a bound, not at its timeout or when the
disk is full (found by an attacker: a planner's flood was bounded only after it exited,
and a command tool's the same way; its temporary files grew at ~1 GB/s).

- stdout that is the tool's output (``output: text`` or ``json``): at most
  ``MAX_OUTPUT_BYTES`` (64 MiB), through the real CLI;
- stderr, and stdout of ``output: none`` (only their tails are kept): at most
  ``MAX_STREAM_BYTES`` (1 GiB), here with the bound made small (a real command, called
  in-process), so that the test does not write a gigabyte;
- what is kept of a stream is read from its end, not the whole file into memory.

Killed mid-call, an idempotent tool failed (code ``output``, retried as its ``retries``
say); one that is not has an unknown effect: ``indeterminate``, as on a timeout.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness import run_planrun
from planrun import tools
from planrun.redact import Secrets
from planrun.registry import load_registry

FLOOD = "import sys\nwhile True:\n    sys.{stream}.buffer.write(b'x' * 65536)\n"

TOOLS = """\
tools:
  flood_out:
    command: [{python}, flood.py]
    output: text
    idempotent: true
    arguments: {{type: object, additionalProperties: false}}
  flood_out_once:
    command: [{python}, flood.py]
    output: text
    arguments: {{type: object, additionalProperties: false}}
"""


def _project(root: Path, stream: str = "stdout") -> Path:
    (root / "plans").mkdir(parents=True)
    (root / "flood.py").write_text(FLOOD.format(stream=stream))
    (root / "tools.yaml").write_text(TOOLS.format(python=json.dumps(sys.executable)))
    for tool in ("flood_out", "flood_out_once"):
        (root / "plans" / f"{tool}.yaml").write_text(
            f"planrun: 1\ngoal: flood\nsteps:\n  - {{id: s, tool: {tool}, arguments: {{}}}}\n")
    return root


@pytest.mark.parametrize(("tool", "exit_code", "status"), [
    ("flood_out", 1, "failed"), ("flood_out_once", 1, "indeterminate")])
def test_a_command_flooding_its_output_is_killed_at_the_bound(
        tmp_path: Path, tool: str, exit_code: int, status: str) -> None:
    """No timeout is declared: before, the run went on until the disk was full."""
    root = _project(tmp_path / "p")
    env = dict(os.environ, PLANRUN_JOURNAL=str(tmp_path / "j.sqlite3"))
    res = run_planrun("execute", tool, "--json", cwd=root, env=env,
                      stdin=subprocess.DEVNULL, timeout=120)
    assert res.returncode == exit_code, res.stderr
    step = json.loads(res.stdout)["steps"][0]
    assert step["status"] == status
    assert step["error"]["code"] == "output"
    assert (f"wrote more than {tools.MAX_OUTPUT_BYTES:,} bytes on stdout (its output) and "
            "was killed") in step["error"]["message"]
    assert "Traceback" not in res.stderr


def _spec(tmp_path: Path, command: list[str], output: str) -> tools.ToolSpec:
    (tmp_path / "tools.yaml").write_text(
        "tools:\n  t:\n    command: " + json.dumps(command) + f"\n    output: {output}\n"
        "    idempotent: true\n    arguments: {type: object, additionalProperties: false}\n")
    registry, issues = load_registry(tmp_path / "tools.yaml")
    assert not issues, issues
    return registry.tools["t"]


def _call(tmp_path: Path, spec: tools.ToolSpec, secrets: Secrets | None = None) -> Any:
    ctx = tools.StepContext(run_id="r", step_id="s", item_index=None,
                            idempotency_key="k" * 64, attempt=1)
    return asyncio.run(tools.call_command(spec, {}, ctx, tmp_path, None, secrets=secrets))


@pytest.mark.parametrize(("stream", "output"), [
    ("stderr", "text"), ("stderr", "none"), ("stdout", "none")])
def test_a_command_flooding_a_stream_of_which_a_tail_is_kept_is_killed_at_the_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stream: str, output: str) -> None:
    monkeypatch.setattr(tools, "MAX_STREAM_BYTES", 4 * 1024 * 1024)
    (tmp_path / "flood.py").write_text(FLOOD.format(stream=stream))
    spec = _spec(tmp_path, [sys.executable, "flood.py"], output)
    with pytest.raises(tools.OutputBound) as caught:
        _call(tmp_path, spec)
    assert caught.value.error["code"] == "output"
    assert (f"wrote more than {4 * 1024 * 1024:,} bytes on {stream} (a stream of which only "
            f"the last {tools.STDERR_TAIL_BYTES:,} characters are kept) and was killed"
            ) in caught.value.error["message"]


def test_the_output_bound_is_not_applied_to_a_stdout_that_is_no_output(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``output: none``: stdout is only a tail, bounded as stderr is, not as an output."""
    monkeypatch.setattr(tools, "MAX_OUTPUT_BYTES", 1024)
    (tmp_path / "big.py").write_text("import sys\nsys.stdout.write('x' * 100_000)\n")
    spec = _spec(tmp_path, [sys.executable, "big.py"], "none")
    assert _call(tmp_path, spec) is None
    spec = _spec(tmp_path, [sys.executable, "big.py"], "text")
    with pytest.raises(tools.ToolFailure) as caught:  # it exited: its effect is known
        _call(tmp_path, spec)
    assert not isinstance(caught.value, tools.CallCutShort)
    assert caught.value.error == {"code": "output", "message": "command wrote more than "
                                  "1,024 bytes on stdout (its output)"}


def test_a_long_stderr_gives_its_tail_and_no_part_of_a_secret(tmp_path: Path) -> None:
    """8 MB of stderr, a secret straddling where the tail is read from: the message has
    the stream's last characters and nothing of the secret (the tail is read from the end
    of the file, its window as :func:`planrun.redact.conceal_tail` needs it)."""
    secret = "αβγδεζηθικλμνξοπρστυφχψω"
    secrets = Secrets({"token": secret})
    keep = tools.STDERR_TAIL_BYTES
    for filler in (keep - 5, keep + 3, keep * 2 + 17):
        (tmp_path / "loud.py").write_text(
            "import sys\nw = sys.stderr.buffer.write\nw(b'y' * 8_000_000)\n"
            f"w({secret!r}.encode())\nw(b'z' * {filler} + b'END')\nsys.exit(3)\n")
        spec = _spec(tmp_path, [sys.executable, "loud.py"], "none")
        with pytest.raises(tools.ToolFailure) as caught:
            _call(tmp_path, spec, secrets)
        message = caught.value.error["message"]
        assert caught.value.error["code"] == "exit_status"
        assert message.endswith("zzzEND")
        assert not set(message) & set(secret), message[:200]
        assert len(message) < keep + 200


def test_a_python_tool_returning_more_than_the_bound_failed(tmp_path: Path) -> None:
    """The same bound for a python tool's output, as the journal would keep it (JSON):
    before, 65 MiB went into the journal's row."""
    root = tmp_path / "p"
    (root / "plans").mkdir(parents=True)
    (root / "big.py").write_text(
        f"def big(extra):\n    return 'x' * ({tools.MAX_OUTPUT_BYTES} + extra)\n")
    (root / "tools.yaml").write_text(
        "tools:\n  big:\n    python: big:big\n    idempotent: true\n    arguments: {type: "
        "object, properties: {extra: {type: integer}}, required: [extra], "
        "additionalProperties: false}\n")
    (root / "plans" / "big.yaml").write_text(
        "planrun: 1\ngoal: big\nparams:\n  extra: {type: integer}\nsteps:\n"
        "  - {id: s, tool: big, arguments: {extra: '{params.extra}'}}\n")
    env = dict(os.environ, PLANRUN_JOURNAL=str(tmp_path / "j.sqlite3"))
    res = run_planrun("execute", "big", "-p", "extra=1", "--json", cwd=root, env=env)
    assert res.returncode == 1, res.stderr
    step = json.loads(res.stdout)["steps"][0]
    assert step["status"] == "failed"
    assert step["error"]["code"] == "output"
    assert f"more than {tools.MAX_OUTPUT_BYTES:,} bytes as JSON" in step["error"]["message"]
    assert (tmp_path / "j.sqlite3").stat().st_size < 8 * 1024 * 1024
    # the JSON text of a string is 2 bytes longer: one 3 bytes under the bound is kept
    res = run_planrun("execute", "big", "-p", "extra=-3", "--json", cwd=root, env=env)
    assert res.returncode == 0, res.stderr
