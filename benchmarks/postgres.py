"""PostgreSQL journal benchmarks (issue 14): W1 and W2 of ``run.py`` on a PostgreSQL journal.

    python benchmarks/postgres.py                      # a throw-away durable cluster
    python benchmarks/postgres.py --url postgresql://… # an existing (empty) database
    python benchmarks/postgres.py --quick

Without ``--url`` it starts a throw-away cluster (``tests/pgcluster.py``: Unix socket
only, ``fsync`` on, removed at the end). It prints: the raw commit (one small ``INSERT``
per transaction, autocommit, on the same server: ms per commit, timed before and after
the workloads), W1 (a 1,000-step chain of no-op python tools, in-process
``planrun.api.execute``, ms/step and its ratio to a raw commit; goal ≤ 2x) and W2 (2,000
fan-out items, items/s; goal ≥ 2,000 items/s). Not a test: nothing checks a timing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

import run as bench  # noqa: E402


def raw_commit_ms(url: str, n: int) -> float:
    """Median ms of one small INSERT committed on its own (autocommit)."""
    import psycopg

    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_raw (id BIGSERIAL PRIMARY KEY, v TEXT)")
        times = []
        for i in range(n):
            t0 = time.perf_counter()
            conn.execute("INSERT INTO bench_raw (v) VALUES (%s)", (f"row {i}",))
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def measure(url: str, quick: bool) -> list[tuple[str, float, str]]:
    rows: list[tuple[str, float, str]] = []
    with tempfile.TemporaryDirectory(prefix="planrun-pgbench-") as folder:
        project = bench.Project(Path(folder) / "project")
        commit_before = raw_commit_ms(url, 300 if quick else 1000)
        n = 1000
        plan = project.add("chain_w1", bench.chain_plan("chain_w1", n))
        bench.in_process_execute(
            project, project.add("warm", bench.chain_plan("warm", 10)), url)  # type: ignore[arg-type]
        per_step = []
        for _ in range(1 if quick else 3):
            elapsed, manifest = bench.in_process_execute(project, plan, url)  # type: ignore[arg-type]
            assert manifest["counts"]["succeeded"] == n, manifest["counts"]
            per_step.append(elapsed * 1000 / n)
        items = 2000
        fan = project.add("fan_w2", bench.fan_plan("fan_w2", items))
        rates = []
        for _ in range(1 if quick else 3):
            elapsed, manifest = bench.in_process_execute(project, fan, url)  # type: ignore[arg-type]
            total = bench.in_process_output(project, url, manifest["run_id"], "join")  # type: ignore[arg-type]
            assert total == items * (items - 1), total
            rates.append(items / elapsed)
        commit_after = raw_commit_ms(url, 300 if quick else 1000)
    commit = (commit_before + commit_after) / 2
    w1 = statistics.median(per_step)
    rows.append(("raw PostgreSQL commit (before / after)", commit,
                 f"ms ({commit_before:.3f} / {commit_after:.3f})"))
    rows.append(("W1 1,000-step chain, in-process", w1,
                 f"ms/step = {w1 / commit:.2f}x commit (goal <= 2x)"))
    rows.append(("W2 2,000 items, in-process", statistics.median(rates),
                 "items/s (goal >= 2,000)"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="an empty PostgreSQL database (default: a throw-away "
                        "cluster)")
    parser.add_argument("--quick", action="store_true", help="one repetition each")
    args = parser.parse_args(argv)
    cluster: Any = None
    url = args.url
    if url is None:
        from pgcluster import Cluster, server_bindir

        bindir = server_bindir()
        if bindir is None:
            print("no PostgreSQL server installed; give --url", file=sys.stderr)
            return 1
        cluster = Cluster.start(bindir, durable=True)
        url = cluster.database("bench")
    try:
        print(f"planrun {bench.source_revision()}, PostgreSQL journal")
        for label, value, unit in measure(url, args.quick):
            print(f"{label:45} {value:10.3f} {unit}")
    finally:
        if cluster is not None:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
