"""The seam between the scheduler and whatever runs a tool call (SPEC §12).

The scheduler (:mod:`planrun.execution`) keeps the DAG, the journal, retries and timeouts;
a :class:`Dispatcher` only makes one call at a time when asked. What it is asked is a
:class:`Call`: plain data (the tool by name, the arguments, the step context, the timeout,
the secrets to mask) that can be pickled and sent to another process or host, so a second
dispatcher (a cluster) is an addition, not a change to the scheduler.

How a call ends, as the dispatcher reports it:

- it returns the tool's output (JSON data, not yet checked against ``output_schema``);
- :class:`~planrun.tools.ToolFailure` (``tool_error`` | ``exit_status`` | ``output`` |
  ``arguments``): the call ran and failed;
- :class:`~planrun.tools.CallTimeout`: it ran past ``Call.timeout`` seconds;
- :class:`CallLost`: the worker running it is gone — its effect is unknown, so the call
  is journaled ``indeterminate`` (code ``call_lost``), as one left running by a crash;
- :class:`asyncio.CancelledError`: the scheduler cancelled it (signals, the run's timeout,
  a lost lease).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..procs import Group
from ..redact import Secrets
from ..tools import StepContext

#: The journaled error ``code`` of a call whose worker was lost.
CALL_LOST = "call_lost"


@dataclass(frozen=True)
class Call:
    """One tool call to make, as data (picklable: it may cross to another process).

    Attributes:
        tool: the tool's name in the registry (the dispatcher finds the tool by it).
        arguments: the arguments to call with (values, secrets revealed).
        context: run, step, item, idempotency key and attempt (:func:`planrun.context`).
        timeout: seconds the call may run, or None.
        secrets: the secrets to mask in what the call says back (errors, stderr).
    """

    tool: str
    arguments: dict[str, Any]
    context: StepContext
    timeout: float | None
    secrets: Secrets = field(default_factory=lambda: Secrets({}))

    @property
    def where(self) -> str:
        """``STEP`` or ``STEP#ITEM``: how the call is named in messages."""
        ctx = self.context
        return ctx.step_id if ctx.item_index is None else f"{ctx.step_id}#{ctx.item_index}"


class CallLost(Exception):
    """The worker running the call is gone (it died, or its host did): effect unknown."""


@dataclass(eq=False)
class Watch:
    """What a dispatcher reports while a call runs (all optional, called on the loop).

    Attributes:
        started: a command's process group started (journaled as a running call).
        ended: that group's leader was reaped.
        stderr: the masked tail of what a call that succeeded wrote on stderr.
        signalled: a SIGINT or SIGTERM the process took while the call held the loop's
            thread (:mod:`planrun.dispatch.inline`), to handle as the loop would have,
            with the seconds since it came; reported before the call's end is.
    """

    started: Callable[[Group], None] | None = None
    ended: Callable[[Group], None] | None = None
    stderr: Callable[[str], None] | None = None
    signalled: Callable[[int, float], None] | None = None


class Dispatcher(abc.ABC):
    """Makes tool calls for one run. Subclasses: local threads and processes, scripts.

    Use: ``with dispatcher.session(secrets): ... await dispatcher.call(call, watch) ...``
    (the session is entered outside the event loop, the calls are made on it).
    """

    #: Calls left running out of reach after a cancel or a timeout (python threads).
    abandoned: int = 0

    @contextlib.contextmanager
    def session(self, secrets: Secrets) -> Iterator[None]:
        """The surroundings calls need while the run is driven (none by default)."""
        yield

    @abc.abstractmethod
    async def call(self, call: Call, watch: Watch) -> Any:
        """Make the call once; returns its output.

        Raises:
            ToolFailure: the call failed. CallTimeout: it ran past its timeout.
            CallLost: the worker running it is gone.
        """

    def abandons(self, call: Call) -> bool:
        """True when a cancelled or timed-out ``call`` may go on running out of reach."""
        return False

    def end_all(self) -> None:  # noqa: B027 - optional
        """From any thread: end every call running now (the run's lease was lost)."""
