"""The Dask dispatcher: each call (each fan-out item) runs on a Dask cluster (SPEC §12).

``--executor dask`` starts a :class:`distributed.LocalCluster` for the run (worker
processes on this host, loopback only, no dashboard); ``--executor dask:tcp://HOST:PORT``
uses the scheduler of a cluster that is already there. planrun keeps everything that
decides what happens — the DAG, the journal (the dispatch record before, the outcome
after, per call), approvals, retries and timeouts — and Dask only runs calls:

- Calls are sent as data (:class:`~planrun.dispatch.base.Call`: the tool by name, the
  arguments, the context, the timeout, the secrets to mask) to
  :func:`planrun.dispatch.worker.run_calls`, which imports the tool on the worker from the
  project's ``tools.yaml`` (the worker must have planrun and the project).
- Dask's own retries are off: every task is submitted with ``retries=0`` and
  ``pure=False``, the cluster planrun starts has ``distributed.scheduler.allowed-failures``
  0, and a scheduler that would re-run a task whose worker died (allowed-failures above 0)
  is refused. A call whose worker died raises :class:`~planrun.dispatch.base.CallLost`:
  it is journaled ``indeterminate`` (code ``call_lost``) and settled like a call left
  running by a crash.
- The timeout is the worker's: a command that runs past it has its process group ended
  there. planrun waits :data:`BACKSTOP_S` seconds more (and the timeouts of the calls
  before it in its batch, which run first) before it gives a call up as timed out (a
  worker that does not answer); a call without a timeout is waited for.
- Calls are sent in batches, one Dask task each, so that a 10,000-item fan-out does not
  pay Dask's per-task cost (several milliseconds of CPU between client, scheduler and
  worker) 10,000 times: at most :data:`SLOTS_PER_THREAD` tasks per worker thread are
  under way, and calls that become ready meanwhile wait in planrun and go together, the
  calls under way shared out over the worker threads (up to :data:`MAX_BATCH` a task),
  and no more than about :data:`BATCH_S` seconds of work by what the tool's calls took so
  far. A batch crosses the scheduler as one pickle (the scheduler does not unpickle each
  call), its outcomes come back as one; each call is still journaled before and after on
  its own, and at most ``max_parallel`` calls are under way, so planrun's memory stays
  bounded.
- A task the scheduler runs a second time because the worker holding its finished result
  died (Dask recomputes lost results whatever ``allowed-failures`` says) makes none of its
  calls: each task marks itself on the scheduler as it starts
  (:func:`worker.mark_run`), and a marked one answers ``call_lost`` for every call.
- A cancelled call (SIGINT/SIGTERM after the grace period, the run's timeout, a lost
  lease) has its task cancelled and is stopped on the worker (:func:`worker.stop_calls`).

``distributed`` is imported only when this module is: nothing of it is loaded by
``planrun --help`` or by a local run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import itertools
import logging
import os
import pickle
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import childenv
from ..errors import ExecutorUnavailable, PlanrunError, UsageError
from ..redact import Secrets
from ..tools import KILL_GRACE_S, CallTimeout, ToolFailure
from . import worker
from .base import Call, CallLost, Dispatcher, Watch

#: Most calls sent in one Dask task.
MAX_BATCH = 256
#: Seconds of work a batch is meant to hold, by what its calls' tools took so far.
BATCH_S = 0.5
#: Dask tasks under way per worker thread of the cluster.
SLOTS_PER_THREAD = 2
#: Seconds the most calls under way is remembered for (batch sizes follow it).
PEAK_S = 1.0
#: Seconds planrun waits past a call's own timeout before it gives the call up.
BACKSTOP_S = KILL_GRACE_S + 10.0
#: Seconds to wait for a scheduler to answer when connecting (Dask's own setting
#: ``distributed.comm.timeouts.connect``, set in the environment as
#: ``DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT``, wins when given).
CONNECT_TIMEOUT_S = 10.0
#: Seconds between two looks, while calls are under way, at whether the client still has
#: its scheduler (a client that gave up reconnecting leaves its futures pending forever).
CLIENT_WATCH_S = 1.0
#: Seconds planrun waits for a scheduler past its connect timeout and the wait for a
#: worker, before it gives it up (:meth:`DaskDispatcher._connect`).
CONNECT_MARGIN_S = 10.0
_CONNECT_ENV = "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT"


@dataclass
class _Pending:
    call: Call
    done: asyncio.Future[Any]
    name: str = ""
    timer: asyncio.TimerHandle | None = None


@dataclass
class _Batch:
    pending: list[_Pending]
    future: Any = None
    cancelled: set[str] = field(default_factory=set)


class DaskDispatcher(Dispatcher):
    """Makes calls on a Dask cluster (see the module docstring).

    Args:
        project: the project folder (sent to workers; :data:`worker.PROJECT_ENV` there
            overrides it).
        registry: the ``tools.yaml`` file (likewise).
        address: a scheduler's address (``tcp://HOST:PORT``), or None to start a
            :class:`distributed.LocalCluster` for the run.
        workers: worker processes of that local cluster (default: the CPU count).
        threads: threads per worker process of that local cluster (default 1).
    """

    def __init__(self, project: Path, registry: Path, address: str | None = None,
                 workers: int | None = None, threads: int = 1) -> None:
        self.project = project
        self.registry = registry
        self.address = address
        self.workers = workers or os.cpu_count() or 1
        self.threads = threads
        self.abandoned = 0
        self._client: Any = None
        self._cluster: Any = None
        #: While the local cluster lives: the journal's credentials and parameters out of
        #: the environment its worker processes start with (:func:`childenv.hidden`).
        self._hiding: contextlib.ExitStack | None = None
        self._queue: deque[_Pending] = deque()  # calls waiting for a free task slot
        self._waking = False
        self._ended = False
        self._seconds: dict[str, float] = {}  # tool → seconds a call takes (on average)
        self._threads = 1  # worker threads of the cluster
        self._peaks, self._peak_at = (0, 0), 0.0  # most calls under way: last, this window
        self._batches: dict[str, _Batch] = {}  # token → its batch, while under way
        self._by_key: dict[str, _Batch] = {}  # Dask key → batch
        self._stops: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watching: asyncio.TimerHandle | None = None  # _watch_client, while armed

    # --- the cluster ----------------------------------------------------------------------

    def open(self) -> None:
        """Connect to the scheduler (or start the local cluster). Idempotent.

        Raises:
            UsageError: ``distributed`` is not installed (exit 2).
            ExecutorUnavailable: the scheduler cannot be reached, has no workers in
                :data:`CONNECT_TIMEOUT_S` seconds, or re-runs tasks whose worker died
                (exit 5).
        """
        if self._client is not None:
            return
        try:
            import dask
            import distributed as _distributed
        except ImportError:
            raise UsageError("--executor dask needs Dask's distributed scheduler, which is "
                             "not installed", hint="pip install 'planrun[dask]'") from None
        distributed: Any = _distributed  # untyped: its calls are checked by the tests
        _one_line_logs()
        shown = self.address or "a local cluster"
        timeout: Any = (dask.config.get("distributed.comm.timeouts.connect")
                        if os.environ.get(_CONNECT_ENV) else f"{CONNECT_TIMEOUT_S}s")
        try:
            with dask.config.set({"distributed.scheduler.allowed-failures": 0,
                                  "distributed.comm.timeouts.connect": timeout}):
                if self.address is None:
                    # A nanny starts a worker process (again, after one died) with this
                    # process's environment as it is then: from now until close()
                    # nothing of what children must not know is in it.
                    hide = _hidden()
                    self._hiding = contextlib.ExitStack()
                    self._hiding.enter_context(childenv.hidden())
                    self._cluster = distributed.LocalCluster(
                        n_workers=self.workers, threads_per_worker=self.threads,
                        processes=True, host="127.0.0.1", dashboard_address=None,
                        protocol="tcp://",
                        env={worker.OWNED_ENV: "1", worker.HIDE_ENV: ",".join(hide)})
                    self._client = distributed.Client(self._cluster, timeout=timeout)
                    self._check()
                else:
                    self._connect(distributed, timeout)
        except PlanrunError:
            self.close()
            raise
        except Exception as exc:  # OSError, TimeoutError, CommClosedError, …
            self.close()
            raise ExecutorUnavailable(
                f"cannot use the Dask scheduler at {shown}: {_why(exc)}; nothing ran",
                hint="Check that the scheduler runs and is reachable from here "
                "(dask scheduler --host ...), or run with --executor local.") from None

    def _connect(self, distributed: Any, timeout: Any) -> None:
        """Connect to the scheduler at ``address`` and check it, in a thread of its own.

        Waited for no longer than the connect timeout, plus the wait for a worker and
        :data:`CONNECT_MARGIN_S`: a peer that takes the connection and never answers (a
        hung scheduler, another service) kept Dask's own connect waiting for ever, and
        one that answers with something else than Dask's protocol made it fail with a
        ``MemoryError`` and then stall 20 s in the half-made client's ``__del__``,
        printing a traceback (found by an attacker). What is left in that thread is
        dropped: the process ends with ``executor_unavailable``.

        Raises:
            ExecutorUnavailable: as :meth:`_check`, or no answer in time (exit 5).
            _Unusable: the connection failed (its reason, as text only).
        """
        from dask.utils import parse_timedelta

        limit = float(parse_timedelta(timeout, "s") or CONNECT_TIMEOUT_S) + \
            CONNECT_TIMEOUT_S + CONNECT_MARGIN_S
        ended: list[BaseException | None] = []
        done = threading.Event()

        def connect() -> None:
            try:
                self._client = distributed.Client(self.address, timeout=timeout,
                                                  set_as_default=False)
                self._check()
            except PlanrunError as exc:
                ended.append(exc)
            except Exception as exc:  # the reason only: no traceback, no half-made client
                ended.append(_Unusable(_why(exc)))
                done.set()  # before the half-made client is dropped (its __del__ stalls)
            else:
                ended.append(None)
            done.set()
            if ended[0] is not None:
                # The half-made client is collected here, in this thread, not by the
                # interpreter's exit on the main thread (a 20 s stall in its __del__).
                gc.collect()

        _quiet_client_del()
        threading.Thread(target=connect, name="planrun-dask-connect", daemon=True).start()
        if not done.wait(limit):
            raise _Unusable(f"no answer in {limit:g} s")
        if ended[0] is not None:
            raise ended[0]

    def _check(self) -> None:
        """Refuse what cannot keep planrun's rules; count the workers' threads.

        Refused: a scheduler that would run a call twice, workers that cannot make the
        calls (no planrun, no project).
        """
        client = self._client
        failures = client.run_on_scheduler(_allowed_failures)
        if failures != 0:
            raise ExecutorUnavailable(
                f"the Dask scheduler at {self.address} re-runs a task whose worker died "
                f"(distributed.scheduler.allowed-failures is {failures}); planrun needs 0, "
                "so that a call is never run twice behind its back; nothing ran",
                hint="Start the scheduler with "
                "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES=0.")
        client.wait_for_workers(1, timeout=CONNECT_TIMEOUT_S)  # seconds
        answers = client.run(worker.check, str(self.project), str(self.registry),
                             on_error="return")
        bad = {address: answer for address, answer in answers.items() if answer is not None}
        if bad:
            address, answer = sorted(bad.items())[0]
            why = answer if isinstance(answer, str) else f"{type(answer).__name__}: {answer}"
            raise ExecutorUnavailable(
                f"{len(bad)} of {len(answers)} Dask worker(s) cannot make planrun's calls "
                f"(worker {address}: {why[:300]}); nothing ran",
                hint="Every worker needs planrun (pip install 'planrun[dask]') and the "
                "project, at the same path or at PLANRUN_WORKER_PROJECT.")
        self._threads = max(1, sum(client.nthreads().values()))

    def close(self) -> None:
        """Disconnect (and stop the local cluster). Idempotent; never raises."""
        if self._watching is not None:
            self._watching.cancel()
            self._watching = None
        client, cluster, self._client, self._cluster = self._client, self._cluster, None, None
        for thing in (client, cluster):
            if thing is not None:
                with contextlib.suppress(Exception):
                    thing.close()
        hiding, self._hiding = self._hiding, None
        if hiding is not None:
            hiding.close()

    def __enter__(self) -> DaskDispatcher:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def session(self, secrets: Secrets) -> Iterator[None]:
        """The run's calls are made on the cluster (connected first if need be).

        A cluster connected here is disconnected at the end.
        """
        here = self._client is None
        self.open()
        self._ended = False
        try:
            yield
        finally:
            if here:
                self.close()

    # --- calls ----------------------------------------------------------------------------

    def abandons(self, call: Call) -> bool:
        """False: nothing of a call runs in this process.

        A python call cancelled goes on in its worker's thread until it returns; its result
        is dropped there.
        """
        return False

    async def call(self, call: Call, watch: Watch) -> Any:
        """Send the call to the cluster and wait for its outcome (see Dispatcher.call).

        Raises:
            ToolFailure: the call failed (its error as the local dispatcher gives it).
            CallTimeout: it ran past its timeout (ended on the worker), or the worker did
                not answer :data:`BACKSTOP_S` seconds after it.
            CallLost: the worker running it died, or the cluster lost the task.
        """
        loop = self._loop = asyncio.get_running_loop()
        pending = _Pending(call, loop.create_future(), worker.token(call))
        self._queue.append(pending)
        self._wake()
        try:
            outcome = await pending.done
        except asyncio.CancelledError:
            self._stop(pending)
            raise
        finally:
            if pending.timer is not None:
                pending.timer.cancel()
        if isinstance(outcome, tuple) and outcome[:1] == ("gave_up",):
            raise CallTimeout({"code": "timeout", "message": "the Dask worker gave no answer "
                               f"{BACKSTOP_S:g} s after the call's timeout of "
                               f"{call.timeout} s; it was told to stop"})
        if isinstance(outcome, tuple) and outcome[:1] == ("ok",) and len(outcome) > 2 \
                and outcome[2] and watch.stderr is not None:
            watch.stderr(outcome[2])
        return _unpack(outcome, call.secrets)

    def _wake(self) -> None:
        """Send what waits at the end of this turn of the loop (once per turn)."""
        if not self._waking and self._loop is not None:
            self._waking = True
            self._loop.call_soon(self._send)

    def _send(self) -> None:
        """Submit waiting calls in batches (one Dask task each), while a task slot is free.

        At most :data:`SLOTS_PER_THREAD` tasks per worker thread are under way: enough that
        a worker has its next batch when one ends, few enough that the calls ready
        meanwhile wait here and go together in the next batch, instead of one by one.
        """
        self._waking = False
        if self._ended:
            return
        queue = self._queue
        if any(p.done.done() for p in queue):  # cancelled before it was sent
            queue = self._queue = deque(p for p in queue if not p.done.done())
        free = SLOTS_PER_THREAD * self._threads - len(self._by_key)
        while queue and free > 0:
            self._submit([queue.popleft() for _ in range(self._size())])
            free -= 1

    def _size(self) -> int:
        """How many of the waiting calls the next batch takes.

        The calls under way (sent and waiting; the most seen in the last one to two
        :data:`PEAK_S` windows, so that a wave of outcomes being handled does not make the
        next batches small) spread over the worker threads (over every task slot while
        the tool has not been seen yet), at most :data:`MAX_BATCH` a batch, and no more
        than about :data:`BATCH_S` seconds of work by what each call's tool took so far (a
        tool not seen yet counts as :data:`BATCH_S` / 8): a slow tool goes a call or a
        few to a task, so that its calls spread over the workers and a worker that dies
        takes few outcomes with it.
        """
        queue = self._queue
        under_way = len(self._batches) + len(queue)
        now = time.monotonic()
        if now - self._peak_at > PEAK_S:  # a new window: the last one's peak is kept
            self._peaks, self._peak_at = (self._peaks[1], 0), now
        self._peaks = (self._peaks[0], max(self._peaks[1], under_way))
        # a tool not seen yet may be slow: its calls spread over every task slot
        spread = self._threads if queue[0].call.tool in self._seconds else \
            SLOTS_PER_THREAD * self._threads
        size = min(MAX_BATCH, len(queue), -(-max(self._peaks) // spread))
        work, taken = 0.0, 0
        for p in itertools.islice(queue, size):
            work += self._seconds.get(p.call.tool, BATCH_S / 8)
            if taken and work > BATCH_S:
                break
            taken += 1
        return taken

    def _submit(self, part: list[_Pending]) -> None:
        batch = _Batch(part)
        client = self._client
        status = getattr(client, "status", "closed")
        if status != "running":
            # The scheduler is gone (the client reconnects, or gave up): a task submitted
            # now would wait in the client for ever. The call was not sent: it failed.
            for p in part:
                _settle(p, ("failed", {
                    "code": "tool_error", "message": "the Dask scheduler at "
                    f"{self.address or 'the local cluster'} is not connected (the client is "
                    f"{status}); the call was not sent"}))
            return
        try:
            # a call carries the secrets it was given, not the run's others (SPEC §12)
            payload = pickle.dumps(
                [dataclasses.replace(p.call, secrets=p.call.secrets.within(p.call.arguments))
                 for p in part], protocol=pickle.HIGHEST_PROTOCOL)
            batch.future = client.submit(
                worker.run_batch, str(self.project), str(self.registry), payload,
                pure=False, retries=0,
                key=f"planrun-{part[0].name}-{len(part)}-{os.urandom(4).hex()}")
        except Exception as exc:  # the client is closed, the scheduler went away
            for p in part:
                _settle(p, exc)
            return
        self._by_key[batch.future.key] = batch
        # The calls of a batch run one after the other: the n-th may wait for the
        # timeouts of those before it. Give up on a call only past all of them.
        budget: float | None = BACKSTOP_S
        loop = self._loop
        for p in part:
            self._batches[p.name] = batch
            budget = None if budget is None or p.call.timeout is None else \
                budget + p.call.timeout
            if budget is not None and loop is not None:
                p.timer = loop.call_later(budget, self._give_up, p)
        client.loop.add_callback(self._fetch, batch.future)
        if self._watching is None and loop is not None:
            self._watching = loop.call_later(CLIENT_WATCH_S, self._watch_client)

    def _watch_client(self) -> None:
        """While tasks are under way: end them as lost once the client lost its scheduler.

        A client whose scheduler died cancels the tasks it had, then tries to reconnect;
        when it gives up it closes without settling the tasks submitted meanwhile, whose
        fetch would wait for ever (the run hung; found by an attacker).
        """
        self._watching = None
        if not self._by_key or self._loop is None:
            return
        client = self._client
        status = getattr(client, "status", "closed")
        if status in ("running", "connecting", "newly-created"):
            self._watching = self._loop.call_later(CLIENT_WATCH_S, self._watch_client)
            return
        for key in list(self._by_key):
            self._deliver(key, CallLost(f"the Dask client lost its scheduler (it is {status})"))

    async def _fetch(self, future: Any) -> None:
        """On the client's loop: wait for a batch's task, fetch its outcomes, hand them over.

        Fetches of tasks that end together share one request (Dask gathers them at once).
        """
        outcomes: Any
        try:
            outcomes = pickle.loads(await self._client.gather(future, asynchronous=True))
        except BaseException as exc:  # every end of a task is an outcome for its calls
            status = future.status
            outcomes = exc if status in ("error", "finished") else \
                CallLost(f"the Dask task was {status}")
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the run's loop has ended
            loop.call_soon_threadsafe(self._deliver, future.key, outcomes)

    def _deliver(self, key: str, outcomes: Any) -> None:
        batch = self._by_key.pop(key, None)
        if batch is None:
            return
        self._wake()  # a task slot is free
        seconds: list[float] = []
        if isinstance(outcomes, tuple) and len(outcomes) == 2:
            outcomes, seconds = outcomes
        for i, p in enumerate(batch.pending):
            self._batches.pop(p.name, None)
            if isinstance(outcomes, list) and i < len(outcomes):
                one = outcomes[i]
                _settle(p, worker.read_outcome(p.call, one) if isinstance(one, bytes) else one)
            else:
                _settle(p, outcomes)
        for p, took in zip(batch.pending, seconds, strict=False):  # seconds per call
            if took > 0:
                was = self._seconds.get(p.call.tool)
                self._seconds[p.call.tool] = took if was is None else 0.8 * was + 0.2 * took

    def _give_up(self, pending: _Pending) -> None:
        """The call's worker did not answer in time: a timeout, and the call is stopped."""
        _settle(pending, ("gave_up",))
        self._stop(pending)

    def _stop(self, pending: _Pending) -> None:
        """Stop a call given up on: its task cancelled, the call stopped on its worker.

        A call still waiting to be sent is only dropped.
        """
        batch = self._batches.pop(pending.name, None)
        if not pending.done.done():
            pending.done.cancel()
        if batch is None or self._client is None:
            return
        batch.cancelled.add(pending.name)
        if batch.future is not None and all(p.name in batch.cancelled for p in batch.pending):
            self._by_key.pop(batch.future.key, None)
            self._wake()  # its slot is free
            with contextlib.suppress(Exception):
                batch.future.cancel()
        if not self._stops and self._loop is not None:
            self._loop.call_soon(self._send_stops)
        self._stops.append(pending.name)

    def _send_stops(self) -> None:
        """Tell every worker, once for all the calls given up on in this turn."""
        names, self._stops = self._stops, []
        if names and self._client is not None:
            with contextlib.suppress(Exception):
                self._client.run(worker.stop_calls, names, on_error="ignore")

    def end_all(self) -> None:
        """From any thread: stop every call under way (the run's lease was lost).

        Calls still waiting here are not sent any more.
        """
        self._ended = True
        names = list(self._batches)
        client = self._client
        if names and client is not None:
            with contextlib.suppress(Exception):
                client.run(worker.stop_calls, names, on_error="ignore")


