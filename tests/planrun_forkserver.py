"""A fork server for ``planrun`` commands, so that documented examples run fast.

Starting a Python interpreter and importing planrun's dependencies costs about 0.3 s per
command, which is most of the time of a documented example. The server imports planrun
once; for each command it forks a child that takes over the client's stdin, stdout and
stderr (passed over a Unix socket), its working folder, environment and arguments, runs
``planrun.cli.main()`` exactly as the console script does, and exits. The client reports
the child's exit status, or dies of the same signal, so to the shell that ran it the client
*is* the planrun process.

Usage (stdlib only at the top, so the client can run with ``python -S``)::

    python planrun_forkserver.py serve SOCKET      # until SIGTERM
    python -S planrun_forkserver.py client SOCKET [planrun arguments...]
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import select
import signal
import socket
import sys

#: Exit status of the client when the server cannot be reached or breaks.
BROKEN = 70


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the connection closed early")
        data += chunk
    return data


def _peek(conn: socket.socket) -> bytes:
    """What a client sent after its request (nothing: it closed); b"" on an error too."""
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return b"?"  # readable but nothing to read: not closed
    except OSError:
        return b""


def client(path: str, argv: list[str]) -> None:
    """Run ``planrun ARGV`` in the server; exit (or die) as that process did."""
    payload = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(path)
            socket.send_fds(sock, [b"F"], [0, 1, 2])
            sock.sendall(len(payload).to_bytes(4, "big") + payload)
            reply = b""
            while chunk := sock.recv(4096):
                reply += chunk
        result = json.loads(reply)
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"planrun fork server: {exc}\n")
        sys.exit(BROKEN)
    if "signal" in result:
        with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
            signal.signal(result["signal"], signal.SIG_DFL)
        os.kill(os.getpid(), result["signal"])
    sys.exit(result.get("exit", BROKEN))


def _child(request: dict[str, object], fds: list[int]) -> None:
    code = BROKEN
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.setsid()  # its own session, as a test's planrun process: never the server's group
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.chdir(str(request["cwd"]))
        os.environ.clear()
        os.environ.update(request["env"])  # type: ignore[arg-type]
        sys.argv = ["planrun", *request["argv"]]  # type: ignore[misc]
        from planrun.cli import main

        try:
            main()
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                sys.stderr.write(f"{exc.code}\n")
                code = 1
    except BaseException:  # a bug in planrun: show it, as the console script would
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # the stream may be closed by now
                stream.flush()
        os._exit(code)


def serve(path: str) -> None:
    """Accept commands on ``path`` until SIGTERM or until the parent process dies.

    One forked child per command.
    """
    # What the CLI imports lazily, imported once here (behaviour is the same, only faster).
    import rich.console
    import rich.table  # noqa: F401

    import planrun.api
    import planrun.cli
    import planrun.executor
    import planrun.lifecycle
    import planrun.policy
    import planrun.ui
    import planrun.views
    from planrun.conditions import compile_condition
    from planrun.registry import schema_problems, strict_validator

    # Warm the caches a first command fills: the CEL parser, the JSON Schema metaschema,
    # the models, and the CLI's own argument handling (a pure command, output dropped).
    compile_condition("true")
    schema_problems({"type": "object"})
    strict_validator({"type": "object"})
    sys.argv = ["planrun", "schema", "plan"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        planrun.cli.main()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    waiting: dict[int, socket.socket] = {}
    parent = os.getppid()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while os.getppid() == parent:  # the test run that started it is gone: stop
        ready, _, _ = select.select([listener, *waiting.values()], [], [], 0.005)
        for pid, conn in list(waiting.items()):
            if conn in ready and not _peek(conn):
                # its client is gone (killed by a test's timeout): a command nobody waits
                # for must not run on, e.g. a hung run spinning through later tests
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
        if listener in ready:
            conn, _ = listener.accept()
            try:
                _, fds, _, _ = socket.recv_fds(conn, 1, 3)
                size = int.from_bytes(_recv_exact(conn, 4), "big")
                request = json.loads(_recv_exact(conn, size))
            except (OSError, ValueError, ConnectionError):
                conn.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                for other in waiting.values():
                    other.close()
                _child(request, fds)
            for fd in fds:
                os.close(fd)
            waiting[pid] = conn
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = waiting.pop(pid)
            if os.WIFSIGNALED(status):
                reply = {"signal": os.WTERMSIG(status)}
            else:
                reply = {"exit": os.waitstatus_to_exitcode(status)}
            with contextlib.suppress(OSError):  # the client is gone
                conn.sendall(json.dumps(reply).encode())
            conn.close()


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        client(sys.argv[2], sys.argv[3:])
