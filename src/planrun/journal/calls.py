"""Process groups of running command calls (SPEC §12)."""

from __future__ import annotations

from typing import Any

from .. import procs
from ..errors import RunError
from .base import Conn, JournalBase, epoch_seconds, now


class CallsMixin(JournalBase):
    """The journal's calls: a part of :class:`planrun.journal.Journal`."""

    def record_call(self, run_id: str, step_id: str, item: int | None,
                    group: procs.Group) -> None:
        """Journal the process group of a command call that just started (committed now).

        Raises:
            LeaseLost: another process holds the run's lease (the caller ends the call).
        """
        with self._write() as c:
            self._guard(c, run_id)
            c.execute("INSERT INTO call_groups (run_id, step_id, item_index, pgid, host, "
                      "boot_id, start_ticks, started_at) VALUES (?,?,?,?,?,?,?,?) "
                      "ON CONFLICT (run_id, host, pgid) DO UPDATE SET "
                      "step_id = excluded.step_id, item_index = excluded.item_index, "
                      "boot_id = excluded.boot_id, start_ticks = excluded.start_ticks, "
                      "started_at = excluded.started_at",
                      (run_id, step_id, item, group.pgid, group.host, group.boot_id,
                       group.start_ticks, now()))

    def end_call(self, run_id: str, group: procs.Group) -> None:
        """Forget a call's group once its leader was reaped (joins the next commit)."""
        def write(c: Conn) -> None:
            c.execute("DELETE FROM call_groups WHERE run_id = ? AND host = ? AND pgid = ?",
                      (run_id, group.host, group.pgid))

        self._deferred.append(write)

    @staticmethod
    def _call_rows(c: Conn, run_ids: list[str]
                   ) -> list[tuple[str, str, int | None, procs.Group, str]]:
        marks = ", ".join("?" for _ in run_ids)
        rows = c.execute(
            "SELECT run_id, step_id, item_index, pgid, host, boot_id, start_ticks, "
            f"started_at FROM call_groups WHERE run_id IN ({marks}) ORDER BY started_at",
            run_ids).fetchall()
        return [(r[0], r[1], r[2], procs.Group(r[3], r[4], r[5], r[6], epoch_seconds(r[7])), r[7])
                for r in rows]

    def calls(self, run_id: str) -> list[dict[str, Any]]:
        """The recorded command calls of a run still running or left by a dead process.

        Each: ``step``, ``item``, ``pgid``, ``host``, ``started_at``, ``alive`` (True /
        False, None on another host). Changes nothing.
        """
        if self.conn is None:
            return []
        try:
            rows = self._call_rows(self.conn, [run_id])
        except self.backend.DatabaseError as exc:
            raise self.backend.fail(exc, "read") from None
        return [{"step": sid, "item": item, "pgid": g.pgid, "host": g.host,
                 "started_at": ts, "alive": procs.group_alive(g)}
                for _run, sid, item, g, ts in rows]

    def forget_calls(self, run_id: str, *, host: str | None = None) -> int:
        """Forget a run's recorded calls (only those on ``host`` when given); how many."""
        with self._write() as c:
            if host is None:
                cur = c.execute("DELETE FROM call_groups WHERE run_id = ?", (run_id,))
            else:
                cur = c.execute("DELETE FROM call_groups WHERE run_id = ? AND host = ?",
                                (run_id, host))
            return int(cur.rowcount)

    def _refuse_live_calls(self, c: Conn, run_id: str,
                           risk: str = "running the step again now could do its effect "
                           "twice") -> None:
        """``run_busy`` while a call of the run (or of a child run) outlives its planrun.

        ``risk``: what the refused command would do, said in the message.

        Calls that are provably over are forgotten; one on another host cannot be
        checked from here and counts as running until ``planrun unlock``.
        """
        runs = [run_id] + [r[0] for r in c.execute(
            "SELECT run_id FROM runs WHERE parent_run_id = ?", (run_id,))]
        live = []
        for rid, sid, item, group, _ts in self._call_rows(c, runs):
            alive = procs.group_alive(group)
            if alive is False:
                c.execute("DELETE FROM call_groups WHERE run_id = ? AND host = ? AND pgid = ?",
                          (rid, group.host, group.pgid))
            else:
                live.append((rid, sid, item, group, alive))
        if not live:
            return
        rid, sid, item, group, alive = live[0]
        what = f"step {sid!r}" + (f" item {item}" if item is not None else "")
        of = "" if rid == run_id else f" (of its retry {rid})"
        if alive:
            where = f"process group {group.pgid}"
            hint = (f"Wait for it to end, or end it (kill -TERM -{group.pgid}); then run "
                    "this command again.")
        else:
            where = f"process group {group.pgid} on host {group.host}"
            hint = (f"Make sure it ended on {group.host}, then `planrun unlock {run_id}` "
                    "forgets it.")
        more = f" and {len(live) - 1} more" if len(live) > 1 else ""
        raise RunError(f"run {run_id}: the call of {what}{of} is still running "
                       f"({where}{more}), started by a planrun process that is gone; "
                       f"{risk}",
                       code="run_busy", hint=hint,
                       details={"calls": [{"run_id": r, "step": s, "item": i,
                                           **procs.describe(g)} for r, s, i, g, _a in live]})

