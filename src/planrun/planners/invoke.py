"""Asking a planner once: the request in, one plan document out (SPEC §10, protocol 1).

A command gets the request as JSON on stdin and prints one plan, JSON or YAML, on
stdout. It runs without a shell, in the project folder, as the leader of its own process
group, with planrun's environment less ``PLANRUN_PARAM_*`` (secrets reach a planner
never); past its timeout the whole group is killed. A callable gets the request (a dict)
as its one argument and returns the plan (text, or a dict); past its timeout it is
abandoned (its thread keeps running until the process ends).

Whatever goes wrong (cannot start, exits non-zero, times out, raises, writes more than
:data:`MAX_OUTPUT_BYTES`, writes something that is not a plan) is a
:class:`PlannerFailed`, which the rounds loop turns into an issue coded ``planner``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Any

from ..issues import Issue
from ..redact import Secrets
from .spec import Planner

#: The most bytes a planner may write as its plan (4 MiB); more is a ``planner`` issue.
MAX_OUTPUT_BYTES = 4 * 1024 * 1024
#: The most bytes a planner command may write on stderr (16 MiB; only its tail is kept).
MAX_STDERR_BYTES = 16 * 1024 * 1024
#: Seconds between two looks at how much a running planner command wrote.
POLL_S = 0.02
#: How much of a failing command's stderr is kept in the issue message (characters).
STDERR_TAIL_CHARS = 2000
#: What a planner's output is called in issues.
OUTPUT_NAME = "<planner>"


class PlannerFailed(Exception):
    """The planner gave no plan this round; ``message`` says why (secrets masked)."""

    def __init__(self, message: str, *, line: int | None = None,
                 column: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column

    def issue(self) -> Issue:
        """The round's issue: code ``planner``, file ``<planner>``."""
        return Issue(code="planner", message=self.message, file=OUTPUT_NAME, path="",
                     line=self.line, column=self.column)


def ask(planner: Planner, request: dict[str, Any], secrets: Secrets) -> Any:
    """One answer of ``planner`` to ``request``, as a :class:`~planrun.loading.Document`.

    Raises:
        PlannerFailed: no plan this round (the reason masks ``secrets``).
    """
    if planner.argv is not None:
        raw = _run_command(planner, request, secrets)
    else:
        raw = _call(planner, request, secrets)
    return _document(raw, secrets)


def _tail(data: bytes, secrets: Secrets) -> str:
    """The planner's last :data:`STDERR_TAIL_CHARS` characters of stderr, secrets hidden.

    Concealed before the cut, never after it (:func:`planrun.redact.conceal_tail`): a cut
    through a secret would leave its end in clear.
    """
    from ..redact import conceal_tail, display_text

    data = data.strip()
    text = conceal_tail(data, secrets, STDERR_TAIL_CHARS)
    if len(data.decode("utf-8", "replace")) > STDERR_TAIL_CHARS:
        text = "…" + text
    return display_text(text)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


