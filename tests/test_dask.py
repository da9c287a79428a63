"""``--executor dask`` (SPEC §12): calls on a real Dask LocalCluster, planrun keeps the truth.

Every test drives the real ``planrun`` process. Most share one LocalCluster started by
this module (worker processes, loopback only, ``allowed-failures`` 0) and reach it with
``--executor dask:tcp://127.0.0.1:PORT``; one lets planrun start its own cluster
(``executor = "dask"`` in planrun.toml). The project is shared too (the workers import its
tool module once); each test names its own effects file, in which every call that really
happened wrote one fsync'd line.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import PLANRUN, TIMEOUT_S, Result

try:
    import dask
    import distributed
except ImportError:  # pragma: no cover - the test extra installs it
    pytest.skip("--executor dask needs dask[distributed] (pip install -e '.[test]')",
                allow_module_level=True)

pytestmark = pytest.mark.dask

TOOLS = """
tools:
  rec:
    python: dasktools:record
    idempotent: true
    arguments:
      type: object
      properties: {log: {type: string}, name: {type: string}}
      required: [log]
  hold:
    python: dasktools:hold
    arguments:
      type: object
      properties: {log: {type: string}, until: {type: string}}
      required: [log, until]
  hold_again:
    python: dasktools:hold
    idempotent: true
    arguments:
      type: object
      properties: {log: {type: string}, until: {type: string}}
      required: [log, until]
  chatty:
    python: dasktools:chatty
    arguments:
      type: object
      properties: {log: {type: string}, token: {type: string}}
      required: [log, token]
  nap:
    python: dasktools:nap
    idempotent: true
    arguments:
      type: object
      properties: {log: {type: string}, s: {type: number}}
      required: [log, s]
  gate:
    python: dasktools:gate
    idempotent: true
    arguments:
      type: object
      properties: {log: {type: string}, until: {type: string}, hold: {type: boolean}}
      required: [log, until, hold]
  peek:
    python: dasktools:peek
    arguments:
      type: object
      properties: {log: {type: string}, word: {type: string}}
      required: [log, word]
  odd:
    python: dasktools:odd
    arguments:
      type: object
      properties: {log: {type: string}, name: {type: string}}
      required: [log, name]
  sleeper:
    command: ["sh", "-c", "echo $$ > \\"$0\\"; sleep 60 & sleep 60", "{pidfile}"]
    arguments:
      type: object
      properties: {pidfile: {type: string}}
      required: [pidfile]
  shout:
    command: ["sh", "-c", "echo \\"no: $0\\" >&2; exit 3", "{word}"]
    arguments:
      type: object
      properties: {word: {type: string}}
      required: [word]
"""

MODULE = '''
import json, os, sys, time
import planrun


def _log(log, **entry):
    c = planrun.context()
    entry.update(step=c.step_id, item=c.item_index, key=c.idempotency_key,
                 attempt=c.attempt, pid=os.getpid())
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(entry) + "\\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def record(log, name=None):
    _log(log, event="call")
    if name == "boom":
        raise ValueError("boom was asked for")
    return {"name": name, "pid": os.getpid()}


def _held(log, until):
    _log(log, event="start")
    deadline = time.monotonic() + 60
    while not os.path.exists(until):
        if time.monotonic() > deadline:
            raise TimeoutError(until)
        time.sleep(0.02)


def hold(log, until):
    _held(log, until)
    _log(log, event="call")
    return {"held": until}


def nap(log, s):
    time.sleep(s)
    _log(log, event="call")
    return {"slept": s}


def gate(log, until, hold):
    if hold:
        _held(log, until)
    _log(log, event="call")
    return {"held": hold}


def peek(log, word):
    from planrun.dispatch import worker
    _log(log, event="call", held=sorted(worker._SECRETS.get().values))  # the call's secrets
    return {"n": len(word)}


def odd(log, name):
    _log(log, event="call")
    if name == "lock":  # cannot be pickled on the worker
        import threading
        return {"lock": threading.Lock()}
    if name == "local":  # pickles on the worker, cannot be read on planrun's host
        import types
        module = types.ModuleType("only_on_the_worker")
        exec("class Thing:\\n    pass", module.__dict__)
        module.Thing.__module__ = module.__name__
        sys.modules[module.__name__] = module
        return {"thing": module.Thing()}
    return {"name": name}


def chatty(log, token):
    print("the token is", token)
    print("to stderr:", token, file=sys.stderr)
    _log(log, event="call", env=sorted(k for k in os.environ if k.startswith("PLANRUN_PARAM")))
    return {"said": len(token)}
'''


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """One LocalCluster for the module: 2 worker processes, 1 thread each, loopback."""
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        lc = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                      host="127.0.0.1", dashboard_address=None)
    try:
        yield f"dask:{lc.scheduler_address}"
    finally:
        lc.close()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared project folder (tools.yaml, dasktools.py, plans/)."""
    folder = tmp_path_factory.mktemp("daskproj")
    (folder / "plans").mkdir()
    (folder / "tools.yaml").write_text(textwrap.dedent(TOOLS), encoding="utf-8")
    (folder / "dasktools.py").write_text(textwrap.dedent(MODULE), encoding="utf-8")
    return folder