class _Unusable(Exception):
    """The scheduler could not be used (the reason, as text: no Dask object is kept)."""


def _why(exc: BaseException) -> str:
    """Why connecting failed, in one phrase."""
    if isinstance(exc, _Unusable):
        return str(exc)
    if isinstance(exc, MemoryError):  # Dask read a frame length out of a foreign answer
        return "it did not answer as a Dask scheduler (is that address a Dask scheduler?)"
    return f"{type(exc).__name__}: {str(exc)[:300] or 'no answer'}"


def _quiet_client_del() -> None:
    """A client that failed to connect says nothing when it is collected.

    Dask's ``Client.__del__`` closes it and, when that times out, Python prints the
    exception as unraisable, with its traceback; planrun has already said why.
    """
    previous = sys.unraisablehook
    if getattr(previous, "planrun_dask", False):
        return

    def hook(unraisable: Any) -> None:
        if getattr(unraisable.object, "__qualname__", "") == "Client.__del__":
            return
        previous(unraisable)

    hook.planrun_dask = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


class _OneLine(logging.Filter):
    """What Dask logs in planrun's process, as one line: no traceback reaches a user.

    A scheduler that dies makes the client log its reconnection errors with their
    tracebacks on planrun's stderr (found by an attacker); planrun says itself what
    became of the calls.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info or record.exc_text or record.stack_info:
            exc = record.exc_info[1] if record.exc_info else None
            text = record.getMessage().strip()
            if exc is not None:
                text = f"{text} {type(exc).__name__}: {exc}".strip()
            record.msg, record.args = " ".join(text.split())[:300], ()
            record.exc_info = record.exc_text = record.stack_info = None
        return True


def _one_line_logs() -> None:
    """Every handler Dask's logging set up in this process gets :class:`_OneLine`."""
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
               if name.split(".")[0] in ("distributed", "tornado", "asyncio")]
    for logger in loggers:
        for handler in logger.handlers:
            if not any(isinstance(f, _OneLine) for f in handler.filters):
                handler.addFilter(_OneLine())


