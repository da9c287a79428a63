"""``planrun log`` and ``log --follow`` on a run with very many events (found by attack).

A 100,000-item fan-out journals 200,000 events and more. ``planrun log --json`` read them
all into memory and then built the whole document (680 MB of memory for that run;
``planrun log``: 230 MB), and ``log --follow`` read every event of the run again at each
poll (half a second), so following a big fan-out cost more the longer it ran. Now events
are read a page at a time (keyset pagination on the event id) and printed as they come,
and ``--follow`` reads only the events after the last one it printed.

Measured on real processes: peak memory (``ru_maxrss`` of the child) and bytes the
follower read from the journal file (``/proc/PID/io``), never seconds. The events are
written into a real run's SQLite journal, as many as a big run would leave.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from planrun import api
from test_operator import ops_project, run, start_waiting_run

pytestmark = pytest.mark.sqlite

#: More than the events the journal reads at a time (planrun.journal.reads.EVENTS_PAGE).
EVENTS_PAGE = 1000

TIME = "/usr/bin/time"

#: Each added event's data: 2 KB of JSON, so that holding them all shows.
PAYLOAD = json.dumps({"note": "x" * 2000})


def journal_of(app: Path) -> Path:
    location = api.load_settings(project=app).journal
    assert isinstance(location, Path)
    return location


def add_events(app: Path, run_id: str, n: int, payload: str = PAYLOAD,
               kind: str = "note") -> None:
    """``n`` events for ``run_id`` written into the journal file itself."""
    with sqlite3.connect(journal_of(app), timeout=30) as conn:
        conn.executemany(
            "INSERT INTO events (run_id, ts, kind, step_id, item_index, data_json) "
            "VALUES (?, '2026-01-01T00:00:00.000+00:00', ?, NULL, ?, ?)",
            ((run_id, kind, i, payload) for i in range(n)))


def peak_rss_kb(app: Path, *args: str) -> int:
    """Peak resident memory (KB) of ``planrun ARGS`` in ``app``, its stdout thrown away.

    Measured by ``/usr/bin/time`` (a small process that starts it): ``ru_maxrss`` of a
    child of this process would count this process's memory at the fork.
    """
    if not Path(TIME).exists():
        pytest.skip(f"{TIME} is not installed")
    out = app / "rss.txt"
    res = subprocess.run([TIME, "-f", "%M", "-o", str(out), sys.executable, "-m", "planrun",
                          *args], cwd=app, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    return int(out.read_text().split()[-1])


def finished_run(app: Path) -> str:
    res = run(app, "execute", "hello", "--approve", "publish", "--json")
    assert res.returncode == 0, res
    return str(json.loads(res.stdout)["run_id"])


def test_log_of_many_pages_prints_every_event_once_in_order(tmp_path: Path) -> None:
    app = ops_project(tmp_path / "app")
    run_id = finished_run(app)
    add_events(app, run_id, 2 * EVENTS_PAGE + 7, payload='{"n": 1}')
    _, expected = api.log(api.load_settings(project=app), run_id)
    assert len(expected) > 2 * EVENTS_PAGE + 7
    res = run(app, "log", run_id, "--json")
    assert res.returncode == 0, res
    assert json.loads(res.stdout) == expected
    assert res.stdout == json.dumps(expected, indent=2, ensure_ascii=False) + "\n"
    text = run(app, "log", run_id)
    assert len(text.stdout.splitlines()) == len(expected)
    missing = run(app, "log", "nope", "--json")
    assert missing.returncode == 5
    assert json.loads(missing.stdout)["error"]["code"] == "unknown_run"


@pytest.mark.slow  # ~10 s: 120 MB of events written, read three times
def test_log_memory_does_not_grow_with_the_events(tmp_path: Path) -> None:
    app = ops_project(tmp_path / "app")
    run_id = finished_run(app)
    add_events(app, run_id, 60_000)  # 120 MB of event data
    for args in (("log", run_id, "--json"), ("log", run_id), ("report", run_id, "-o", "-")):
        assert peak_rss_kb(app, *args) < 100_000, args  # 500 MB and more when all held


def _read_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar")


def test_log_follow_reads_only_new_events(tmp_path: Path) -> None:
    app = ops_project(tmp_path / "app")
    gate = tmp_path / "gate"
    proc = start_waiting_run(app, gate)
    follower = None
    try:
        run_id = api.runs(api.load_settings(project=app))[0]["run_id"]
        add_events(app, run_id, 20_000)  # 40 MB the run's events take in the journal
        follower = subprocess.Popen([sys.executable, "-m", "planrun", "log", run_id,
                                     "--follow", "--json"], cwd=app, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert follower.stdout is not None
        seen = 0
        while seen < 20_000:
            line = follower.stdout.readline()
            assert line, follower.stderr.read() if follower.stderr else ""
            seen += json.loads(line)["kind"] == "note"
        before = _read_bytes(follower.pid)
        for marker in ("mark-1", "mark-2"):  # each seen after at least one more poll
            add_events(app, run_id, 1, payload="{}", kind=marker)
            while json.loads(follower.stdout.readline())["kind"] != marker:
                pass
        read = _read_bytes(follower.pid) - before
        assert read < 4_000_000, read  # each poll read all 40 MB again
        gate.touch()
        follower.communicate(timeout=60)
        assert follower.returncode == 0
    finally:
        gate.touch()
        proc.communicate(timeout=60)
        if follower is not None and follower.poll() is None:
            follower.kill()
            follower.communicate()


def test_a_report_copies_the_first_and_last_events_and_counts_the_rest(tmp_path: Path) -> None:
    """A run with tens of thousands of run and step events (resumed many times, or of
    10,000 steps): the report copied them all (20,000 made 5 MB of a 16 MB page)."""
    app = ops_project(tmp_path / "app")
    run_id = finished_run(app)
    sizes = []
    for n in (3_000, 12_000):
        add_events(app, run_id, n, payload='{"n": 1}', kind=f"note{n}")
        with sqlite3.connect(journal_of(app)) as conn:
            conn.execute("UPDATE events SET item_index = NULL")  # run events, not items'
            total = conn.execute("SELECT count(*) FROM events WHERE run_id = ?",
                                 (run_id,)).fetchone()[0]
        out = tmp_path / f"r{n}.html"
        assert run(app, "report", run_id, "-o", str(out)).returncode == 0
        page = out.read_text(encoding="utf-8")
        events = page[page.index('<h2 id="events">'):]
        assert events.count("<tr><td class=\"mono when\"") == 2_000
        assert f"{total - 2_000:,} events are not copied here" in events
        assert f"{total:,} events in order" in events
        cut = events.index("events are not copied")
        assert ">planned<" in events[:cut]  # the first events, then the last ones
        assert events[cut:].count(f">note{n}<") == 1_000
        sizes.append(len(page.encode()))
    assert sizes[1] < sizes[0] * 1.05, sizes  # 12,000 more events, the same page
