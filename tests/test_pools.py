"""Concurrency pools (SPEC §1 ``[pools]``): a pool bounds the calls running at once across
the run, fan-out items included. Proven by counting calls inside at the same moment (a
counter under a file lock), not by timing."""

from __future__ import annotations

import json

import pytest

from conftest import Project, by_step, execute_plan

MODULE = '''
import fcntl, json, os, time

def _bump(delta):
    """Add delta to the calls inside (0: just read), under the lock; return the state."""
    path = os.path.join(os.environ["POOL_DIR"], "inside.json")
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = json.load(open(path)) if os.path.exists(path) else {"now": 0, "max": 0}
        state["now"] += delta
        state["max"] = max(state["max"], state["now"])
        json.dump(state, open(path, "w"))
        return state

def use(name):
    _bump(1)
    time.sleep(0.05)
    _bump(-1)
    return name

def wait_all(name, parties):
    state = _bump(1)
    deadline = time.monotonic() + 10
    while state["max"] < parties and time.monotonic() < deadline:
        time.sleep(0.01)
        state = _bump(0)  # read under the lock: a write is never seen half done
    _bump(-1)
    if state["max"] < parties:
        raise TimeoutError(f"only {state['max']} of {parties} were inside at once")
    return name
'''

TOOLS = """
tools:
  use_db:
    python: pooltools:use
    pool: db
    idempotent: true
    arguments: {type: object, properties: {name: {type: string}}, required: [name],
                additionalProperties: false}
  use_free:
    python: pooltools:wait_all
    idempotent: true
    arguments: {type: object, properties: {name: {type: string}, parties: {type: integer}},
                required: [name, parties], additionalProperties: false}
"""


def _project(project: Project, pool_size: int) -> Project:
    project.write_config(f"[pools]\ndb = {pool_size}\n")
    project.write_tools(TOOLS, module=MODULE, module_name="pooltools")
    return project


def _max_inside(project: Project) -> int:
    return int(json.loads((project.root / "inside.json").read_text())["max"])


def test_a_pool_of_one_serialises_steps_and_fan_out_items(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POOL_DIR", str(project.root))
    _project(project, 1)
    project.write_plan("p", """
        planrun: 1
        goal: Four writers to one database
        steps:
          - {id: a, tool: use_db, arguments: {name: a}}
          - {id: b, tool: use_db, arguments: {name: b}}
          - id: many
            tool: use_db
            for_each: [x, y, z]
            arguments: {name: "{item}"}
        """)
    manifest = execute_plan(project, "p", max_parallel=4)
    assert manifest["status"] == "completed"
    assert _max_inside(project) == 1
    assert by_step(manifest)["many"]["items"] == {"total": 3, "succeeded": 3, "failed": 0}


def test_a_step_level_pool_bounds_calls_that_otherwise_overlap(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POOL_DIR", str(project.root))
    _project(project, 2)
    # without a pool the three calls must all be inside at once (else they time out)
    project.write_plan("free", """
        planrun: 1
        goal: Three calls that must overlap
        steps:
          - {id: a, tool: use_free, arguments: {name: a, parties: 3}}
          - {id: b, tool: use_free, arguments: {name: b, parties: 3}}
          - {id: c, tool: use_free, arguments: {name: c, parties: 3}}
        """)
    assert execute_plan(project, "free", max_parallel=3)["status"] == "completed"
    (project.root / "inside.json").unlink()
    # the same tool under a step-level pool of 2: two meet inside, a third never joins
    project.write_plan("pooled", """
        planrun: 1
        goal: Three calls, at most two at once
        steps:
          - {id: a, tool: use_free, pool: db, arguments: {name: a, parties: 2}}
          - {id: b, tool: use_free, pool: db, arguments: {name: b, parties: 2}}
          - {id: c, tool: use_free, pool: db, arguments: {name: c, parties: 2}}
        """)
    manifest = execute_plan(project, "pooled", max_parallel=3)
    assert manifest["status"] == "completed"
    assert _max_inside(project) == 2
