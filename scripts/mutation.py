"""Mutation testing of planrun's core modules: does the test suite notice a broken guard?

Usage (from the repository root, with ``pip install -e '.[mutation]'``)::

    python scripts/mutation.py params redact          # one or more modules
    python scripts/mutation.py journal/leases --functions renew_lease,take_lease
    python scripts/mutation.py journal/steps --sql-only
    python scripts/mutation.py --list                 # modules and the tests run against each

Two kinds of mutant, each run against the module's own fast tests first and then the
broader fast suites (a mutant survives only if both pass):

- operator mutants from cosmic-ray (https://github.com/sixty-north/cosmic-ray): a
  comparison or boolean operator flipped, a constant changed, a ``return`` value replaced …
- SQL guard mutants, which cosmic-ray does not make: each ``AND <column> <op> <value>``
  clause of a SQL string removed in turn (a guarded UPDATE without its guard).

Prints one line per surviving mutant (file, line, what changed) and a table of mutants,
killed and score per module. Survivors that are equivalent (no test can tell them apart)
are listed in ``scripts/mutation-equivalent.txt`` (one survivor line each, as printed
after ``SURVIVED line N:``) and left out of the score.
Mutants inside annotations are skipped (inert under ``from __future__ import
annotations``); ``--functions``/``--lines`` restrict a run to a region of the module.
The source file is restored at the end, also on Ctrl-C or SIGTERM (the cosmic-ray
process group is ended first); if a run was SIGKILLed, ``git checkout -- src/``.
Not part of CI's default run: a module takes minutes (see the README's development
section for the timings on a 2-core machine).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import os
import random
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "planrun"
EQUIVALENT = Path(__file__).with_name("mutation-equivalent.txt")

#: module -> (its own tests, the broader fast suites run when those pass)
TESTS: dict[str, tuple[list[str], list[str]]] = {
    "canonical": (["tests/test_canonical.py"], ["tests/test_params.py"]),
    "graph": (["tests/test_graph.py"], ["tests/test_validation.py"]),
    "params": (["tests/test_params.py"], ["tests/test_validation.py"]),
    "redact": (["tests/test_redact.py"], ["tests/test_secrets.py", "tests/test_policy.py"]),
    "masking": (["tests/test_masking.py"], ["tests/test_secrets.py"]),
}
#: The journal's lease and guarded-update code, split by concern (issue 12): each module
#: against the journal's own tests, then the executor and resume suites.
for _part in ("base", "leases", "dispatch", "steps", "calls", "runs"):
    TESTS[f"journal/{_part}"] = (
        ["tests/test_journal_guards.py", "tests/test_journal.py",
         "tests/test_journal_backend.py"],
        ["tests/test_executor.py", "tests/test_resume.py"])

#: ``AND column op value`` inside a SQL string: the clause a guard mutant removes.
SQL_GUARD = re.compile(
    r" ?\bAND (?:\"\s*\")?[a-z_.]+ (?:=|!=|<|>|<=|>=|IN|IS(?: NOT)?) "
    r"(?:\?|'[a-z_]*'|\([^)]*\)|NULL|[a-z_.]+)", re.IGNORECASE)


@dataclass
class Outcome:
    """What happened to one module's mutants."""

    module: str
    total: int = 0
    killed: int = 0
    equivalent: int = 0
    minutes: float = 0.0

    @property
    def score(self) -> float:
        """Killed share of the non-equivalent mutants, in percent."""
        counted = self.total - self.equivalent
        return 100.0 * self.killed / counted if counted else 100.0


