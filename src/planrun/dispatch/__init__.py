"""Dispatchers: what makes tool calls for the scheduler (SPEC §12).

``base`` (the :class:`Call` description and the :class:`Dispatcher` seam), ``local``
(threads and child processes of this process) and ``scripted`` (outcomes given in
advance, for tests).
"""

from .base import CALL_LOST, Call, CallLost, Dispatcher, Watch

__all__ = ["CALL_LOST", "Call", "CallLost", "Dispatcher", "Watch"]
