"""planrun.graph: run order, cycles, ancestry — checked on random DAGs against brute force."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planrun.graph import find_cycle, is_ancestor, run_order


@dataclass
class Dag:
    """A random DAG: ``topo`` is a topological order, ``written`` the order in the file."""

    topo: list[str]
    written: list[str]
    deps: dict[str, list[str]]


#: Step ids to draw from; a random permutation keeps ids unrelated to written order.
POOL = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "x-1", "y_2", "Z", "m0"]


@st.composite
def dags(draw: st.DrawFn, min_nodes: int = 1, max_nodes: int = 12) -> Dag:
    n = draw(st.integers(min_nodes, max_nodes))
    ids = draw(st.permutations(POOL))[:n]
    deps: dict[str, list[str]] = {}
    for j, sid in enumerate(ids):
        # edges only from a lower index to a higher one: acyclic by construction
        mask = draw(st.integers(0, (1 << j) - 1))
        deps[sid] = [ids[i] for i in range(j) if mask >> i & 1]
    written = draw(st.permutations(ids))
    # the mapping is built in written order, as validation does
    return Dag(topo=ids, written=list(written), deps={s: deps[s] for s in written})


def closure(deps: dict[str, list[str]]) -> dict[str, set[str]]:
    """step → every step it depends on, directly or not (brute force fixpoint)."""
    anc = {s: set(d) for s, d in deps.items()}
    changed = True
    while changed:
        changed = False
        for s in anc:
            grown = set(anc[s])
            for d in anc[s]:
                grown |= anc.get(d, set())
            if grown != anc[s]:
                anc[s] = grown
                changed = True
    return anc


def reference_order(written: list[str], deps: dict[str, list[str]]) -> list[str]:
    """One-at-a-time dispatch: always the earliest-written step whose dependencies are done."""
    done: list[str] = []
    left = list(written)
    while left:
        ready = next(s for s in left if all(d in done for d in deps[s]))
        done.append(ready)
        left.remove(ready)
    return done


@given(dags())
def test_run_order_respects_every_dependency(dag: Dag) -> None:
    order = run_order(dag.written, dag.deps)
    assert sorted(order) == sorted(dag.written)
    position = {s: i for i, s in enumerate(order)}
    for step, deps in dag.deps.items():
        for dep in deps:
            assert position[dep] < position[step], (dep, step)


@given(dags())
def test_run_order_breaks_ties_by_written_order(dag: Dag) -> None:
    assert run_order(dag.written, dag.deps) == reference_order(dag.written, dag.deps)


@given(dags())
def test_no_dependencies_means_written_order(dag: Dag) -> None:
    free = {s: [] for s in dag.written}
    assert run_order(dag.written, free) == dag.written


@given(dags())
def test_acyclic_graph_has_no_cycle(dag: Dag) -> None:
    assert find_cycle(dag.deps) is None


@st.composite
def dags_with_back_edge(draw: st.DrawFn) -> tuple[Dag, str, str]:
    dag = draw(dags(min_nodes=2))
    anc = closure(dag.deps)
    pairs = [(low, high) for high in dag.topo for low in anc[high]]
    if not pairs:  # make one edge so that a back edge can close a loop
        low, high = dag.topo[0], dag.topo[-1]
        dag.deps[high] = [*dag.deps[high], low]
        pairs = [(low, high)]
    low, high = draw(st.sampled_from(pairs))
    return dag, low, high


@given(dags_with_back_edge())
def test_back_edge_gives_a_closed_path_of_real_edges(case: tuple[Dag, str, str]) -> None:
    dag, low, high = case
    deps = {s: list(d) for s, d in dag.deps.items()}
    deps[low].append(high)  # high already depends on low (transitively): now a loop
    cycle = find_cycle(deps)
    assert cycle is not None
    assert len(cycle) >= 3
    assert cycle[0] == cycle[-1]
    assert len(set(cycle[:-1])) == len(cycle) - 1, "a cycle visits each step once"
    pairs = list(itertools.pairwise(cycle))
    # Every consecutive pair is an edge, all in the same direction.
    waits = all(b in deps[a] for a, b in pairs)        # a waits on b
    feeds = all(a in deps[b] for a, b in pairs)        # b waits on a
    assert waits or feeds, (cycle, deps)
    assert low in cycle
    assert high in cycle


def test_self_loop_is_a_cycle() -> None:
    assert find_cycle({"a": ["a"]}) == ["a", "a"]


def test_three_step_cycle_is_named_completely() -> None:
    deps = {"a": ["c"], "b": ["a"], "c": ["b"], "d": []}
    cycle = find_cycle(deps)
    assert cycle is not None
    assert sorted(cycle[:-1]) == ["a", "b", "c"]
    assert "d" not in cycle


@given(dags())
def test_is_ancestor_agrees_with_the_transitive_closure(dag: Dag) -> None:
    anc = closure(dag.deps)
    for step in dag.written:
        for candidate in dag.written:
            assert is_ancestor(candidate, step, dag.deps) == (candidate in anc[step]), (
                candidate, step)


def test_run_order_example_diamond_and_tie_break() -> None:
    # written: z, b, a, c; a and b are ready together after z: b is written first.
    deps = {"z": [], "b": ["z"], "a": ["z"], "c": ["a", "b"]}
    assert run_order(["z", "b", "a", "c"], deps) == ["z", "b", "a", "c"]
    # a step written first but waiting on a later one runs after it
    assert run_order(["late", "first"], {"late": ["first"], "first": []}) == ["first", "late"]


def test_is_ancestor_is_strict_and_tolerates_unknown_ids() -> None:
    deps = {"a": [], "b": ["a"]}
    assert is_ancestor("a", "b", deps)
    assert not is_ancestor("b", "a", deps)
    assert not is_ancestor("a", "a", deps)
    assert not is_ancestor("a", "missing", deps)


@pytest.mark.parametrize("deps", [{"a": ["b"], "b": ["a"]}, {"a": ["b"], "b": ["c"], "c": ["a"]}])
def test_is_ancestor_terminates_on_cycles(deps: dict[str, list[str]]) -> None:
    assert is_ancestor("a", "b", deps)
    assert not is_ancestor("zz", "a", deps)


# --- the checked plan hands validation's prepared graph to one run ----------------------


def _checked_plan(basic_project: Any) -> Any:
    report, plan = basic_project.check("""
        planrun: 1
        goal: a diamond
        steps:
          - {id: d, tool: echo, depends_on: [b, c], arguments: {value: d}}
          - {id: c, tool: echo, depends_on: [a], arguments: {value: c}}
          - {id: b, tool: echo, depends_on: [a], arguments: {value: b}}
          - {id: a, tool: echo, arguments: {value: a}}
        """)
    assert report.ok, report.issues
    assert plan is not None
    return plan


def _walk(sorter: Any) -> list[str]:
    out: list[str] = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready())
        out.extend(ready)
        sorter.done(*ready)
    return out


def test_validation_hands_its_prepared_graph_to_the_first_run_only(basic_project: Any
                                                                   ) -> None:
    plan = _checked_plan(basic_project)
    first = plan.take_sorter()
    assert _walk(first) == ["a", "b", "c", "d"]
    # the first was used up: a second run gets a new sorter over the same graph, prepared
    second = plan.take_sorter()
    assert second is not first
    assert _walk(second) == ["a", "b", "c", "d"]
    assert plan.take_sorter() is not second


def test_a_copied_plan_does_not_share_the_graph_of_its_original(basic_project: Any) -> None:
    import dataclasses

    plan = _checked_plan(basic_project)
    copy = dataclasses.replace(plan)
    assert _walk(copy.take_sorter()) == ["a", "b", "c", "d"]
    assert _walk(plan.take_sorter()) == ["a", "b", "c", "d"]


def test_a_plan_with_a_cycle_gets_no_graph_from_prepared_graph() -> None:
    from planrun.graph import prepared_graph

    sorter, cycle = prepared_graph({"a": ["b"], "b": ["a"]})
    assert sorter is None
    assert cycle is not None
    assert cycle[0] == cycle[-1]
    sorter, cycle = prepared_graph({"a": [], "b": ["a"]})
    assert cycle is None
    assert sorter is not None
    assert _walk(sorter) == ["a", "b"]
