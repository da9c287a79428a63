"""PostgreSQL journal benchmarks (issue 14): W1 and W2 of ``run.py`` on a PostgreSQL journal.

    python benchmarks/postgres.py                      # a throw-away durable cluster
    python benchmarks/postgres.py --url postgresql://… # an existing (empty) database
    python benchmarks/postgres.py --quick

Without ``--url`` it starts a throw-away cluster (``tests/pgcluster.py``: Unix socket
only, ``fsync`` on, removed at the end). It prints: the raw commit (one small ``INSERT``
per transaction, autocommit, on the same server: ms per commit, timed before and after
each W1 run, since a shared machine's load drifts), W1 (a 1,000-step chain of no-op
python tools, in-process ``planrun.api.execute``, ms/step and its ratio to a raw commit;
goal ≤ 2x) and W2 (2,000 fan-out items, items/s; goal ≥ 2,000 items/s), and for both the
round trips to the server (and W2's commits) per step or item, which do not depend on the
load. Not a test: nothing checks a timing.
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


class RoundTrips:
    """Counts what the journal sends to the server (round trips, commits) while active.

    Wraps :class:`planrun.journal.backends.postgres.PgConnection` (a benchmark, not a
    test): a batch sent is one round trip, so is a statement run outside a batch.
    """

    def __init__(self) -> None:
        from planrun.journal.backends import postgres as pg

        self.trips = self.commits = 0
        send, execute, script = (pg.PgConnection.send_batch, pg.PgConnection.execute,
                                 pg.PgConnection.script)

        def counted_send(conn: Any) -> None:
            if conn._batch:
                self.trips += 1
                self.commits += any(text == b"COMMIT" for text, _ in conn._batch)
            send(conn)

        def counted_execute(conn: Any, sql: str, params: Any = None) -> Any:
            if conn._batch is None:
                self.trips += 1
            return execute(conn, sql, params)

        def counted_script(conn: Any, sql: str) -> None:
            self.trips += 1
            script(conn, sql)

        pg.PgConnection.send_batch = counted_send  # type: ignore[method-assign]
        pg.PgConnection.execute = counted_execute  # type: ignore[method-assign]
        pg.PgConnection.script = counted_script  # type: ignore[method-assign]

    def reset(self) -> None:
        self.trips = self.commits = 0


def measure(url: str, quick: bool) -> list[tuple[str, float, str]]:
    """Each W1 run is bracketed by raw-commit timings (a loaded machine drifts)."""
    rows: list[tuple[str, float, str]] = []
    count = RoundTrips()
    samples = 200 if quick else 500
    with tempfile.TemporaryDirectory(prefix="planrun-pgbench-") as folder:
        project = bench.Project(Path(folder) / "project")
        n = 1000
        plan = project.add("chain_w1", bench.chain_plan("chain_w1", n))
        bench.in_process_execute(
            project, project.add("warm", bench.chain_plan("warm", 10)), url)  # type: ignore[arg-type]
        per_step, ratios, commits = [], [], []
        for _ in range(1 if quick else 3):
            before = raw_commit_ms(url, samples)
            count.reset()
            elapsed, manifest = bench.in_process_execute(project, plan, url)  # type: ignore[arg-type]
            w1_trips = count.trips / n
            after = raw_commit_ms(url, samples)
            assert manifest["counts"]["succeeded"] == n, manifest["counts"]
            per_step.append(elapsed * 1000 / n)
            commits.append((before + after) / 2)
            ratios.append(per_step[-1] / commits[-1])
        items = 2000
        fan = project.add("fan_w2", bench.fan_plan("fan_w2", items))
        rates = []
        for _ in range(1 if quick else 3):
            count.reset()
            elapsed, manifest = bench.in_process_execute(project, fan, url)  # type: ignore[arg-type]
            w2_trips, w2_commits = count.trips / items, count.commits / items
            total = bench.in_process_output(project, url, manifest["run_id"], "join")  # type: ignore[arg-type]
            assert total == items * (items - 1), total
            rates.append(items / elapsed)
    rows.append(("raw PostgreSQL commit (around each W1 run)", statistics.median(commits),
                 "ms (" + " / ".join(f"{c:.3f}" for c in commits) + ")"))
    rows.append(("W1 1,000-step chain, in-process", statistics.median(per_step),
                 f"ms/step = {statistics.median(ratios):.2f}x commit (goal <= 2x); "
                 f"{w1_trips:.2f} round trips/step"))
    rows.append(("W2 2,000 items, in-process", statistics.median(rates),
                 f"items/s (goal >= 2,000); {w2_trips:.2f} round trips/item, "
                 f"{w2_commits:.2f} commits/item"))
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