def _annotation_spans(tree: ast.AST) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) positions (row, column) of every annotation in ``tree``."""
    spans = []
    for node in ast.walk(tree):
        notes: list[ast.expr | None] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            notes.append(node.returns)
        elif isinstance(node, ast.arg | ast.AnnAssign):
            notes.append(node.annotation)
        spans += [((n.lineno, n.col_offset), (n.end_lineno or n.lineno, n.end_col_offset or 0))
                  for n in notes if n is not None]
    return spans


def _function_lines(tree: ast.AST, names: set[str]) -> list[tuple[int, int]]:
    """The (first, last) lines of each function or method named in ``names``."""
    found = [(n.lineno, n.end_lineno or n.lineno) for n in ast.walk(tree)
             if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name in names]
    missing = names - {n.name for n in ast.walk(tree)
                       if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    if missing:
        raise SystemExit(f"no function(s) {sorted(missing)} in the module")
    return found


class Region:
    """Which mutants of a module to run: outside annotations, inside the chosen lines."""

    def __init__(self, source: str, functions: set[str], lines: tuple[int, int] | None):
        tree = ast.parse(source)
        self.annotations = _annotation_spans(tree)
        self.lines = _function_lines(tree, functions) if functions else []
        if lines:
            self.lines.append(lines)

    def wanted(self, start: tuple[int, int], end: tuple[int, int]) -> bool:
        """Whether to run the mutant spanning ``start``..``end`` ((row, column) each).

        Not inside an annotation (inert under ``from __future__ import annotations``),
        and inside the chosen functions/lines when there are any.
        """
        if any(a <= start and end <= b for a, b in self.annotations):
            return False
        return not self.lines or any(a <= start[0] <= b for a, b in self.lines)


def _test_command(module: str) -> str:
    own, broader = TESTS[module]
    own = [t for t in own if (ROOT / t).exists()]
    broader = [t for t in broader if (ROOT / t).exists()]
    run = (f"PYTHONPATH={shlex.quote(str(ROOT / 'scripts'))}${{PYTHONPATH:+:$PYTHONPATH}} "
           f"{shlex.quote(sys.executable)} -m pytest -n 0 -x -q -p no:cacheprovider "
           "-p mutation_plugin -m 'not slow'")
    suites = [" ".join(tests) for tests in (own, broader) if tests]
    if not suites:
        raise SystemExit(f"no tests for {module}: {TESTS[module]}")
    return " && ".join(f"{run} {tests}" for tests in suites)


def _equivalent() -> set[str]:
    if not EQUIVALENT.exists():
        return set()
    return {line.split("#")[0].strip() for line in EQUIVALENT.read_text().splitlines()
            if line.split("#")[0].strip()}


def operator_mutants(module: str, out: Outcome, work: Path, region: Region,
                     sample: int = 0) -> None:
    """Run cosmic-ray on ``module``; add its mutants to ``out`` and print survivors."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    config = work / f"{module.replace('/', '_')}.toml"
    session = config.with_suffix(".sqlite")
    config.write_text(
        "[cosmic-ray]\n"
        f'module-path = "{(SRC / module).with_suffix(".py")}"\n'
        "timeout = 300.0\nexcluded-modules = []\n"
        # cosmic-ray runs the command without a shell: give it one for the ``&&``.
        f"test-command = {_toml_string('sh -c ' + shlex.quote(_test_command(module)))}\n"
        '[cosmic-ray.distributor]\nname = "local"\n')
    if session.exists():  # a kept session (--keep): run what is left of it
        print(f"{module}: resuming {session}", flush=True)
        _run(["cosmic-ray", "exec", str(config), str(session)], quiet=True)
        sample = -1
    else:
        _run(["cosmic-ray", "init", str(config), str(session)])
    with use_db(str(session), WorkDB.Mode.open) as db:
        items = [] if sample < 0 else sorted(db.work_items, key=lambda item: item.job_id)
        wanted = [item for item in items
                  if all(region.wanted(m.start_pos, m.end_pos) for m in item.mutations)]
        skipped = len(items) - len(wanted)
        chosen = random.Random(0).sample(wanted, sample) if 0 < sample < len(wanted) else wanted
        left_out = {item.job_id for item in items} - {item.job_id for item in chosen}
        for job_id in left_out:
            db.set_result(job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
        if items:
            print(f"{module}: {len(chosen)} operator mutants to run ({skipped} skipped: "
                  f"annotations or outside the region; {len(wanted) - len(chosen)} not "
                  "sampled)", flush=True)
    _run(["cosmic-ray", "exec", str(config), str(session)], quiet=True)
    equivalent = _equivalent()
    conn = sqlite3.connect(session)
    rows = conn.execute(
        "SELECT m.module_path, m.operator_name, m.start_pos_row, r.test_outcome, r.diff "
        "FROM mutation_specs m JOIN work_results r ON r.job_id = m.job_id "
        "WHERE r.worker_outcome != 'SKIPPED' AND r.worker_outcome != 'skipped' "
        "ORDER BY m.start_pos_row").fetchall()
    conn.close()
    for path, operator, line, outcome, diff in rows:
        out.total += 1
        changed = next((d[1:].strip() for d in (diff or "").splitlines()
                        if d.startswith("+") and not d.startswith("+++")), "")
        name = f"{Path(path).resolve().relative_to(SRC)}:{operator}: {changed}"
        if str(outcome).lower() not in ("survived", "testoutcome.survived"):
            out.killed += 1  # killed, or incompetent (cannot even run)
        elif name in equivalent:
            out.equivalent += 1
        else:
            print(f"SURVIVED line {line}: {name}", flush=True)


def _run(argv: list[str], *, quiet: bool = False) -> None:
    """Run ``argv`` in its own process group; end the group if we are interrupted."""
    child = subprocess.Popen(argv, cwd=ROOT, start_new_session=True,
                             stdout=subprocess.DEVNULL if quiet else None)
    try:
        if child.wait() != 0:
            raise SystemExit(f"{argv[0]} {argv[1]} failed (exit {child.returncode})")
    finally:
        if child.poll() is None:
            _end(child)


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (cosmic-ray starts each test run in a new group)."""
    found: list[int] = []
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return found
    for child in map(int, children):
        found += [child, *_descendants(child)]
    return found


def _end(child: subprocess.Popen[bytes]) -> None:
    """End ``child`` and every process below it (their groups): SIGTERM, then SIGKILL."""
    groups = {child.pid}
    for pid in _descendants(child.pid):
        with suppress(OSError):
            groups.add(os.getpgid(pid))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for group in groups:
            with suppress(ProcessLookupError):
                os.killpg(group, sig)
        try:
            child.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


@contextmanager
def _restored(path: Path) -> Iterator[str]:
    """Yield ``path``'s text; put it back on the way out (Ctrl-C and SIGTERM included)."""
    original = path.read_text()

    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    before = signal.signal(signal.SIGTERM, stop)
    try:
        yield original
    finally:
        signal.signal(signal.SIGTERM, before)
        if path.read_text() != original:
            path.write_text(original)


def _toml_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sql_mutants(module: str, out: Outcome, region: Region, original: str) -> None:
    """Remove each SQL guard clause of ``module`` (in the region) in turn; run its tests."""
    path = (SRC / module).with_suffix(".py")
    equivalent = _equivalent()
    command = _test_command(module)
    try:
        for n, match in enumerate(SQL_GUARD.finditer(original)):
            line = original.count("\n", 0, match.start()) + 1
            if not region.wanted((line, 0), (line, 1)):
                continue
            name = f"{module}.py:sql-guard: {match.group().strip()} (#{n})"
            path.write_text(original[:match.start()] + original[match.end():])
            out.total += 1
            child = subprocess.Popen(command, shell=True, cwd=ROOT, start_new_session=True,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                returncode = child.wait(timeout=600)
            except subprocess.TimeoutExpired:
                returncode = -1
            finally:
                if child.poll() is None:
                    _end(child)
            if returncode != 0:
                out.killed += 1
            elif name in equivalent:
                out.equivalent += 1
            else:
                print(f"SURVIVED line {line}: {name} removed", flush=True)
    finally:
        path.write_text(original)


def main() -> int:
    """Parse the command line, run the mutants, print the table; exit 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help="modules under src/planrun, e.g. params")
    parser.add_argument("--sql-only", action="store_true", help="only SQL guard mutants")
    parser.add_argument("--functions", default="",
                        help="only mutants inside these functions/methods (comma-separated)")
    parser.add_argument("--lines", default="", help="only mutants on lines FIRST-LAST")
    parser.add_argument("--sample", type=int, default=0,
                        help="run only N operator mutants, a fixed pseudo-random choice")
    parser.add_argument("--keep", metavar="DIR", default="",
                        help="keep cosmic-ray's session in DIR; a run interrupted resumes "
                             "from it (only the mutants not yet run)")
    parser.add_argument("--list", action="store_true", help="list modules and their tests")
    args = parser.parse_args()
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
    if args.list or not args.modules:
        for module in TESTS:
            print(f"{module}: {_test_command(module)}")
        return 0
    unknown = [m for m in args.modules if m not in TESTS]
    if unknown:
        parser.error(f"unknown module(s) {unknown}; known: {sorted(TESTS)}")
    functions = {f.strip() for f in args.functions.split(",") if f.strip()}
    lines = tuple(int(n) for n in args.lines.split("-")) if args.lines else None
    outcomes = []
    try:
        with (contextlib.nullcontext(args.keep) if args.keep
              else tempfile.TemporaryDirectory(prefix="planrun-mutation-")) as tmp:
            for module in args.modules:
                out = Outcome(module)
                started = time.monotonic()
                with _restored((SRC / module).with_suffix(".py")) as original:
                    region = Region(original, functions, lines)  # type: ignore[arg-type]
                    if not args.sql_only:
                        operator_mutants(module, out, Path(tmp), region, args.sample)
                    sql_mutants(module, out, region, original)
                out.minutes = (time.monotonic() - started) / 60
                outcomes.append(out)
    except KeyboardInterrupt:
        print("interrupted; the source files are restored", file=sys.stderr)
        return 130
    print(f"\n{'module':<16} {'mutants':>8} {'killed':>7} {'equiv.':>7} {'score':>7} {'min':>5}")
    for o in outcomes:
        print(f"{o.module:<16} {o.total:>8} {o.killed:>7} {o.equivalent:>7} {o.score:>6.1f}%"
              f" {o.minutes:>5.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
