#!/usr/bin/env python3
"""``--executor dask`` benchmarks (issue 15): throughput of a big fan-out, CPU-bound calls.

    python benchmarks/dask.py            # W2 with 10,000 items, 20 CPU-bound calls
    python benchmarks/dask.py --quick    # 2,000 items, 6 CPU-bound calls
    python benchmarks/dask.py --items N --cpu-items M --workers W --max-parallel P

Needs ``planrun[dask]``. Starts one :class:`distributed.LocalCluster` (W worker processes,
1 thread each, loopback only, ``allowed-failures`` 0) in this process and points
``planrun execute --executor dask:tcp://127.0.0.1:PORT`` at it, so that the figures are
those of planrun's process (the cluster's start-up is not timed; ``--executor dask``
alone would start one per run, about 3 s here). Figures:

- **W2 over Dask**: ``emit`` returns ``list(range(N))``, ``double`` fans out over it
  (``2 * item``, one call per item, each journaled before and after), ``join`` sums the
  outputs (checked). Whole-process items/s, the run alone (manifest ``duration_s``) per
  item, the CPU time (user + system) of the planrun process per item, and its peak RSS
  (both from ``os.wait4``: that process only, not the workers); the CPU time per item of
  the scheduler (this process, which hosts it) and of the worker processes. The same plan
  with ``--executor local`` for comparison.
- **CPU-bound calls**: a fan-out of M python calls, each hashing a 4 MiB buffer with
  SHA-256 in 1 KiB updates, 48 times (the GIL is held: hashlib only releases it for
  updates of 2 KiB or more), with ``--max-parallel W``: wall seconds with ``local``
  (threads of one process) and with ``dask`` (W worker processes).

The planrun measured is the one ``python -m planrun`` imports with the ``PYTHONPATH``
given (the project's folder is put first). The load average is printed before and after.
Not a test: nothing checks a timing. Results are in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

TOOLS = """
tools:
  emit:
    python: benchtools:emit
    arguments: {type: object, properties: {n: {type: integer}}, required: [n]}
  double:
    python: benchtools:double
    idempotent: true
    arguments: {type: object, properties: {x: {type: integer}}, required: [x]}
  join:
    python: benchtools:join
    arguments: {type: object, properties: {xs: {type: array}}, required: [xs]}
  churn:
    python: benchtools:churn
    idempotent: true
    arguments: {type: object, properties: {seed: {type: integer}}, required: [seed]}
