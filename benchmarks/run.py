#!/usr/bin/env python3
"""planrun benchmarks (issues 4 and 16): one command, one table.

    python benchmarks/run.py            # full run (a few minutes on a 2-core machine)
    python benchmarks/run.py --quick    # fewer/smaller repetitions (< 60 s)
    python benchmarks/run.py --smoke    # a few steps each, targets not checked (< 15 s)

Run it with the project's virtualenv active (it imports ``planrun`` and runs the
``planrun`` executable next to the Python running it). W1 (whole process), W3 and W4 also
run as luigi tasks side by side (benchmarks/luigi_peer.py) when a Python with luigi is
found: ``--luigi-python PATH``, ``$BENCH_LUIGI_PYTHON``, or this Python if it has luigi;
luigi is never a planrun dependency (``pip install luigi``, best in a separate
virtualenv). Everything happens in a temporary folder that is removed at the end
(``--keep`` keeps it). Only the standard library and planrun are used (luigi only in its
own process). See benchmarks/README.md for what each workload measures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# --- sizes per mode ----------------------------------------------------------------------


@dataclass(frozen=True)
class Mode:
    name: str
    check_targets: bool
    commits: int  # raw SQLite commits timed before the first and after the last workload
    commits_between: int  # ... and between two workloads
    w1_steps: int
    w1_reps: int
    w1_proc_steps: int
    w1_proc_reps: int
    w2_items: int
    w2_reps: int
    w2_big_items: int
    w2_big_reps: int
    w3_steps: int
    w3_sleep: float
    w3_reps: int
    w4_steps: int
    w4_crash: int
    w4_reps: int
    w4_big_steps: int
    w4_big_crash: int
    w4_big_reps: int
    w5_reps: int
    w6_sizes: tuple[int, int, int]
    w6_reps: tuple[int, int, int]


MODES = {
    "full": Mode("full", True, commits=1000, commits_between=300,
                 w1_steps=1000, w1_reps=5, w1_proc_steps=200, w1_proc_reps=7,
                 w2_items=2000, w2_reps=5, w2_big_items=10_000, w2_big_reps=3,
                 w3_steps=20, w3_sleep=0.2, w3_reps=7,
                 w4_steps=50, w4_crash=26, w4_reps=5,
                 w4_big_steps=10_000, w4_big_crash=5001, w4_big_reps=2,
                 w5_reps=11, w6_sizes=(1000, 10_000, 100_000), w6_reps=(5, 3, 2)),
    "quick": Mode("quick", True, commits=300, commits_between=100,
                  w1_steps=1000, w1_reps=2, w1_proc_steps=200, w1_proc_reps=3,
                  w2_items=2000, w2_reps=2, w2_big_items=10_000, w2_big_reps=1,
                  w3_steps=20, w3_sleep=0.2, w3_reps=3,
                  w4_steps=50, w4_crash=26, w4_reps=2,
                  w4_big_steps=10_000, w4_big_crash=5001, w4_big_reps=1,
                  w5_reps=5, w6_sizes=(1000, 5000, 50_000), w6_reps=(1, 1, 1)),
    "smoke": Mode("smoke", False, commits=20, commits_between=10,
                  w1_steps=5, w1_reps=1, w1_proc_steps=5, w1_proc_reps=1,
                  w2_items=5, w2_reps=1, w2_big_items=20, w2_big_reps=1,
                  w3_steps=3, w3_sleep=0.01, w3_reps=1,
                  w4_steps=6, w4_crash=4, w4_reps=1,
                  w4_big_steps=20, w4_big_crash=11, w4_big_reps=1,
                  w5_reps=1, w6_sizes=(10, 50, 100), w6_reps=(1, 1, 1)),
}

#: Longest any one planrun subprocess may take before it is killed (the workload fails).
PROC_TIMEOUT_S = 240.0


class BenchError(Exception):
    """A workload did not do what it should (wrong exit status, wrong result...)."""


# --- the temporary project -------------------------------------------------------------

TOOLS_MODULE = '''\
"""Tools of the planrun benchmark project (written by benchmarks/run.py)."""

import os
import time


def noop(n):
    return None


def emit(n):
    return list(range(n))


def double(x):
    return 2 * x


def total(xs):
    return sum(xs)


def nap(seconds):
    time.sleep(seconds)
    return None


def mark(n):
    """Append "N UNIX_TIME" to $BENCH_EFFECTS: one line per real call."""
    line = f"{n} {time.time():.6f}\\n".encode()
    fd = os.open(os.environ["BENCH_EFFECTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return n
'''

TOOLS_YAML = '''\
tools:
  noop:
    description: Does nothing
    python: bench_tools:noop
    blocking: false     # returns at once: called on the event loop's thread
    arguments: {type: object, properties: {n: {type: integer}}, required: [n],
                additionalProperties: false}
  noop_threaded:
    description: Does nothing, in a worker thread (no blocking declaration)
    python: bench_tools:noop
    arguments: {type: object, properties: {n: {type: integer}}, required: [n],
                additionalProperties: false}
  emit:
    description: The list 0..n-1
    python: bench_tools:emit
    blocking: false     # returns at once: called on the event loop's thread
    arguments: {type: object, properties: {n: {type: integer}}, required: [n],
                additionalProperties: false}
  double:
    description: 2 * x
    python: bench_tools:double
    blocking: false     # returns at once: called on the event loop's thread
    arguments: {type: object, properties: {x: {type: integer}}, required: [x],
                additionalProperties: false}
  total:
    description: Sum of a list of integers
    python: bench_tools:total
    blocking: false     # returns at once: called on the event loop's thread
    arguments: {type: object, properties: {xs: {type: array, items: {type: integer}}},
                required: [xs], additionalProperties: false}
  nap:
    description: Sleep some seconds
    python: bench_tools:nap
    arguments: {type: object, properties: {seconds: {type: number}}, required: [seconds],
                additionalProperties: false}
  mark:
    description: Append a timestamped line to $BENCH_EFFECTS
    python: bench_tools:mark
    idempotent: true
    blocking: false
    arguments: {type: object, properties: {n: {type: integer}}, required: [n],
                additionalProperties: false}
'''


def chain_plan(name: str, n: int, tool: str = "noop") -> str:
    """A chain s1 -> s2 -> ... -> sN, one flow-style line per step."""
    lines = [f"planrun: 1\nname: {name}\ngoal: benchmark chain of {n} steps\nsteps:"]
    lines.append(f"  - {{id: s1, tool: {tool}, arguments: {{n: 1}}}}")
    lines.extend(f"  - {{id: s{i}, tool: {tool}, depends_on: [s{i - 1}], arguments: {{n: {i}}}}}"
                 for i in range(2, n + 1))
    return "\n".join(lines) + "\n"


def fan_plan(name: str, items: int) -> str:
    return textwrap.dedent(f"""\
        planrun: 1
        name: {name}
        goal: emit {items} integers, double each, sum them
        steps:
          - id: emit
            tool: emit
            arguments: {{n: {items}}}
          - id: double
            tool: double
            depends_on: [emit]
            for_each: "{{steps.emit.output}}"
            arguments: {{x: "{{item}}"}}
          - id: join
            tool: total
            depends_on: [double]
            arguments: {{xs: "{{steps.double.output}}"}}
        """)


def parallel_plan(name: str, n: int, seconds: float) -> str:
    lines = [f"planrun: 1\nname: {name}\ngoal: {n} independent sleeps\nsteps:"]
    lines.extend(f"  - {{id: p{i}, tool: nap, arguments: {{seconds: {seconds}}}}}"
                 for i in range(1, n + 1))
    return "\n".join(lines) + "\n"


@dataclass
class Project:
    root: Path
    plans: Path = field(init=False)

    def __post_init__(self) -> None:
        self.plans = self.root / "plans"
        self.plans.mkdir(parents=True)
        (self.root / "planrun.toml").write_text("max_steps = 200000\nmax_parallel = 4\n")
        (self.root / "tools.yaml").write_text(TOOLS_YAML)
        (self.root / "bench_tools.py").write_text(TOOLS_MODULE)

    def add(self, name: str, text: str) -> str:
        (self.plans / f"{name}.yaml").write_text(text)
        return name

    def journal(self, label: str) -> Path:
        path = self.root / "journals" / f"{label}.sqlite3"
        path.parent.mkdir(exist_ok=True)
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                Path(f"{path}{suffix}").unlink()
        return path


# --- running planrun as a process --------------------------------------------------------


def planrun_argv() -> list[str]:
    exe = Path(sys.executable).parent / "planrun"
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "planrun"]


#: The user cache folder of every planrun process (``XDG_CACHE_HOME``): inside the
#: benchmark's temporary folder, so what planrun keeps there (contract fits, the CEL
#: parser) comes from this run's warm-up runs, never from the user's own. Set by main.
CACHE_HOME: Path | None = None


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PLANRUN_") and k not in ("FORCE_COLOR", "CLICOLOR_FORCE")}
    env["NO_COLOR"] = "1"
    if CACHE_HOME is not None:
        env["XDG_CACHE_HOME"] = str(CACHE_HOME)
    env.update(extra)
    return env


@dataclass
class Proc:
    argv: list[str]
    returncode: int
    wall_s: float
    maxrss_mb: float
    stdout: str
    stderr: str

    def describe(self) -> str:
        tail = "\n".join((self.stderr.strip() or self.stdout.strip()).splitlines()[-8:])
        return f"`{' '.join(self.argv)}` exited {self.returncode}:\n{tail}"


def run_proc(argv: Sequence[str], *, cwd: Path, env: dict[str, str],
             timeout: float = PROC_TIMEOUT_S, expect: int | None = 0) -> Proc:
    """Run one child; wall time from just before spawn to reaping, and its own peak RSS.

    ``os.wait4`` gives the resource usage of exactly this child (``ru_maxrss``), unlike
    ``RUSAGE_CHILDREN``, which is the maximum over every child reaped so far.
    """
    timed_out = threading.Event()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                             stdout=out, stderr=err, start_new_session=True)

        def kill() -> None:
            timed_out.set()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            _, status, usage = os.wait4(p.pid, 0)
        except BaseException:
            timer.cancel()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            raise
        wall = time.perf_counter() - t0
        timer.cancel()
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        proc = Proc(list(argv), p.returncode, wall, usage.ru_maxrss / 1024,
                    out.read().decode(errors="replace"), err.read().decode(errors="replace"))
    if timed_out.is_set():
        raise BenchError(f"`{' '.join(argv)}` did not finish in {timeout:.0f} s (killed)")
    if expect is not None and proc.returncode != expect:
        raise BenchError(f"expected exit {expect}; " + proc.describe())
    return proc


# --- the raw durable commit baseline --------------------------------------------------------


def sqlite_commit_ms(folder: Path, n: int) -> list[float]:
    """Milliseconds per commit of one small INSERT (WAL, synchronous=FULL, BEGIN IMMEDIATE)."""
    path = folder / f"raw-{time.monotonic_ns()}.sqlite3"
    con = sqlite3.connect(path, isolation_level=None)
    try:
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=FULL")
        con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        samples = []
        payload = "x" * 64
        for _ in range(n + 10):
            t0 = time.perf_counter()
            con.execute("BEGIN IMMEDIATE")
            con.execute("INSERT INTO t (v) VALUES (?)", (payload,))
            con.execute("COMMIT")
            samples.append((time.perf_counter() - t0) * 1000)
        return samples[10:]  # the first commits create the WAL file
    finally:
        con.close()
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                Path(f"{path}{suffix}").unlink()


# --- results -----------------------------------------------------------------------------


@dataclass
class Row:
    workload: str
    what: str
    value: float | None
    unit: str
    target: str = "-"
    ok: bool | None = None
    ratio: bool = False  # show value / raw commit (value in ms)
    note: str = ""
    commit_ms: float | None = None  # the raw commit timed around this row's workload
    luigi: float | None = None  # the same workload as luigi tasks (same unit)


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    commit_ms: float = 0.0
    luigi: list[str] | None = None  # argv prefix running benchmarks/luigi_peer.py, or None
    luigi_missing: str = ""  # why luigi does not run

    def add(self, *args: Any, **kwargs: Any) -> Row:
        row = Row(*args, **kwargs)
        self.rows.append(row)
        return row


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def fmt_value(row: Row, v: float | None = None) -> str:
    v = row.value if v is None else v
    if v is None:
        return "error"
    if row.unit == "ms":
        return f"{v:.3f} ms" if v < 10 else f"{v:.1f} ms"
    if row.unit == "s":
        return f"{v:.3f} s"
    if row.unit == "items/s":
        return f"{v:,.0f} items/s"
    if row.unit == "MB":
        return f"{v:.0f} MB"
    if row.unit == "x":
        return f"{v:.1f}x"
    if row.unit == "count":
        return f"{v:.0f}"
    return f"{v:g} {row.unit}"


def as_ms(value: float, unit: str) -> float | None:
    """A time figure in milliseconds (items/s as ms per item), else None."""
    if unit == "s":
        return value * 1000
    if unit == "ms":
        return value
    if unit == "items/s" and value > 0:
        return 1000 / value
    return None


def print_table(results: Results, mode: Mode, out: Any = sys.stdout) -> None:
    header = ("workload", "measured", "target (issue 16)", "x commit", "luigi", "result")
    rows = []
    for r in results.rows:
        ratio = "-"
        ms = as_ms(r.value, r.unit) if r.value is not None else None
        if (r.ratio or ms is not None) and ms is not None and r.commit_ms:
            ratio = f"{ms / r.commit_ms:,.2f}x"
        verdict = "-" if r.ok is None or not mode.check_targets else (
            "PASS" if r.ok else "FAIL")
        if r.value is None:
            verdict = "ERROR"
        peer = "-"
        if r.luigi is not None:
            peer = fmt_value(r, r.luigi)
            if r.value is not None:
                peer += " (ahead)" if r.value < r.luigi else " (behind)"
        elif r.workload == "Raw" and results.luigi is None:
            peer = "not installed"
        rows.append((f"{r.workload} {r.what}", fmt_value(r), r.target, ratio, peer, verdict))
    widths = [max(len(x[i]) for x in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    print(line(header), file=out)
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|", file=out)
    for cells in rows:
        print(line(cells), file=out)


# --- workloads ---------------------------------------------------------------------------


def in_process_execute(project: Project, plan: str, journal: Path) -> tuple[float, dict[str, Any]]:
    """(seconds of the ``planrun.api.execute`` call alone, the manifest)."""
    from planrun import api
    from planrun.paths import load_settings

    settings = load_settings(project=project.root, journal=journal)
    given = api.param_input()
    t0 = time.perf_counter()
    outcome = api.execute(settings, plan, given)
    elapsed = time.perf_counter() - t0
    if not isinstance(outcome, api.RunOutcome) or outcome.status != "completed":
        raise BenchError(f"plan {plan} did not complete: {outcome!r:.500}")
    return elapsed, outcome.manifest


def in_process_output(project: Project, journal: Path, run_id: str, step: str) -> Any:
    from planrun import api
    from planrun.paths import load_settings

    return api.output(load_settings(project=project.root, journal=journal), run_id, step)


def w1(project: Project, mode: Mode, res: Results) -> None:
    n = mode.w1_steps
    plan = project.add("chain_w1", chain_plan("chain_w1", n))
    journal = project.journal("w1")
    # Warm-up (imports, journal schema) with a short chain of the same tool.
    in_process_execute(project, project.add("chain_w1_warm", chain_plan("chain_w1_warm", 10)),
                       journal)
    per_step = []
    for _ in range(mode.w1_reps):
        elapsed, manifest = in_process_execute(project, plan, journal)
        if manifest["counts"]["succeeded"] != n:
            raise BenchError(f"W1: {manifest['counts']}")
        per_step.append(elapsed * 1000 / n)
    v = median(per_step)
    res.add("W1", f"{n:,}-step chain, in-process (ms/step)", v, "ms", "<= 0.25 ms/step",
            v <= 0.25, ratio=True)
    # The same chain of a tool that does not declare ``blocking: false``: each call goes
    # to a worker thread and back (what a tool costs by default).
    plan_t = project.add("chain_w1t", chain_plan("chain_w1t", n, "noop_threaded"))
    in_process_execute(project, project.add("chain_w1t_warm",
                                            chain_plan("chain_w1t_warm", 10, "noop_threaded")),
                       journal)
    threaded = [in_process_execute(project, plan_t, journal)[0] * 1000 / n
                for _ in range(mode.w1_reps)]
    res.add("W1", f"{n:,}-step chain, in-process, tool in a thread (ms/step)",
            median(threaded), "ms", ratio=True)

    m = mode.w1_proc_steps
    plan = project.add("chain_w1p", chain_plan("chain_w1p", m))
    argv = [*planrun_argv(), "execute", plan]
    env = clean_env(PLANRUN_JOURNAL=str(project.journal("w1p")))
    run_proc(argv, cwd=project.root, env=env)  # warm-up: page cache, journal created
    walls = [run_proc(argv, cwd=project.root, env=env).wall_s
             for _ in range(mode.w1_proc_reps)]
    v = median(walls)
    row = res.add("W1", f"{m}-step chain, whole `planrun execute`", v, "s", "<= 0.30 s",
                  v <= 0.30)
    if res.luigi is not None:
        row.luigi = median([luigi_wall(res, project, ["chain", str(m)])
                            for _ in range(mode.w1_proc_reps)])


def w2(project: Project, mode: Mode, res: Results) -> None:
    n = mode.w2_items
    plan = project.add("fan_w2", fan_plan("fan_w2", n))
    journal = project.journal("w2")
    in_process_execute(project, project.add("fan_w2_warm", fan_plan("fan_w2_warm", 10)),
                       journal)
    times = []
    for _ in range(mode.w2_reps):
        elapsed, manifest = in_process_execute(project, plan, journal)
        total = in_process_output(project, journal, manifest["run_id"], "join")
        if total != n * (n - 1):
            raise BenchError(f"W2: join gave {total}, expected {n * (n - 1)}")
        times.append(elapsed)
    v = median(times)
    res.add("W2", f"{n:,} items, in-process execute (total)", v, "s", "<= 0.25 s", v <= 0.25)
    res.add("W2", f"{n:,} items, per item", v * 1000 / n, "ms", ratio=True)

    big = mode.w2_big_items
    plan = project.add("fan_w2_big", fan_plan("fan_w2_big", big))
    j = project.journal("w2big")
    env = clean_env(PLANRUN_JOURNAL=str(j))
    run_proc([*planrun_argv(), "execute", "fan_w2_warm"], cwd=project.root, env=env)
    walls, rss, exec_s = [], [], []
    for _ in range(mode.w2_big_reps):
        proc = run_proc([*planrun_argv(), "execute", plan, "--json"], cwd=project.root,
                        env=env)
        manifest = json.loads(proc.stdout)
        if manifest["status"] != "completed":
            raise BenchError(f"W2 {big} items: run {manifest['status']}")
        total = in_process_output(project, j, manifest["run_id"], "join")
        if total != big * (big - 1):
            raise BenchError(f"W2: join gave {total}, expected {big * (big - 1)}")
        walls.append(proc.wall_s)
        rss.append(proc.maxrss_mb)
        exec_s.append(float(manifest["duration_s"]))
    rate = big / median(walls)
    res.add("W2", f"{big:,} items, whole process", rate, "items/s", ">= 6,000 items/s",
            rate >= 6000, note=f"process wall {median(walls):.2f} s")
    res.add("W2", f"{big:,} items, run only (manifest duration_s), per item",
            median(exec_s) * 1000 / big, "ms", ratio=True)
    v = max(rss)
    res.add("W2", f"{big:,} items, peak RSS of the process", v, "MB", "<= 100 MB", v <= 100)


def w3(project: Project, mode: Mode, res: Results) -> None:
    n = mode.w3_steps
    plan = project.add("par_w3", parallel_plan("par_w3", n, mode.w3_sleep))
    argv = [*planrun_argv(), "execute", plan, "--max-parallel", str(n)]
    env = clean_env(PLANRUN_JOURNAL=str(project.journal("w3")))
    run_proc(argv, cwd=project.root, env=env)  # warm-up: page cache, journal created
    walls = [run_proc(argv, cwd=project.root, env=env).wall_s for _ in range(mode.w3_reps)]
    v = median(walls)
    row = res.add("W3", f"{n} x {mode.w3_sleep} s sleeps, --max-parallel {n}, whole process",
                  v, "s", "<= 0.38 s", v <= 0.38)
    if res.luigi is not None:
        row.luigi = median([luigi_wall(res, project, ["parallel", str(n), str(mode.w3_sleep)])
                            for _ in range(mode.w3_reps)])


def read_effects(path: Path) -> list[tuple[int, float]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        n, t = line.split()
        out.append((int(n), float(t)))
    return out


def crash_and_resume(project: Project, plan: str, steps: int, crash: int, label: str
                     ) -> tuple[int, float]:
    """SIGKILL the run at the dispatch of step ``crash``, resume it.

    Returns:
        (completed steps that ran again, seconds from launching ``resume`` to the effect
        of step ``crash``).
    """
    journal = project.journal(label)
    effects = project.root / "journals" / f"{label}.effects"
    effects.unlink(missing_ok=True)
    env = clean_env(PLANRUN_JOURNAL=str(journal), BENCH_EFFECTS=str(effects))
    run_proc([*planrun_argv(), "execute", plan], cwd=project.root,
             env={**env, "PLANRUN_TEST_CRASH": f"dispatch:s{crash}"}, expect=-signal.SIGKILL)
    before = read_effects(effects)
    if [n for n, _ in before] != list(range(1, crash)):
        raise BenchError(f"{label}: before the crash, steps {_span(before)} ran; expected "
                         f"1..{crash - 1}")
    launched = time.time()
    run_proc([*planrun_argv(), "resume"], cwd=project.root, env=env)
    after = read_effects(effects)[len(before):]
    rerun = sum(1 for n, _ in after if n < crash)
    ran = sorted(n for n, _ in after if n >= crash)
    if ran != list(range(crash, steps + 1)):
        raise BenchError(f"{label}: resume ran steps {_span(after)}; expected {crash}..{steps}")
    first = next(t for n, t in after if n == crash)
    return rerun, first - launched


def _span(effects: list[tuple[int, float]]) -> str:
    ns = [n for n, _ in effects]
    return f"{ns[:5]}...{ns[-3:]} ({len(ns)})" if len(ns) > 8 else str(ns)


def w4(project: Project, mode: Mode, res: Results) -> None:
    for steps, crash, reps, target in (
            (mode.w4_steps, mode.w4_crash, mode.w4_reps, 0.12),
            (mode.w4_big_steps, mode.w4_big_crash, mode.w4_big_reps, 0.35)):
        plan = project.add(f"chain_w4_{steps}", chain_plan(f"chain_w4_{steps}", steps, "mark"))
        reruns, latency = [], []
        for i in range(reps):
            r, lat = crash_and_resume(project, plan, steps, crash, f"w4-{steps}-{i}")
            reruns.append(r)
            latency.append(lat)
        res.add("W4", f"{steps:,}-step chain killed at s{crash}: completed steps re-run",
                max(reruns), "count", "0", max(reruns) == 0)
        v = median(latency)
        row = res.add("W4", f"{steps:,}-step chain: `resume` launch -> s{crash} effect", v,
                      "s", f"<= {target} s", v <= target)
        if res.luigi is not None and steps == mode.w4_steps:
            row.luigi = median([luigi_resume(res, project, steps, crash, f"{steps}-{i}")
                                for i in range(reps)])


def w5(project: Project, mode: Mode, res: Results) -> None:
    plan = project.add("small_w5", chain_plan("small_w5", 3))
    env = clean_env(PLANRUN_JOURNAL=str(project.journal("w5")))
    cases: list[tuple[str, list[str], str, float | None]] = [
        ("`python -c pass`", [sys.executable, "-c", "pass"], "(reference, ~11 ms)", None),
        ("`planrun --help`", [*planrun_argv(), "--help"], "<= 60 ms", 60.0),
        ("`planrun validate` (3-step plan)", [*planrun_argv(), "validate", plan], "<= 130 ms",
         130.0),
        ("`planrun execute` (3-step plan)", [*planrun_argv(), "execute", plan], "<= 180 ms",
         180.0),
    ]
    for label, argv, target, limit in cases:
        run_proc(argv, cwd=project.root, env=env)  # warm the page cache
        walls = [run_proc(argv, cwd=project.root, env=env).wall_s * 1000
                 for _ in range(mode.w5_reps)]
        v = median(walls)
        res.add("W5", f"{label} start-up", v, "ms", target,
                None if limit is None else v <= limit)
    # The first process of a plan on a machine (CI, a new plan): nothing kept in the user
    # cache folder yet, so every contract check runs (jsonschema is loaded; planrun.fits).
    for label, argv, _target, _limit in cases[2:]:
        walls = []
        for i in range(mode.w5_reps):
            cold = project.root / "cold-cache" / f"{label[10:18]}-{i}"
            walls.append(run_proc(argv, cwd=project.root,
                                  env={**env, "XDG_CACHE_HOME": str(cold)}).wall_s * 1000)
        res.add("W5", f"{label} start-up, first process (nothing kept yet)", median(walls),
                "ms")


def w6(project: Project, mode: Mode, res: Results) -> None:
    env = clean_env(PLANRUN_JOURNAL=str(project.journal("w6")))
    medians = []
    for size, reps in zip(mode.w6_sizes, mode.w6_reps, strict=True):
        plan = project.add(f"gen_w6_{size}", chain_plan(f"gen_w6_{size}", size))
        argv = [*planrun_argv(), "validate", plan]
        # The first process of a plan: nothing kept in a cache folder of its own, so the
        # YAML is parsed and every contract check runs (what CI does with a new plan).
        cold = [run_proc(argv, cwd=project.root, env={**env, "XDG_CACHE_HOME": str(
            project.root / "cold-cache" / f"w6-{size}-{i}")}).wall_s for i in range(reps)]
        v = median(cold)
        medians.append(v)
        res.add("W6", f"`planrun validate` of a {size:,}-step plan, first process", v, "s")
        # The same plan again (nightly, CI on an unchanged plan): its parsed data and fits
        # are kept (planrun.parse_cache, planrun.fits).
        run_proc(argv, cwd=project.root, env=env)
        again = [run_proc(argv, cwd=project.root, env=env).wall_s for _ in range(reps)]
        res.add("W6", f"`planrun validate` of a {size:,}-step plan, again", median(again),
                "s")
    _small, mid, big = mode.w6_sizes
    ratio = medians[2] / medians[1]
    scale = big / mid
    res.add("W6", f"validate time {big:,} / {mid:,} steps (first process)", ratio, "x",
            f"<= {scale:g}x (linear)", ratio <= scale)


# --- luigi, side by side (benchmarks/luigi_peer.py) -----------------------------------------

LUIGI_PEER = Path(__file__).resolve().parent / "luigi_peer.py"


def find_luigi(explicit: str | None) -> tuple[list[str] | None, str]:
    """(argv running luigi_peer.py, "") or (None, why luigi does not run)."""
    import importlib.util

    python = explicit or os.environ.get("BENCH_LUIGI_PYTHON")
    if python is None:
        if importlib.util.find_spec("luigi") is None:
            return None, ("luigi not installed: pip install luigi (best in a separate "
                          "virtualenv, then --luigi-python PATH/bin/python)")
        python = sys.executable
    try:
        subprocess.run([python, "-c", "import luigi"], check=True, capture_output=True,
                       timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None, f"luigi not installed for {python}: pip install luigi"
    return [python, str(LUIGI_PEER)], ""


def luigi_wall(res: Results, project: Project, args: list[str]) -> float:
    """Wall seconds of one luigi process on a fresh state folder."""
    assert res.luigi is not None
    state = Path(tempfile.mkdtemp(prefix="luigi-", dir=project.root))
    return run_proc([*res.luigi, *args, str(state)], cwd=project.root, env=clean_env()).wall_s


def luigi_resume(res: Results, project: Project, steps: int, crash: int, label: str) -> float:
    """W4 with luigi: SIGKILL at task ``crash``, run again; launch -> its effect (seconds)."""
    assert res.luigi is not None
    state = Path(tempfile.mkdtemp(prefix=f"luigi-w4-{label}-", dir=project.root))
    effects = state / "effects"
    env = clean_env(BENCH_EFFECTS=str(effects))
    argv = [*res.luigi, "marks", str(steps), str(state)]
    run_proc(argv, cwd=project.root, env={**env, "BENCH_CRASH": str(crash)},
             expect=-signal.SIGKILL)
    before = read_effects(effects)
    if [n for n, _ in before] != list(range(1, crash)):
        raise BenchError(f"luigi W4: before the crash, tasks {_span(before)} ran")
    launched = time.time()
    run_proc(argv, cwd=project.root, env=env)
    after = read_effects(effects)[len(before):]
    if sorted(n for n, _ in after) != list(range(crash, steps + 1)):
        raise BenchError(f"luigi W4: the second run ran {_span(after)}")
    return next(t for n, t in after if n == crash) - launched


WORKLOADS: list[tuple[str, Callable[[Project, Mode, Results], None]]] = [
    ("W1", w1), ("W2", w2), ("W3", w3), ("W4", w4), ("W5", w5), ("W6", w6)]


# --- main ------------------------------------------------------------------------------


def source_revision() -> str:
    """The git commit of the planrun being measured, ``+dirty`` if src/ has changes."""
    import planrun

    src = Path(planrun.__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=src, text=True,
                             capture_output=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=src,
                               text=True, capture_output=True, timeout=10,
                               check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"from {src}, not a git checkout"
    return f"git {rev}{'+dirty' if dirty else ''}"


@contextlib.contextmanager
def workdir(keep: bool) -> Iterator[Path]:
    # Under the system temp folder, i.e. on the same disk as the raw SQLite baseline.
    root = Path(tempfile.mkdtemp(prefix="planrun-bench-"))
    try:
        yield root
    finally:
        if keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="fewer/smaller repetitions (< 60 s)")
    group.add_argument("--smoke", action="store_true",
                       help="a few steps per workload, targets not checked (< 15 s)")
    parser.add_argument("--only", action="append", metavar="W",
                        help="run only this workload (W1..W6); repeatable")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--luigi-python", metavar="PATH",
                        help="a Python with luigi installed (default: $BENCH_LUIGI_PYTHON, "
                        "or this Python if it has luigi)")
    args = parser.parse_args(argv)
    mode = MODES["smoke" if args.smoke else "quick" if args.quick else "full"]
    try:
        import planrun
    except ImportError:
        print("error: cannot import planrun; activate the project's virtualenv "
              "(source .venv/bin/activate) and run again", file=sys.stderr)
        return 2
    only = {w.upper() for w in args.only or []}
    unknown = only - {name for name, _ in WORKLOADS}
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(sorted(unknown))}")

    started = time.perf_counter()
    res = Results()
    res.luigi, res.luigi_missing = find_luigi(args.luigi_python)
    print(f"planrun {planrun.__version__} ({source_revision()}) benchmarks, mode {mode.name}, "
          f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    all_commits: list[float] = []
    around: list[str] = []
    global CACHE_HOME
    with workdir(args.keep) as root:
        CACHE_HOME = root / "cache"
        # Raw commits are timed before the first workload, between workloads and after the
        # last; each workload's ratios use the commits timed just before and just after it,
        # so that a machine whose load changes during the run still gets fair ratios.
        chunk = sqlite_commit_ms(root, mode.commits)
        all_commits += chunk
        project = Project(root / "project")
        baseline = res.add("Raw", "durable SQLite commit (WAL, synchronous=FULL)", None, "ms",
                           "(reference, ~0.13 ms)", ratio=True)
        selected = [(name, fn) for name, fn in WORKLOADS if not only or name in only]
        for k, (name, fn) in enumerate(selected):
            t0 = time.perf_counter()
            first = len(res.rows)
            print(f"  {name} ...", end="", flush=True)
            try:
                fn(project, mode, res)
            except Exception as exc:  # a failed workload is reported, the others still run
                res.failures.append(f"{name}: {type(exc).__name__}: {exc}")
                res.add(name, "FAILED (see below)", None, "-")
                print(" FAILED", flush=True)
            else:
                print(f" {time.perf_counter() - t0:.1f} s", flush=True)
            last = k == len(selected) - 1
            next_chunk = sqlite_commit_ms(root, mode.commits if last else mode.commits_between)
            all_commits += next_chunk
            local = median(chunk + next_chunk)
            around.append(f"{name} {local:.3f} ms")
            for row in res.rows[first:]:
                row.commit_ms = local
            chunk = next_chunk
    res.commit_ms = median(all_commits)
    baseline.value = baseline.commit_ms = res.commit_ms
    print(f"\nraw durable commit: median {res.commit_ms:.3f} ms over {len(all_commits):,} "
          f"commits (min {min(all_commits):.3f}, max {max(all_commits):.3f}); around each "
          f"workload (its 'x commit' ratios use this): {', '.join(around)}\n")
    print_table(res, mode)
    if res.luigi is None:
        print(f"\n{res.luigi_missing}")
    else:
        print("\nluigi: the same workloads as luigi tasks (benchmarks/luigi_peer.py, local "
              "scheduler, LocalTarget files: atomic rename, no fsync); '(ahead)': planrun "
              "took less")
    notes = [f"  {r.workload} {r.what}: {r.note}" for r in res.rows if r.note]
    if notes:
        print("\n" + "\n".join(notes))
    print(f"\ntotal {time.perf_counter() - started:.1f} s; load average now "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if res.failures:
        print("\nFAILED workloads:", file=sys.stderr)
        for failure in res.failures:
            print(f"- {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
