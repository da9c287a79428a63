"""No child planrun starts is given the journal's password or parameters (SPEC §7, §11).

A child's environment as it *started* is in ``/proc/PID/environ`` for as long as it lives,
whatever it takes out of ``os.environ`` later; ``/proc/PID/cmdline`` is what ``ps``
shows. Every test drives the real ``planrun`` process journaling to a real PostgreSQL
cluster with a password in the URL (``planrun --journal URL COMMAND`` puts it into
``PLANRUN_JOURNAL``) and in ``PGPASSWORD``, and a secret parameter from
``PLANRUN_PARAM_TOKEN``; while the calls wait, every process below planrun (commands,
the keeper, Dask's worker processes and multiprocessing's helpers, a planner) is read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from harness import PLANRUN, TIMEOUT_S

pytestmark = pytest.mark.postgres

URL_PASSWORD = "pw-in-url-7781"
ENV_PASSWORD = "pw-in-env-5512"
TOKEN = "tok-secret-9043"
SECRETS = (URL_PASSWORD.encode(), ENV_PASSWORD.encode(), TOKEN.encode())

TOOLS = """
tools:
  wait_cmd:
    command: ["{python}", "-c", "import os, sys, time, pathlib; \
pathlib.Path(sys.argv[1] + '.pid').write_text(str(os.getpid())); \
[time.sleep(0.05) for _ in iter(lambda: os.path.exists(sys.argv[2]), True)]", \
"{{mark}}", "{{gate}}"]
    arguments:
      type: object
      properties: {{mark: {{type: string}}, gate: {{type: string}}, token: {{type: string}}}}
      required: [mark, gate]
  wait_py:
    python: envtools:wait
    arguments:
      type: object
      properties: {{mark: {{type: string}}, gate: {{type: string}}, token: {{type: string}}}}
      required: [mark, gate]
"""

MODULE = """
import os
import pathlib
import time


def wait(mark, gate, token=None):
    pathlib.Path(mark + ".pid").write_text(str(os.getpid()))
    while not os.path.exists(gate):
        time.sleep(0.05)
    return {"pid": os.getpid()}
"""

PLANNER = """
import json, pathlib, sys
request = json.load(sys.stdin)
pathlib.Path("planner.environ").write_bytes(pathlib.Path("/proc/self/environ").read_bytes())
print(json.dumps({"planrun": 1, "name": "planned", "goal": request["goal"], "steps": [
    {"id": "a", "tool": "wait_py", "arguments": {"mark": "m", "gate": "g"}}]}))
"""


def _with_password(pg_url: str) -> str:
    """``pg_url`` with user ``postgres`` and a password in its user part (trust ignores it)."""
    assert pg_url.startswith("postgresql:///")
    assert pg_url.endswith("&user=postgres")
    return ("postgresql://postgres:" + URL_PASSWORD + "@/"
            + pg_url[len("postgresql:///"):-len("&user=postgres")])


def _project(root: Path, executor: str) -> Path:
    (root / "plans").mkdir(parents=True)
    (root / "tools.yaml").write_text(TOOLS.format(python=sys.executable), encoding="utf-8")
    (root / "envtools.py").write_text(textwrap.dedent(MODULE), encoding="utf-8")
    (root / "planner.py").write_text(textwrap.dedent(PLANNER), encoding="utf-8")
    config = ('executor = "dask"\n[dask]\nworkers = 1\nthreads_per_worker = 2\n'
              if executor == "dask" else "")
    (root / "planrun.toml").write_text(config, encoding="utf-8")
    gate = root / "gate"
    (root / "plans" / "wait.yaml").write_text(textwrap.dedent(f"""\
        planrun: 1
        name: wait
        goal: wait for the gate
        params:
          token: {{type: string, secret: true}}
        steps:
          - {{id: c, tool: wait_cmd, arguments: {{mark: "{root / 'c'}", gate: "{gate}",
              token: "{{params.token}}"}}}}
          - {{id: p, tool: wait_py, arguments: {{mark: "{root / 'p'}", gate: "{gate}",
              token: "{{params.token}}"}}}}
        """), encoding="utf-8")
    return gate


def _env(pg_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PLANRUN_JOURNAL"}
    env.update(PGPASSWORD=ENV_PASSWORD, PLANRUN_PARAM_TOKEN=TOKEN)
    return env


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (read from ``/proc/*/stat``)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rpartition(")")[2].split()[1])
    found, frontier = [], [pid]
    while frontier:
        here = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == here]
        found.extend(kids)
        frontier.extend(kids)
    return found


def _seen(pid: int) -> dict[str, Any]:
    """What anyone may read of ``pid``: its starting environment and its command line."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # gone meanwhile
        return {"names": set(), "text": b""}
    names = {item.split(b"=", 1)[0].decode() for item in environ.split(b"\0") if item}
    return {"names": names, "text": environ + b"\0" + cmdline, "cmdline": cmdline}


