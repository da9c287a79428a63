"""What the scheduler's parts share: outcomes, step state, test seams, keys (SPEC §5, §7).

Also the two helpers that run beside the loop: the lease's heartbeat thread and the
ordered acquisition of concurrency slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from .. import redact
from ..canonical import canonical_json, digest
from ..journal import Journal
from ..journal.store import lease_ttl
from ..redact import Secrets
from ..validation import CheckedStep

Progress = Callable[[str, str, dict[str, Any]], None]

#: Seconds running calls get to finish after the first SIGINT/SIGTERM (SPEC §5).
GRACE_S = 10.0
#: Test-only seam: ``PLANRUN_TEST_CRASH=POINT:STEP[,POINT:STEP...]`` makes the process
#: SIGKILL itself at a named point of a step (``STEP#N``: of fan-out item N), so crash
#: tests are deterministic.
#: POINT is ``dispatch`` (after the dispatch record commits), ``call`` (after the tool
#: returned, before the outcome record) or ``outcome`` (after the outcome record commits).
CRASH_ENV = "PLANRUN_TEST_CRASH"
CRASH_POINTS = ("dispatch", "call", "outcome")
#: Default bound on fan-out items (SPEC §3 ``max_items``).
MAX_ITEMS = 10_000
#: Where a step (or item) can be when it fails before its tool is called: never
#: dispatched, or left ``running``/``indeterminate`` by a crash and being dispatched again
#: (a changed contract or an unresolvable reference fails it then, SPEC §5).
BEFORE_CALL = ("pending", "running", "indeterminate")


#: Test-only seam: ``PLANRUN_TEST_INTERNAL=POINT[:STEP][,...]`` raises an unexpected
#: exception (a stand-in for a bug in planrun) at a named point, so that tests can show
#: that no bug leaves a run ``running`` (SPEC §5). POINT is ``prepare`` (before a step's
#: dispatch record), ``dispatch`` (after it commits, before the call), ``call`` (after the
#: tool returned), ``schedule`` (the scheduler, about to dispatch the step, outside any
#: step's own handling) — these take a STEP (``STEP#N``: fan-out item N; without one, the
#: first step to get there) —, ``approval`` (while clearing approvals, after the run is
#: journaled) or ``finish`` (after the steps ran, before the run's status is recorded).
INTERNAL_ENV = "PLANRUN_TEST_INTERNAL"


def inject_fault(point: str, step: str | None = None, item: int | None = None,
                 seam: str | None = None) -> None:
    """Raise the test seam's stand-in bug when ``PLANRUN_TEST_INTERNAL`` names this point.

    ``seam``: the variable's value as read once for the run (the scheduler reads it when
    a run starts: ~3 us of ``os.environ`` a look-up, four a step), or None to read it now.

    Raises:
        RuntimeError: the seam names ``point`` (and ``step``, or ``step#item``).
    """
    raw = os.environ.get(INTERNAL_ENV) if seam is None else seam
    if not raw:
        return
    names = {point} if step is None else {point, f"{point}:{step}"} | (
        {f"{point}:{step}#{item}"} if item is not None else set())
    if names & {part.strip() for part in raw.split(",")}:
        raise RuntimeError(f"injected internal error at {sorted(names)[-1]} "
                           f"({INTERNAL_ENV})")


def internal_error(exc: BaseException, where: str, run_id: str,
                   secrets: Secrets | None = None) -> dict[str, Any]:
    """The journaled error of an unexpected exception in planrun: code ``internal``.

    ``message`` names the exception type and text (never the traceback, which goes to
    ``traceback`` and is shown only by ``planrun log RUN --tracebacks``). Both are in
    reference form: a value of ``secrets`` (the run's, when known) they quote is stored
    as a reference (SPEC §7).
    """
    import traceback

    if secrets is None:
        secrets = redact.NO_SECRETS
    try:
        text = secrets.conceal_text(str(exc))
    except Exception:
        text = "<the exception's message could not be read>"
    what = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    try:
        tb = secrets.conceal_text("".join(traceback.format_exception(exc)))
    except Exception:
        tb = what
    return {"code": "internal", "type": type(exc).__name__,
            "message": f"unexpected error in planrun{where} ({what[:500]}); this is a bug "
            f"in planrun — `planrun log {run_id} --tracebacks` shows where", "traceback": tb}


def dependency_message(dep: str, status: str) -> str:
    """Why a step was skipped: ``dependency 'DEP' STATUS`` (its ``dependency`` error).

    The one wording, also recognised by ``planrun resolve`` (:mod:`planrun.settle`), which
    says so when it settles ``DEP``.
    """
    return f"dependency {dep!r} {status}"


#: Default bound on re-dispatches of a call cut short by a crash (SPEC §5 ``max_recoveries``).
MAX_RECOVERIES = 3


def crash_points() -> frozenset[tuple[str, str]]:
    """The (point, step) pairs ``PLANRUN_TEST_CRASH`` names."""
    raw = os.environ.get(CRASH_ENV, "")
    out = set()
    for part in raw.split(","):
        point, _, step = part.strip().partition(":")
        if point in CRASH_POINTS and step:
            out.add((point, step))
    return frozenset(out)


@lru_cache(maxsize=4096)
def _key_tail(plan: str, root_run_id: str | None, step_id: str, tool: str) -> str:
    """The canonical text of an idempotency key after its arguments and item (see there).

    ``root_run_id`` None: the plan's scope (``dedupe: plan``).
    """
    scope: dict[str, Any] = {"scope": "plan"} if root_run_id is None \
        else {"root_run_id": root_run_id}
    return canonical_json({"plan": plan, **scope, "step": step_id, "tool": tool})[1:]


def idempotency_key(*, plan: str, root_run_id: str, step: CheckedStep, item: int | None,
                    arguments: dict[str, Any], arguments_json: str | None = None) -> str:
    """SHA-256 of the canonical JSON of {plan, root run, step, item, tool, arguments} (SPEC §7).

    ``arguments`` are in reference form (:mod:`planrun.redact`): a secret counts by its
    parameter's name, never its value. With ``key_arguments`` only those arguments count
    (the registry makes each of them required, so none is ever missing). A tool with
    ``dedupe: plan`` leaves the root run out (``"scope": "plan"`` instead): every run of
    the plan gets the same key for the same call.

    ``arguments_json``: :func:`planrun.canonical.canonical_json` of ``arguments`` when the
    caller has it (it digests them too): the same key, without writing them twice.
    """
    keys = step.tool.entry.key_arguments
    by_plan = step.tool.entry.dedupe == "plan"
    if keys is None and arguments_json is not None:
        # The keys sort "arguments", "item", then the rest: the canonical text is spliced
        # around the arguments' and the item's, the rest written once a step (a fan-out's
        # items share it).
        tail = _key_tail if item is not None else _key_tail.__wrapped__  # one key a step
        text = ('{"arguments":' + arguments_json + ',"item":'
                + ("null" if item is None else str(int(item))) + ","
                + tail(plan, None if by_plan else root_run_id, step.id, step.tool.name))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()
    scope: dict[str, Any] = {"scope": "plan"} if by_plan else {"root_run_id": root_run_id}
    args = {k: arguments[k] for k in keys if k in arguments} if keys is not None \
        else arguments
    return digest({"plan": plan, **scope, "step": step.id, "item": item,
                   "tool": step.tool.name, "arguments": args})


def facets_of(raw: Any, output: Any) -> dict[str, Any] | None:
    """:func:`planrun.facets.of_output` of a step whose ``facets`` field is ``raw``.

    The facets module is loaded only for a step that declares facets: most plans have
    none (~2 ms of a process's start).
    """
    if raw is None:
        return None
    from ..facets import of_output

    return of_output(raw, output)


def listing(indices: list[int], most: int = 10) -> str:
    """``1, 2, 3 and N more``: at most ``most`` indices."""
    shown = ", ".join(map(str, indices[:most]))
    return shown + (f" and {len(indices) - most} more" if len(indices) > most else "")


class Heartbeat(threading.Thread):
    """Renews the run's lease from a thread of its own, on a journal connection of its own.

    The event loop may be blocked by a tool (an ``async def`` tool that calls
    ``time.sleep``): the lease must not depend on tools behaving (SPEC §7 "Leases").
    When the lease is found taken, ``on_lost(None)`` is called from this thread, once.

    A lease that cannot be renewed (the journal does not answer this thread: a
    connection limit, a changed password, a server away) runs out, and then another
    process may take the run over while this one still calls its steps. So when no
    renewal has succeeded for two thirds of the lease's time (two beats), this process
    gives the run up first: ``on_lost(why)``, with what the journal said, a beat before the
    lease can expire (fencing; a silent heartbeat let a resume call a python step a
    second time; found by an attacker).
    """

    def __init__(self, path: Path | str, run_ids: list[str], owner: str,
                 on_lost: Callable[[str | None], None]) -> None:
        super().__init__(name="planrun-lease", daemon=True)
        self.path, self.run_ids, self.owner, self.on_lost = path, run_ids, owner, on_lost
        self.ttl = lease_ttl()
        self.stopped = threading.Event()

    def run(self) -> None:
        """Renew every ``ttl / 3`` seconds until stopped or the lease is lost."""
        import time

        journal: Journal | None = None
        renewed = time.monotonic()
        try:
            while not self.stopped.wait(self.ttl / 3):
                try:
                    if journal is None:
                        journal = Journal(self.path, write=True)
                    held = [journal.renew_lease(rid, self.owner, ttl=self.ttl)
                            for rid in self.run_ids]
                except Exception as exc:  # busy or failing: try again at the next beat,
                    if journal is not None:  # on a new connection
                        with contextlib.suppress(Exception):
                            journal.close()
                        journal = None
                    unrenewed = time.monotonic() - renewed
                    if unrenewed >= self.ttl * 2 / 3:
                        if not self.stopped.is_set():
                            self.on_lost(f"the lease could not be renewed for {unrenewed:.0f} "
                                         f"s ({_said(exc)})")
                        return
                    continue
                renewed = time.monotonic()
                if not held[0]:
                    if not self.stopped.is_set():
                        self.on_lost(None)
                    return
        finally:
            if journal is not None:
                with contextlib.suppress(Exception):
                    journal.close()

    def stop(self) -> None:
        """Stop renewing (returns at once; the thread ends at its next beat)."""
        self.stopped.set()


def _said(exc: BaseException) -> str:
    """What an error said, on one line (a journal's error already hides a password)."""
    text = " ".join(str(getattr(exc, "message", None) or exc).split())
    return text[:300] or type(exc).__name__


class Slots:
    """Acquire semaphores in a fixed order (pool first, then the run's limit)."""

    def __init__(self, sems: list[asyncio.Semaphore], journal: Journal) -> None:
        self.sems = sems
        self.journal = journal
        self.held: list[asyncio.Semaphore] = []

    async def __aenter__(self) -> None:
        if any(sem.locked() for sem in self.sems):
            self.journal.flush()  # about to wait: no outcome may sit uncommitted meanwhile
        try:
            for sem in self.sems:
                await sem.acquire()
                self.held.append(sem)
        except BaseException:
            await self.__aexit__()
            raise

    async def __aexit__(self, *exc: object) -> None:
        while self.held:
            self.held.pop().release()


#: A step output kept in the journal (a fan-out's list), loaded when a reference needs it.
IN_JOURNAL: Any = object()


class Later:
    """A replayed step's output, parsed only when a reference or condition reads it.

    ``resume`` of a run half done replays every step that succeeded; a 10,000-step chain
    would parse 5,000 outputs of which its next step reads one.

    Args:
        record: what has the output as its ``output`` attribute, parsed on first read (a
            :class:`planrun.journal.StepRecord`).
    """

    __slots__ = ("record",)

    def __init__(self, record: Any) -> None:
        self.record = record

    def load(self) -> Any:
        """The output."""
        return self.record.output


@dataclass
class Outcome:
    """How one call (or a replay, or a failure before the call) ended."""

    status: str
    output: Any = None
    error: dict[str, Any] | None = None
    replayed: bool = False


@dataclass(eq=False)
class StepState:
    """What the scheduler knows of one step during a run."""

    status: str = "pending"
    output: Any = None
    reason: str | None = None


