"""Driving a journaled run: running the executor to its end.

Shared by ``execute``, ``resume`` and ``retry`` (SPEC §5) so that they end the same way,
with the same manifest and exit statuses. Clearing approvals before is
:mod:`planrun.clearance` (its names are importable from here too, for now).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from . import redact
from .clearance import clear_approvals, covered, record_decision
from .errors import EXIT_SIGINT, JournalError, PlanrunError
from .journal import Journal, NewRun
from .outcome import RunOutcome
from .params import UNKNOWN
from .paths import Settings
from .validation import CheckedPlan

if TYPE_CHECKING:
    from .dispatch.base import Dispatcher

#: The cluster dispatcher :func:`executor_for` connected for this command, if any.
_OPEN: contextvars.ContextVar[Dispatcher | None] = contextvars.ContextVar(
    "planrun_open_dispatcher", default=None)


def cluster_dispatcher(settings: Settings) -> Dispatcher:
    """A (not yet connected) dispatcher for ``settings.executor`` ``dask[:ADDRESS]``.

    Imports :mod:`planrun.dispatch.dask` (and so ``distributed``) only now.

    Raises:
        UsageError: ``distributed`` is not installed (exit 2).
    """
    from .dispatch.dask import DaskDispatcher

    _, _, address = settings.executor.partition(":")
    return DaskDispatcher(settings.project, settings.registry, address or None,
                          workers=settings.dask.get("workers"),
                          threads=settings.dask.get("threads_per_worker", 1))


@contextlib.contextmanager
def executor_for(settings: Settings, dispatcher: Any = None) -> Iterator[None]:
    """While a command drives a run: the cluster of ``settings.executor``, connected.

    Nothing to do for ``local`` or when the caller gives its own ``dispatcher``. For
    ``dask[:ADDRESS]`` the scheduler is reached (or the local cluster started) *before*
    the command journals anything, so a cluster that cannot be used costs nothing to
    resume; :func:`drive` then makes the calls on it. Closed at the end.

    Raises:
        ExecutorUnavailable: code ``executor_unavailable`` (exit 5).
        UsageError: ``distributed`` is not installed (exit 2).
    """
    if dispatcher is not None or settings.executor == "local" or _OPEN.get() is not None:
        yield
        return
    opened: Any = cluster_dispatcher(settings)
    opened.open()
    token = _OPEN.set(opened)
    try:
        yield
    finally:
        _OPEN.reset(token)
        opened.close()


def stored_params(plan: CheckedPlan) -> dict[str, Any]:
    """Parameter values as journaled, in reference form: a secret is a reference."""
    return {k: (redact.reference(k) if k in plan.secret_params
                else None if v is UNKNOWN else redact.escape_value(v))
            for k, v in plan.params.items()}


#: Former names (before secrets became references): what is journaled, and how it prints.
masked_params = stored_params
SECRET_MASK = redact.MASK
#: Moved to :mod:`planrun.clearance`; still importable from here.
__all__ = ["clear_approvals", "contracts", "covered", "drive", "internal_guard",
           "record_decision", "stored_params"]


def contracts(plan: CheckedPlan) -> dict[str, Any]:
    """The contracts of the tools a plan uses, as journaled with the run."""
    out: dict[str, Any] = {}
    for s in plan.steps:
        t = s.tool
        out[t.name] = {
            "kind": t.kind, "contract": t.contract, "irreversible": t.entry.irreversible,
            "idempotent": t.entry.idempotent, "key_arguments": t.entry.key_arguments,
            "command": t.entry.command, "python": t.entry.python,
        }
    return out


def new_run(plan: CheckedPlan, *, run_id: str, root_run_id: str, owner: str,
            document: Any, plan_file: str | None, project: str | None,
            options: dict[str, Any], parent_run_id: str | None = None) -> NewRun:
    """The journal record of a run about to be driven by ``owner`` (execute and retry).

    ``document`` is the plan as stored; ``options`` the run options (``max_parallel``,
    ``keep_going``, ``file_sha256``).
    """
    from .journal import now

    return NewRun(run_id=run_id, root_run_id=root_run_id, parent_run_id=parent_run_id,
                  plan_name=plan.name, plan_file=plan_file, project=project, plan=document,
                  digest=plan.digest, revision=plan.revision, goal=plan.goal,
                  params=stored_params(plan), contracts=contracts(plan), options=options,
                  status="running", created_at=now(), lease_owner=owner)


def journal_stopped(exc: JournalError, run_id: str) -> JournalError:
    """``exc`` (exit 6) as the error that stopped run ``run_id``: named, with the way on.

    The journal keeps what was committed, so the run waits (``running``, nobody driving
    it) for ``planrun resume RUN`` once its journal can be written again; a message that
    named no run (and offered another journal) sent an operator whose journal's disk
    filled up mid-run the wrong way (found by a fresh operator). A call under way then may
    have ended unjournaled: the hint says that resume settles it, or names it for
    ``resolve`` (the log said a step succeeded, resume then stopped on it; found by a
    fresh operator).
    """
    if exc.run_id is not None:
        return exc  # said already (a nested guard)
    hint = (exc.hint + " " if exc.hint else "") + (
        f"Run {run_id} keeps what was committed: `planrun resume {run_id}` continues it "
        "(a call whose end could not be journaled is made again if its tool is idempotent; "
        "else resume names it for `planrun resolve` first).")
    stopped = JournalError(f"run {run_id} stopped: {exc.message}", code=exc.code,
                           hint=hint, details=exc.details, run_id=run_id)
    stopped.abandoned_calls = getattr(exc, "abandoned_calls", 0)  # type: ignore[attr-defined]
    return stopped


@contextlib.contextmanager
def internal_guard(journal: Journal, run_id: str) -> Iterator[None]:
    """Turn an unexpected exception (a bug) into a ``failed`` run (SPEC §5).

    Wraps everything a command does with a journaled run (clearing approvals, running its
    steps, recording its status). A :class:`~planrun.errors.PlanrunError` passes through
    unchanged; any other exception ends the run ``failed`` — unless it already ended — with
    a ``run_finished`` event carrying ``error`` (code ``internal``) and the traceback (shown
    only by ``planrun log RUN --tracebacks``).

    Raises:
        InternalError: code ``internal``, exit 1, with the run's manifest when it can be read.
    """
    from .errors import InternalError
    from .executor import internal_error

    try:
        yield
    except JournalError as exc:
        raise journal_stopped(exc, run_id) from None
    except PlanrunError:
        raise
    except Exception as exc:
        error = internal_error(exc, "", run_id)
        plain = {k: v for k, v in error.items() if k != "traceback"}
        result = None
        try:
            if journal.run(run_id).status in ("running", "interrupted"):
                journal.finish_run(run_id, "failed", {"error": plain,
                                                      "traceback": error["traceback"]})
            from . import manifest

            result = manifest.build(journal, run_id)
        except Exception:  # the journal cannot take it: the run stays resumable
            result = None
        bug = InternalError(f"run {run_id} failed: {plain['message']}", manifest=result,
                            details={"run_id": run_id, "type": error["type"]})
        # python calls left running in threads: the program must not wait for them at exit
        bug.abandoned_calls = getattr(exc, "planrun_abandoned", 0)  # type: ignore[attr-defined]
        raise bug from None



def _announce(progress: Any, run_id: str, plan: CheckedPlan, begun: str) -> None:
    """Send the display its ``run`` event: ``{run_id, plan, revision, begun, at}``.

    ``begun``: "started", "resumed", …; ``at``: now, RFC 3339 UTC. A display that fails
    is a report, never part of the run (SPEC §5).
    """
    from .journal.base import now

    with contextlib.suppress(Exception):
        progress("run", "", {"run_id": run_id, "plan": plan.name,
                             "revision": plan.revision, "begun": begun, "at": now()})


def _note_overlap(journal: Journal, progress: Any, run_id: str, plan: CheckedPlan,
                  settings: Settings) -> None:
    """Send the display an ``overlap`` event per other live run of this plan.

    One per run of this plan in this project that a live process drives now:
    ``{run_id, owner}``. Each ``execute`` is a run of its own and does all its steps, so
    two nights of a cron job that overlap did every step twice, the irreversible ones
    too, and the log gave no sign of it (found by a fresh operator). A note, not a
    refusal: two runs of one plan can be meant (other parameters). A failing look is no
    note, never part of the run.
    """
    from .checking import project_key
    from .journal.records import driven

    with contextlib.suppress(Exception):
        for other in journal.list_runs(plan=plan.name, status="running",
                                       project=project_key(settings), limit=20):
            if other["run_id"] == run_id:
                continue
            lease = journal.run(other["run_id"]).lease
            if lease is not None and driven(lease):
                progress("overlap", "", {"run_id": other["run_id"], "owner": lease.owner})


def drive(journal: Journal, settings: Settings, plan: CheckedPlan, *, run_id: str,
          root_run_id: str, owner: str, max_parallel: int, keep_going: bool,
          state: dict[str, Any] | None = None, progress: Any = None,
          fresh: bool = False, also_leased: list[str] | None = None,
          dispatcher: Dispatcher | None = None, approver: Any = None,
          approve: set[str] | frozenset[str] = frozenset(),
          approve_all: bool = False, begun: str | None = None,
          notes: Sequence[str] = ()) -> RunOutcome:
    """Run the run's pending steps to the end, record its status.

    ``begun`` is how the display's first line says the run begins here (default:
    "started" for a ``fresh`` run, else "resumed").

    ``approver``, ``approve`` and ``approve_all`` clear ``approve: resolved`` steps at
    dispatch (:mod:`planrun.execution.gate`); a step nobody clears leaves the run
    ``awaiting_approval``, a denial ends it ``denied`` (both exit 4).

    ``dispatcher`` makes the calls (default: a
    :class:`~planrun.dispatch.local.LocalDispatcher`, which runs python tools in the
    project folder with their prints on stderr, SPEC §2).

    Returns:
        The outcome: the manifest, the signal's exit status (130/143) when interrupted,
        and the python calls left running in threads.
    """
    from . import manifest
    from .executor import Executor, inject_fault

    if dispatcher is None:
        dispatcher = _OPEN.get()
    if dispatcher is None and settings.executor != "local":
        dispatcher = cluster_dispatcher(settings)  # connected in its session
    executor = Executor(journal=journal, plan=plan, run_id=run_id, root_run_id=root_run_id,
                        project=settings.project, max_parallel=max_parallel,
                        keep_going=keep_going, progress=progress, owner=owner,
                        state=state or {}, pools=settings.pools, fresh=fresh,
                        also_leased=also_leased or [], dispatcher=dispatcher,
                        approver=approver, approve=frozenset(approve),
                        approve_all=approve_all)
    if progress is not None:
        _announce(progress, run_id, plan, begun or ("started" if fresh else "resumed"))
        # before any step: a note that matters to what is about to run (the plan file
        # edited since: resume and retry use the journaled plan) was printed after them
        for note in notes:
            progress("note", "", {"text": note})
        if fresh:
            _note_overlap(journal, progress, run_id, plan, settings)
    try:
        status = executor.run()
    except Exception as exc:
        # python calls left running in threads: the CLI must not wait for them at exit
        # (an error it prints says how many: ``abandoned_calls``, as a LeaseLost does; a
        # journal error mid-call left planrun waiting for the tool to end)
        exc.planrun_abandoned = executor.abandoned  # type: ignore[attr-defined]
        if isinstance(exc, PlanrunError) and not getattr(exc, "abandoned_calls", 0):
            exc.abandoned_calls = executor.abandoned  # type: ignore[attr-defined]
        raise
    inject_fault("finish")
    data: dict[str, Any] | None = None
    if status == "awaiting_approval":
        data = {"reason": "approval_required", "waiting": executor.awaiting}
    elif status == "denied":
        data = {"reason": "approval_denied", "by": executor.denied.decided_by,
                "step": executor.denied.step_id}
    journal.finish_run(run_id, status, data)
    return RunOutcome(manifest.build(journal, run_id),
                      signal_exit=(executor.signal_exit or EXIT_SIGINT
                                   if status == "interrupted" else None),
                      abandoned_calls=executor.abandoned,
                      notes=[] if progress is not None else list(notes))
