"""What runs on a Dask worker: a batch of planrun tool calls (SPEC §12 "Executors").

Imported on the worker by name (``planrun.dispatch.worker.run_calls``): the worker must
have planrun and the project (its ``tools.yaml`` and tool modules) installed, and nothing
of planrun's command line, journal or run state is needed there. For each
:class:`~planrun.dispatch.base.Call` of a batch, in order:

- the project's registry is loaded (once per worker process, and again when
  ``tools.yaml`` or a tool module's file changed) and the tool is found by name;
- the tool is called once with :func:`planrun.tools.call_python` or
  :func:`planrun.tools.call_command`, in the project folder, with the call's own timeout
  (a command that runs past it has its whole process group ended: SIGTERM, then SIGKILL);
- what comes back is an :data:`Outcome` — plain data, masked: errors and stderr tails in
  reference form, exactly as the local dispatcher gives them.

A batch comes as one pickle and goes back as one (:func:`run_batch`). Before it runs, a
task marks itself on the scheduler (:func:`mark_run`): a task the scheduler runs again
because the worker holding its result died makes none of its calls.

Commands' process groups are registered with a keeper process of the worker
(:class:`planrun.procs.Keeper`): a worker that is killed (``kill -9``, out of memory) does
not leave its commands running. What python tools print on the worker goes to the
worker's stderr with the call's secrets masked (``***``).

:func:`stop_calls` (sent with ``Client.run``) ends calls by token: a call not started yet
is skipped, a running one is cancelled (its command's group ended). The same happens on
its own when the batch's Dask task is released — cancelled, or its client (planrun) gone:
the worker looks every :data:`WATCH_S` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib
import inspect
import json
import os
import pickle
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .. import procs
from ..redact import MASK, Secrets
from ..registry import ToolSpec
from ..tools import (
    PARAM_ENV_PREFIX,
    CallCutShort,
    ToolFailure,
    call_command,
    call_python,
    python_invocation,
    tool_error,
)
from .base import Call

#: How a call ended on the worker, as sent back (plain, picklable data):
#: ``("ok", output, stderr_tail | None)`` | ``("failed", error)`` (a ToolFailure's error)
#: | ``("timeout", error)`` | ``("cancelled", None)`` (stopped by :func:`stop_calls`)
#: | ``("lost", None)`` (not made: its task had run before, see :func:`run_batch`)
#: | ``("broken", text)`` (planrun's code around the call raised: its effect is unknown).
Outcome = tuple[Any, ...]

#: Set in the environment of workers planrun starts itself (``--executor dask``): their
#: file descriptor 1 is planrun's stdout, which is for results only.
OWNED_ENV = "PLANRUN_DASK_OWNED"
#: Set with :data:`OWNED_ENV`: the variables of planrun's environment its workers drop
#: (comma-separated), as the local dispatcher hides them from tools (SPEC §7, §11).
HIDE_ENV = "PLANRUN_DASK_HIDE"
#: On a worker, the project folder to use instead of the one planrun sends (the project
#: is installed at another path there).
PROJECT_ENV = "PLANRUN_WORKER_PROJECT"


def token(call: Call) -> str:
    """``RUN/STEP[#ITEM]/ATTEMPT``: names one attempt of a call on every worker."""
    return f"{call.context.run_id}/{call.where}/{call.context.attempt}"


@dataclass
class _Running:
    stop: Callable[[], object]  # from any thread: the call is given up on here


@dataclass
class _State:
    """What one worker process keeps between tasks (guarded by ``lock``)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    registries: dict[str, _Loaded] = field(default_factory=dict)  # by tools.yaml path
    running: dict[str, _Running] = field(default_factory=dict)
    stopped: set[str] = field(default_factory=set)
    keeper: procs.Keeper | None = None
    pool: ThreadPoolExecutor | None = None
    prepared: bool = False


_STATE = _State()
_SECRETS: contextvars.ContextVar[Secrets | None] = contextvars.ContextVar(
    "planrun_worker_secrets", default=None)


class _MaskedStream:
    """A text stream that masks the secrets of the tool call writing to it."""

    def __init__(self, inner: IO[str]) -> None:
        self._inner = inner

    def write(self, text: str) -> int:
        secrets = _SECRETS.get()
        if secrets:
            for form in secrets.forms:
                if form:
                    text = text.replace(form, MASK)
        return self._inner.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _prepare() -> None:
    """Once per worker process: stdio masked (and off planrun's stdout), the keeper."""
    with _STATE.lock:  # several threads of one worker may start their first batch at once
        if not _STATE.prepared:
            _prepare_process()
            _STATE.prepared = True


def _prepare_process() -> None:
    # Tools get a parameter only as an argument (SPEC §7): never PLANRUN_PARAM_*, which a
    # worker planrun started inherits from it; nor what planrun hides from its own tools.
    hidden = [n for n in os.environ.get(HIDE_ENV, "").split(",") if n]
    for name in list(os.environ):
        if name.startswith(PARAM_ENV_PREFIX) or name in hidden:
            os.environ.pop(name, None)
    if os.environ.get(OWNED_ENV):
        # A worker planrun started shares planrun's stdout: tools' writes go to stderr.
        with contextlib.suppress(OSError):
            sys.stdout.flush()
            os.dup2(2, 1)
    if not isinstance(sys.stdout, _MaskedStream):
        sys.stdout = _MaskedStream(sys.stdout)
    if not isinstance(sys.stderr, _MaskedStream):
        sys.stderr = _MaskedStream(sys.stderr)
    _STATE.keeper = procs.Keeper()
    _STATE.pool = ThreadPoolExecutor(thread_name_prefix="planrun-tool")


@dataclass
class _Loaded:
    """A registry as loaded on this worker, and the files it was loaded from."""

    tools: dict[str, ToolSpec]
    stamps: dict[str, int]  # tools.yaml and each tool module's file → its mtime (ns)
    modules: dict[str, str]  # tool module name → its file


def _stamp(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


def _tools(project: Path, registry: Path) -> dict[str, ToolSpec]:
    """The project's registered tools, loaded again when a file they come from changed.

    A long-lived worker serves many runs: when ``tools.yaml`` or the file of a python
    tool's module has another modification time than when they were loaded, the modules
    whose file changed are imported afresh and the registry is loaded again (what those
    modules import themselves is not: restart the workers after changing it).
    """
    from ..registry import load_registry

    with _STATE.lock:
        found = _STATE.registries.get(str(registry))
    if found is not None and all(_stamp(f) == v for f, v in found.stamps.items()):
        return found.tools
    if found is not None:  # a file changed: its module is imported again
        changed = {f for f, v in found.stamps.items() if _stamp(f) != v}
        for name, file in found.modules.items():
            if file in changed:
                sys.modules.pop(name, None)
        importlib.invalidate_caches()
    stamps = {str(registry): _stamp(str(registry))}
    loaded, _issues = load_registry(registry)  # a tool with issues is left out
    tools = dict(loaded.tools)
    modules: dict[str, str] = {}
    for tool in tools.values():
        if tool.entry.python:
            module = tool.entry.python.partition(":")[0]
            path = getattr(sys.modules.get(module), "__file__", None)
            if path:
                modules[module] = str(path)
                stamps[str(path)] = _stamp(str(path))
    with _STATE.lock:
        _STATE.registries[str(registry)] = _Loaded(tools, stamps, modules)
    return tools


def _where(project: str, registry: str) -> tuple[Path, Path]:
    """The project folder and registry file on this worker (:data:`PROJECT_ENV`)."""
    here = os.environ.get(PROJECT_ENV)
    if not here:
        return Path(project), Path(registry)
    root = Path(here)
    try:
        return root, root / Path(registry).relative_to(project)
    except ValueError:
        return root, root / Path(registry).name


def check(project: str, registry: str) -> str | None:
    """On a worker (``Client.run``, when planrun connects): None when calls can be made.

    Returns:
        What is missing, as one sentence: the project folder or its ``tools.yaml`` as this
        worker would look for them (:data:`PROJECT_ENV`). A worker without planrun cannot
        even load this function: the caller gets that exception instead.
    """
    root, reg = _where(project, registry)
    if not root.is_dir():
        return f"no project folder {root} on this worker (set {PROJECT_ENV})"
    if not reg.is_file():
        return f"no {reg} on this worker"
    return None


def run_batch(project: str, registry: str, payload: bytes) -> bytes:
    """:func:`run_calls` on a batch sent as one pickle, its answer as one pickle.

    What a Dask task of planrun runs: the calls cross the scheduler as bytes, which it
    passes on without unpickling and pickling each call again.

    Args:
        project: the project folder, as planrun sees it (:data:`PROJECT_ENV` overrides).
        registry: the ``tools.yaml`` path, as planrun sees it.
        payload: ``pickle`` of the list of :class:`~planrun.dispatch.base.Call`.

    Returns:
        ``pickle`` of ``(outcomes, seconds)``: one :data:`Outcome` per call, each pickled
        on its own (:func:`outcome_bytes`; read back with :func:`read_outcome`), and the
        seconds each call took here (0 for one not made), by which planrun sizes the
        batches of the tool. One call's outcome that cannot cross (an output that does
        not pickle here, or does not unpickle on planrun's host) fails that call alone:
        the other calls of the batch ran, and their outcomes must not be lost with it.
    """
    calls = pickle.loads(payload)
    if not _first_run():
        outcomes: list[Outcome] = [("lost", None)] * len(calls)
        seconds = [0.0] * len(calls)
    else:
        outcomes, seconds = _run(project, registry, calls)
    sent = [outcome_bytes(call, outcome)
            for call, outcome in zip(calls, outcomes, strict=True)]
    return pickle.dumps((sent, seconds), protocol=pickle.HIGHEST_PROTOCOL)


def outcome_bytes(call: Call, outcome: Outcome) -> bytes:
    """One call's :data:`Outcome` as a pickle of its own.

    An output that cannot be pickled (a lock, a generator) is the call's ``output``
    failure, with the words the local dispatcher's check gives a value that is not JSON
    data.
    """
    try:
        return pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # PicklingError, TypeError, RecursionError, …
        why = f"{type(exc).__name__}: {exc}"
        if outcome[:1] == ("ok",):
            try:
                json.dumps(outcome[1])
            except (TypeError, ValueError) as bad:
                why = str(bad)
            error = {"code": "output", "message": f"tool {call.tool!r} returned a value "
                     f"that is not JSON data: {why}"[:2000]}
        else:
            error = {"code": "tool_error", "message": "the Dask worker could not send the "
                     f"call's outcome back ({why})"[:2000]}
        return pickle.dumps(("failed", error), protocol=pickle.HIGHEST_PROTOCOL)


def read_outcome(call: Call, data: bytes) -> Outcome:
    """On planrun's host: one call's outcome from :func:`outcome_bytes`.

    One that cannot be read here (an output of a class only the worker can import) is
    the call's ``output`` failure.
    """
    try:
        outcome: Outcome = pickle.loads(data)
    except Exception as exc:  # ModuleNotFoundError, AttributeError, UnpicklingError, …
        return ("failed", {"code": "output", "message": f"tool {call.tool!r} returned a "
                           "value that is not JSON data (planrun cannot read it: "
                           f"{type(exc).__name__}: {exc})"[:2000]})
    return outcome


def _first_run() -> bool:
    """False when this Dask task ran before: none of its calls may be made again.

    A worker that dies holding a finished task's result (before planrun fetched it) makes
    the scheduler run the task again, whatever ``allowed-failures`` says: Dask recomputes
    a lost result. Each task is marked on the scheduler as it starts; a task already
    marked answers ``("lost", None)`` for each of its calls (planrun: ``call_lost``).
    """
    try:
        from distributed import get_client, get_worker

        key = str(get_worker().get_current_task())
        client: Any = get_client()  # the worker's own (untyped: checked by the tests)
    except Exception:  # not in a Dask task (called directly)
        return True
    return bool(client.run_on_scheduler(mark_run, key))


#: On the scheduler: the planrun tasks that started (see :func:`mark_run`).
_STARTED: set[str] = set()
#: Marks kept before the forgotten tasks' marks are dropped.
_MARKS = 1000


def mark_run(key: str, dask_scheduler: Any = None) -> bool:
    """On the scheduler (``run_on_scheduler``): mark task ``key`` started; False if it was.

    A key the scheduler has forgotten cannot run again (planrun never reuses a key): its
    mark is dropped once more than :data:`_MARKS` are kept.
    """
    if key in _STARTED:
        return False
    if len(_STARTED) >= _MARKS and dask_scheduler is not None:
        _STARTED.intersection_update(dask_scheduler.tasks)
    _STARTED.add(key)
    return True


def run_calls(project: str, registry: str, calls: list[Call]) -> list[Outcome]:
    """Make each call once, in order, on this worker; returns one outcome per call.

    Args:
        project: the project folder, as planrun sees it (:data:`PROJECT_ENV` overrides).
        registry: the ``tools.yaml`` path, as planrun sees it.
        calls: the calls (each with its arguments, context, timeout in seconds, secrets).

    Returns:
        One :data:`Outcome` per call. A tool the worker's registry does not have (or that
        has problems there) fails with code ``tool_error``. This function never raises
        for a call's own failure; an exception out of it is a bug or a broken worker.
    """
    return _run(project, registry, calls)[0]


def _run(project: str, registry: str, calls: list[Call]
         ) -> tuple[list[Outcome], list[float]]:
    _prepare()
    root, reg = _where(project, registry)
    tools = _tools(root, reg)
    with contextlib.suppress(OSError):
        if Path.cwd() != root:
            os.chdir(root)  # python tools run in the project folder, like commands
    gone = _task_watch()
    outcomes: list[Outcome] = []
    seconds: list[float] = []
    runner: asyncio.Runner | None = None  # an event loop, once a call needs one
    try:
        for call in calls:
            if gone is not None and gone():
                outcomes.append(("cancelled", None))
                seconds.append(0.0)
                continue
            started = time.perf_counter()
            tool = tools.get(call.tool)
            try:
                if tool is not None and tool.kind == "python" \
                        and not inspect.iscoroutinefunction(tool.func):
                    outcomes.append(_one_sync(tool, call, gone))  # no event loop
                else:
                    runner = runner or asyncio.Runner()
                    outcomes.append(runner.run(_one(root, tools, call, gone)))
            except Exception as exc:  # a bug around the call: the calls before it ran
                outcomes.append(("broken", f"{type(exc).__name__}: {exc}"[:500]))
            seconds.append(time.perf_counter() - started)
    finally:
        if runner is not None:
            runner.close()
    return outcomes, seconds


#: Seconds between two looks at whether the Dask task of a batch is still wanted.
WATCH_S = 0.5


async def _watch(gone: Callable[[], bool], name: str) -> None:
    """Stop the running call when the task was released (cancelled, or planrun is gone).

    A planrun that was killed has no client any more: the scheduler releases its tasks,
    and a command it started here must not run on unnoticed.
    """
    while True:
        await asyncio.sleep(WATCH_S)
        if gone():
            stop_calls([name])
            return


def _task_watch() -> Callable[[], bool] | None:
    """In a Dask task: a check that the task was released; None outside one."""
    try:
        from distributed.worker import get_worker

        dask_worker = get_worker()
        key = dask_worker.get_current_task()
    except Exception:  # not in a Dask task (called directly)
        return None

    def gone() -> bool:
        state = dask_worker.state.tasks.get(key)
        return state is None or state.state in ("cancelled", "released", "forgotten")

    return gone


def _one_sync(tool: ToolSpec, call: Call, gone: Callable[[], bool] | None) -> Outcome:
    """A sync python call: in a thread of the pool, waited for here (no event loop).

    Like :func:`planrun.tools.call_python`: past its timeout, once stopped, or once the
    Dask task is released (``gone``, looked at every :data:`WATCH_S` seconds: planrun
    cancelled it or is gone), the call is left to finish in its thread and this returns,
    so that the worker's own thread is free for other tasks.
    """
    name = token(call)
    over = threading.Event()  # set when the call returned, or was stopped
    with _STATE.lock:
        if name in _STATE.stopped:
            _STATE.stopped.discard(name)
            return ("cancelled", None)
        _STATE.running[name] = _Running(over.set)
    try:
        try:
            invoke = python_invocation(tool, call.arguments, call.context, call.secrets)
        except ToolFailure as exc:
            return ("failed", exc.error)
        secret = _SECRETS.set(call.secrets)  # the tool's thread masks what it prints
        try:
            context = contextvars.copy_context()
        finally:
            _SECRETS.reset(secret)
        assert _STATE.pool is not None
        future = _STATE.pool.submit(context.run, invoke)
        future.add_done_callback(lambda _: over.set())
        released = _wait(over, call.timeout, gone)
        if not future.done():  # left to finish in its thread
            if released or over.is_set():
                return ("cancelled", None)
            return ("timeout", {"code": "timeout",
                                "message": f"call ran past its timeout of {call.timeout} s"})
        try:
            output = future.result()
            if inspect.isawaitable(output):
                output = asyncio.run(_awaited(output, call.timeout))
        except TimeoutError:
            return ("timeout", {"code": "timeout",
                                "message": f"call ran past its timeout of {call.timeout} s"})
        except BaseException as exc:  # the tool's own failure, also SystemExit and friends
            return ("failed", tool_error(exc, call.secrets).error)
        return ("ok", output, None)
    finally:
        with _STATE.lock:
            _STATE.running.pop(name, None)
            _STATE.stopped.discard(name)


def _wait(over: threading.Event, timeout: float | None,
          gone: Callable[[], bool] | None) -> bool:
    """Wait until ``over`` is set or ``timeout`` seconds passed; True: the task was released."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = WATCH_S if deadline is None else min(WATCH_S, deadline - time.monotonic())
        if over.wait(max(0.0, left)):
            return False
        if gone is not None and gone():
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False


async def _awaited(result: Any, timeout: float | None) -> Any:
    return await asyncio.wait_for(result, timeout)


async def _one(root: Path, tools: dict[str, ToolSpec], call: Call,
               gone: Callable[[], bool] | None) -> Outcome:
    name = token(call)
    with _STATE.lock:
        if name in _STATE.stopped:
            _STATE.stopped.discard(name)
            return ("cancelled", None)
    tool = tools.get(call.tool)
    if tool is None:
        return ("failed", {"code": "tool_error", "message": f"tool {call.tool!r} is not "
                           f"registered (without problems) in this worker's copy of the "
                           f"project's tools.yaml ({root})"})
    # Each call is a task of its own, so that stop_calls cancels this call only.
    task = asyncio.create_task(_call(root, tool, call), name=name)
    loop = asyncio.get_running_loop()
    with _STATE.lock:
        _STATE.running[name] = _Running(lambda: loop.call_soon_threadsafe(task.cancel))
    watcher = asyncio.create_task(_watch(gone, name)) if gone is not None else None
    try:
        return await task
    except asyncio.CancelledError:
        return ("cancelled", None)
    finally:
        if watcher is not None:
            watcher.cancel()
        with _STATE.lock:
            _STATE.running.pop(name, None)
            _STATE.stopped.discard(name)


async def _call(root: Path, tool: ToolSpec, call: Call) -> Outcome:
    _SECRETS.set(call.secrets)  # a task's own context: the tool's thread inherits it
    stderr: list[str] = []
    try:
        if tool.kind == "python":
            output = await call_python(tool, call.arguments, call.context, _STATE.pool,
                                       call.timeout, secrets=call.secrets)
        else:
            output = await _command(root, tool, call, stderr)
    except CallCutShort as exc:  # a timeout, an output bound: killed mid-call
        return ("timeout", exc.error)
    except ToolFailure as exc:
        return ("failed", exc.error)
    return ("ok", output, stderr[-1] if stderr else None)


async def _command(root: Path, tool: ToolSpec, call: Call, stderr: list[str]) -> Any:
    keeper = _STATE.keeper
    assert keeper is not None
    keeper.start()
    groups: list[int] = []

    def started(proc: asyncio.subprocess.Process) -> None:
        groups.append(proc.pid)
        keeper.add(proc.pid)

    try:
        return await call_command(tool, call.arguments, call.context, root, call.timeout,
                                  on_start=started, preexec=keeper.preexec,
                                  on_stderr=stderr.append, secrets=call.secrets)
    finally:
        for pgid in groups:
            keeper.remove(pgid)


def stop_calls(tokens: list[str]) -> int:
    """End the calls named by ``tokens`` on this worker (sent with ``Client.run``).

    A running call is cancelled (a command's group gets SIGTERM, then SIGKILL after
    :data:`planrun.tools.KILL_GRACE_S` seconds; a python call is left to finish in its
    thread, its result dropped); one that has not started yet will not start here.

    Returns:
        How many of the calls were running on this worker.
    """
    found = 0
    with _STATE.lock:
        for name in tokens:
            running = _STATE.running.get(name)
            if running is None:
                _STATE.stopped.add(name)
                continue
            found += 1
            running.stop()
    return found