def _wait_for(path: Path, proc: subprocess.Popen[bytes]) -> int:
    deadline = time.monotonic() + TIMEOUT_S
    while not (path.exists() and path.read_text()):
        if proc.poll() is not None:
            raise AssertionError(f"planrun ended ({proc.returncode}) before {path.name}: "
                                 f"{proc.communicate()}")
        assert time.monotonic() < deadline, f"no {path}"
        time.sleep(0.05)
    return int(path.read_text())


@pytest.mark.parametrize("executor", ["local", "dask"])
def test_no_child_starts_with_the_journal_password_or_a_parameter(
        tmp_path: Path, pg_url: str, executor: str) -> None:
    if executor == "dask":
        pytest.importorskip("distributed")
    root = tmp_path / "proj"
    gate = _project(root, executor)
    proc = subprocess.Popen(
        [*PLANRUN, "--journal", _with_password(pg_url), "execute", "wait", "--json"],
        cwd=root, env=_env(pg_url), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)
    try:
        command = _wait_for(root / "c.pid", proc)
        python = _wait_for(root / "p.pid", proc)
        children = _descendants(proc.pid)
        assert command in children
        if executor == "dask":
            assert python in children  # a worker process planrun's cluster started
            assert python != proc.pid
        else:
            assert python == proc.pid
        assert len(children) >= (4 if executor == "dask" else 2), children  # + the keeper
        for pid in children:
            seen = _seen(pid)
            leaked = [s for s in SECRETS if s in seen["text"]]
            assert not leaked, (pid, seen.get("cmdline"), leaked)
            assert not seen["names"] & {"PGPASSWORD", "PLANRUN_JOURNAL",
                                        "PLANRUN_PARAM_TOKEN"}, (pid, seen.get("cmdline"))
    finally:
        gate.write_text("")
        out, err = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 0, err.decode()
    manifest = json.loads(out)
    assert manifest["status"] == "completed"
    for secret in SECRETS:
        assert secret not in out + err


def test_a_planner_starts_without_the_journal_password_or_a_parameter(
        tmp_path: Path, pg_url: str) -> None:
    root = tmp_path / "proj"
    _project(root, "local")
    r = subprocess.run(
        [*PLANRUN, "--journal", _with_password(pg_url), "plan", "wait a bit",
         "--planner", f"cmd:{sys.executable} planner.py"],
        cwd=root, env=_env(pg_url), stdin=subprocess.DEVNULL, capture_output=True,
        timeout=TIMEOUT_S, check=False)
    assert r.returncode == 0, r.stderr.decode()
    environ = (root / "planner.environ").read_bytes()
    assert environ  # the planner ran and read its own starting environment
    for secret in SECRETS:
        assert secret not in environ
    names = {item.split(b"=", 1)[0] for item in environ.split(b"\0") if item}
    assert not names & {b"PGPASSWORD", b"PLANRUN_JOURNAL", b"PLANRUN_PARAM_TOKEN"}


def test_a_dask_worker_started_again_after_one_died_starts_without_them(
        tmp_path: Path, pg_url: str) -> None:
    """The nanny starts a new worker process when one dies, at any time while the cluster
    lives: that one, too, starts without the journal's password or a parameter."""
    import signal

    pytest.importorskip("distributed")
    root = tmp_path / "proj"
    gate = _project(root, "dask")
    plan = (root / "plans" / "wait.yaml").read_text(encoding="utf-8")
    (root / "plans" / "wait.yaml").write_text(plan + textwrap.indent(textwrap.dedent(f"""\
        - {{id: q, tool: wait_py, depends_on: [p], run_if: always,
            arguments: {{mark: "{root / 'q'}", gate: "{gate}"}}}}
        """), "  "), encoding="utf-8")
    proc = subprocess.Popen(
        [*PLANRUN, "--journal", _with_password(pg_url), "execute", "wait", "--keep-going",
         "--json"], cwd=root, env=_env(pg_url), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for(root / "c.pid", proc)
        first = _wait_for(root / "p.pid", proc)
        assert not (root / "q.pid").exists()  # both worker threads are taken
        os.kill(first, signal.SIGKILL)
        again = _wait_for(root / "q.pid", proc)  # on the worker started in its place
        assert again != first
        assert again in _descendants(proc.pid)
        seen = _seen(again)
        assert seen["names"], "its environment could not be read"
        assert not [s for s in SECRETS if s in seen["text"]]
        assert not seen["names"] & {"PGPASSWORD", "PLANRUN_JOURNAL", "PLANRUN_PARAM_TOKEN"}
    finally:
        gate.write_text("")
        proc.communicate(timeout=TIMEOUT_S)