def plan(root: Path, name: str, steps: str, extra: str = "") -> None:
    (root / "plans" / f"{name}.yaml").write_text(
        "planrun: 1\ngoal: dask executor test\n" + extra + "steps:\n"
        + textwrap.dedent(steps).strip("\n") + "\n", encoding="utf-8")


def planrun(root: Path, *args: str, timeout: float = TIMEOUT_S,
            env: dict[str, str] | None = None) -> Result:
    argv = [*PLANRUN, *args]
    proc = subprocess.run(argv, cwd=root, env={**os.environ, **(env or {})},
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout, check=False)
    return Result(argv, proc.returncode, proc.stdout, proc.stderr)


def start(root: Path, tmp: Path, *args: str) -> subprocess.Popen[bytes]:
    out, err = (tmp / "planrun.out").open("wb"), (tmp / "planrun.err").open("wb")
    with out, err:
        return subprocess.Popen([*PLANRUN, *args], cwd=root, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=err, start_new_session=True)


def finish(proc: subprocess.Popen[bytes], tmp: Path) -> Result:
    try:
        proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return Result([str(a) for a in proc.args],  # type: ignore[union-attr]
                  proc.returncode, (tmp / "planrun.out").read_text(),
                  (tmp / "planrun.err").read_text())


def entries(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line]


def calls(log: Path, step: str | None = None) -> list[dict[str, Any]]:
    return [e for e in entries(log) if e["event"] == "call"
            and (step is None or e["step"] == step)]