def _hidden() -> list[str]:
    """What the local dispatcher keeps from tools besides ``PLANRUN_PARAM_*`` (SPEC §11).

    ``PLANRUN_JOURNAL`` when it is a URL with a password; ``PGPASSWORD`` while this
    process journals to PostgreSQL. The worker processes planrun starts do not get them
    (:meth:`DaskDispatcher.open` hides them while the cluster lives); a worker removes
    them again should it still have them (e.g. set in ``distributed.nanny.environ``).
    """
    return [n for n in childenv.hidden_names() if not n.startswith(childenv.PARAM_ENV_PREFIX)]


def _allowed_failures(dask_scheduler: Any = None) -> Any:
    """On the scheduler: how often it re-runs a task whose worker died."""
    return getattr(dask_scheduler, "allowed_failures", None)


def _settle(pending: _Pending, outcome: Any) -> None:
    if not pending.done.done():
        pending.done.set_result(outcome)


def _unpack(outcome: Any, secrets: Secrets) -> Any:
    """A worker's :data:`worker.Outcome` (or a task's exception) as Dispatcher.call ends."""
    if isinstance(outcome, tuple) and outcome:
        kind = outcome[0]
        if kind == "ok":
            return outcome[1]
        if kind == "failed":
            raise ToolFailure(outcome[1])
        if kind == "timeout":
            raise CallTimeout(outcome[1])
        if kind == "cancelled":  # stopped on its worker while planrun still waited for it
            raise CallLost("the call was stopped on its Dask worker (its task was released)")
        if kind == "lost":  # its task ran again: the first outcome died with its worker
            raise CallLost("the Dask worker holding its outcome died before planrun had it")
        if kind == "broken":  # planrun's own code around the call raised on the worker
            raise CallLost(f"planrun's code on the Dask worker failed around the call "
                           f"({secrets.conceal_text(str(outcome[1]))})")
    if isinstance(outcome, CallLost):
        raise outcome
    if type(outcome).__name__ == "KilledWorker":
        raise CallLost("the Dask worker running it died")
    if isinstance(outcome, BaseException):
        text = secrets.conceal_text(str(outcome))[:500]
        if isinstance(outcome, (OSError, ConnectionError, TimeoutError)) or \
                "Comm" in type(outcome).__name__:
            raise CallLost(f"the Dask cluster could not be reached "
                           f"({type(outcome).__name__}: {text})")
        raise ToolFailure({"code": "tool_error", "type": type(outcome).__name__,
                           "message": "the Dask worker could not run the call "
                           f"({type(outcome).__name__}: {text}); does it have planrun "
                           "and the project installed?"})
    raise ToolFailure({"code": "tool_error", "message": "the Dask worker sent back "
                       f"something planrun cannot read ({type(outcome).__name__})"})
