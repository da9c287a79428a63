"""Crash/adversary suite: SIGKILL of planrun **alone** during command calls (SPEC §12).

Unlike the crash matrix (which uses the test seam, at planrun's own points), here the
adversary is outside: ``os.kill(planrun_pid, SIGKILL)`` — never the process group — while
a command tool is running, at two moments of the call:

- ``waiting``: the command started and waits, before its effect;
- ``effect``: its effect is done (logged) and it still runs.

The operator recovers with the CLI only, as the messages say: ``resume``; on
``indeterminate``, ``resolve`` each named step from the effects log (``--succeeded
--output`` when the call's effect is logged, ``--failed`` when not); a run that then ends
``failed`` is continued with ``retry``; ``run_busy`` (a call of the dead planrun still
being ended) is waited out. The files the killed call waits for are created only once the
operator's next command started a call (after ``resolve`` settled the killed call from
the log): a copy of the call that outlived planrun would then do its effect after it was
settled as not done (a second line in the effects log), and, as each command holds a lock
while it runs, a copy running beside the resumed one logs an ``overlap`` line.

The plan chains three command tools: ``a`` idempotent (its effect is done once per
idempotency key, as an idempotent tool's is), ``b`` not idempotent, ``c`` not idempotent
with its effect done by a child process in the command's group (a grandchild of
planrun), then a fan-out ``f`` of a non-idempotent command over three items, two at once.

Every scenario ends with: the last run ``completed``, each effect exactly once, no
overlap, nothing left in ``call_groups``, ``PRAGMA integrity_check`` ok.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

import pytest

from planrun_cli import CliProject, Result, resolve_targets
from test_procs import TOOLS, kill_alone, overlaps

pytestmark = pytest.mark.slow

PLAN = """
planrun: 1
goal: Command calls killed from outside
max_parallel: 2
steps:
  - {id: a, tool: idem_cmd, arguments: {file: go-a, after: after-a}}
  - {id: b, tool: once_cmd, depends_on: [a], arguments: {file: go-b, after: after-b}}
  - {id: c, tool: once_tree, depends_on: [b], arguments: {file: go-c, after: after-c}}
  - id: f
    tool: once_cmd
    depends_on: [c]
    for_each: [0, 1, 2]
    max_parallel: 2
    arguments: {file: "go-f{item}", after: "after-f{item}"}
