"""Crash safety (SPEC §7, principle 5): SIGKILL at every step, item and crash point.

The real ``planrun`` process is killed by its test-only seam ``PLANRUN_TEST_CRASH`` at each
``dispatch`` (the dispatch record committed, the tool not called yet), ``call`` (the tool
returned, its outcome not recorded yet) and ``outcome`` (the outcome committed) of every
step and every fan-out item of one plan, which mixes:

- ``prep``: an idempotent python tool whose output is the run-time list fanned out over;
- ``fan``: a non-idempotent python tool over 3 items (items run concurrently);
- ``shell``: a non-idempotent command tool;
- ``idemcmd``: an idempotent command tool;
- ``danger``: an irreversible python tool (cleared with ``--approve-all``) that takes the
  outputs of ``fan`` and ``shell`` as arguments.

After each kill a careful operator recovers with the CLI only: ``planrun resume --json
--approve-all``; when resume stops with ``indeterminate`` (exit 5) the operator reads the
effects log and settles each named step/item: ``--succeeded --output <what the call
returned>`` when the log shows the call happened, ``--failed`` when it does not; a run
that then ends ``failed`` (a step settled as failed) is continued with ``planrun retry``.
This repeats until a run completes.

**How the counting is exact.** Each tool call appends one fsync'd line to the effects log
before it returns, so at a kill the log says exactly which calls happened. Then:

- a non-idempotent step/item happens exactly once: resume never calls it again on its own
  (it stops with ``indeterminate``), the operator settles it from the log, and a call
  settled as failed (no line) is then really made exactly once by the retry;
- an idempotent step killed at ``dispatch`` was not called (1 line after the rerun); killed
  at ``outcome`` its success is journaled and replayed (1 line); killed at ``call`` it was
  called but its success was not journaled, so resume calls it again under the same key
  (SPEC §7: that is what ``idempotent`` allows): 2 lines, both with the same key.
  Idempotent steps are alone in the plan's chain, so no other kill catches them mid-call.

So ``count(effect) == 1 + (kills at "call" of that effect when its tool is idempotent)``,
exactly. On top: a step or item the journal records as ``succeeded`` when a process is
killed is never called again (its count at that moment is its final count), the final run
is ``completed``, ``danger`` received the real outputs of ``fan`` and ``shell`` (also when
they were settled by hand), and ``PRAGMA integrity_check`` of the journal is ``ok``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from planrun.executor import CRASH_POINTS
from planrun_cli import CliProject, Result, resolve_targets

pytestmark = pytest.mark.slow

TOOLS = """
tools:
  idem:
    description: An idempotent python effect
    python: crashtools:record
    idempotent: true
    arguments:
      type: object
      properties:
        items: {type: array, items: {type: string}}
      required: [items]
      additionalProperties: false
  once:
    description: A python effect that must not happen twice
    python: crashtools:record
    arguments:
      type: object
      properties:
        value: {type: string}
        index: {type: integer}
      required: [value, index]
      additionalProperties: false
  cmd_once:
    description: A command effect that must not happen twice
    command: [{PY}, crashtools.py, record]
    output: json
    arguments:
      type: object
      properties:
        label: {type: string}
      additionalProperties: false
  cmd_idem:
    description: An idempotent command effect
    command: [{PY}, crashtools.py, record]
    output: json
    idempotent: true
    arguments:
      type: object
      properties:
        label: {type: string}
      additionalProperties: false
  danger:
    description: An effect that cannot be undone
    python: crashtools:record
    irreversible: true
    arguments:
      type: object
      properties:
        fan: {type: array}
        shell: {type: object}
      required: [fan, shell]
      additionalProperties: false
"""

PLAN = """
planrun: 1
goal: Mixed tools, a run-time fan-out and an irreversible last step
steps:
  - id: prep
    tool: idem
    arguments: {items: [x, y, z]}
  - id: fan
    tool: once
    depends_on: [prep]
    for_each: "{steps.prep.output.args.items}"
    arguments: {value: "{item}", index: "{index}"}
  - id: shell
    tool: cmd_once
    depends_on: [fan]
    arguments: {label: shell}
  - id: idemcmd
    tool: cmd_idem
    depends_on: [shell]
    arguments: {label: idemcmd}
  - id: danger
    tool: danger
    depends_on: [idemcmd]
    arguments: {fan: "{steps.fan.output}", shell: "{steps.shell.output}"}
