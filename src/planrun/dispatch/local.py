"""The local dispatcher: python tools in threads of this process, commands as children.

A sync python tool declared ``blocking: false`` is called on the event loop's thread
instead, unless a timeout could need to leave the call behind
(:mod:`planrun.dispatch.inline`).

It owns what running tools here takes (SPEC §2, §7, §12): the thread pool, the process
groups of commands and the keeper that ends them if planrun dies, and — for the run's
duration only, inside :meth:`LocalDispatcher.session` — the process's working folder
(python tools run in the project folder, like commands), its stdio (what tools print goes
to stderr, masked; stdin is end-of-file) and the ``PLANRUN_PARAM_*`` variables (taken
out of the environment). Nothing else in the library changes process-wide state.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import os
import signal
import sys
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .. import childenv, masking, procs
from ..redact import Secrets
from ..registry import ToolSpec
from ..streams import drop_broken
from ..tools import (
    CallTimeout,
    _Raised,
    await_tool,
    call_command,
    call_python,
    python_invocation,
    tool_error,
)
from .base import Call, Dispatcher, Watch
from .inline import Cut, Interruptible, LoopAside, on_main_thread


class LocalDispatcher(Dispatcher):
    """Calls tools in this process (python, in threads) and as child processes (commands).

    Args:
        project: the project folder (the working folder of every call).
        tools: tool name → its spec (the tools the plan uses).
        threads: threads for sync python tools (the run's ``max_parallel``).
        inline: whether calls of ``blocking: false`` tools may be made on the loop's
            thread (:mod:`planrun.dispatch.inline`; False when the run has a ``timeout``).
        grace_s: seconds a call made there gets after the first SIGINT or SIGTERM (the
            scheduler passes its own).
    """

    def __init__(self, project: Path, tools: Mapping[str, ToolSpec], threads: int, *,
                 inline: bool = True, grace_s: float = 10.0) -> None:
        self.project = project
        self.tools = dict(tools)
        self.threads = threads
        self.inline = inline
        self.grace_s = grace_s
        self.abandoned = 0
        #: ids of the calls cut short on the loop's thread (nothing of them goes on).
        self._cut: set[int] = set()
        self._groups: set[int] = set()
        self._pool: ThreadPoolExecutor | None = None
        self._keeper: procs.Keeper | None = None

    @contextlib.contextmanager
    def session(self, secrets: Secrets) -> Iterator[None]:
        """Working folder, stdio and environment for the run; threads and the keeper.

        Everything is given back at the end — except, when python calls were abandoned
        and still run in threads, stderr stays masked until the process exits.
        """
        here = os.getcwd()
        os.chdir(self.project)
        try:
            with _stdout_to_stderr(), _without_param_env(), \
                    masking.masked_output(secrets, lambda: self.abandoned > 0):
                self._pool = ThreadPoolExecutor(max_workers=self.threads,
                                                thread_name_prefix="planrun-tool")
                self._keeper = procs.Keeper()
                try:
                    yield
                finally:
                    self._pool.shutdown(wait=False, cancel_futures=True)
                    self._keeper.close()
        finally:
            os.chdir(here)

    def abandons(self, call: Call) -> bool:
        """A python call cancelled or timed out goes on in its thread (it is abandoned).

        Not one cut short on the loop's thread (:class:`~.inline.Cut`): it ended.
        """
        if id(call) in self._cut:
            self._cut.discard(id(call))
            return False
        return self.tools[call.tool].kind == "python"

    async def call(self, call: Call, watch: Watch) -> Any:
        """Call the tool once (see :meth:`Dispatcher.call`)."""
        tool = self.tools[call.tool]
        if tool.kind != "python":
            return await self._command(tool, call, watch)
        drop_broken()  # a stderr nobody reads any more (a client gone) fails no tool's write
        if (tool.entry.blocking is False and self.inline and call.timeout is None
                and on_main_thread() and not inspect.iscoroutinefunction(tool.func)):
            return await self._on_loop(tool, call, watch)
        try:
            return await call_python(tool, call.arguments, call.context, self._pool,
                                     call.timeout, secrets=call.secrets)
        except (asyncio.CancelledError, CallTimeout):
            self.abandoned += 1
            raise

    async def _on_loop(self, tool: ToolSpec, call: Call, watch: Watch) -> Any:
        """A ``blocking: false`` call on the loop's thread (as :func:`call_python` makes it).

        The signals taken meanwhile go to ``watch.signalled`` (else they are raised again
        for the loop's own handlers) before the call's end is reported.

        Raises:
            ToolFailure: the callable raised (code ``tool_error``), or the arguments do
                not fit its model (code ``arguments``).
            asyncio.CancelledError: a signal cut it short (:class:`~.inline.Interruptible`).
        """
        invoke = python_invocation(tool, call.arguments, call.context, call.secrets)
        guard = Interruptible(self.grace_s)
        aside = LoopAside()
        raised: BaseException | None = None
        cut = False
        aside.open()
        try:
            guard.open()
            try:
                result = contextvars.copy_context().run(invoke)
            except BaseException as exc:  # the tool's own failure, SystemExit too; or Cut
                raised = exc
        except Cut:  # came between the call's end and the guard's close
            cut = True
        finally:
            while True:  # a signal may cut short the close at its entry: close again
                try:
                    guard.close()
                    break
                except Cut:
                    cut = True
            aside.close()
        now = time.monotonic()
        for signum, at in guard.received:
            if watch.signalled is not None:
                watch.signalled(signum, now - at)
            else:
                signal.raise_signal(signum)
        if cut or guard.cut or isinstance(raised, Cut):
            # whatever the call did with the Cut (caught it, wrapped it): cancelled
            self._cut.add(id(call))
            # the cancel those signals asked for (a second Ctrl-C cancels what runs) is
            # taken here, where a call in a thread would have taken it
            await asyncio.sleep(0)
            raise asyncio.CancelledError
        if raised is not None:
            raise tool_error(raised, call.secrets) from None
        if inspect.isawaitable(result):  # a sync function that returned an awaitable
            try:
                result = await await_tool(result)
            except asyncio.CancelledError:
                raise
            except _Raised as exc:
                raise tool_error(exc.raised, call.secrets) from None
        return result

    async def _command(self, tool: ToolSpec, call: Call, watch: Watch) -> Any:
        # The command's group is known to the keeper from before it runs, and reported
        # (journaled) as soon as it started, until its leader was reaped (SPEC §12).
        keeper = self._keeper
        assert keeper is not None, "call() outside session()"
        keeper.start()
        groups: list[procs.Group] = []

        def started(proc: asyncio.subprocess.Process) -> None:
            group = procs.identify(proc.pid)
            groups.append(group)
            self._groups.add(group.pgid)
            keeper.add(group.pgid)
            if watch.started is not None:
                watch.started(group)

        try:
            return await call_command(tool, call.arguments, call.context, self.project,
                                      call.timeout, on_start=started, preexec=keeper.preexec,
                                      on_stderr=watch.stderr, secrets=call.secrets)
        finally:
            for group in groups:
                self._groups.discard(group.pgid)
                keeper.remove(group.pgid)
                if watch.ended is not None:
                    watch.ended(group)

    def end_all(self) -> None:
        """SIGTERM the group of every command running now (from any thread)."""
        for pgid in list(self._groups):
            procs.signal_group(pgid, signal.SIGTERM)


def _without_param_env() -> contextlib.AbstractContextManager[None]:
    """While tools run, ``PLANRUN_PARAM_*`` is not in the environment (SPEC §7).

    Nor ``PLANRUN_JOURNAL`` when it is a URL with a password, nor ``PGPASSWORD`` while this
    process journals to PostgreSQL (SPEC §11): :func:`planrun.childenv.hidden`.

    A tool receives a parameter only as an argument the plan gives it: commands, python
    tools (``os.environ``) and what they start do not inherit the variables.
    """
    return childenv.hidden()


#: The process's stdin (a duplicate of fd 0) while :func:`_stdout_to_stderr` holds it.
_SAVED_STDIN: list[int] = []


@contextlib.contextmanager
def real_stdin() -> Iterator[None]:
    """The process's own stdin back for the block, while tools run with end-of-file.

    For a question to the person at dispatch (``approve: resolved``, SPEC §6): the
    prompt reads the terminal. Nothing to do outside a local session.
    """
    if not _SAVED_STDIN:
        yield
        return
    quiet_in, quiet = os.dup(0), sys.stdin
    try:
        os.dup2(_SAVED_STDIN[-1], 0)
        sys.stdin = os.fdopen(os.dup(0), encoding="utf-8", closefd=True)
        yield
    finally:
        if sys.stdin is not quiet:
            sys.stdin.close()
        sys.stdin = quiet
        os.dup2(quiet_in, 0)
        os.close(quiet_in)


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """While tools run, whatever they print goes to stderr; stdin is end-of-file.

    stdout is for results only (the manifest, ``--json``), so a chatty python tool cannot
    corrupt it.
    """
    sys.stdout.flush()
    drop_broken()
    try:
        saved = os.dup(1)
        saved_in = os.dup(0)
    except OSError:  # no file descriptors (embedded): redirect the Python level only
        with contextlib.redirect_stdout(sys.stderr):
            yield
        return
    old_stdin = sys.stdin
    _SAVED_STDIN.append(saved_in)
    try:
        os.dup2(2, 1)
        # nothing waits on a stdin: a tool that reads it gets end-of-file at once
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        sys.stdin = open(os.devnull, encoding="utf-8")  # noqa: SIM115 - closed below
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _SAVED_STDIN.remove(saved_in)
        sys.stderr.flush()
        if sys.stdin is not old_stdin:
            sys.stdin.close()
        sys.stdin = old_stdin
        os.dup2(saved, 1)
        os.close(saved)
        os.dup2(saved_in, 0)
        os.close(saved_in)
