"""The executor, in parts: scheduling, steps, fan-out, attempts (SPEC §5).

``scheduler`` (the :class:`Executor` and its loop, signals, lease), ``steps`` (one step
from ready to settled), ``fanout`` (``for_each`` items), ``attempts`` (record, call,
record, retries), ``common`` (what they share). Calls are made by a
:mod:`planrun.dispatch` dispatcher.
"""
