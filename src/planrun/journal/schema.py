"""The journal's schema (SQLite): one list of statements per ``PRAGMA user_version`` step.

``MIGRATIONS[n]`` takes a journal from version ``n`` to ``n + 1``. Never edit a released
entry; append a new one.
"""

from __future__ import annotations

MIGRATIONS: list[list[str]] = [
    # 0 -> 1: runs, steps, fan-out items, approvals, events, idempotency keys
    [
        """CREATE TABLE runs (
            run_id TEXT PRIMARY KEY,
            root_run_id TEXT NOT NULL,
            parent_run_id TEXT,
            plan_name TEXT NOT NULL,
            plan_file TEXT,
            plan_json TEXT NOT NULL,
            digest TEXT NOT NULL,
            revision INTEGER NOT NULL,
            goal TEXT,
            params_json TEXT NOT NULL,
            contracts_json TEXT NOT NULL,
            options_json TEXT NOT NULL DEFAULT '{}',
            report_json TEXT,
            status TEXT NOT NULL,
            created_at TEXT NOT NULL,
            finished_at TEXT,
            lease_owner TEXT,
            lease_expires REAL
        )""",
        "CREATE INDEX runs_created ON runs (created_at)",
        """CREATE TABLE steps (
            run_id TEXT NOT NULL REFERENCES runs (run_id),
            step_id TEXT NOT NULL,
            position INTEGER NOT NULL,
            tool TEXT NOT NULL,
            status TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            idempotency_key TEXT,
            output_json TEXT,
            error_json TEXT,
            skip_reason TEXT,
            started_at TEXT,
            finished_at TEXT,
            replayed INTEGER NOT NULL DEFAULT 0,
            approved_by TEXT,
            PRIMARY KEY (run_id, step_id)
        ) WITHOUT ROWID""",
        """CREATE TABLE items (
            run_id TEXT NOT NULL,
            step_id TEXT NOT NULL,
            item_index INTEGER NOT NULL,
            status TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            idempotency_key TEXT,
            output_json TEXT,
            error_json TEXT,
            started_at TEXT,
            finished_at TEXT,
            replayed INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (run_id, step_id, item_index),
            FOREIGN KEY (run_id, step_id) REFERENCES steps (run_id, step_id)
        ) WITHOUT ROWID""",
        """CREATE TABLE approvals (
            id INTEGER PRIMARY KEY,
            run_id TEXT NOT NULL REFERENCES runs (run_id),
            step_id TEXT NOT NULL,
            item_index INTEGER,
            tool TEXT NOT NULL,
            digest TEXT NOT NULL,
            granted INTEGER NOT NULL,
            decided_by TEXT NOT NULL,
            method TEXT NOT NULL,
            decided_at TEXT NOT NULL,
            reason TEXT
        )""",
        "CREATE INDEX approvals_run ON approvals (run_id, step_id)",
        """CREATE TABLE events (
            id INTEGER PRIMARY KEY,
            run_id TEXT NOT NULL REFERENCES runs (run_id),
            ts TEXT NOT NULL,
            kind TEXT NOT NULL,
            step_id TEXT,
            item_index INTEGER,
            data_json TEXT
        )""",
        "CREATE INDEX events_run ON events (run_id, id)",
        """CREATE TABLE idempotency_keys (
            key TEXT PRIMARY KEY,
            root_run_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            step_id TEXT NOT NULL,
            item_index INTEGER,
            status TEXT NOT NULL,
            output_json TEXT,
            claimed_at TEXT NOT NULL,
            finished_at TEXT
        ) WITHOUT ROWID""",
    ],
    # 1 -> 2 (issue 9, process groups): the process group of every running command call,
    # so that resume refuses while one outlives its planrun (SPEC §12); crash re-dispatches
    # counted per step and item, bounded by max_recoveries (SPEC §5 "Attempts").
    [
        """CREATE TABLE call_groups (
            run_id TEXT NOT NULL,
            step_id TEXT NOT NULL,
            item_index INTEGER,
            pgid INTEGER NOT NULL,
            host TEXT NOT NULL,
            boot_id TEXT,
            start_ticks INTEGER,
            started_at TEXT NOT NULL,
            PRIMARY KEY (run_id, host, pgid)
        ) WITHOUT ROWID""",
        "ALTER TABLE steps ADD COLUMN recoveries INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE items ADD COLUMN recoveries INTEGER NOT NULL DEFAULT 0",
    ],
    # 2 -> 3 (issue 10): the project folder of each run (runs of many projects share one journal)
    [
        "ALTER TABLE runs ADD COLUMN project TEXT",
        "CREATE INDEX runs_project ON runs (project, created_at)",
    ],
    # 3 -> 4 (issue 12, journal backends): an explicit sequence of runs (newest-first order
    # without ``rowid``); leases as (owner, epoch, until) with ``until`` (``lease_expires``,
    # seconds since the epoch) from the database clock and an epoch every guarded write
    # checks; the holder's boot id and start time, so liveness is more than host and pid.
    [
        "ALTER TABLE runs ADD COLUMN seq INTEGER",
        "UPDATE runs SET seq = rowid",
        "CREATE INDEX runs_seq ON runs (created_at, seq)",
        "ALTER TABLE runs ADD COLUMN lease_epoch INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE runs ADD COLUMN lease_boot TEXT",
        "ALTER TABLE runs ADD COLUMN lease_start INTEGER",
    ],
    # 4 -> 5 (issue 17, facets): the facets of a finished step, computed from its output
    # when it succeeded (``{"values": {NAME: value}, "cut": [NAME]}``), so that a condition
    # or a manifest reads them without the output.
    [
        "ALTER TABLE steps ADD COLUMN facets_json TEXT",
    ],
]

#: The schema version this code writes and reads.
SCHEMA_VERSION = len(MIGRATIONS)
