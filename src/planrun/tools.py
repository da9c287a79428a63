"""Calling one tool once: python callables and commands (SPEC §2).

A python tool is called with the validated arguments as keyword arguments (sync ones in a
worker thread, ``async def`` ones on the event loop) and can read its run, step, item,
idempotency key and attempt from :func:`planrun.context`. A command is run **without a
shell**: each ``{name}`` in an argv element is replaced by that argument's scalar value,
the full arguments object is given as JSON on stdin, and the environment carries
``PLANRUN_RUN_ID``, ``PLANRUN_STEP_ID``, ``PLANRUN_ITEM_INDEX`` (fan-out only),
``PLANRUN_IDEMPOTENCY_KEY`` and ``PLANRUN_ATTEMPT`` (and never ``PLANRUN_PARAM_*``).

What a tool says back in text (an exception, the tail of stderr) is put in reference form
(:mod:`planrun.redact`) before it becomes an error message: a secret it echoes is stored
as a reference and printed as ``***``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import json
import os
import re
import signal
import tempfile
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import childenv, redact
from .argv import PLACEHOLDER
from .params import render
from .pointers import pointer_of
from .redact import Secrets
from .registry import ToolSpec

#: Bytes of a command's stderr kept as its error message (the tail).
STDERR_TAIL_BYTES = 2000
#: Seconds a command gets between SIGTERM and SIGKILL when it is cancelled or times out.
KILL_GRACE_S = 5.0
#: The most bytes a command may write on stdout when that is its output (``output: text``
#: or ``json``: journaled, read back by resume, shown): 64 MiB, the bound of a plan file.
#: A command still running past it is killed; one that exited past it failed (``output``).
MAX_OUTPUT_BYTES = 64 * 1024 * 1024
#: The most bytes a running command may write on a stream of which only the tail is kept
#: (stderr, and stdout of ``output: none``): 1 GiB; past it, it is killed. Its temporary
#: file would otherwise grow until the disk is full or the call's timeout, if it has one
#: (found by an attacker). Only the end of such a stream is read.
MAX_STREAM_BYTES = 1024 * 1024 * 1024
#: Seconds between two looks at how much a running command wrote.
STREAM_POLL_S = 0.05
#: Environment variables that give parameters; tools never see them (SPEC §7).
PARAM_ENV_PREFIX = childenv.PARAM_ENV_PREFIX


@dataclass(frozen=True)
class StepContext:
    """What a running python tool can learn about its call (``planrun.context()``).

    Attributes:
        run_id: the run.
        step_id: the step.
        item_index: the fan-out item index, or None.
        idempotency_key: the call's idempotency key (SHA-256 hex, SPEC §7).
        attempt: 1 for the first call, 2 for the first retry, …
    """

    run_id: str
    step_id: str
    item_index: int | None
    idempotency_key: str
    attempt: int


_CONTEXT: contextvars.ContextVar[StepContext] = contextvars.ContextVar("planrun_step")


def context() -> StepContext:
    """The :class:`StepContext` of the tool call running in this thread or task.

    Raises:
        LookupError: called outside a tool call.
    """
    return _CONTEXT.get()


class ToolFailure(Exception):
    """A call that did not succeed; ``error`` is the journaled error object.

    ``error`` has ``code`` (``tool_error`` | ``exit_status`` | ``timeout`` | ``output``),
    ``message``, and where known ``type``, ``exit_code``, ``traceback``.
    """

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message", ""))
        self.error = error


class CallCutShort(ToolFailure):
    """planrun ended the call before it ended (killed it, or abandoned a python call).

    A tool that is not idempotent then has an unknown effect (``indeterminate``); an
    idempotent one failed (it may be retried).
    """


class CallTimeout(CallCutShort):
    """The call ran past its timeout (it was killed, or abandoned for a python tool)."""


class OutputBound(CallCutShort):
    """A command wrote past a bound and was killed with its process group (code ``output``).

    The bounds: :data:`MAX_OUTPUT_BYTES` on a stdout that is its output,
    :data:`MAX_STREAM_BYTES` on stderr or on a stdout that is not.
    """


def fill_argv(argv: list[str], arguments: dict[str, Any]) -> list[str]:
    """Each argv element with its ``{name}`` placeholders replaced by argument values.

    Values are rendered as text (strings as-is, numbers/booleans in JSON spelling); the
    registry guarantees each named argument is required and scalar.
    """
    def sub(m: re.Match[str]) -> str:
        tok = m.group(0)
        if tok == "{{":
            return "{"
        if tok == "}}":
            return "}"
        return render(arguments[m.group(1)])

    return [PLACEHOLDER.sub(sub, element) for element in argv]


#: The secrets of the run whose call is being checked, for the one path that reaches
#: :func:`validate_model` without being given them (validation's argument check, at run
#: time); empty elsewhere. Context-local (task and thread), never process-wide.
_CHECKING: contextvars.ContextVar[Secrets] = contextvars.ContextVar(
    "planrun_checking_secrets", default=redact.NO_SECRETS)


@contextlib.contextmanager
def checking_with(secrets: Secrets) -> Iterator[None]:
    """While arguments are checked for a call, mask ``secrets`` in what a model says."""
    token = _CHECKING.set(secrets)
    try:
        yield
    finally:
        _CHECKING.reset(token)


def _secrets(secrets: Secrets | None) -> Secrets:
    """The secrets given, or those of :func:`checking_with` (none outside a run)."""
    return _CHECKING.get() if secrets is None else secrets


def _tail(data: bytes, secrets: Secrets) -> str:
    """The last :data:`STDERR_TAIL_BYTES` characters of output, in reference form.

    Secrets are found *before* the cut, and no fragment of one survives at the edge
    (:func:`planrun.redact.conceal_tail`).
    """
    return redact.conceal_tail(data, secrets, STDERR_TAIL_BYTES).strip()


#: Characters of a python tool's exception message kept (its first), and of its traceback
#: (its last: the raising frame and the message end it). A 3 MB message made a 9 MB
#: report and 3 MB on stderr (found by attack).
MESSAGE_CHARS = 2000
TRACEBACK_CHARS = 20_000


def _describe(exc: BaseException, secrets: Secrets) -> str:
    """``Type: message`` of an exception (reference form), even when ``__str__`` fails.

    The message is cut at :data:`MESSAGE_CHARS` characters, after its secrets were
    concealed (a cut never leaves part of one), saying how long it was.
    """
    try:
        text = secrets.conceal_text(str(exc))
    except Exception:  # a broken __str__ in tool code
        text = "<the exception's message could not be read>"
    if len(text) > MESSAGE_CHARS:
        text = f"{redact.cut_head(text, MESSAGE_CHARS)}… ({len(text):,} characters in all)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def validate_model(model: Any, arguments: dict[str, Any], secrets: Secrets | None = None
                   ) -> tuple[Any, list[tuple[str, str]]]:
    """Validate arguments with an ``accepts`` pydantic model, from JSON, in strict mode.

    The arguments are JSON data (a plan is JSON), so they are validated as JSON
    (``model_validate_json``): a ``Decimal``, ``datetime``, ``UUID`` or ``Enum`` field
    takes its JSON form (a string, a number), while strict mode still refuses ``"2"`` for
    an integer. Validation (``planrun validate``) and the call use this same function, so
    arguments that validate are arguments the call accepts. Whatever the model's code
    prints goes to stderr. ``secrets``: what to mask in a validator's own words.

    Returns:
        (the model instance, []) or (None, [(JSON Pointer, message), ...]).
    """
    import json

    from pydantic import ValidationError

    from .streams import stdout_to_stderr

    try:
        with stdout_to_stderr():
            return model.model_validate_json(json.dumps(arguments), strict=True), []
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False, include_input=False):
            where = pointer_of(err.get("loc", ()))
            problems.append((where, str(err.get("msg", "invalid"))))
        return None, problems or [("", str(exc))]
    except BaseException as exc:  # a validator in the model raised something else
        if isinstance(exc, KeyboardInterrupt) and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            raise  # Ctrl-C reads as KeyboardInterrupt here (validate): the person's
        return None, [("", f"the model {getattr(model, '__name__', model)!s} raised "
                       f"{_describe(exc, _secrets(secrets))}")]


class _Raised(Exception):
    """Carries what a tool raised past asyncio, so that it is read as the tool's failure.

    Asyncio would misread several exceptions as its own: ``Future.set_exception``
    refuses a ``StopIteration`` (on Python 3.11 it raises ``TypeError``, and the future is
    never settled: the call would wait forever), an ``asyncio.CancelledError`` (also
    ``concurrent.futures.CancelledError``) reads as a cancellation of the awaiting step, a
    ``TimeoutError`` as the call's own timeout, and a ``GeneratorExit`` escapes the
    awaiting coroutine. So every exception of a tool's call comes wrapped
    (:func:`in_thread`, :func:`await_tool`), and :func:`call_python` unwraps it.
    """

    def __init__(self, raised: BaseException) -> None:
        super().__init__(repr(raised))
        self.raised = raised


def in_thread(pool: Executor | None, fn: Callable[..., Any], *args: Any
              ) -> asyncio.Future[Any]:
    """``fn(*args)`` in a thread of ``pool`` (None: the loop's default executor).

    Returns the :class:`asyncio.Future` of :meth:`asyncio.loop.run_in_executor`, to
    await, with ``fn``'s result or exception. A future, not a coroutine:
    ``asyncio.wait_for`` (a call's timeout) awaits a future as it is, while it would run
    a coroutine as a task of its own — and a task whose coroutine raises ``SystemExit``
    or ``KeyboardInterrupt`` (a tool's ``sys.exit()``) re-raises it out of the event
    loop, ending planrun instead of failing the step.

    An exception raised by ``fn`` comes back wrapped in :class:`_Raised` (asyncio would
    misread some as its own). Cancelled, the call is taken back if its thread has not
    started it, and otherwise goes on (abandoned).

    Raises:
        RuntimeError: ``pool`` is shut down (from ``Executor.submit``).
    """
    def guarded() -> Any:
        try:
            return fn(*args)
        except BaseException as exc:
            raise _Raised(exc) from None

    return asyncio.get_running_loop().run_in_executor(pool, guarded)


async def await_tool(awaitable: Any) -> Any:
    """Await a tool's awaitable; what it raises comes wrapped in :class:`_Raised`.

    Not a cancellation of the awaiting task itself (planrun's: a signal, a timeout, a
    lost lease), which goes through as it is.
    """
    try:
        return await awaitable
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        raise _Raised(asyncio.CancelledError()) from None
    except BaseException as exc:
        raise _Raised(exc) from None


def _python_kwargs(tool: ToolSpec, arguments: dict[str, Any], secrets: Secrets
                   ) -> dict[str, Any]:
    """The keyword arguments of a python tool's call (through its model, when it has one)."""
    if tool.model is None:
        return arguments
    model, problems = validate_model(tool.model, arguments, secrets)
    if problems:
        raise ToolFailure({"code": "arguments", "message": secrets.conceal_text("; ".join(
            f"{where or '/'}: {message}" for where, message in problems))})
    return {name: getattr(model, name) for name in type(model).model_fields}


def tool_error(exc: BaseException, secrets: Secrets) -> ToolFailure:
    """A python tool's own exception as its failure (code ``tool_error``, masked)."""
    try:
        tb = secrets.conceal_text("".join(traceback.format_exception(exc)))
    except Exception:
        tb = None
    if tb and len(tb) > TRACEBACK_CHARS:
        tb = "…" + redact.cut_tail(tb, TRACEBACK_CHARS)
    error = {"code": "tool_error", "type": type(exc).__name__,
             "message": _describe(exc, secrets)}
    if tb:
        error["traceback"] = tb
    return ToolFailure(error)


def python_invocation(tool: ToolSpec, arguments: dict[str, Any], ctx: StepContext,
                      secrets: Secrets | None = None) -> Callable[[], Any]:
    """A sync python tool's call as a function of nothing, to run in a thread.

    The function sets :func:`context` for the call and returns what the tool returns (or
    raises what it raises: :func:`tool_error` makes that its failure). Used by
    :func:`call_python` and by the Dask worker, which calls sync tools without an event
    loop.

    Raises:
        ToolFailure: the arguments do not fit the tool's model (code ``arguments``).
    """
    func = tool.func
    assert func is not None
    kwargs = _python_kwargs(tool, arguments, _secrets(secrets))

    def invoke() -> Any:
        token = _CONTEXT.set(ctx)
        try:
            return func(**kwargs)
        finally:
            _CONTEXT.reset(token)

    return invoke


async def call_python(tool: ToolSpec, arguments: dict[str, Any], ctx: StepContext,
                      pool: Executor | None, timeout: float | None,
                      secrets: Secrets | None = None) -> Any:
    """Call a python tool once; returns its output.

    ``secrets`` are masked (put in reference form) in the errors it returns.

    Raises:
        ToolFailure: the callable raised (code ``tool_error``).
        CallTimeout: it ran past ``timeout`` seconds (a sync call is abandoned).
    """
    func = tool.func
    assert func is not None
    secrets = _secrets(secrets)
    is_async = inspect.iscoroutinefunction(func)
    if is_async:
        kwargs = _python_kwargs(tool, arguments, secrets)
    else:
        invoke = python_invocation(tool, arguments, ctx, secrets)

    try:
        if is_async:
            async def run_async() -> Any:
                _CONTEXT.set(ctx)
                return await await_tool(func(**kwargs))

            result = await asyncio.wait_for(asyncio.create_task(run_async()), timeout)
        else:
            result = await asyncio.wait_for(in_thread(pool, contextvars.copy_context().run,
                                                      invoke), timeout)
        if inspect.isawaitable(result):
            result = await asyncio.wait_for(await_tool(result), timeout)
    except TimeoutError:
        raise CallTimeout({"code": "timeout",
                           "message": f"call ran past its timeout of {timeout} s"}) from None
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # the tool's own failure, also SystemExit and friends
        if isinstance(exc, _Raised):
            exc = exc.raised
        raise tool_error(exc, secrets) from None
    return result


async def call_command(tool: ToolSpec, arguments: dict[str, Any], ctx: StepContext,
                       project: Path, timeout: float | None,
                       on_start: Callable[[asyncio.subprocess.Process], None] | None = None,
                       preexec: Callable[[], None] | None = None,
                       on_stderr: Callable[[str], None] | None = None,
                       secrets: Secrets | None = None) -> Any:
    """Run a command tool once, without a shell; returns its output per ``output``.

    ``on_start`` is called once the command started (it may raise: the command is then
    ended); ``preexec`` runs in the forked child before the command (``preexec_fn``).
    ``on_stderr`` gets the bounded tail (:data:`STDERR_TAIL_BYTES`, secrets in reference
    form) of what a command that succeeded wrote on stderr, when it wrote anything (tar's
    warnings, say), so that it is kept instead of discarded. ``secrets`` are masked in
    the errors it returns and in that tail.

    Raises:
        ToolFailure: non-zero exit (``exit_status``, with the tail of stderr), a program
            that cannot be started (``tool_error``), or stdout that is not the declared
            JSON (``output``).
        CallTimeout: it ran past ``timeout`` seconds (SIGTERM, then SIGKILL).
        OutputBound: while it ran, it wrote past :data:`MAX_OUTPUT_BYTES` on stdout that
            is its output, or past :data:`MAX_STREAM_BYTES` on stderr or another stdout
            (killed so).
    """
    secrets = _secrets(secrets)
    argv = fill_argv(list(tool.entry.command or []), arguments)
    cwd = project / tool.entry.cwd if tool.entry.cwd else project
    env = _command_env(ctx)
    # stdin, stdout and stderr are temporary files, not pipes: a background child that
    # inherits them cannot keep the call open after the command itself exited. The command
    # leads its own process group, so a timeout or a cancel ends everything it started.
    with tempfile.TemporaryFile() as fin, tempfile.TemporaryFile() as fout, \
            tempfile.TemporaryFile() as ferr:
        fin.write(json.dumps(arguments).encode())
        fin.seek(0)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, cwd=cwd, env=env, stdin=fin, stdout=fout, stderr=ferr,
                process_group=0, preexec_fn=preexec)
        except OSError as exc:
            raise ToolFailure({"code": "tool_error", "type": type(exc).__name__,
                               "message": "cannot start "
                               f"{secrets.conceal_text(repr(argv[0]))}: "
                               f"{exc.strerror or exc}"}) from None
        if on_start is not None:
            try:
                on_start(proc)
            except BaseException:
                await terminate(proc)
                raise
        output = tool.output_mode != "none"
        bounds = ((fout, "stdout", MAX_OUTPUT_BYTES if output else MAX_STREAM_BYTES),
                  (ferr, "stderr", MAX_STREAM_BYTES))
        try:
            await _wait_bounded(proc, timeout, bounds)
        except TimeoutError:
            await terminate(proc)
            raise CallTimeout({"code": "timeout",
                               "message": f"command ran past its timeout of {timeout} s "
                               "and was killed"}) from None
        except StreamPastBound as past:
            await terminate(proc)
            what = "its output" if past.stream == "stdout" and output else \
                f"a stream of which only the last {STDERR_TAIL_BYTES:,} characters are kept"
            raise OutputBound({"code": "output", "message": f"command wrote more than "
                               f"{past.bound:,} bytes on {past.stream} ({what}) and was "
                               "killed"}) from None
        except asyncio.CancelledError:
            await terminate(proc)
            raise
        if output and os.fstat(fout.fileno()).st_size > MAX_OUTPUT_BYTES:  # written at once
            raise ToolFailure({"code": "output", "message": f"command wrote more than "
                               f"{MAX_OUTPUT_BYTES:,} bytes on stdout (its output)"})
        out = _read(fout) if output else _read_tail(fout, secrets)
        err = _read_tail(ferr, secrets)
    if proc.returncode != 0:
        raise ToolFailure(_exit_error(argv[0], proc.returncode, out, err, secrets))
    if err.strip() and on_stderr is not None:
        on_stderr(_tail(err, secrets))
    return _command_output(tool, argv[0], out, secrets)


class StreamPastBound(Exception):
    """A running command wrote more than ``bound`` bytes on ``stream``.

    A tool's or a planner's command; it is still running: the caller ends it.
    """

    def __init__(self, stream: str, bound: int) -> None:
        super().__init__(stream)
        self.stream, self.bound = stream, bound


def check_streams(bounds: tuple[tuple[Any, str, int], ...]) -> None:
    """Raise :class:`StreamPastBound` when a running command wrote past a bound so far.

    ``bounds``: (temporary file, stream name, most bytes) of each stream; the first past
    its bound is raised.
    """
    for f, stream, bound in bounds:
        if os.fstat(f.fileno()).st_size > bound:
            raise StreamPastBound(stream, bound)


async def _wait_bounded(proc: asyncio.subprocess.Process, timeout: float | None,
                        bounds: tuple[tuple[Any, str, int], ...]) -> None:
    """Wait for the command to exit, looking at what it wrote every :data:`STREAM_POLL_S`.

    ``bounds``: (temporary file, stream name, most bytes) of each stream it writes to.

    Raises:
        TimeoutError: it ran past ``timeout`` seconds.
        StreamPastBound: it wrote past a bound (:func:`check_streams`).
    """
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    exited = asyncio.ensure_future(proc.wait())
    try:
        while True:
            wait = STREAM_POLL_S if deadline is None else min(STREAM_POLL_S,
                                                              deadline - loop.time())
            if wait <= 0:
                raise TimeoutError
            done, _ = await asyncio.wait((exited,), timeout=wait)
            if done:
                return
            check_streams(bounds)
    finally:
        exited.cancel()


def _read(f: Any) -> bytes:
    """All a command wrote to the temporary file ``f``."""
    f.seek(0)
    data: bytes = f.read()
    return data


def _read_tail(f: Any, secrets: Secrets) -> bytes:
    """The end of what a command wrote to ``f``, not the whole stream into memory.

    What :func:`_tail` keeps of it, and one byte more (so that the cut is seen).
    """
    keep = redact.tail_window(secrets, STDERR_TAIL_BYTES) + 1
    f.seek(max(os.fstat(f.fileno()).st_size - keep, 0))
    data: bytes = f.read(keep)
    return data


def _command_env(ctx: StepContext) -> dict[str, str]:
    """The environment of a command: planrun's, less parameters, plus the call's context.

    Less what no child gets either (:func:`planrun.childenv.child_env`: parameters, the
    journal's password).
    """
    env = childenv.child_env()
    env.update(PLANRUN_RUN_ID=ctx.run_id, PLANRUN_STEP_ID=ctx.step_id,
               PLANRUN_IDEMPOTENCY_KEY=ctx.idempotency_key, PLANRUN_ATTEMPT=str(ctx.attempt))
    if ctx.item_index is not None:
        env["PLANRUN_ITEM_INDEX"] = str(ctx.item_index)
    else:
        env.pop("PLANRUN_ITEM_INDEX", None)
    return env


def _exit_error(program: str, code: int | None, out: bytes, err: bytes,
                secrets: Secrets) -> dict[str, Any]:
    """The ``exit_status`` error of a command that did not exit 0 (tails masked)."""
    how = f"killed by signal {-code}" if code is not None and code < 0 else \
        f"exited with status {code}"
    # some programs report failures on stdout
    tail = _tail(err, secrets) or _tail(out, secrets)
    error: dict[str, Any] = {"code": "exit_status", "exit_code": code,
                             "message": f"{secrets.conceal_text(program)} {how}"
                             + (f": {tail}" if tail else "")}
    if err and out:
        error["stdout_tail"] = _tail(out, secrets)
    return error


def _command_output(tool: ToolSpec, program: str, out: bytes, secrets: Secrets) -> Any:
    """A command's stdout as its tool's ``output`` says (none | text | json)."""
    mode = tool.output_mode
    if mode == "none":
        return None
    text = out.decode("utf-8", "replace")
    if mode == "text":
        return text[:-1] if text.endswith("\n") else text
    from .jsontext import json_pairs

    repeated: list[str] = []
    try:
        value = json.loads(text, object_pairs_hook=json_pairs(repeated))
    except ValueError as exc:
        raise ToolFailure({"code": "output",
                           "message": f"{secrets.conceal_text(program)} printed no valid "
                           f"JSON on stdout ({exc}); "
                           "its tool declares output: json"}) from None
    except RecursionError:  # the call ended: its effect is known; the output is refused
        raise ToolFailure({"code": "output",
                           "message": f"{secrets.conceal_text(program)} printed JSON nested "
                           "too deeply to read on stdout; its tool declares output: json"}
                          ) from None
    if repeated:  # json keeps the last value of a key: the others would be lost unseen
        raise ToolFailure({"code": "output",
                           "message": f"{secrets.conceal_text(program)} printed JSON with "
                           f"the key {secrets.conceal_text(json.dumps(repeated[0]))} twice "
                           "in one object on stdout; its tool declares output: json"})
    return value


async def terminate(proc: asyncio.subprocess.Process, grace: float = KILL_GRACE_S) -> None:
    """SIGTERM the command's process group, wait up to ``grace`` seconds, then SIGKILL it."""
    if proc.returncode is not None:
        _signal_group(proc.pid, signal.SIGKILL)  # what it left behind
        return
    _signal_group(proc.pid, signal.SIGTERM)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(proc.wait()), grace)
    _signal_group(proc.pid, signal.SIGKILL)
    if proc.returncode is None:
        await proc.wait()


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