"""

#: Effects in plan order (fan-out items as ``f#N``).
EFFECTS = ["a", "b", "c", "f#0", "f#1", "f#2"]
#: The files each effect waits for (before its effect, after it).
FILES = {e: (f"go-{e.replace('#', '')}", f"after-{e.replace('#', '')}") for e in EFFECTS}
#: Operator rounds before a scenario is declared stuck (a hang guard).
MAX_ROUNDS = 30


@pytest.fixture
def proj(cli: CliProject) -> CliProject:
    cli.tools(TOOLS)
    cli.plan("chain", PLAN)
    return cli


def release(proj: CliProject, effects: list[str]) -> None:
    for e in effects:
        for name in FILES[e]:
            proj.touch(name)


def effect_logged(proj: CliProject, run: str, effect: str) -> dict[str, Any] | None:
    """The call line of ``effect`` in ``run``, if its call did its effect."""
    for line in proj.calls(effect):
        if line["run"] == run:
            return line
    return None


def settle(proj: CliProject, r: Result) -> None:
    """Resolve each step an ``indeterminate`` names, from the effects log."""
    targets = resolve_targets(r)
    assert targets, r
    for run, step, item in targets:
        effect = step if item is None else f"{step}#{item}"
        found = effect_logged(proj, run, effect)
        where = [] if item is None else ["--item", str(item)]
        if found is not None:
            args = ["--succeeded", "--output", json.dumps(found["output"])]
        else:
            args = ["--failed", "--reason", "no effect in the log"]
        done = proj.run("resolve", run, step, *where, *args)
        assert done.returncode == 0, done


def next_command(proj: CliProject, run_id: str, used: list[str]
                 ) -> tuple[str, ...] | None:
    """What the operator runs next to continue ``run_id``; None when it completed.

    Settles what ``resume`` stops on, waits out ``run_busy``, retries a failed run.
    """
    for _ in range(MAX_ROUNDS):
        ex = proj.run("resume", "--explain", "--json", run_id)
        if ex.error_code == "run_not_resumable":
            status = proj.run("status", run_id, "--json").json["status"]
            if status == "completed":
                return None
            assert status == "failed", ex
            return ("retry", run_id, "--json")
        assert ex.returncode == 0, ex
        if not ex.json["would_stop"]:
            return ("resume", run_id, "--json")
        r = proj.run("resume", run_id, "--json")
        used.append(f"resume:{r.returncode}:{r.error_code}")
        if r.error_code == "run_busy":
            time.sleep(0.2)  # a call of the dead planrun is still being ended
        elif r.error_code == "indeterminate":
            settle(proj, r)
        elif r.returncode not in (0, 1):
            raise AssertionError(f"unexpected outcome:\n{r}")
    raise AssertionError(f"stuck after {MAX_ROUNDS} rounds: {used}")


def latest_run(proj: CliProject) -> str:
    return str(proj.probe().run_ids()[0])


def kill_at_next_blocked_call(proj: CliProject, args: tuple[str, ...], released: set[str],
                              moment: str, late: list[str]) -> str | None:
    """Run ``args``; SIGKILL planrun alone once a call waits on files not yet released.

    ``late``: effects killed before, whose files are released only now, once this command
    started a call (or ended): a copy that outlived the earlier planrun would run beside
    the new one (an ``overlap``) or do its effect after the operator settled it as failed.
    With ``moment == "effect"`` the call is first let do its effect (it then waits for its
    second file). Returns the effect killed during, or None when the command ended first.
    """
    seen = len(proj.entries())
    p = proj.start(*args)
    deadline = time.monotonic() + 60
    target = None
    while target is None:
        fresh = proj.entries()[seen:]
        if late and (fresh or p.poll() is not None):
            release(proj, late)
            late.clear()
        for e in fresh:
            if e["event"] == "start" and e["effect"] not in released:
                target = e
                break
        else:
            if p.poll() is not None:
                return None
            assert time.monotonic() < deadline, "no call started"
            time.sleep(0.02)
    if moment == "effect":
        proj.touch(FILES[target["effect"]][0])
        while not any(e["event"] == "done" and e["pid"] == target["pid"]
                      for e in proj.entries()):
            assert p.poll() is None, proj.output_of(p)
            assert time.monotonic() < deadline, f"{target} never did its effect"
            time.sleep(0.02)
    kill_alone(p)
    return str(target["effect"])


def drive_with_kills(proj: CliProject, moments: list[str], released: set[str] | None = None
                     ) -> list[str]:
    """Kill planrun alone at each call that blocks, one kill per moment, then finish.

    After each kill the killed call's files are released (a surviving copy would go on).
    Returns the effects killed during.
    """
    released = set(released or ())
    release(proj, sorted(released))
    killed: list[str] = []
    used: list[str] = []
    args: tuple[str, ...] | None = ("execute", "chain", "--json")
    run_id: str | None = None
    pending = list(moments)
    late: list[str] = []
    for _ in range(MAX_ROUNDS):
        if not pending or args is None:
            break
        effect = kill_at_next_blocked_call(proj, args, released, pending[0], late)
        run_id = latest_run(proj)  # a retry's child run, once there is one
        if effect is not None:
            killed.append(f"{effect}@{pending.pop(0)}")
            late.append(effect)
            released.add(effect)
        args = next_command(proj, run_id, used)
    assert run_id is not None
    if args is not None and late:
        # the next command runs while the killed call's files appear (see the docstring)
        p = proj.start(*args)
        seen = len(proj.entries())
        deadline = time.monotonic() + 60
        while len(proj.entries()) == seen and p.poll() is None:
            assert time.monotonic() < deadline, "no call started"
            time.sleep(0.02)
        release(proj, late)
        release(proj, EFFECTS)
        r = proj.finish(p)
        used.append(f"{args[0]}:{r.returncode}:{r.error_code}")
        run_id = latest_run(proj)
    release(proj, EFFECTS)
    while (args := next_command(proj, run_id, used)) is not None:
        r = proj.run(*args)
        used.append(f"{args[0]}:{r.returncode}:{r.error_code}")
        run_id = latest_run(proj)
    assert proj.run("status", run_id, "--json").json["status"] == "completed", used
    return killed


def final_checks(proj: CliProject) -> None:
    assert proj.counts() == dict.fromkeys(EFFECTS, 1), proj.entries()
    assert overlaps(proj) == [], overlaps(proj)
    assert proj.probe().calls() == []
    assert proj.integrity() == "ok"


@pytest.mark.parametrize("moment", ["waiting", "effect"])
@pytest.mark.parametrize("target", ["a", "b", "c", "f"])
def test_one_kill_of_planrun_alone(proj: CliProject, target: str, moment: str) -> None:
    first = EFFECTS.index(target if target != "f" else "f#0")
    killed = drive_with_kills(proj, [moment], set(EFFECTS[:first]))
    assert len(killed) == 1, killed
    # fan-out items start two at once: the kill hits whichever started first
    assert killed[0].partition("@")[0].partition("#")[0] == target, killed
    assert killed[0].endswith(f"@{moment}")
    final_checks(proj)


@pytest.mark.parametrize("seed", [1, 2])
def test_a_kill_of_planrun_alone_at_every_call(proj: CliProject, seed: int) -> None:
    """One run; planrun is killed alone at every call that starts, at random moments."""
    rng = random.Random(seed)
    killed = drive_with_kills(proj, [rng.choice(["waiting", "effect"]) for _ in EFFECTS])
    assert len(killed) == len(EFFECTS), killed
    final_checks(proj)
