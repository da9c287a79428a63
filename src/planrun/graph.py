"""The dependency graph of a plan, on :class:`graphlib.TopologicalSorter`.

``depends_on`` alone orders execution; the order steps are written in breaks ties between
steps ready at the same moment, so runs are deterministic (SPEC §3).
"""

from __future__ import annotations

import graphlib
import heapq
from collections.abc import Iterable, Mapping, Sequence


def find_cycle(deps: Mapping[str, Iterable[str]]) -> list[str] | None:
    """A cycle as a closed path ``[a, b, a]``, or None when the graph is acyclic.

    ``deps`` maps each step id to the ids it depends on (only existing ids).
    """
    return prepared_graph(deps)[1]


def prepared_graph(deps: Mapping[str, Iterable[str]]
                   ) -> tuple[graphlib.TopologicalSorter[str] | None, list[str] | None]:
    """The graph's prepared :class:`graphlib.TopologicalSorter`, or the cycle that stops it.

    Returns ``(sorter, None)`` when the graph is acyclic, else ``(None, cycle)`` with the
    cycle as :func:`find_cycle` gives it. Building and preparing the sorter is the whole
    cost of finding a cycle (linear in steps and edges), and the run's scheduler needs
    exactly that sorter: validation hands it on
    (:meth:`planrun.validation.CheckedPlan.take_sorter`).
    """
    sorter = graphlib.TopologicalSorter({k: list(v) for k, v in deps.items()})
    try:
        sorter.prepare()
    except graphlib.CycleError as exc:
        # graphlib lists the path against the edges (node, its dependency, ...);
        # we name it in waiting order: "a -> b" reads "a waits on b".
        return None, list(exc.args[1])
    return sorter, None


def run_order(order: Sequence[str], deps: Mapping[str, Iterable[str]]) -> list[str]:
    """All step ids in the order a one-at-a-time run dispatches them.

    Args:
        order: step ids in the order written (tie-break).
        deps: step id → ids it depends on; must be acyclic.
    """
    position = {sid: i for i, sid in enumerate(order)}
    sorter = graphlib.TopologicalSorter({k: list(v) for k, v in deps.items()})
    sorter.prepare()
    out: list[str] = []
    ready = ReadyQueue(position)
    while sorter.is_active():
        ready.add(sorter.get_ready())
        sid = ready.pop()
        out.append(sid)
        sorter.done(sid)
    return out


class ReadyQueue:
    """Steps ready to run, taken in the order they are written (SPEC §3 tie-break).

    Args:
        position: step id → its index in the plan (the order written).
    """

    __slots__ = ("_heap", "_position")

    def __init__(self, position: Mapping[str, int]) -> None:
        self._position = position
        self._heap: list[tuple[int, str]] = []

    def add(self, ready: Iterable[str]) -> None:
        """Queue step ids that became ready (``TopologicalSorter.get_ready()``)."""
        for sid in ready:
            heapq.heappush(self._heap, (self._position[sid], sid))

    def pop(self) -> str:
        """The ready step written first; IndexError when none is queued."""
        return heapq.heappop(self._heap)[1]

    def __bool__(self) -> bool:
        return bool(self._heap)


def ancestors(step: str, deps: Mapping[str, Iterable[str]]) -> set[str]:
    """Every step id that ``step`` depends on, directly or not (itself excluded)."""
    out: set[str] = set()
    frontier = list(deps.get(step, ()))
    while frontier:
        sid = frontier.pop()
        if sid not in out:
            out.add(sid)
            frontier.extend(deps.get(sid, ()))
    return out


def is_ancestor(candidate: str, step: str, deps: Mapping[str, Iterable[str]]) -> bool:
    """True when ``step`` depends on ``candidate``, directly or not.

    A breadth-first walk up from ``step``; cheap for the direct case, linear at worst.
    """
    direct = deps.get(step, ())
    if candidate in direct:
        return True
    seen = {step}
    frontier = list(direct)
    while frontier:
        nxt: list[str] = []
        for sid in frontier:
            if sid == candidate:
                return True
            if sid in seen:
                continue
            seen.add(sid)
            nxt.extend(deps.get(sid, ()))
        frontier = nxt
    return False


