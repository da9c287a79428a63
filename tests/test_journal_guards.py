"""Every guarded writer of the journal against every status it must refuse (SPEC §5, §7).

A record never moves backwards: a finished step (or fan-out item) stays finished whatever
writer is called on it, its succeeded idempotency key survives, and a refused write leaves
no event behind. Each test puts a real journal file into a state with plain SQL, calls one
writer, and compares the whole state before and after.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from planrun.errors import JournalError, RunError, UsageError
from planrun.journal import Journal, now

#: These tests look at and tamper with the SQLite file itself (SPEC §7 on SQLite).
pytestmark = pytest.mark.sqlite

HOST = socket.gethostname()
RUN = "0123456789abcdef"
OTHER = "fedcba9876543210"
KEY = "key-a"
STATUSES = ("pending", "running", "succeeded", "failed", "skipped", "indeterminate")


def _new_run(journal: Journal, run_id: str = RUN, steps: tuple[str, ...] = ("a", "b")) -> str:
    run = {
        "run_id": run_id, "root_run_id": run_id, "parent_run_id": None, "plan_name": "p",
        "plan_file": "plans/p.yaml", "plan_json": "{}", "digest": "0" * 64, "revision": 1,
        "goal": "a test", "params_json": "{}", "contracts_json": "{}", "status": "running",
        "created_at": now(),
    }
    journal.create_run(run=run, steps=[(s, i, "echo") for i, s in enumerate(steps)])
    return run_id


def _sql(path: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        return [tuple(r) for r in conn.execute(sql, args).fetchall()]
    finally:
        conn.close()


def _put(path: Path, status: str, *, item: int | None = None, step: str = "a",
         run_id: str = RUN) -> None:
    """Put step ``step`` (or its item ``item``) of ``run_id`` into ``status`` with plain SQL.

    A succeeded record carries the output ``"old"`` and a succeeded key; a running or
    indeterminate one a claimed key; a failed one an error.
    """
    output = '"old"' if status == "succeeded" else None
    error = '{"code":"tool_error","message":"old"}' if status == "failed" else None
    if item is None:
        _sql(path, "UPDATE steps SET status = ?, output_json = ?, error_json = ?, "
             "idempotency_key = ?, attempts = 1 WHERE run_id = ? AND step_id = ?",
             status, output, error, KEY, run_id, step)
    else:
        _sql(path, "INSERT OR REPLACE INTO items (run_id, step_id, item_index, status, "
             "output_json, error_json, idempotency_key, attempts) VALUES (?,?,?,?,?,?,?,1)",
             run_id, step, item, status, output, error, KEY)
    if status in ("succeeded", "running", "indeterminate"):
        key_status = "succeeded" if status == "succeeded" else "running"
        _sql(path, "INSERT OR REPLACE INTO idempotency_keys (key, root_run_id, run_id, "
             "step_id, item_index, status, output_json, claimed_at) VALUES (?,?,?,?,?,?,?,?)",
             KEY, run_id, run_id, step, item, key_status, output, now())


def _state(path: Path) -> dict[str, Any]:
    """Everything a guarded writer could change."""
    return {
        "steps": _sql(path, "SELECT * FROM steps ORDER BY run_id, position"),
        "items": _sql(path, "SELECT * FROM items ORDER BY run_id, step_id, item_index"),
        "keys": _sql(path, "SELECT * FROM idempotency_keys ORDER BY key"),
        "events": _sql(path, "SELECT COUNT(*) FROM events")[0][0],
        "runs": _sql(path, "SELECT * FROM runs ORDER BY run_id"),
    }


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "journal.sqlite3"


@pytest.fixture
def journal(path: Path) -> Iterator[Journal]:
    with Journal(path, write=True) as j:
        _new_run(j)
        yield j


def _refused(path: Path, write: Callable[[], Any], *, raises: bool) -> None:
    """``write`` changes nothing (and raises JournalError when ``raises``)."""
    before = _state(path)
    if raises:
        with pytest.raises(JournalError):
            write()
    else:
        write()
    assert _state(path) == before


# --- writers that move a step forward only from the states they name ------------------------

ERR = {"code": "exit_status", "message": "exit 1"}

#: writer name -> (call, statuses it accepts); targets step "a" (or its item 0).
WRITERS: dict[str, tuple[Callable[[Journal, int | None], Any], tuple[str, ...]]] = {
    "step_started": (lambda j, it: j.step_started(RUN, "a", attempt=2, key=KEY,
                                                  root_run_id=RUN, item=it),
                     ("pending", "running", "indeterminate")),
    "step_finished": (lambda j, it: j.step_finished(RUN, "a", status="succeeded", key=KEY,
                                                    output="new", item=it),
                      ("running",)),
    "step_finished_failed": (lambda j, it: j.step_finished(RUN, "a", status="failed",
                                                           key=KEY, error=ERR, item=it),
                             ("running",)),
    "step_retried": (lambda j, it: j.step_retried(RUN, "a", 1, ERR, 0.0, item=it),
                     ("running",)),
    "step_replayed": (lambda j, it: j.step_replayed(RUN, "a", "new", KEY, "test", item=it),
                      ("pending",)),
}


@pytest.mark.parametrize("item", [None, 0], ids=["step", "item"])
@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("status", STATUSES)
def test_a_guarded_writer_refuses_every_status_it_does_not_accept(
        journal: Journal, path: Path, writer: str, status: str, item: int | None) -> None:
    call, accepts = WRITERS[writer]
    _put(path, status, item=item)
    if status in accepts:
        before = _state(path)
        call(journal, item)
        assert _state(path) != before
    else:
        _refused(path, lambda: call(journal, item), raises=True)


@pytest.mark.parametrize("status", [s for s in STATUSES
                                    if s not in ("pending", "running", "indeterminate")])
def test_step_skipped_refuses_a_finished_step(journal: Journal, path: Path,
                                              status: str) -> None:
    _put(path, status)
    _refused(path, lambda: journal.step_skipped(RUN, "a", "stopped", "a message"),
             raises=True)


@pytest.mark.parametrize("status", ["pending", "running", "indeterminate"])
def test_step_skipped_accepts_a_step_that_did_not_finish(journal: Journal, path: Path,
                                                         status: str) -> None:
    _put(path, status)
    journal.step_skipped(RUN, "a", "stopped")
    assert _sql(path, "SELECT status FROM steps WHERE step_id = 'a'") == [("skipped",)]


@pytest.mark.parametrize("status", ["succeeded", "failed", "skipped"])
def test_fanout_begin_refuses_a_finished_step(journal: Journal, path: Path,
                                              status: str) -> None:
    _put(path, status)
    _refused(path, lambda: journal.fanout_begin(RUN, "a", 3), raises=True)


@pytest.mark.parametrize("status", ["pending", "running", "indeterminate"])
def test_fanout_begin_keeps_journaled_items(journal: Journal, path: Path, status: str) -> None:
    _put(path, status)
    _put(path, "succeeded", item=1)
    assert journal.fanout_begin(RUN, "a", 3) == ["pending", "succeeded", "pending"]
    assert _sql(path, "SELECT status FROM steps WHERE step_id = 'a'") == [("running",)]


@pytest.mark.parametrize("status", [s for s in STATUSES if s != "running"])
def test_fanout_succeeded_refuses_a_step_that_is_not_running(journal: Journal, path: Path,
                                                             status: str) -> None:
    _put(path, status)
    _refused(path, lambda: journal.fanout_succeeded(RUN, "a"), raises=True)


def test_fanout_succeeded_assembles_the_items_in_order(journal: Journal, path: Path) -> None:
    journal.fanout_begin(RUN, "a", 2)
    for i, out in ((1, "second"), (0, "first")):
        journal.step_started(RUN, "a", attempt=1, key=f"k{i}", root_run_id=RUN, item=i)
        journal.step_finished(RUN, "a", status="succeeded", key=f"k{i}", output=out, item=i)
    journal.fanout_succeeded(RUN, "a")
    assert _sql(path, "SELECT status, output_json FROM steps WHERE step_id = 'a'") == [
        ("succeeded", '["first","second"]')]


# --- withdraw, indeterminate, resolve -------------------------------------------------------


@pytest.mark.parametrize("item", [None, 0], ids=["step", "item"])
@pytest.mark.parametrize("status", [s for s in STATUSES if s != "running"])
def test_withdraw_dispatch_never_resets_a_step_that_is_not_running(
        journal: Journal, path: Path, status: str, item: int | None) -> None:
    _put(path, status, item=item)
    _refused(path, lambda: journal.withdraw_dispatch(RUN, "a", KEY, item), raises=False)


def test_withdraw_dispatch_keeps_a_succeeded_key_of_another_record(journal: Journal,
                                                                   path: Path) -> None:
    """The key a withdrawn call claimed may be one a sibling already completed."""
    _put(path, "succeeded", step="b")  # KEY is succeeded for step b
    journal.step_started(RUN, "a", attempt=1, key="key-fresh", root_run_id=RUN)
    _sql(path, "UPDATE steps SET idempotency_key = ? WHERE step_id = 'a'", KEY)
    journal.withdraw_dispatch(RUN, "a", KEY)
    assert _sql(path, "SELECT status FROM idempotency_keys WHERE key = ?", KEY) == [
        ("succeeded",)]
    assert _sql(path, "SELECT status FROM steps WHERE step_id = 'a'") == [("pending",)]


def test_withdraw_dispatch_resets_a_running_step_and_releases_its_key(journal: Journal,
                                                                      path: Path) -> None:
    journal.step_started(RUN, "a", attempt=1, key=KEY, root_run_id=RUN)
    journal.withdraw_dispatch(RUN, "a", KEY)
    assert _sql(path, "SELECT status FROM steps WHERE step_id = 'a'") == [("pending",)]
    assert _sql(path, "SELECT * FROM idempotency_keys") == []


@pytest.mark.parametrize("item", [None, 0], ids=["step", "item"])
@pytest.mark.parametrize("status", [s for s in STATUSES if s != "running"])
def test_mark_indeterminate_only_touches_running_records(journal: Journal, path: Path,
                                                         status: str, item: int | None) -> None:
    _put(path, status, item=item)
    _refused(path, lambda: journal.mark_indeterminate(RUN, [("a", item)], "crash"),
             raises=False)


def test_mark_indeterminate_marks_a_running_record(journal: Journal, path: Path) -> None:
    _put(path, "running")
    journal.mark_indeterminate(RUN, [("a", None)], "running at crash")
    assert _sql(path, "SELECT status, json_extract(error_json, '$.code') FROM steps "
                "WHERE step_id = 'a'") == [("indeterminate", "indeterminate")]


@pytest.mark.parametrize("status", ["pending", "succeeded", "failed", "skipped"])
def test_resolve_refuses_a_step_that_is_not_indeterminate(journal: Journal, path: Path,
                                                          status: str) -> None:
    _put(path, status)
    before = _state(path)
    with pytest.raises(RunError) as caught:
        journal.resolve_step(RUN, "a", succeeded=True, output=1, reason=None,
                             decided_by="me")
    assert caught.value.code == "not_indeterminate"
    assert _state(path) == before


@pytest.mark.parametrize("item", [None, 0], ids=["step", "item"])
@pytest.mark.parametrize("start", ["indeterminate", "running"])
def test_resolve_as_failed_records_the_error_and_releases_the_key(
        journal: Journal, path: Path, start: str, item: int | None) -> None:
    _put(path, start, item=item)
    journal.resolve_step(RUN, "a", succeeded=False, output=None, reason="checked by hand",
                         decided_by="ops", item=item)
    table, where = ("steps", "") if item is None else ("items", " AND item_index = 0")
    row = _sql(path, f"SELECT status, output_json, error_json, finished_at IS NOT NULL "
               f"FROM {table} WHERE step_id = 'a'{where}")
    assert row == [("failed", None, '{"code":"resolved_failed","message":"checked by hand"}',
                    1)]
    assert _sql(path, "SELECT COUNT(*) FROM idempotency_keys") == [(0,)]
    [(kind, step, index, data)] = _sql(path, "SELECT kind, step_id, item_index, data_json "
                                       "FROM events ORDER BY rowid DESC LIMIT 1")
    assert (kind, step, index) == ("indeterminate_resolved", "a", item)
    assert json.loads(data) == {"decided_by": "ops", "reason": "checked by hand",
                                "status": "failed"}


def test_resolve_as_failed_without_a_reason_names_who_decided(journal: Journal,
                                                              path: Path) -> None:
    _put(path, "indeterminate")
    journal.resolve_step(RUN, "a", succeeded=False, output=None, reason=None,
                         decided_by="ops")
    assert _sql(path, "SELECT error_json FROM steps WHERE step_id = 'a'") == [
        ('{"code":"resolved_failed","message":"resolved as failed by ops"}',)]


@pytest.mark.parametrize("item", [None, 0], ids=["step", "item"])
def test_resolve_as_succeeded_records_the_output_and_keeps_the_key(
        journal: Journal, path: Path, item: int | None) -> None:
    _put(path, "indeterminate", item=item)
    journal.resolve_step(RUN, "a", succeeded=True, output={"n": 5}, reason=None,
                         decided_by="ops", item=item)
    table, where = ("steps", "") if item is None else ("items", " AND item_index = 0")
    assert _sql(path, f"SELECT status, output_json, error_json FROM {table} "
                f"WHERE step_id = 'a'{where}") == [("succeeded", '{"n":5}', None)]
    assert _sql(path, "SELECT key, status, output_json FROM idempotency_keys") == [
        (KEY, "succeeded", '{"n":5}')]


@pytest.mark.parametrize(("item", "named"), [(None, "step 'a' of run"),
                                             (0, "step 'a' item 0 of run")])
def test_resolve_refusal_names_the_step_or_the_item(journal: Journal, path: Path,
                                                    item: int | None, named: str) -> None:
    _put(path, "succeeded", item=item)
    with pytest.raises(RunError, match=f"^not_indeterminate: {named} {RUN} is succeeded, not"):
        journal.resolve_step(RUN, "a", succeeded=True, output=1, reason=None,
                             decided_by="me", item=item)


def test_resolve_of_an_unknown_step_is_a_usage_error(journal: Journal, path: Path) -> None:
    before = _state(path)
    with pytest.raises(UsageError) as caught:
        journal.resolve_step(RUN, "zz", succeeded=True, output=1, reason=None,
                             decided_by="me")
    assert caught.value.code == "unknown_step"
    assert _state(path) == before


# --- leases -----------------------------------------------------------------------------------


def test_renew_lease_of_another_owner_fails_and_changes_nothing(journal: Journal,
                                                                path: Path) -> None:
    mine = f"{HOST}:{os.getpid()}:aaaaaaaa"
    journal.take_lease(RUN, mine, ttl=5.0)
    before = _state(path)
    assert journal.renew_lease(RUN, "someone:1:else", ttl=1000.0) is False
    assert _state(path) == before


def test_renew_lease_extends_the_holders_lease(journal: Journal, path: Path) -> None:
    mine = f"{HOST}:{os.getpid()}:aaaaaaaa"
    journal.take_lease(RUN, mine, ttl=5.0)
    (expires,), = _sql(path, "SELECT lease_expires FROM runs")
    assert journal.renew_lease(RUN, mine, ttl=1000.0) is True
    (renewed,), = _sql(path, "SELECT lease_expires FROM runs")
    assert renewed > expires + 900


def test_renew_lease_of_a_released_lease_fails(journal: Journal, path: Path) -> None:
    mine = f"{HOST}:{os.getpid()}:aaaaaaaa"
    journal.take_lease(RUN, mine)
    journal.release_lease(RUN, mine)
    assert journal.renew_lease(RUN, mine) is False
    assert _sql(path, "SELECT lease_owner, lease_expires FROM runs") == [(None, None)]


# --- a key claimed by a run that is still being driven ---------------------------------------


def _claimed_by_other(path: Path, journal: Journal, *, holder: str | None, ttl: float,
                      key_status: str = "running") -> None:
    """Run OTHER holds ``KEY`` (status ``key_status``) with lease ``holder`` for ``ttl`` s."""
    _new_run(journal, OTHER)
    _put(path, "running", run_id=OTHER)
    _sql(path, "UPDATE idempotency_keys SET status = ? WHERE key = ?", key_status, KEY)
    _sql(path, "UPDATE runs SET lease_owner = ?, lease_expires = ? WHERE run_id = ?",
         holder, None if holder is None else time.time() + ttl, OTHER)


def _claim(journal: Journal) -> None:
    journal.fresh_keys = False  # a resumed or retried run looks at claims of others
    journal.step_started(RUN, "a", attempt=1, key=KEY, root_run_id=RUN)


def test_a_key_a_live_run_is_calling_is_refused(journal: Journal, path: Path) -> None:
    _claimed_by_other(path, journal, holder=f"{HOST}:{os.getpid()}:livelive", ttl=30.0)
    before = _state(path)
    with pytest.raises(RunError) as caught:
        _claim(journal)
    assert caught.value.code == "run_busy"
    assert OTHER in str(caught.value)
    assert _state(path) == before


def test_a_key_claimed_by_a_run_whose_lease_this_process_holds_is_taken_over(
        journal: Journal, path: Path) -> None:
    """A retry holds its parent's lease: the parent's claim of an indeterminate call is
    stale, so the child claims the key (same key: an idempotent call runs again once)."""
    owner = f"{HOST}:{os.getpid()}:retry"
    journal.take_lease(RUN, owner)
    _claimed_by_other(path, journal, holder=owner, ttl=30.0)
    _claim(journal)
    assert _sql(path, "SELECT run_id, status FROM idempotency_keys WHERE key = ?", KEY) == [
        (RUN, "running")]


def test_a_key_a_live_run_on_another_host_is_calling_is_refused(journal: Journal,
                                                                path: Path) -> None:
    _claimed_by_other(path, journal, holder="elsewhere.invalid:4242:livelive", ttl=30.0)
    with pytest.raises(RunError):
        _claim(journal)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize(("holder", "ttl", "key_status"), [
    pytest.param("dead", 30.0, "running", id="holder-dead"),
    pytest.param("live", -1.0, "running", id="lease-expired"),
    pytest.param(None, 30.0, "running", id="no-lease"),
    pytest.param("live", 30.0, "succeeded", id="key-succeeded"),
])
def test_a_key_nobody_is_calling_can_be_claimed(journal: Journal, path: Path,
                                                holder: str | None, ttl: float,
                                                key_status: str) -> None:
    owner = {"dead": f"{HOST}:{_dead_pid()}:deaddead",
             "live": f"{HOST}:{os.getpid()}:livelive"}.get(holder or "")
    _claimed_by_other(path, journal, holder=owner, ttl=ttl, key_status=key_status)
    _claim(journal)
    assert _sql(path, "SELECT run_id, status FROM idempotency_keys WHERE key = ?", KEY) == [
        (RUN, "running")]


@pytest.mark.parametrize("item", [None, 3], ids=["step", "item"])
@pytest.mark.parametrize(("holder", "ttl"), [
    pytest.param("dead", 30.0, id="holder-dead"),
    pytest.param("live", -1.0, id="lease-expired"),
    pytest.param(None, 30.0, id="no-lease"),
])
def test_a_key_a_stopped_run_was_calling_is_refused_for_a_tool_that_is_not_idempotent(
        journal: Journal, path: Path, holder: str | None, ttl: float,
        item: int | None) -> None:
    """Run OTHER stopped inside the call: its effect is unknown. A tool that is not
    idempotent is not called again (``indeterminate``); the error names that run's step
    (or item) and the ``resolve`` that settles it, and nothing is written."""
    owner = {"dead": f"{HOST}:{_dead_pid()}:deaddead",
             "live": f"{HOST}:{os.getpid()}:livelive"}.get(holder or "")
    _claimed_by_other(path, journal, holder=owner, ttl=ttl)
    if item is not None:
        _sql(path, "UPDATE idempotency_keys SET item_index = ? WHERE key = ?", item, KEY)
    before = _state(path)
    journal.fresh_keys = False
    with pytest.raises(RunError) as caught:
        journal.step_started(RUN, "b", attempt=1, key=KEY, root_run_id=RUN,
                             idempotent=False)
    error = caught.value
    assert error.code == "indeterminate"
    assert error.details == {"run_id": OTHER, "step": "a", "item": item}
    shown, where = ("a", "a") if item is None else ("a[3]", "a --item 3")
    assert f"step {shown} was being called by run {OTHER} " in str(error)
    assert f"planrun resolve {OTHER} {where} --succeeded" in str(error.hint)
    assert f"planrun resume {RUN} " in str(error.hint)
    assert _state(path) == before


def test_one_key_of_a_live_run_among_keys_of_the_holders_own_run_is_refused(
        journal: Journal, path: Path) -> None:
    """A batch of claims (several keys, one query): the claims this process's own run
    holds are passed over, and a later key a live run is calling is still refused."""
    owner = f"{HOST}:{os.getpid()}:retry"
    journal.take_lease(RUN, owner)
    _claimed_by_other(path, journal, holder=owner, ttl=30.0)  # KEY: OTHER, this lease
    third = "0123456789abcdee"
    _new_run(journal, third)
    _sql(path, "INSERT INTO idempotency_keys (key, root_run_id, run_id, step_id, "
         "item_index, status, claimed_at) VALUES (?,?,?,?,?,?,?)", "key-z", third, third,
         "a", None, "running", now())
    _sql(path, "UPDATE runs SET lease_owner = ?, lease_expires = ? WHERE run_id = ?",
         f"{HOST}:{os.getpid()}:livelive", time.time() + 30, third)
    assert journal.conn is not None
    for keys in ([KEY, "key-z"], ["key-z", KEY]):
        with pytest.raises(RunError) as caught:
            journal._refuse_live_claim(journal.conn, keys, RUN)
        assert caught.value.code == "run_busy"
        assert third in str(caught.value)
    journal._refuse_live_claim(journal.conn, [KEY], RUN, idempotent=False)  # its own


def test_a_live_lease_of_another_machine_with_this_host_name_is_not_taken_over(
        journal: Journal, path: Path) -> None:
    """Another boot id under this host name, renewed since this machine booted: a cloned
    machine of the same name holds it (its pid means nothing here), not this machine
    before a restart. It is refused as on another host until it expires; before, it was
    taken as a holder that died in a restart and taken over at once (found by an
    attacker). A planning session held so is not settled as dead either."""
    holder = f"{HOST}:{_dead_pid()}:clone000"
    _sql(path, "UPDATE runs SET lease_owner = ?, lease_expires = ?, lease_boot = ? "
         "WHERE run_id = ?", holder, time.time() + 30, "boot-of-the-clone", RUN)
    before = _state(path)
    with pytest.raises(RunError) as caught:
        journal.take_lease(RUN, f"{HOST}:{os.getpid()}:takeover")
    assert caught.value.code == "run_busy"
    assert "on another host" in str(caught.value)
    assert _state(path) == before
    _sql(path, "UPDATE runs SET status = 'planning' WHERE run_id = ?", RUN)
    assert journal.settle_dead_planning() == []
    # expired: taken over, as any lease of another host
    _sql(path, "UPDATE runs SET status = 'running', lease_expires = ? WHERE run_id = ?",
         time.time() - 1, RUN)
    journal.take_lease(RUN, f"{HOST}:{os.getpid()}:takeover")


def test_a_live_lease_of_this_machine_before_a_restart_is_taken_over(
        journal: Journal, path: Path) -> None:
    """Another boot id, the lease last renewed before this machine booted: its holder
    died in the restart (dead, not "another host"); its lease is taken."""
    from planrun import procs

    booted = procs.booted_at()
    assert booted is not None
    holder = f"{HOST}:{_dead_pid()}:rebooted"
    # renewed (its expiry less the lease's 30 s) a minute before the boot
    _sql(path, "UPDATE runs SET lease_owner = ?, lease_expires = ?, lease_boot = ? "
         "WHERE run_id = ?", holder, booted - 30, "an-earlier-boot", RUN)
    lease = journal.lease(RUN)
    assert lease is not None
    assert lease.expired  # a machine up longer than a lease: its leases all ran out
    assert lease.holder_alive() is False
    journal.take_lease(RUN, f"{HOST}:{os.getpid()}:takeover")


def test_a_key_claimed_by_the_same_run_is_not_refused(journal: Journal, path: Path) -> None:
    """Resume re-dispatches an idempotent step under the key it claimed itself."""
    journal.take_lease(RUN, f"{HOST}:{os.getpid()}:mineмine")
    _put(path, "indeterminate")
    _claim(journal)
    assert _sql(path, "SELECT status FROM steps WHERE step_id = 'a'") == [("running",)]


def test_the_holder_takes_its_own_lease_again(journal: Journal, path: Path) -> None:
    """A live holder re-taking its own lease (resume inside one process) is not busy."""
    mine = f"{HOST}:{os.getpid()}:aaaaaaaa"
    journal.take_lease(RUN, mine, ttl=5.0)
    journal.take_lease(RUN, mine, ttl=1000.0)
    (owner, expires), = _sql(path, "SELECT lease_owner, lease_expires FROM runs")
    assert owner == mine
    assert expires > time.time() + 900


def test_step_output_of_an_item_reads_that_steps_item(journal: Journal, path: Path) -> None:
    for step in ("a", "b"):
        journal.fanout_begin(RUN, step, 1)
        journal.step_started(RUN, step, attempt=1, key=f"k{step}", root_run_id=RUN, item=0)
        journal.step_finished(RUN, step, status="succeeded", key=f"k{step}",
                              output=f"out-{step}", item=0)
    assert journal.step_output(RUN, "b", item=0) == ("succeeded", "out-b")
    assert journal.step_output(RUN, "a", item=0) == ("succeeded", "out-a")
    assert journal.step_output(RUN, "a", item=1) is None


@pytest.mark.parametrize(("holder", "where"), [
    (f"{HOST}:{os.getpid()}:livelive", ""),
    ("elsewhere.invalid:4242:livelive", " on another host"),
], ids=["this-host", "another-host"])  # ids without the pid: xdist workers must agree
def test_a_live_lease_is_refused_with_its_holder_and_time_left(journal: Journal, path: Path,
                                                               holder: str, where: str) -> None:
    """``run_busy`` names the holder and how long its lease still runs (in whole seconds)."""
    journal.take_lease(RUN, holder, ttl=1000.0)
    before = _state(path)
    with pytest.raises(RunError) as caught:
        journal.take_lease(RUN, f"{HOST}:{os.getpid()}:othother")
    assert caught.value.code == "run_busy"
    message = str(caught.value)
    assert f"another process{where} ({holder}); its lease expires in " in message
    seconds = int(message.split("its lease expires in ", 1)[1].split(" s", 1)[0])
    assert 900 <= seconds <= 1000
    assert _state(path) == before


def test_an_expired_lease_without_a_time_is_taken_over(journal: Journal, path: Path) -> None:
    _sql(path, "UPDATE runs SET lease_owner = ?, lease_expires = ?", "elsewhere.invalid:1:x",
         time.time() - 1)
    journal.take_lease(RUN, f"{HOST}:{os.getpid()}:newnewnn")
    assert _sql(path, "SELECT lease_owner FROM runs") == [(f"{HOST}:{os.getpid()}:newnewnn",)]


# --- recorded calls (process groups) -------------------------------------------------------


def test_forgetting_the_calls_of_one_host_keeps_the_other_hosts(journal: Journal) -> None:
    """``unlock`` on a host forgets that host's calls only (``forget_calls(host=…)``)."""
    from planrun import procs

    journal.take_lease(RUN, f"{HOST}:{os.getpid()}:calls")
    here = procs.Group(pgid=_dead_pid(), host=HOST, boot_id=None, start_ticks=None)
    there = procs.Group(pgid=4242, host="elsewhere.invalid", boot_id=None, start_ticks=None)
    journal.record_call(RUN, "a", None, here)
    journal.record_call(RUN, "b", None, there)
    assert journal.forget_calls(RUN, host=HOST) == 1
    assert [(c["step"], c["host"]) for c in journal.calls(RUN)] == [("b", "elsewhere.invalid")]
    assert journal.forget_calls(RUN) == 1  # without a host: all of the run's calls
    assert journal.calls(RUN) == []
