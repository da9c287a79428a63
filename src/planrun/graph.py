"""The dependency graph of a plan, on :class:`graphlib.TopologicalSorter`.

``depends_on`` alone orders execution; the order steps are written in breaks ties between
steps ready at the same moment, so runs are deterministic (SPEC §3).
"""

from __future__ import annotations

import graphlib
import heapq
from collections.abc import Iterable, Iterator, Mapping, Sequence


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




#: The most steps the ancestry questions of one plan's check may walk
#: (:class:`Ancestry`). A plain walk per question is linear in the graph, and a plan of N
#: steps each reading a far ancestor asks N of them (a 16,000-step chain whose every step
#: read the first took 23 s in ``validate``): the walks remember what they learnt, which
#: makes the usual shapes constant time per question, and this bounds the rest.
MAX_ANCESTRY_WALK = 2_000_000
#: Steps walked for one step's questions before its ancestors are gathered once instead.
_GATHER_AFTER = 256


class AncestryTooLarge(Exception):
    """The ancestry questions of one graph walked past :data:`MAX_ANCESTRY_WALK` steps."""


class Ancestry:
    """Answers "does ``step`` depend on ``candidate``, directly or not?" for one graph.

    The walk for a question goes no lower than the candidate's depth (a step can only
    depend on a step of a smaller depth), and remembers, per candidate, the steps it
    found to depend on it and those it found not to: each step is walked at most once per
    candidate, and a later question stops where an earlier one found its answer (every
    step reading the first step's output, or its grandparent's, is answered at once).
    A step that keeps asking about different far-away candidates has its ancestors
    gathered once and answered from them.

    Args:
        deps: step id → the ids it depends on (existing ids only; the graph acyclic).
        budget: the most steps all questions may walk.

    Raises (from :meth:`depends`):
        AncestryTooLarge: the walks went past ``budget``.
    """

    def __init__(self, deps: Mapping[str, Sequence[str]],
                 budget: int = MAX_ANCESTRY_WALK) -> None:
        self._deps = deps
        self._budget = self._left = budget
        self._depth: dict[str, int] | None = None
        self._yes: dict[str, set[str]] = {}
        self._no: dict[str, set[str]] = {}
        self._asking: str | None = None
        self._spent = 0
        self._gathered: set[str] | None = None

    @property
    def walked(self) -> int:
        """How many steps the questions asked so far have walked."""
        return self._budget - self._left

    def depends(self, step: str, candidate: str) -> bool:
        """True when ``step`` depends on ``candidate``, directly or not."""
        direct = self._deps.get(step, ())
        if candidate in direct:
            return True
        if step != self._asking:
            self._asking, self._spent, self._gathered = step, 0, None
        if self._gathered is not None:
            return candidate in self._gathered
        if self._spent > _GATHER_AFTER:
            self._gathered = self._gather(step)
            return candidate in self._gathered
        return self._walk(step, candidate)

    def more_than(self, step: str, most: int) -> bool:
        """Whether ``step`` depends on more than ``most`` steps, directly or not.

        The walk stops as soon as it knows; each dependency it follows counts.
        """
        seen: set[str] = set()
        stack: list[Iterator[str]] = [iter(self._deps.get(step, ()))]
        while stack:
            for sid in stack[-1]:
                self._charge(1)
                if sid not in seen:
                    seen.add(sid)
                    if len(seen) > most:
                        return True
                    stack.append(iter(self._deps.get(sid, ())))
                    break
            else:
                stack.pop()
        return False

    def _depths(self) -> dict[str, int]:
        if self._depth is None:
            depth: dict[str, int] = {}
            for sid in graphlib.TopologicalSorter(
                    {k: list(v) for k, v in self._deps.items()}).static_order():
                depth[sid] = 1 + max((depth[d] for d in self._deps.get(sid, ())),
                                     default=-1)
            self._depth = depth
        return self._depth

    def _charge(self, n: int) -> None:
        self._left -= n
        self._spent += n
        if self._left < 0:
            raise AncestryTooLarge(
                "checking which steps the plan's placeholders and conditions may read "
                f"walked more than {MAX_ANCESTRY_WALK:,} steps of its graph")

    def _gather(self, step: str) -> set[str]:
        out: set[str] = set()
        frontier = list(self._deps.get(step, ()))
        while frontier:
            sid = frontier.pop()
            if sid not in out:
                out.add(sid)
                self._charge(1)
                frontier.extend(self._deps.get(sid, ()))
        return out

    def _walk(self, step: str, candidate: str) -> bool:
        depth = self._depths()
        floor = depth.get(candidate, 0)
        yes = self._yes.setdefault(candidate, set())
        no = self._no.setdefault(candidate, set())
        if step in yes:
            return True
        if step in no or depth.get(step, 0) <= floor:
            return False
        deps = self._deps
        # depth-first: a step is known not to lead to the candidate once all it depends
        # on is; on the way to the candidate, every step on the stack leads to it
        stack: list[tuple[str, Iterator[str]]] = [(step, iter(deps.get(step, ())))]
        on_stack = {step}
        while stack:
            _sid, it = stack[-1]
            for dep in it:
                if dep == candidate or dep in yes:
                    yes.update(on_stack)
                    return True
                if dep in no or dep in on_stack or depth.get(dep, 0) <= floor:
                    continue
                self._charge(1)
                stack.append((dep, iter(deps.get(dep, ()))))
                on_stack.add(dep)
                break
            else:
                done, _it = stack.pop()
                on_stack.discard(done)
                no.add(done)
        return False
