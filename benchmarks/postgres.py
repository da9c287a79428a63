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
round trips to the server, the statements sent (and W2's commits) per step or item,
which do not depend on the load, and the CPU per step or item of this process (planrun's
engine and the journal's client) and of the server (a throw-away cluster only), which
depend on it less than wall times. Not a test: nothing checks a timing.
"""

from __future__ import annotations

import argparse
import os
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

        self.trips = self.commits = self.statements = 0
        send, execute, script = (pg.PgConnection.send_batch, pg.PgConnection.execute,
                                 pg.PgConnection.script)

        def counted_send(conn: Any) -> None:
            if conn._batch:
                self.trips += 1
                self.commits += any(text == b"COMMIT" for text, _ in conn._batch)
                # BEGIN and COMMIT of a transaction sent whole are not sent
                whole = getattr(conn, "_unsent", False) and conn._batch[0][0] == b"BEGIN" \
                    and conn._batch[-1][0] == b"COMMIT"
                self.statements += len(conn._batch) - (2 if whole else 0)
            send(conn)

        def counted_execute(conn: Any, sql: str, params: Any = None) -> Any:
            if conn._batch is None:
                self.trips += 1
                self.statements += 1
            return execute(conn, sql, params)

        def counted_script(conn: Any, sql: str) -> None:
            self.trips += 1
            self.statements += 1
            script(conn, sql)

        pg.PgConnection.send_batch = counted_send  # type: ignore[method-assign]
        pg.PgConnection.execute = counted_execute  # type: ignore[method-assign]
        pg.PgConnection.script = counted_script  # type: ignore[method-assign]

    def reset(self) -> None:
        self.trips = self.commits = self.statements = 0


def server_cpu_s(pid: int | None) -> float:
    """CPU seconds of a local server so far: the postmaster, its children, ended ones.

    0.0 when unknown (``--url``): the server's CPU is then not shown.
    """
    if pid is None:
        return 0.0
    tick = os.sysconf("SC_CLK_TCK")
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    total = sum(int(x) for x in fields[11:15])  # utime, stime, ended children's
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            f = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(f[1]) == pid:
            total += int(f[11]) + int(f[12])
    return total / tick


def measure(url: str, quick: bool, server: int | None = None
            ) -> list[tuple[str, float, str]]:
    """Each W1 run is bracketed by raw-commit timings (a loaded machine drifts).

    Also the CPU per step or item: this process's (planrun's engine and journal client,
    psycopg) and, for a throw-away cluster (``server``: its postmaster's pid), the
    server's, which depend less on the load than wall times do.
    """
    rows: list[tuple[str, float, str]] = []
    count = RoundTrips()
    samples = 200 if quick else 500
    with tempfile.TemporaryDirectory(prefix="planrun-pgbench-") as folder:
        project = bench.Project(Path(folder) / "project")
        n = 1000
        plan = project.add("chain_w1", bench.chain_plan("chain_w1", n))
        bench.in_process_execute(
            project, project.add("warm", bench.chain_plan("warm", 10)), url)  # type: ignore[arg-type]
        per_step, ratios, commits, cpu = [], [], [], []
        for _ in range(1 if quick else 3):
            before = raw_commit_ms(url, samples)
            count.reset()
            c0, s0 = time.process_time(), server_cpu_s(server)
            elapsed, manifest = bench.in_process_execute(project, plan, url)  # type: ignore[arg-type]
            time.sleep(0.2)  # the server reaps the journal's ended backend
            cpu.append(((time.process_time() - c0) * 1000 / n,
                        (server_cpu_s(server) - s0) * 1000 / n))
            w1_trips, w1_statements = count.trips / n, count.statements / n
            after = raw_commit_ms(url, samples)
            assert manifest["counts"]["succeeded"] == n, manifest["counts"]
            per_step.append(elapsed * 1000 / n)
            commits.append((before + after) / 2)
            ratios.append(per_step[-1] / commits[-1])
        items = 2000
        fan = project.add("fan_w2", bench.fan_plan("fan_w2", items))
        rates, cpu2 = [], []
        for _ in range(1 if quick else 3):
            count.reset()
            c0, s0 = time.process_time(), server_cpu_s(server)
            elapsed, manifest = bench.in_process_execute(project, fan, url)  # type: ignore[arg-type]
            time.sleep(0.2)
            cpu2.append(((time.process_time() - c0) * 1000 / items,
                         (server_cpu_s(server) - s0) * 1000 / items))
            w2_trips, w2_commits = count.trips / items, count.commits / items
            w2_statements = count.statements / items
            total = bench.in_process_output(project, url, manifest["run_id"], "join")  # type: ignore[arg-type]
            assert total == items * (items - 1), total
            rates.append(items / elapsed)
    rows.append(("raw PostgreSQL commit (around each W1 run)", statistics.median(commits),
                 "ms (" + " / ".join(f"{c:.3f}" for c in commits) + ")"))
    rows.append(("W1 1,000-step chain, in-process", statistics.median(per_step),
                 f"ms/step = {statistics.median(ratios):.2f}x commit (goal <= 2x); "
                 f"{w1_trips:.2f} round trips/step, {w1_statements:.2f} statements/step"))
    rows.append(("W1 CPU of this process", statistics.median(c for c, _ in cpu),
                 "ms/step (planrun's engine and the journal's client)"))
    if server is not None:
        rows.append(("W1 CPU of the server", statistics.median(s for _, s in cpu),
                     "ms/step"))
    rows.append(("W2 2,000 items, in-process", statistics.median(rates),
                 f"items/s (goal >= 2,000); {w2_trips:.2f} round trips/item, "
                 f"{w2_commits:.2f} commits/item, {w2_statements:.2f} statements/item"))
    rows.append(("W2 CPU of this process", statistics.median(c for c, _ in cpu2),
                 "ms/item"))
    if server is not None:
        rows.append(("W2 CPU of the server", statistics.median(s for _, s in cpu2),
                     "ms/item"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="an empty PostgreSQL database (default: a throw-away "
                        "cluster)")
    parser.add_argument("--quick", action="store_true", help="one repetition each")
    args = parser.parse_args(argv)
    cluster: Any = None
    server: int | None = None
    url = args.url
    if url is None:
        from pgcluster import Cluster, server_bindir

        bindir = server_bindir()
        if bindir is None:
            print("no PostgreSQL server installed; give --url", file=sys.stderr)
            return 1
        cluster = Cluster.start(bindir, durable=True)
        url = cluster.database("bench")
        server = int((cluster.root / "data" / "postmaster.pid").read_text().split()[0])
    try:
        print(f"planrun {bench.source_revision()}, PostgreSQL journal")
        for label, value, unit in measure(url, args.quick, server):
            print(f"{label:45} {value:10.3f} {unit}")
    finally:
        if cluster is not None:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
