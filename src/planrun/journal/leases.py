"""Leases: (owner, epoch, until), ``until`` by the database clock (SPEC §7, §11).

Taking a lease bumps its epoch; every guarded write of this handle checks owner and epoch
(``JournalBase._guard``), so a process that lost its lease writes nothing more. Expiry is
computed by the database (``backend.NOW_SQL``), never by this host's clock; the holder's
boot id and start time are journaled with it, so a reused pid does not look alive.
"""

from __future__ import annotations

from typing import Any

from ..errors import RunError
from .base import _reads, lease_ttl
from .calls import CallsMixin
from .records import Lease, holder_identity, lease_record


class LeasesMixin(CallsMixin):
    """The journal's leases: a part of :class:`planrun.journal.Journal`."""

    @_reads
    def lease_holder(self, run_id: str) -> str | None:
        """Who holds the run's lease now (``host:pid:token``), or None."""
        row = self._c().execute("SELECT lease_owner FROM runs WHERE run_id = ?",
                                (run_id,)).fetchone()
        return None if row is None or row[0] is None else str(row[0])

    @_reads
    def lease(self, run_id: str) -> Lease | None:
        """The run's lease as the database sees it now, or None when nobody holds it."""
        row = self._c().execute(
            f"SELECT lease_owner, lease_epoch, lease_expires, "
            f"lease_expires - {self.backend.NOW_SQL}, lease_boot, lease_start "
            "FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None or row[0] is None else lease_record(row)

    def take_lease(self, run_id: str, owner: str, *, ttl: float | None = None,
                   statuses: tuple[str, ...] | None = None) -> None:
        """Take the run's lease for ``owner`` (SPEC §7 "Leases"); its epoch goes up by one.

        A lease held by a live process is refused; a dead holder (same host, pid gone or
        given to another process) or an expired lease is taken over. A command call of the
        run (or of a retry of it) that outlived its planrun and still runs is refused too
        (SPEC §12). With ``statuses``, the run's status is checked in the same transaction
        (a run another process just finished is not taken). ``ttl``: seconds (default
        :func:`lease_ttl`), counted by the database clock.

        Raises:
            RunError: ``run_busy``; ``run_not_resumable`` when the status is not one of
                ``statuses``; ``unknown_run`` (exit 5).
        """
        boot, start = holder_identity(owner)
        with self._write() as c:
            row = self._lease_row(c, run_id)
            status = row[6]
            if statuses is not None and status not in statuses:
                raise RunError(f"run {run_id} is {status} now", code="run_not_resumable")
            held = None if row[0] is None else lease_record(row)
            if held is not None and held.owner != owner:
                alive = held.holder_alive()
                # A live holder renews every LEASE_TTL_S / 3; one that let its lease expire
                # is stuck (or its pid was reused by another process): take it over.
                if not held.expired and alive is not False:
                    where = "" if alive else " on another host"
                    raise RunError(
                        f"run {run_id} is being driven by another process{where} "
                        f"({held.owner}); its lease expires in "
                        f"{max(0.0, held.remaining_s):.0f} s",
                        code="run_busy",
                        hint="Wait for it to finish; if that process is gone for good "
                        f"(another host), `planrun unlock {run_id}` releases the lease.")
            self._refuse_live_calls(c, run_id)
            epoch = int(row[1] or 0) + 1
            c.execute(f"UPDATE runs SET lease_owner = ?, lease_epoch = ?, "
                      f"lease_expires = {self.backend.NOW_SQL} + ?, lease_boot = ?, "
                      "lease_start = ? WHERE run_id = ?",
                      (owner, epoch, ttl or lease_ttl(), boot, start, run_id))
        self.owner = owner
        self._epochs[run_id] = epoch

    def _lease_row(self, c: Any, run_id: str) -> Any:
        """The run's lease row, read in the write transaction ``c``.

        (owner, epoch, until, until less the database clock, boot id, start ticks, status).

        Raises:
            RunError: ``unknown_run`` (exit 5).
        """
        row = c.execute(
            f"SELECT lease_owner, lease_epoch, lease_expires, "
            f"lease_expires - {self.backend.NOW_SQL}, lease_boot, lease_start, status "
            "FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            raise RunError(f"no run {run_id!r}", code="unknown_run")
        return row

    def renew_lease(self, run_id: str, owner: str, *, ttl: float | None = None) -> bool:
        """Extend ``owner``'s lease by ``ttl`` seconds from the database clock.

        At the epoch this handle took, when it took the lease. False when ``owner`` no
        longer holds it.
        """
        epoch = self._epochs.get(run_id)
        sql = (f"UPDATE runs SET lease_expires = {self.backend.NOW_SQL} + ? "
               "WHERE run_id = ? AND lease_owner = ?")
        args: list[object] = [ttl or lease_ttl(), run_id, owner]
        if epoch is not None:
            sql += " AND lease_epoch = ?"
            args.append(epoch)
        with self._write() as c:
            return bool(c.execute(sql, args).rowcount == 1)

    def unlock(self, run_id: str) -> str | None:
        """``planrun unlock``: clear the run's lease and forget its recorded calls.

        Unless a live process on this host holds the lease or runs a call of the run.
        Checked in the transaction that clears them: a ``resume`` that took the lease
        between a check and the clearing would have lost it to the unlock while it ran
        (found by an attacker). Returns who held the lease, or None.

        Raises:
            RunError: ``unknown_run``; ``run_busy`` (exit 5).
        """
        from .. import procs

        with self._write() as c:
            row = self._lease_row(c, run_id)
            lease = None if row[0] is None else lease_record(row)
            if lease is not None and lease.holder_alive() is True and not lease.expired:
                raise RunError(f"run {run_id}'s lease is held by a live process on this "
                               f"host ({lease.owner})", code="run_busy",
                               hint="Stop that process (Ctrl-C or SIGTERM) instead.")
            for _rid, sid, _item, group, _ts in self._call_rows(c, [run_id]):
                if procs.group_alive(group) is True:
                    raise RunError(f"run {run_id}: the call of step {sid!r} still runs on "
                                   f"this host (process group {group.pgid})",
                                   code="run_busy", hint="Wait for it to end, or end it "
                                   f"(kill -TERM -{group.pgid}).")
            # what was recorded on another host cannot be checked from here: the person
            # unlocking says it is over (SPEC §7 "planrun unlock")
            c.execute("DELETE FROM call_groups WHERE run_id = ?", (run_id,))
            c.execute("UPDATE runs SET lease_owner = NULL, lease_expires = NULL, "
                      "lease_boot = NULL, lease_start = NULL WHERE run_id = ?", (run_id,))
        return None if lease is None else lease.owner

    def release_lease(self, run_id: str, owner: str | None = None) -> str | None:
        """Clear the lease (only ``owner``'s when given); returns who held it.

        The epoch stays: the next holder's is one more.
        """
        with self._write() as c:
            row = c.execute("SELECT lease_owner FROM runs WHERE run_id = ?",
                            (run_id,)).fetchone()
            holder = row[0] if row else None
            if owner is None or holder == owner:
                c.execute("UPDATE runs SET lease_owner = NULL, lease_expires = NULL, "
                          "lease_boot = NULL, lease_start = NULL WHERE run_id = ?", (run_id,))
        if self.owner == owner:
            self.owner = None
            self._epochs.pop(run_id, None)
        return holder if holder is None else str(holder)
