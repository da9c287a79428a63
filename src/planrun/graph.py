"""The dependency graph of a plan, on :class:`graphlib.TopologicalSorter`.

``depends_on`` alone orders execution; the order steps are written in breaks ties between
steps ready at the same moment, so runs are deterministic (SPEC §3).
"""

from __future__ import annotations

import graphlib
from collections.abc import Iterable, Mapping, Sequence


def find_cycle(deps: Mapping[str, Iterable[str]]) -> list[str] | None:
    """A cycle as a closed path ``[a, b, a]``, or None when the graph is acyclic.

    ``deps`` maps each step id to the ids it depends on (only existing ids).
    """
    sorter = graphlib.TopologicalSorter({k: list(v) for k, v in deps.items()})
    try:
        sorter.prepare()
    except graphlib.CycleError as exc:
        cycle = list(exc.args[1])
        # graphlib lists the path against the edges (node, its dependency, ...);
        # we name it in waiting order: "a -> b" reads "a waits on b".
        return cycle
    return None


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
    import heapq

    heap: list[tuple[int, str]] = []
    while sorter.is_active():
        for sid in sorter.get_ready():
            heapq.heappush(heap, (position[sid], sid))
        _pos, sid = heapq.heappop(heap)
        out.append(sid)
        sorter.done(sid)
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