"""

MODULE = '''
import hashlib


def emit(n):
    return list(range(n))


def double(x):
    return 2 * x


def join(xs):
    return sum(xs)


_BUFFER = bytes(range(256)) * (4 * 1024 * 1024 // 256)


def churn(seed):
    h = hashlib.sha256(str(seed).encode())
    view = memoryview(_BUFFER)
    for _ in range(48):
        for start in range(0, len(view), 1024):
            h.update(view[start:start + 1024])
    return h.hexdigest()
'''


def project(base: Path, items: int, cpu_items: int, parallel: int, cpu_parallel: int) -> Path:
    root = base / "proj"
    (root / "plans").mkdir(parents=True)
    (root / "planrun.toml").write_text("max_steps = 200000\n", encoding="utf-8")
    (root / "tools.yaml").write_text(textwrap.dedent(TOOLS), encoding="utf-8")
    (root / "benchtools.py").write_text(textwrap.dedent(MODULE), encoding="utf-8")
    (root / "plans" / "w2.yaml").write_text(textwrap.dedent(f"""
        planrun: 1
        goal: W2 fan-out
        steps:
          - {{id: emit, tool: emit, arguments: {{n: {items}}}}}
          - id: double
            tool: double
            depends_on: [emit]
            for_each: "{{steps.emit.output}}"
            max_items: {max(items, 10_000)}
            max_parallel: {parallel}
            arguments: {{x: "{{item}}"}}
          - {{id: join, tool: join, depends_on: [double],
              arguments: {{xs: "{{steps.double.output}}"}}}}
    """), encoding="utf-8")
    (root / "plans" / "cpu.yaml").write_text(textwrap.dedent(f"""
        planrun: 1
        goal: CPU-bound calls
        steps:
          - id: churn
            tool: churn
            for_each: {list(range(cpu_items))}
            max_parallel: {cpu_parallel}
            arguments: {{seed: "{{item}}"}}
    """), encoding="utf-8")
    return root


def execute(root: Path, plan: str, executor: str, env: dict[str, str], parallel: int
            ) -> dict[str, Any]:
    """One ``planrun execute --json`` process: wall seconds, peak RSS (bytes), manifest.

    ``os.wait4`` gives the resource usage of exactly this child (``ru_maxrss``).
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "planrun", "execute", plan, "--json",
                                 "-q", "--executor", executor, "--max-parallel",
                                 str(parallel)], cwd=root, env=env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        raise SystemExit(f"planrun execute {plan} --executor {executor} exited "
                         f"{proc.returncode}:\n{stderr.decode()[-2000:]}")
    return {"wall": wall, "rss": usage.ru_maxrss * 1024, "manifest": json.loads(stdout),
            "cpu": usage.ru_utime + usage.ru_stime}


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _cluster_cpu(workers: list[Any]) -> tuple[float, float]:
    """CPU seconds (user + system) so far of this process (the scheduler and the nannies of
    the LocalCluster: the benchmark itself only waits meanwhile) and of the workers."""
    own = os.times()
    spent = 0.0
    for proc in workers:
        times = proc.cpu_times()
        spent += times.user + times.system
    return own.user + own.system, spent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--items", type=int)
    parser.add_argument("--cpu-items", type=int)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-parallel", type=int, default=256,
                        help="W2's --max-parallel (calls under way at once)")
    args = parser.parse_args(argv)
    items = args.items or (2000 if args.quick else 10_000)
    cpu_items = args.cpu_items or (6 if args.quick else 20)
    # this file is named dask.py: its folder must not shadow the dask package
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    sys.modules.pop("dask", None)
    try:
        import dask
        import distributed
        import psutil  # a dependency of distributed
    except ImportError:
        print("benchmarks/dask.py needs planrun[dask]", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="planrun-bench-dask-") as tmp, \
            dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        base = Path(tmp)
        root = project(base, items, cpu_items, args.max_parallel, args.workers)
        # the project's tool module first, then the planrun source measured (PYTHONPATH)
        env = {**os.environ, "PLANRUN_JOURNAL": str(base / "journal.sqlite3"),
               "PYTHONPATH": os.pathsep.join([str(root), *filter(None, [
                   os.environ.get("PYTHONPATH")])])}
        cluster = distributed.LocalCluster(n_workers=args.workers, threads_per_worker=1,
                                           processes=True, host="127.0.0.1",
                                           dashboard_address=None)
        address = f"dask:{cluster.scheduler_address}"
        rows: list[tuple[str, str]] = []
        print(f"load average at start: {_load()}", flush=True)
        try:
            execute(root, "cpu", address, env, args.workers)  # warm-up: workers import the tools
            with distributed.Client(cluster) as client:
                workers = [psutil.Process(pid) for pid in client.run(os.getpid).values()]
            for executor in (address, "local"):
                name = "dask" if executor != "local" else "local"
                before = _cluster_cpu(workers)
                got = execute(root, "w2", executor, env, args.max_parallel)
                spent = [a - b for a, b in zip(_cluster_cpu(workers), before, strict=True)]
                m = got["manifest"]
                assert m["status"] == "completed", m
                run = m["duration_s"]
                rows += [
                    (f"W2 {items:,} items, --executor {name}, whole process",
                     f"{items / got['wall']:,.0f} items/s ({got['wall']:.2f} s)"),
                    (f"W2 {items:,} items, --executor {name}, run only, per item",
                     f"{run / items * 1000:.3f} ms"),
                    (f"W2 {items:,} items, --executor {name}, CPU of planrun per item",
                     f"{got['cpu'] / items * 1000:.3f} ms"),
                    (f"W2 {items:,} items, --executor {name}, peak RSS of planrun",
                     f"{got['rss'] / 1e6:.0f} MB"),
                ]
                if executor != "local":
                    rows.append((f"W2 {items:,} items, --executor {name}, CPU of the scheduler "
                                 "/ of the workers per item",
                                 f"{spent[0] / items * 1000:.3f} ms / "
                                 f"{spent[1] / items * 1000:.3f} ms"))
            for executor in ("local", address):
                name = "dask" if executor != "local" else "local"
                got = execute(root, "cpu", executor, env, args.workers)
                rows.append((f"{cpu_items} CPU-bound calls, --max-parallel {args.workers}, "
                             f"--executor {name}", f"{got['wall']:.2f} s wall"))
        finally:
            cluster.close()
    rows.append(("load average at the end", _load()))
    width = max(len(r[0]) for r in rows)
    print(f"| {'figure'.ljust(width)} | measured |")
    print(f"|{'-' * (width + 2)}|----------|")
    for name, value in rows:
        print(f"| {name.ljust(width)} | {value} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