def wait_for(check: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{what} did not happen in {timeout} s")


def quiet(log: Path, still_s: float = 0.5, timeout: float = 30.0) -> list[dict[str, Any]]:
    """The calls of ``log`` once no new one came for ``still_s`` seconds."""
    deadline = time.monotonic() + timeout
    seen = calls(log)
    while time.monotonic() < deadline:
        time.sleep(still_s)
        now = calls(log)
        if len(now) == len(seen):
            return now
        seen = now
    raise AssertionError(f"{log} kept growing for {timeout} s")


def manifest(r: Result) -> dict[str, Any]:
    assert "Traceback" not in r.stderr, r.stderr
    return json.loads(r.stdout)


def steps(m: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["id"]: s for s in m["steps"]}


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


# --- runs ----------------------------------------------------------------------------------


def test_a_chain_and_a_fan_out_run_on_the_cluster(root: Path, cluster: str,
                                                  tmp_path: Path) -> None:
    log = tmp_path / "chain.log"
    plan(root, "chain", f"""
      - {{id: a, tool: rec, arguments: {{log: "{log}", name: first}}}}
      - {{id: b, tool: rec, depends_on: [a],
          arguments: {{log: "{log}", name: "{{steps.a.output.name}}-then"}}}}
      - id: f
        tool: rec
        depends_on: [b]
        for_each: ["{{steps.b.output.name}}", x, y, z, "1", "2", "3", "4", "5", "6", "7", "8"]
        max_parallel: 6
        arguments: {{log: "{log}", name: "{{item}}"}}
    """)
    # 16 calls under way on 2 worker threads: the items go 4 to a Dask task
    r = planrun(root, "execute", "chain", "--executor", cluster, "--json",
                "--max-parallel", "16")
    assert r.returncode == 0, r.stderr
    m = manifest(r)
    assert m["status"] == "completed"
    assert steps(m)["f"]["items"] == {"total": 12, "succeeded": 12, "failed": 0}
    made = calls(log)
    assert sorted((c["step"], c["item"]) for c in made) == sorted(
        [("a", None), ("b", None)] + [("f", i) for i in range(12)])  # each exactly once
    assert os.getpid() not in {c["pid"] for c in made}
    assert {c["pid"] for c in made} <= set(_worker_pids(cluster))  # on the workers
    out = planrun(root, "output", m["run_id"], "f")
    assert [o["name"] for o in json.loads(out.stdout)][:2] == ["first-then", "x"]


def test_each_item_of_a_batch_has_its_own_outcome(root: Path, cluster: str,
                                                   tmp_path: Path) -> None:
    log = tmp_path / "batch.log"
    names = [f"n{i}" for i in range(20)]
    names[7] = names[13] = "boom"
    plan(root, "batch", f"""
      - id: f
        tool: rec
        for_each: {json.dumps(names)}
        on_item_error: continue
        arguments: {{log: "{log}", name: "{{item}}"}}
    """)
    r = planrun(root, "execute", "batch", "--executor", cluster, "--json",
                "--max-parallel", "20")
    assert r.returncode == 1, r.stderr
    f = steps(manifest(r))["f"]
    assert f["items"] == {"total": 20, "succeeded": 18, "failed": 2}
    assert f["error"]["code"] == "items_failed"
    assert f["error"]["message"].startswith("item(s) 7, 13 failed; item 7: ValueError: boom")
    assert sorted(c["item"] for c in calls(log)) == list(range(20))  # each called once
    assert {c["pid"] for c in calls(log)} <= set(_worker_pids(cluster))
    out = planrun(root, "output", manifest(r)["run_id"], "f", "--item", "19")
    assert json.loads(out.stdout)["name"] == "n19"


def test_a_command_that_times_out_has_its_group_ended_on_the_worker(
        root: Path, cluster: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "sleeper.pid"
    plan(root, "slow", f"""
      - {{id: s, tool: sleeper, timeout: 1, arguments: {{pidfile: "{pidfile}"}}}}
    """)
    r = planrun(root, "execute", "slow", "--executor", cluster, "--json")
    assert r.returncode == 1, r.stderr
    s = steps(manifest(r))["s"]
    assert (s["status"], s["error"]["code"]) == ("indeterminate", "timeout")  # not idempotent
    pgid = int(pidfile.read_text())
    assert wait_for(lambda: group_gone(pgid), f"the end of group {pgid}", 10)


def test_secrets_are_masked_in_errors_and_in_what_tools_print(
        root: Path, cluster: str, tmp_path: Path) -> None:
    plan(root, "secret", """
      - {id: s, tool: shout, arguments: {word: "{params.token}"}}
    """, extra="params:\n  token: {type: string, secret: true}\n")
    secret = "hunter2-sesame-9531"
    r = planrun(root, "execute", "secret", "-p", f"token={secret}", "--executor", cluster,
                "--json")
    assert r.returncode == 1
    s = steps(manifest(r))["s"]
    assert s["error"]["code"] == "exit_status"
    assert "no: ***" in s["error"]["message"]
    assert secret not in r.stdout + r.stderr
    journal = Path(os.environ["PLANRUN_JOURNAL"])
    with sqlite3.connect(journal) as conn:
        dumped = "\n".join(conn.iterdump())
    assert secret not in dumped


def test_a_call_sent_to_a_worker_carries_only_the_secrets_it_was_given(
        root: Path, cluster: str, tmp_path: Path) -> None:
    """Every call carried every secret of the run to the cluster (found by an attacker)."""
    log = tmp_path / "peek.log"
    plan(root, "peek", f"""
      - {{id: a, tool: peek, arguments: {{log: "{log}", word: "--key={{params.token}}"}}}}
      - {{id: b, tool: peek, arguments: {{log: "{log}", word: "plain"}}}}
      - {{id: c, tool: peek, arguments: {{log: "{log}", word: "pin {{params.pin}}"}}}}
      - {{id: d, tool: peek, arguments: {{log: "{log}", word: "{{params.db}}"}}}}
    """, extra="params:\n  token: {type: string, secret: true}\n"
               "  pin: {type: integer, secret: true}\n  db: {type: string, secret: true}\n")
    r = planrun(root, "execute", "peek", "-p", "token=tok-3141-secret", "-p", "pin=271828",
                "-p", "db=db-pw-1618", "--executor", cluster, "--json")
    assert r.returncode == 0, r.stderr
    held = {c["step"]: c["held"] for c in calls(log)}
    assert held == {"a": ["token"], "b": [], "c": ["pin"], "d": ["db"]}, held


def test_planrun_starts_its_own_cluster_from_planrun_toml(tmp_path: Path) -> None:
    """``executor = "dask"``: a LocalCluster for the run; tools' prints stay off stdout."""
    proj = tmp_path / "own"
    (proj / "plans").mkdir(parents=True)
    (proj / "tools.yaml").write_text(textwrap.dedent(TOOLS), encoding="utf-8")
    (proj / "dasktools.py").write_text(textwrap.dedent(MODULE), encoding="utf-8")
    (proj / "planrun.toml").write_text('executor = "dask"\n[dask]\nworkers = 1\n',
                                       encoding="utf-8")
    log = tmp_path / "own.log"
    secret = "opensesame-4417-zz"
    plan(proj, "own", f"""
      - {{id: a, tool: chatty, arguments: {{log: "{log}", token: "{{params.token}}"}}}}
      - {{id: b, tool: rec, depends_on: [a], arguments: {{log: "{log}"}}}}
    """, extra="params:\n  token: {type: string, secret: true}\n")
    r = planrun(proj, "execute", "own", "--json", env={"PLANRUN_PARAM_TOKEN": secret})
    assert r.returncode == 0, r.stderr
    m = manifest(r)  # stdout is the manifest only: the workers' prints went to stderr
    assert m["status"] == "completed"
    assert [c["step"] for c in calls(log)] == ["a", "b"]
    assert os.getpid() not in {c["pid"] for c in calls(log)}
    assert calls(log)[0]["env"] == []  # the workers inherit planrun's environment, less this
    assert "the token is ***" in r.stderr
    assert secret not in r.stdout + r.stderr


def _tasks_of(cluster: str, run_id: str, step: str) -> list[tuple[int, int]]:
    """(first item, calls) of each Dask task of a fan-out, from the scheduler's log."""
    def keys(dask_scheduler: Any = None) -> list[str]:
        return [str(t[0]) for t in dask_scheduler.transition_log]

    with distributed.Client(cluster.removeprefix("dask:"), timeout=10) as client:
        found = client.run_on_scheduler(keys)
    pattern = re.compile(rf"planrun-{run_id}/{step}#(\d+)/\d+-(\d+)-[0-9a-f]{{8}}")
    return sorted({(int(m[1]), int(m[2])) for k in found if (m := pattern.fullmatch(k))})


def test_a_slow_tool_goes_few_calls_to_a_task_once_its_time_is_known(
        root: Path, cluster: str, tmp_path: Path) -> None:
    log = tmp_path / "nap.log"
    plan(root, "naps", f"""
      - id: f
        tool: nap
        for_each: {list(range(40))}
        max_parallel: 40
        arguments: {{log: "{log}", s: 0.2}}
    """)
    r = planrun(root, "execute", "naps", "--executor", cluster, "--json",
                "--max-parallel", "40")
    assert r.returncode == 0, r.stderr
    m = manifest(r)
    assert sorted(c["item"] for c in calls(log)) == list(range(40))  # each exactly once
    tasks = _tasks_of(cluster, m["run_id"], "f")
    assert sum(n for _, n in tasks) == 40, tasks
    # 40 calls under way on 2 worker threads: the tool's time not known yet, the first
    # four tasks take 8 calls each (about 0.5 s of work at 1/16 s a call)...
    assert tasks[:4] == [(0, 8), (8, 8), (16, 8), (24, 8)], tasks
    # ...then, at 0.2 s a call, at most 2 calls (0.5 s) go to a task, not 20
    assert all(n <= 2 for first, n in tasks if first >= 32), tasks


def test_a_python_call_past_its_timeout_on_the_worker_is_a_timeout(
        root: Path, cluster: str, tmp_path: Path) -> None:
    log = tmp_path / "late.log"
    plan(root, "late", f"""
      - {{id: s, tool: nap, timeout: 1, arguments: {{log: "{log}", s: 4}}}}
      - {{id: t, tool: nap, arguments: {{log: "{log}", s: 0}}}}
    """)
    r = planrun(root, "execute", "late", "--executor", cluster, "--json", "--keep-going")
    assert r.returncode == 1, r.stderr
    got = steps(manifest(r))
    assert (got["s"]["status"], got["s"]["error"]["code"]) == ("failed", "timeout")
    assert "timeout of 1" in got["s"]["error"]["message"]
    assert got["t"]["status"] == "succeeded"  # the worker went on with the next call


def test_a_changed_tool_module_is_imported_again_on_the_workers(
        cluster: str, tmp_path: Path) -> None:
    """Workers outlive runs: a tool module edited between two runs is not served stale."""
    proj = tmp_path / "ver"
    (proj / "plans").mkdir(parents=True)
    (proj / "tools.yaml").write_text(
        "tools:\n  ver:\n    python: vermod_i15:version\n"
        "    arguments: {type: object, properties: {i: {type: integer}}}\n", encoding="utf-8")
    module = proj / "vermod_i15.py"
    module.write_text("import os\n\ndef version(i):\n    return [1, os.getpid()]\n",
                      encoding="utf-8")
    plan(proj, "ver", """
      - {id: v, tool: ver, for_each: [0, 1, 2, 3, 4, 5, 6, 7], max_parallel: 8,
         arguments: {i: "{item}"}}
    """)

    def outputs() -> list[list[Any]]:
        r = planrun(proj, "execute", "ver", "--executor", cluster, "--json",
                    "--max-parallel", "8")
        assert r.returncode == 0, r.stderr
        out = planrun(proj, "output", manifest(r)["run_id"], "v")
        return [list(o) for o in json.loads(out.stdout)]

    workers = set(_worker_pids(cluster))
    seen: set[int] = set()
    for _ in range(10):  # until every worker has imported the first version
        got = outputs()
        assert {v for v, _ in got} == {1}
        seen |= {pid for _, pid in got}
        if seen >= workers:
            break
    assert seen >= workers, (seen, workers)
    module.write_text("import os\n\ndef version(i):\n    return ['two', os.getpid()]\n",
                      encoding="utf-8")
    st = module.stat()  # a later modification time, whatever the clock's resolution
    os.utime(module, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
    assert {v for v, _ in outputs()} == {"two"}


# --- a worker killed mid-call ------------------------------------------------------------


def test_a_worker_killed_mid_batch_loses_only_that_batch_and_nothing_runs_twice(
        root: Path, cluster: str, tmp_path: Path) -> None:
    """A large batch held by one call: the worker is killed; what had reported stays."""
    log, until = tmp_path / "gate.log", tmp_path / "open"
    n, held = 120, 70
    plan(root, "gates", f"""
      - id: f
        tool: gate
        for_each: {json.dumps([i == held for i in range(n)])}
        max_parallel: {n}
        on_item_error: continue
        arguments: {{log: "{log}", until: "{until}", hold: "{{item}}"}}
    """)
    proc = start(root, tmp_path, "execute", "gates", "--executor", cluster, "--json",
                 "--max-parallel", str(n))
    mark = wait_for(lambda: [e for e in entries(log) if e["event"] == "start"],
                    "the held call starting")[0]
    before = quiet(log)  # every other call that can report did: the log stopped growing
    os.kill(mark["pid"], signal.SIGKILL)  # the worker, in the middle of its batch
    r = finish(proc, tmp_path)
    assert r.returncode == 1, r.stderr
    m = manifest(r)
    f = steps(m)["f"]
    assert f["status"] == "indeterminate", f
    lost = n - f["items"]["succeeded"]
    assert lost >= 1  # the held call, and the calls of its batch and worker
    # the calls of the batch that ran before the held one had no outcome back: they are
    # among the lost, never succeeded; every call ran at most once
    ran = sorted(c["item"] for c in before)
    assert len(ran) == len(set(ran))
    # Calls still waiting for a task slot when the worker died go on to the other worker
    # in this same run (they had not started anywhere): the first run's calls are counted
    # once it has ended, not when its log first went quiet (a CI run had 28 such calls).
    first = calls(log)
    ran = sorted(c["item"] for c in first)
    assert len(ran) == len(set(ran))
    until.touch()
    again = planrun(root, "retry", m["run_id"], "--executor", cluster, "--json")
    assert again.returncode == 0, again.stderr
    assert manifest(again)["status"] == "completed"
    after = calls(log)[len(first):]
    rerun = sorted(c["item"] for c in after)
    # exactly the items that had not reported ran again, each once, under the same key
    assert len(rerun) == len(set(rerun)) == lost, (rerun, lost)
    assert held in rerun
    keys = {c["item"]: c["key"] for c in before}
    assert all(keys.get(c["item"], c["key"]) == c["key"] for c in after)
    assert sorted(set(ran) | set(rerun)) == list(range(n))
    # what had reported before the kill (succeeded in the first run) never ran again
    assert len(set(ran) - set(rerun)) == f["items"]["succeeded"]


@pytest.mark.parametrize("odd", ["lock", "local"])
def test_an_output_that_cannot_cross_fails_its_call_alone_not_its_batch(
        root: Path, cluster: str, tmp_path: Path, odd: str) -> None:
    """One call's output that does not pickle (or unpickle on planrun's host) fails only it.

    The other calls of its batch ran: they succeed, and a retry never makes them again
    (the whole batch was journaled failed, and `retry` ran the non-idempotent calls twice;
    found by an attacker).
    """
    log = tmp_path / "odd.log"
    names = [f"n{i}" for i in range(20)]
    names[10] = odd
    plan(root, f"odd-{odd}", f"""
      - id: f
        tool: odd
        for_each: {json.dumps(names)}
        max_parallel: 20
        arguments: {{log: "{log}", name: "{{item}}"}}
    """)
    r = planrun(root, "execute", f"odd-{odd}", "--executor", cluster, "--json",
                "--max-parallel", "20")
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    m = manifest(r)
    tasks = _tasks_of(cluster, m["run_id"], "f")
    assert any(first <= 10 < first + n and n > 1 for first, n in tasks), tasks  # shared
    f = steps(m)["f"]
    assert f["items"] == {"total": 20, "succeeded": 19, "failed": 1}, f
    err = planrun(root, "status", m["run_id"], "--json")
    item = [e for e in json.loads(err.stdout)["steps"][0]["item_errors"]]
    assert [(e["index"], e["code"]) for e in item] == [(10, "output")], item
    assert "not JSON data" in item[0]["message"]
    again = planrun(root, "retry", m["run_id"], "--executor", cluster, "--json")
    assert again.returncode == 1, again.stderr
    made = sorted(c["item"] for c in calls(log))
    assert made == sorted([*range(20), 10]), made  # only the odd one was made again


def test_a_batch_whose_worker_died_holding_its_outcomes_is_not_run_again(
        root: Path, cluster: str, tmp_path: Path) -> None:
    """Dask reruns a finished task whose result died with its worker: its calls are not."""
    from planrun.dispatch import worker
    from planrun.dispatch.base import Call
    from planrun.tools import StepContext

    log = tmp_path / "held.log"
    batch = [Call("rec", {"log": str(log), "name": f"n{i}"},
                  StepContext(run_id="r-held", step_id="f", item_index=i,
                              idempotency_key=f"k{i}", attempt=1), None) for i in range(3)]
    with distributed.Client(cluster.removeprefix("dask:"), timeout=10) as client:
        future = client.submit(worker.run_batch, str(root), str(root / "tools.yaml"),
                               pickle.dumps(batch), pure=False, retries=0,
                               key=f"planrun-r-held/f#0/1-3-{os.urandom(4).hex()}")
        wait_for(lambda: future.status == "finished", "the batch finishing")
        assert len(calls(log)) == 3
        os.kill(calls(log)[0]["pid"], signal.SIGKILL)  # its outcomes die with the worker
        sent, _ = pickle.loads(future.result(timeout=TIMEOUT_S))  # run again by Dask
    outcomes = [worker.read_outcome(c, one) for c, one in zip(batch, sent, strict=True)]
    assert outcomes == [("lost", None)] * 3
    assert len(calls(log)) == 3  # each call made once, not twice


def test_a_worker_killed_mid_call_leaves_calls_indeterminate_never_run_twice(
        root: Path, cluster: str, tmp_path: Path) -> None:
    log, until = tmp_path / "kill.log", tmp_path / "release"
    plan(root, "kill", f"""
      - {{id: first, tool: rec, arguments: {{log: "{log}"}}}}
      - {{id: once, tool: hold, depends_on: [first],
          arguments: {{log: "{log}", until: "{until}"}}}}
      - {{id: again, tool: hold_again, depends_on: [first],
          arguments: {{log: "{log}", until: "{until}"}}}}
    """)
    proc = start(root, tmp_path, "execute", "kill", "--executor", cluster, "--json")
    marks = wait_for(lambda: [e for e in entries(log) if e["event"] == "start"]
                     if len([e for e in entries(log) if e["event"] == "start"]) == 2
                     else None, "both calls starting")
    for pid in {e["pid"] for e in marks}:
        os.kill(pid, signal.SIGKILL)  # the worker process itself, mid-call
    r = finish(proc, tmp_path)
    assert r.returncode == 1, r.stderr
    m = manifest(r)
    got = steps(m)
    assert got["first"]["status"] == "succeeded"
    for sid in ("once", "again"):
        assert (got[sid]["status"], got[sid]["error"]["code"]) == ("indeterminate",
                                                                   "call_lost"), got[sid]
    run_id = m["run_id"]
    until.touch()  # from now on a held call returns at once
    # the non-idempotent call is never called again on planrun's own: a person settles it
    refused = planrun(root, "retry", run_id, "--executor", cluster)
    assert refused.returncode == 5, refused.stderr
    assert "indeterminate" in refused.stderr
    assert calls(log, "once") == []
    settled = planrun(root, "resolve", run_id, "once", "--succeeded", "--output",
                      '{"held": "by hand"}')
    assert settled.returncode == 0, settled.stderr
    again = planrun(root, "retry", run_id, "--executor", cluster, "--json")
    assert again.returncode == 0, again.stderr
    assert manifest(again)["status"] == "completed"
    # the idempotent call ran once more, under the same key; nothing completed ran twice
    first_start = next(e for e in marks if e["step"] == "again")
    rerun = calls(log, "again")
    assert len(rerun) == 1
    assert rerun[0]["key"] == first_start["key"]
    assert len(calls(log, "first")) == 1
    assert calls(log, "once") == []


# --- cancellation ---------------------------------------------------------------------------


def test_a_second_sigint_stops_the_command_on_the_worker(root: Path, cluster: str,
                                                         tmp_path: Path) -> None:
    pidfile = tmp_path / "held.pid"
    plan(root, "stop", f"""
      - {{id: s, tool: sleeper, arguments: {{pidfile: "{pidfile}"}}}}
    """)
    proc = start(root, tmp_path, "execute", "stop", "--executor", cluster, "--json")
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), "the command starting")
    pgid = int(pidfile.read_text())
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)  # the second cancels at once
    r = finish(proc, tmp_path)
    assert r.returncode == 130, r.stderr
    m = manifest(r)
    assert m["status"] == "interrupted"
    assert steps(m)["s"]["status"] == "indeterminate"
    assert wait_for(lambda: group_gone(pgid), f"the end of group {pgid}", 15)


