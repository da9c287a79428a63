"""``planrun.tools.in_thread``: a sync python call's hand-over to its thread (issue 16).

It replaces ``loop.run_in_executor`` on the path of every sync python call, so it must
keep that contract: the value comes back, the exception too (``SystemExit``,
``TimeoutError``, ``GeneratorExit`` …) but wrapped, so that asyncio cannot take it for its
own, the caller's context variables are seen, and a call cancelled before its thread took
it is never run.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from planrun.tools import _Raised, in_thread

WHO: contextvars.ContextVar[str] = contextvars.ContextVar("WHO", default="nobody")


def test_the_value_the_exception_and_the_context_come_back() -> None:
    async def main() -> None:
        with ThreadPoolExecutor(2) as pool:
            assert await in_thread(pool, lambda x: x * 2, 21) == 42
            for raised in (ValueError("bad"), SystemExit(3), TimeoutError("own"),
                           GeneratorExit("gone"), StopIteration(1),
                           asyncio.CancelledError("own"), KeyboardInterrupt()):
                with pytest.raises(_Raised) as info:
                    await in_thread(pool, _raise, raised)
                assert info.value.raised is raised
            WHO.set("caller")
            ctx = contextvars.copy_context()
            assert await in_thread(pool, ctx.run, WHO.get) == "caller"
            # None: the loop's default executor
            assert await in_thread(None, threading.current_thread) is not \
                threading.current_thread()

    asyncio.run(main())


def _raise(exc: BaseException) -> None:
    raise exc


def test_a_call_cancelled_before_its_thread_took_it_never_runs() -> None:
    ran: list[str] = []
    release = threading.Event()

    async def main() -> None:
        with ThreadPoolExecutor(1) as pool:  # one thread, held by the first call
            first = asyncio.ensure_future(in_thread(pool, release.wait, 10))
            await asyncio.sleep(0.05)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(in_thread(pool, ran.append, "second"), 0.05)
            release.set()
            assert await first is True
            # the thread is free again: a later call runs
            await in_thread(pool, ran.append, "third")
        assert ran == ["third"]

    asyncio.run(main())