@contextlib.contextmanager
def _terminate_raises() -> Any:
    """While a planner command runs, SIGTERM ends planrun through Python (exit 143).

    Without it, planrun would die at once and leave the planner (in its own process
    group) running; with it, the group is killed on the way out. Main thread only.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(143)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _wait(proc: subprocess.Popen[bytes], timeout: float, fout: Any, ferr: Any) -> int:
    """The command's exit status, looking every :data:`POLL_S` at what it wrote.

    A planner that writes without end is stopped at the bound, not at its timeout: its
    output goes to temporary files, which it would otherwise grow until the disk is full
    (found by an attacker).

    Raises:
        subprocess.TimeoutExpired: it ran past ``timeout`` seconds.
        StreamPastBound: it wrote more than :data:`MAX_OUTPUT_BYTES` on stdout or
            :data:`MAX_STDERR_BYTES` on stderr (:func:`planrun.tools.check_streams`, as
            for a command tool).
    """
    import time

    from ..tools import check_streams

    bounds = ((fout, "stdout", MAX_OUTPUT_BYTES), (ferr, "stderr", MAX_STDERR_BYTES))
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise subprocess.TimeoutExpired(proc.args, timeout)
        try:
            return proc.wait(min(POLL_S, left))
        except subprocess.TimeoutExpired:
            pass
        check_streams(bounds)


def _run_command(planner: Planner, request: dict[str, Any], secrets: Secrets) -> bytes:
    from .. import childenv, procs
    from ..tools import StreamPastBound

    argv = list(planner.argv or ())
    env = childenv.child_env()  # no parameters, no journal password (SPEC §7, §11)
    with tempfile.TemporaryFile() as fin, tempfile.TemporaryFile() as fout, \
            tempfile.TemporaryFile() as ferr:
        fin.write(json.dumps(request, ensure_ascii=False).encode("utf-8", "surrogatepass"))
        fin.seek(0)
        # The keeper ends the planner's group if planrun dies (SIGKILL) while it runs,
        # as for a tool's command (SPEC §12).
        keeper = procs.Keeper()
        keeper.start()
        try:
            proc = subprocess.Popen(argv, cwd=planner.folder, env=env, stdin=fin,
                                    stdout=fout, stderr=ferr, process_group=0,
                                    preexec_fn=keeper.preexec)
        except OSError as exc:
            keeper.close()
            raise PlannerFailed(f"cannot start the planner {argv[0]!r}: "
                                f"{exc.strerror or exc}") from None
        keeper.add(proc.pid)
        try:
            with _terminate_raises():
                code = _wait(proc, planner.timeout, fout, ferr)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.wait()
            raise PlannerFailed(f"the planner ran past its timeout of {planner.timeout:g} s "
                                "and was killed (with its process group)") from None
        except StreamPastBound as flood:
            _kill_group(proc.pid)
            proc.wait()
            raise PlannerFailed(f"the planner wrote more than {flood.bound:,} bytes on "
                                f"{flood.stream} and was killed (with its process group); "
                                f"a plan from a planner is at most {MAX_OUTPUT_BYTES:,} "
                                "bytes") from None
        except BaseException:  # Ctrl-C: the planner does not outlive planrun
            _kill_group(proc.pid)
            proc.wait()
            raise
        finally:
            keeper.remove(proc.pid)
            keeper.close()
        _kill_group(proc.pid)  # what it left behind
        if code != 0:
            size = ferr.seek(0, os.SEEK_END)
            ferr.seek(max(0, size - 4 * STDERR_TAIL_CHARS))  # the tail only, however much
            err = _tail(ferr.read(), secrets)
            what = (f"was killed by signal {-code}" if code < 0
                    else f"exited with status {code}")
            raise PlannerFailed(f"the planner {what}" + (f": {err}" if err else
                                                          " (nothing on stderr)"))
        size = fout.seek(0, os.SEEK_END)
        if size > MAX_OUTPUT_BYTES:
            raise PlannerFailed(f"the planner wrote {size:,} bytes; a plan from a planner "
                                f"is at most {MAX_OUTPUT_BYTES:,} bytes")
        fout.seek(0)
        return fout.read()


def _import(target: str, folder: Any) -> Any:
    import importlib

    from ..streams import stdout_to_stderr

    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    module_name, _, attr = target.partition(":")
    with stdout_to_stderr():
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    return obj


def _call(planner: Planner, request: dict[str, Any], secrets: Secrets) -> Any:
    from ..redact import display_text

    def described(exc: BaseException) -> str:
        return display_text(secrets.conceal_text(f"{type(exc).__name__}: {exc}"))

    try:
        func = _import(planner.target or "", planner.folder)
    except Exception as exc:
        raise PlannerFailed(f"cannot import the planner {planner.target!r}: "
                            f"{described(exc)}") from None
    if not callable(func):
        raise PlannerFailed(f"the planner {planner.target!r} is not callable")
    box: dict[str, Any] = {}
    # its own copy: a callable that edits its request (or goes on after its timeout)
    # changes nothing planrun sends in a later round
    import copy

    mine = copy.deepcopy(request)

    def run() -> None:
        try:
            box["value"] = func(mine)
        except BaseException as exc:  # the planner's own failure, SystemExit too
            box["error"] = exc

    from ..streams import stdout_to_stderr

    # What the callable prints goes to stderr (stdout is for the plan). The redirection is
    # undone here, in this thread, also when the callable is abandoned at its timeout.
    # A callable that changes the working folder (os.chdir) changes nothing planrun
    # resolves or shows afterwards: the folder is restored when it returns (or is abandoned).
    try:
        folder: str | None = os.getcwd()
    except OSError:  # the working folder was removed: nothing to restore
        folder = None
    with stdout_to_stderr():
        worker = threading.Thread(target=run, name="planrun-planner", daemon=True)
        worker.start()
        try:
            worker.join(planner.timeout)
        finally:
            if folder is not None:
                with contextlib.suppress(OSError):
                    os.chdir(folder)
    if worker.is_alive():
        raise PlannerFailed(f"the planner ran past its timeout of {planner.timeout:g} s "
                            "(abandoned)")
    if "error" in box:
        raise PlannerFailed(f"the planner raised {described(box['error'])}")
    return box.get("value")


def _document(raw: Any, secrets: Secrets) -> Any:
    """The planner's answer as a Document: text (JSON or YAML) or a dict."""
    from ..loading import DocumentError, has_surrogate, parse_text

    if isinstance(raw, dict):
        bad_key = _non_string_key(raw)
        if bad_key is not None:
            # json.dumps would turn 1 into "1" and True into "true": nothing is repaired
            raise PlannerFailed(f"the planner returned a dict that is not JSON data: the "
                                f"key {bad_key!r} is not a string")
        try:
            text = json.dumps(raw, ensure_ascii=False, allow_nan=False)
        except RecursionError:
            raise PlannerFailed("the planner returned a dict that is not a plan: it is "
                                "nested too deeply") from None
        except (TypeError, ValueError) as exc:
            raise PlannerFailed(f"the planner returned a dict that is not JSON data: "
                                f"{exc}") from None
        if len(text) > MAX_OUTPUT_BYTES // 4 and len(text.encode(
                "utf-8", "surrogatepass")) > MAX_OUTPUT_BYTES:
            raise PlannerFailed(f"the planner returned a dict of more than "
                                f"{MAX_OUTPUT_BYTES:,} bytes as JSON; a plan from a "
                                f"planner is at most {MAX_OUTPUT_BYTES:,} bytes")
        if has_surrogate(text):
            raise PlannerFailed("the planner returned a dict whose text is not UTF-8 text "
                                "(a lone surrogate)")
        kind = "json"
    elif isinstance(raw, str | bytes):
        if isinstance(raw, bytes):
            if len(raw) > MAX_OUTPUT_BYTES:
                raise PlannerFailed(f"the planner wrote {len(raw):,} bytes; a plan from a "
                                    f"planner is at most {MAX_OUTPUT_BYTES:,} bytes")
            try:
                text = raw.decode("utf-8-sig")
            except UnicodeDecodeError as exc:
                raise PlannerFailed(f"the planner's output is not UTF-8 text (byte "
                                    f"{exc.start})") from None
        else:
            text = raw
            if len(text) > MAX_OUTPUT_BYTES:
                raise PlannerFailed(f"the planner returned {len(text):,} characters; a plan "
                                    f"from a planner is at most {MAX_OUTPUT_BYTES:,} bytes")
            if has_surrogate(text):
                raise PlannerFailed("the planner's output is not UTF-8 text (a lone "
                                    "surrogate)")
        if not text.strip():
            raise PlannerFailed("the planner wrote nothing: it must print one plan (JSON or "
                                "YAML)")
        kind = "json" if text.lstrip()[:1] in ("{", "[") else "yaml"
    else:
        raise PlannerFailed(f"the planner returned {type(raw).__name__}, not a plan (text "
                            "or a dict)")
    try:
        doc = parse_text(text, kind=kind, file=OUTPUT_NAME)
    except DocumentError as exc:
        first = exc.issues[0]
        from ..redact import display_text

        raise PlannerFailed(
            "the planner's output is not a plan: " + "; ".join(
                f"{i.code}: {display_text(secrets.conceal_text(i.message))}"
                for i in exc.issues[:5]), line=first.line, column=first.column) from None
    if not isinstance(doc.data, dict):
        shown = type(doc.data).__name__ if doc.data is not None else "null"
        raise PlannerFailed(f"the planner's output is not a plan: a plan is a mapping "
                            f"(planrun: 1, goal, steps, …), not {shown}", line=1, column=1)
    return doc


def _non_string_key(value: Any) -> Any:
    """The first mapping key in ``value`` that is not a string, or None.

    Iterative, and each container once (a dict that holds itself is json.dumps's to
    refuse).
    """
    todo = [value]
    seen: set[int] = set()
    while todo:
        item = todo.pop()
        if isinstance(item, dict | list | tuple):
            if id(item) in seen:
                continue
            seen.add(id(item))
        if isinstance(item, dict):
            for k, v in item.items():
                if not isinstance(k, str):
                    return k
                todo.append(v)
        elif isinstance(item, list | tuple):
            todo.extend(item)
    return None