def test_a_python_call_of_a_killed_planrun_frees_its_worker_thread(
        root: Path, cluster: str, tmp_path: Path) -> None:
    log, until = tmp_path / "free.log", tmp_path / "never"
    plan(root, "free", f"""
      - {{id: h, tool: hold, arguments: {{log: "{log}", until: "{until}"}}}}
    """)
    proc = start(root, tmp_path, "execute", "free", "--executor", cluster)
    mark = wait_for(lambda: [e for e in entries(log) if e["event"] == "start"],
                    "the call starting")[0]
    os.killpg(proc.pid, signal.SIGKILL)  # planrun dies; its task is released
    proc.wait()
    try:
        # a python call cannot be killed: it goes on in its thread, but the worker's own
        # thread, which waited for it, is free again for other tasks
        with distributed.Client(cluster.removeprefix("dask:"), timeout=10) as client:
            address = next(a for a, pid in client.run(os.getpid).items()
                           if pid == mark["pid"])
            future = client.submit(os.getpid, workers=[address], allow_other_workers=False,
                                   pure=False)
            assert future.result(timeout=20) == mark["pid"]
        assert calls(log, "h") == []  # still held
    finally:
        until.touch()


def test_a_command_of_a_killed_planrun_does_not_run_on_on_the_worker(
        root: Path, cluster: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "orphan.pid"
    plan(root, "orphan", f"""
      - {{id: s, tool: sleeper, arguments: {{pidfile: "{pidfile}"}}}}
    """)
    proc = start(root, tmp_path, "execute", "orphan", "--executor", cluster)
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), "the command starting")
    pgid = int(pidfile.read_text())
    os.killpg(proc.pid, signal.SIGKILL)  # planrun dies; the worker runs on
    proc.wait()
    # its client gone, the scheduler releases the task; the worker ends the command
    assert wait_for(lambda: group_gone(pgid), f"the end of group {pgid}", 20)
    r = planrun(root, "resume", "--executor", cluster)
    assert r.returncode == 5, r.stderr
    assert "error[indeterminate]" in r.stderr  # left running by a crash, not idempotent


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def own_scheduler(root: Path, tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A scheduler (and one worker) of this test alone, as processes it may kill."""
    port = _free_port()
    env = {**os.environ, "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "0"}
    procs = []
    with (tmp_path / "cluster.log").open("wb") as log:
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
             "--port", str(port), "--no-dashboard"], cwd=root, env=env, stdout=log,
            stderr=log, stdin=subprocess.DEVNULL, start_new_session=True))
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", f"tcp://127.0.0.1:{port}",
             "--nthreads", "1", "--host", "127.0.0.1", "--no-dashboard",
             "--death-timeout", "120"], cwd=root, env=env, stdout=log, stderr=log,
            stdin=subprocess.DEVNULL, start_new_session=True))
    address = f"tcp://127.0.0.1:{port}"
    try:
        with distributed.Client(address, timeout=30) as client:
            client.wait_for_workers(1, timeout=30)
        yield f"dask:{address}", procs[0]
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_scheduler_that_dies_mid_run_ends_the_run_it_does_not_hang(
        root: Path, tmp_path: Path, own_scheduler: tuple[str, subprocess.Popen[bytes]]
) -> None:
    """The call under way is call_lost; calls ready after it are not sent (they failed).

    A call submitted while the client was reconnecting waited for ever once the client
    gave up (the run hung, holding its lease; found by an attacker).
    """
    address, scheduler = own_scheduler
    log, until = tmp_path / "dies.log", tmp_path / "never"
    plan(root, "dies", f"""
      - {{id: a, tool: hold, arguments: {{log: "{log}", until: "{until}"}}}}
      - {{id: c, tool: rec, arguments: {{log: "{log}", name: c}}}}
      - {{id: d, tool: rec, arguments: {{log: "{log}", name: d}}}}
    """)
    proc = start(root, tmp_path, "execute", "dies", "--executor", address, "--json",
                 "--keep-going", "--max-parallel", "1")
    wait_for(lambda: entries(log), "the first call starting")
    os.killpg(scheduler.pid, signal.SIGKILL)
    scheduler.wait()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError("planrun hung after its Dask scheduler died") from None
    r = finish(proc, tmp_path)
    assert r.returncode == 1, r.stderr
    m = manifest(r)
    by = steps(m)
    assert by["a"]["status"] == "indeterminate", by["a"]
    assert by["a"]["error"]["code"] == "call_lost"
    for sid in ("c", "d"):
        assert by[sid]["status"] == "failed", by[sid]
        assert "the call was not sent" in by[sid]["error"]["message"]
    assert calls(log) == []  # c and d never ran anywhere


# --- choosing the executor ----------------------------------------------------------------


@pytest.mark.parametrize("value", ["dusk", "dask:", "dask:tcp://nohost", "dask:udp://h:1",
                                   "dask:tcp://h:99999", "dask:tcp://h:1/x", " local:x"])
def test_executor_values_that_are_refused(value: str) -> None:
    from planrun.paths import parse_executor

    with pytest.raises(ValueError, match=r"use local, dask .* or dask:tcp://HOST:PORT"):
        parse_executor(value)


@pytest.mark.parametrize(("value", "canonical"), [
    ("local", "local"), ("dask", "dask"),
    ("dask:tcp://10.0.0.5:8786", "dask:tcp://10.0.0.5:8786"),
    ("dask:10.0.0.5:8786", "dask:tcp://10.0.0.5:8786"),
    ("dask:tls://h.example:1", "dask:tls://h.example:1"),
])
def test_executor_values_that_are_accepted(value: str, canonical: str) -> None:
    from planrun.paths import parse_executor

    assert parse_executor(value) == canonical


def test_a_bad_executor_is_one_usage_error(root: Path) -> None:
    plan(root, "bad", "  - {id: a, tool: rec, arguments: {log: x.log}}\n")
    r = planrun(root, "execute", "bad", "--executor", "dusk")
    assert r.returncode == 2
    assert r.stderr.count("error[usage]") == 1
    assert "Traceback" not in r.stderr
    assert "dask:tcp://HOST:PORT" in r.stderr


def test_executor_in_planrun_toml(tmp_path: Path) -> None:
    from planrun.errors import Refused
    from planrun.paths import load_settings

    (tmp_path / "planrun.toml").write_text('executor = "dask:h:8786"\n[dask]\nworkers = 3\n',
                                           encoding="utf-8")
    settings = load_settings(project=tmp_path)
    assert (settings.executor, settings.dask) == ("dask:tcp://h:8786", {"workers": 3})
    for bad in ('executor = "cluster"\n', "executor = 3\n", "[dask]\nworkers = 0\n",
                "[dask]\nnodes = 2\n"):
        (tmp_path / "planrun.toml").write_text(bad, encoding="utf-8")
        with pytest.raises(Refused) as exc:
            load_settings(project=tmp_path)
        assert exc.value.code == "config"


def test_a_scheduler_that_cannot_be_reached_is_one_message_and_nothing_runs(
        root: Path, tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "none.log"
    plan(root, "unreached", f"  - {{id: a, tool: rec, arguments: {{log: \"{log}\"}}}}\n")
    r = planrun(root, "execute", "unreached", "--executor", f"dask:tcp://127.0.0.1:{port}",
                env={"DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s"})
    assert r.returncode == 5, r.stderr
    assert r.stderr.count("error[executor_unavailable]") == 1
    assert "Traceback" not in r.stderr
    assert f"127.0.0.1:{port}" in r.stderr
    assert not log.exists()
    runs = planrun(root, "runs", "--json")
    assert json.loads(runs.stdout) == []  # nothing was journaled


@pytest.fixture
def impostor() -> Iterator[tuple[str, list[bytes]]]:
    """A TCP port that takes connections and says what the test puts in the list (or
    nothing at all); never a Dask scheduler."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.2)
    say: list[bytes] = []
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)
            for data in say:
                conn.sendall(data)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"dask:tcp://127.0.0.1:{server.getsockname()[1]}", say
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