"""

STEPS = ("prep", "fan", "shell", "idemcmd", "danger")
#: Every step, and every item of the fan-out (``STEP#N``), in run order.
TARGETS = ("prep", "fan#0", "fan#1", "fan#2", "shell", "idemcmd", "danger")
#: Targets whose tool is idempotent.
IDEMPOTENT = frozenset({"prep", "idemcmd"})

#: One process kill per test: every crash point of every target.
KILL_POINTS = [f"{point}:{target}" for target in TARGETS for point in CRASH_POINTS]
#: 7 targets x 3 crash points.
KILL_POINT_COUNT = 21

#: Two kills per test: the run dies, then the process recovering it dies too (a resume,
#: or a retry's child run), at a later point or at the very same one.
RECOVERY_KILLS = [
    ("call:prep", "call:prep"),          # idempotent, killed twice after its call: 3 calls
    ("dispatch:fan#1", "call:fan#2"),    # settle items, then die inside the fan-out again
    ("call:fan#0", "dispatch:danger"),   # settle an item, die before the irreversible call
    ("dispatch:shell", "dispatch:shell"),  # settled failed; the retry child dies there too
    ("call:shell", "call:idemcmd"),
    ("outcome:fan#2", "outcome:danger"),
]
RECOVERY_KILL_COUNT = 6
#: Process kills the module covers in all.
TOTAL_KILLS = KILL_POINT_COUNT + 2 * RECOVERY_KILL_COUNT


def _effect_of(step: str, item: int | None) -> str:
    return step if item is None else f"{step}#{item}"


class Operator:
    """Recovers a killed run with the CLI only, deciding from the effects log."""

    def __init__(self, cli: CliProject, kills: list[str]) -> None:
        self.cli = cli
        self.kills = list(kills)
        self.fired: list[str] = []
        #: effect -> its call count when the journal first recorded it as succeeded.
        self.frozen: dict[str, int] = {}
        self.settled: list[tuple[str, str]] = []
        self.transcript: list[str] = []

    def _run(self, *args: str) -> Result:
        crash = self.kills[0] if self.kills else None
        result = self.cli.run(*args, crash=crash)
        self.transcript.append(f"[crash={crash}] {result}")
        if result.returncode == -9:
            assert crash is not None, f"killed without a crash point:\n{result}"
            self.fired.append(self.kills.pop(0))
            self._freeze()
        return result

    def _freeze(self) -> None:
        """Note the call count of everything the journal now says succeeded."""
        counts = self.cli.counts()
        p = self.cli.probe()
        done: list[tuple[str, int | None]] = [
            (st.step_id, None) for st in p.steps()
            if st.status == "succeeded" and st.step_id != "fan"]
        done += [("fan", it.index) for it in p.items("fan")
                 if it.status == "succeeded"]
        for step, item in done:
            effect = _effect_of(step, item)
            self.frozen.setdefault(effect, counts[effect])

    def settle(self, result: Result) -> None:
        """Resolve every step/item an ``indeterminate`` names, from the effects log."""
        targets = resolve_targets(result)
        assert targets, f"indeterminate names no resolve command:\n{result}"
        for run_id, step, item in targets:
            effect = _effect_of(step, item)
            calls = self.cli.calls(effect)
            where = ["--item", str(item)] if item is not None else []
            if calls:
                args = ["--succeeded", "--output", json.dumps(calls[-1]["output"])]
            else:
                args = ["--failed", "--reason", "no effect in the log"]
            r = self.cli.run("resolve", run_id, step, *where, *args, "--json")
            self.transcript.append(str(r))
            assert r.returncode == 0, r
            self.settled.append((effect, args[0]))

    def recover(self) -> dict[str, Any]:
        """Execute (killed), then resume/resolve/retry until a run completes."""
        first = self._run("execute", "mixed", "--approve-all", "--json")
        assert first.returncode == -9, f"execute was not SIGKILLed:\n{first}"
        command: tuple[str, ...] = ("resume",)
        for _ in range(12):
            r = self._run(*command, "--approve-all", "--json")
            if r.returncode == -9:
                command = ("resume",)  # the newest running run: the one just killed
                continue
            if r.returncode == 5:
                assert r.error_code == "indeterminate", r
                self.settle(r)
                continue
            if r.returncode == 1:
                manifest = r.json
                assert manifest["status"] == "failed", r
                failed = {e for e, how in self.settled if how == "--failed"}
                assert failed & set(self._failed_effects(manifest)), r
                command = ("retry", manifest["run_id"])
                continue
            assert r.returncode == 0, r
            manifest = r.json
            assert manifest["status"] == "completed", r
            return manifest  # type: ignore[no-any-return]
        raise AssertionError("no completed run after 12 recoveries:\n"
                             + "\n".join(self.transcript))

    @staticmethod
    def _failed_effects(manifest: dict[str, Any]) -> list[str]:
        """Effects of the failed steps of a manifest (``fan`` stands for its items)."""
        out = []
        for s in manifest["steps"]:
            if s["status"] == "failed":
                out.extend([f"fan#{i}" for i in range(3)] if s["id"] == "fan" else [s["id"]])
        return out


def _expected_counts(kills: list[str]) -> Counter[str]:
    expected = Counter({t: 1 for t in TARGETS})
    for kill in kills:
        point, target = kill.split(":")
        if point == "call" and target in IDEMPOTENT:
            expected[target] += 1
    return expected


@pytest.fixture
def mixed(cli: CliProject) -> CliProject:
    cli.tools(TOOLS)
    cli.plan("mixed", PLAN)
    return cli


def check_recovery(cli: CliProject, kills: list[str]) -> None:
    op = Operator(cli, kills)
    manifest = op.recover()
    story = "\n".join(op.transcript)
    assert op.fired == kills, f"not every kill point was reached:\n{story}"

    counts = cli.counts()
    assert counts == _expected_counts(kills), story
    for target in IDEMPOTENT:  # a repeated idempotent call reuses its key
        assert len({c["key"] for c in cli.calls(target)}) == 1, story
    for effect, count in op.frozen.items():
        assert count >= 1, f"{effect} journaled succeeded but never called:\n{story}"
        assert counts[effect] == count, f"{effect} ran again after it succeeded:\n{story}"

    assert manifest["counts"]["succeeded"] == len(STEPS), story
    assert [s["id"] for s in manifest["steps"]] == list(STEPS)
    fan, shell = cli.calls("fan#0") + cli.calls("fan#1") + cli.calls("fan#2"), cli.calls("shell")
    (danger_args,) = {json.dumps(c["output"]["args"], sort_keys=True)
                      for c in cli.calls("danger")}
    assert json.loads(danger_args) == {"fan": [c["output"] for c in fan],
                                       "shell": shell[0]["output"]}, story
    out = cli.probe().step("danger", manifest["run_id"]).output
    assert out == cli.calls("danger")[0]["output"]
    assert cli.integrity() == "ok"


def test_matrix_covers_every_step_item_and_point(
        mixed: CliProject, record_property: Callable[[str, object], None]) -> None:
    """The parametrization is every (target, point); a clean run has exactly TARGETS."""
    record_property("kill_points", TOTAL_KILLS)
    assert set(CRASH_POINTS) == {"dispatch", "call", "outcome"}
    # Every recovery kill names a real kill point of the matrix.
    assert {k for pair in RECOVERY_KILLS for k in pair} <= set(KILL_POINTS)
    print(f"crash matrix: {KILL_POINT_COUNT} single kill points + {RECOVERY_KILL_COUNT} "
          f"double kills = {TOTAL_KILLS} process kills")
    r = mixed.run("execute", "mixed", "--approve-all", "--json")
    assert r.returncode == 0, r
    # A clean run has one effect per target: TARGETS names every step and item of the
    # plan, so the matrix kills at every one of them.
    assert mixed.counts() == Counter(TARGETS)
    assert [s["id"] for s in json.loads(r.stdout)["steps"]] == list(STEPS)


@pytest.mark.parametrize("kill", KILL_POINTS)
def test_kill_point(mixed: CliProject, kill: str) -> None:
    check_recovery(mixed, [kill])


#: The subset of the matrix run on a PostgreSQL journal too (SPEC §11): every crash point
#: of a python step, a fan-out item, a command and the irreversible step, and one double
#: kill.
PG_KILLS = [[f"{point}:{target}"] for target in ("prep", "fan#1", "shell", "danger")
            for point in CRASH_POINTS] + [["dispatch:fan#1", "call:fan#2"]]


@pytest.mark.parametrize("kills", PG_KILLS, ids=[">".join(k) for k in PG_KILLS])
def test_kill_point_on_postgres(pg_url: str, cli: CliProject,
                                monkeypatch: pytest.MonkeyPatch, kills: list[str]) -> None:
    monkeypatch.setenv("PLANRUN_JOURNAL", pg_url)
    cli.journal = pg_url
    cli.tools(TOOLS)
    cli.plan("mixed", PLAN)
    check_recovery(cli, kills)


@pytest.mark.parametrize("kills", RECOVERY_KILLS, ids=[">".join(k) for k in RECOVERY_KILLS])
def test_kill_during_recovery(mixed: CliProject, kills: tuple[str, str]) -> None:
    check_recovery(mixed, list(kills))