@pytest.mark.parametrize("answer", [b"", b"\xff" * 64 + b"\r\n"], ids=["silent", "foreign"])
def test_a_peer_that_is_no_scheduler_is_one_message_in_bounded_time(
        root: Path, tmp_path: Path, impostor: tuple[str, list[bytes]], answer: bytes) -> None:
    """A port that never answers made planrun wait for ever; one that answers something
    else failed with 'MemoryError: no answer', then stalled 20 s and printed the half-made
    client's traceback (found by an attacker)."""
    address, say = impostor
    if answer:
        say.append(answer)
    log = tmp_path / "none.log"
    plan(root, "impostor", f"  - {{id: a, tool: rec, arguments: {{log: \"{log}\"}}}}\n")
    started = time.monotonic()
    r = planrun(root, "execute", "impostor", "--executor", address, timeout=60,
                env={"DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "2s"})
    took = time.monotonic() - started
    assert r.returncode == 5, r.stderr
    assert r.stderr.count("error[executor_unavailable]") == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert "MemoryError" not in r.stderr
    assert took < (35 if not answer else 15), took
    assert not log.exists()
    assert json.loads(planrun(root, "runs", "--json").stdout) == []  # nothing journaled


def test_a_scheduler_that_retries_lost_tasks_is_refused(root: Path) -> None:
    with dask.config.set({"distributed.scheduler.allowed-failures": 3}):
        lc = distributed.LocalCluster(n_workers=0, processes=False, protocol="tcp://",
                                      host="127.0.0.1",
                                      dashboard_address=None)
    try:
        plan(root, "retrying", "  - {id: a, tool: rec, arguments: {log: x.log}}\n")
        r = planrun(root, "execute", "retrying", "--executor", f"dask:{lc.scheduler_address}")
    finally:
        lc.close()
    assert r.returncode == 5
    assert "error[executor_unavailable]" in r.stderr
    assert "allowed-failures" in r.stderr


def test_the_worker_check_names_what_a_worker_lacks(root: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from planrun.dispatch import worker

    assert worker.check(str(root), str(root / "tools.yaml")) is None
    assert "no project folder" in str(worker.check(str(tmp_path / "gone"), "tools.yaml"))
    assert "tools.yaml on this worker" in str(worker.check(str(tmp_path),
                                                           str(tmp_path / "tools.yaml")))
    monkeypatch.setenv(worker.PROJECT_ENV, str(root))  # installed elsewhere on the worker
    assert worker.check("/elsewhere/proj", "/elsewhere/proj/tools.yaml") is None


def test_start_up_and_local_runs_do_not_import_dask(root: Path, tmp_path: Path) -> None:
    probe = textwrap.dedent("""
        import atexit, sys
        def report():
            loaded = sorted(m for m in sys.modules
                            if m.split(".")[0] in ("dask", "distributed"))
            sys.stderr.write("DASK:" + ",".join(loaded) + "\\n")
        atexit.register(report)
        from planrun.cli import main
        sys.argv = ["planrun", *sys.argv[1:]]
        main()
    """)
    log = tmp_path / "local.log"
    plan(root, "local", f"  - {{id: a, tool: rec, arguments: {{log: \"{log}\"}}}}\n")
    for args in (["--help"], ["execute", "local", "--executor", "local"]):
        proc = subprocess.run([sys.executable, "-c", probe, *args], cwd=root,
                              capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
        assert proc.returncode == 0, proc.stderr
        line = [x for x in proc.stderr.splitlines() if x.startswith("DASK:")][-1]
        assert line == "DASK:", (args, line)
    assert [c["pid"] for c in calls(log)] != []


def _worker_pids(address: str) -> list[int]:
    with distributed.Client(address.removeprefix("dask:"), timeout=10) as client:
        return list(client.run(os.getpid).values())
