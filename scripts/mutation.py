"""Mutation testing of planrun's core modules: does the test suite notice a broken guard?

Usage (from the repository root, with ``pip install -e '.[mutation]'``)::

    python scripts/mutation.py params redact          # one or more modules
    python scripts/mutation.py journal/store --sql-only
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
The source file is restored after every SQL mutant, also on Ctrl-C.
Not part of CI's default run: a module takes minutes (``canonical`` ~1 min,
``journal/store`` ~30 min on a 2-core machine).
"""

from __future__ import annotations

import argparse
import re
import shlex
import sqlite3
import subprocess
import sys
import tempfile
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
    "redact": (["tests/test_redact.py"], ["tests/test_policy.py"]),
    "journal/store": (["tests/test_journal.py", "tests/test_journal_guards.py"],
                      ["tests/test_executor.py", "tests/test_resume.py"]),
}

#: ``AND column op value`` inside a SQL string: the clause a guard mutant removes.
SQL_GUARD = re.compile(
    r" AND [a-z_.]+ (?:=|!=|<|>|<=|>=|IN|IS(?: NOT)?) "
    r"(?:\?|'[a-z_]*'|\([^)]*\)|NULL|[a-z_.]+)", re.IGNORECASE)


@dataclass
class Outcome:
    """What happened to one module's mutants."""

    module: str
    total: int = 0
    killed: int = 0
    equivalent: int = 0

    @property
    def score(self) -> float:
        """Killed share of the non-equivalent mutants, in percent."""
        counted = self.total - self.equivalent
        return 100.0 * self.killed / counted if counted else 100.0


def _test_command(module: str) -> str:
    own, broader = TESTS[module]
    own = [t for t in own if (ROOT / t).exists()]
    broader = [t for t in broader if (ROOT / t).exists()]
    run = f"{shlex.quote(sys.executable)} -m pytest -n 0 -x -q -p no:cacheprovider -m 'not slow'"
    command = f"{run} {' '.join(own)}"
    if broader:
        command += f" && {run} {' '.join(broader)}"
    return command


def _equivalent() -> set[str]:
    if not EQUIVALENT.exists():
        return set()
    return {line.split("#")[0].strip() for line in EQUIVALENT.read_text().splitlines()
            if line.split("#")[0].strip()}


def operator_mutants(module: str, out: Outcome, work: Path) -> None:
    """Run cosmic-ray on ``module``; add its mutants to ``out`` and print survivors."""
    config = work / f"{module.replace('/', '_')}.toml"
    session = config.with_suffix(".sqlite")
    config.write_text(
        "[cosmic-ray]\n"
        f'module-path = "{(SRC / module).with_suffix(".py")}"\n'
        "timeout = 120.0\nexcluded-modules = []\n"
        # cosmic-ray runs the command without a shell: give it one for the ``&&``.
        f"test-command = {_toml_string('sh -c ' + shlex.quote(_test_command(module)))}\n"
        '[cosmic-ray.distributor]\nname = "local"\n')
    subprocess.run(["cosmic-ray", "init", str(config), str(session)], check=True, cwd=ROOT)
    subprocess.run(["cosmic-ray", "exec", str(config), str(session)], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL)
    equivalent = _equivalent()
    conn = sqlite3.connect(session)
    rows = conn.execute(
        "SELECT m.module_path, m.operator_name, m.start_pos_row, r.test_outcome, r.diff "
        "FROM mutation_specs m JOIN work_results r ON r.job_id = m.job_id").fetchall()
    conn.close()
    for path, operator, line, outcome, diff in rows:
        out.total += 1
        changed = next((d[1:].strip() for d in (diff or "").splitlines()
                        if d.startswith("+") and not d.startswith("+++")), "")
        name = f"{Path(path).resolve().relative_to(SRC)}:{operator}: {changed}"
        if str(outcome).lower() != "survived":  # killed, or incompetent (cannot even run)
            out.killed += 1
        elif name in equivalent:
            out.equivalent += 1
        else:
            print(f"SURVIVED line {line}: {name}", flush=True)


def _toml_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sql_mutants(module: str, out: Outcome) -> None:
    """Remove each SQL guard clause of ``module`` in turn and run its tests."""
    path = (SRC / module).with_suffix(".py")
    original = path.read_text()
    equivalent = _equivalent()
    command = _test_command(module)
    try:
        for n, match in enumerate(SQL_GUARD.finditer(original)):
            line = original.count("\n", 0, match.start()) + 1
            name = f"{module}.py:sql-guard: {match.group().strip()} (#{n})"
            path.write_text(original[:match.start()] + original[match.end():])
            out.total += 1
            done = subprocess.run(command, shell=True, cwd=ROOT, capture_output=True,
                                  timeout=600)
            if done.returncode != 0:
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
    parser.add_argument("--list", action="store_true", help="list modules and their tests")
    args = parser.parse_args()
    if args.list or not args.modules:
        for module in TESTS:
            print(f"{module}: {_test_command(module)}")
        return 0
    unknown = [m for m in args.modules if m not in TESTS]
    if unknown:
        parser.error(f"unknown module(s) {unknown}; known: {sorted(TESTS)}")
    outcomes = []
    with tempfile.TemporaryDirectory() as tmp:
        for module in args.modules:
            out = Outcome(module)
            if not args.sql_only:
                operator_mutants(module, out, Path(tmp))
            sql_mutants(module, out)
            outcomes.append(out)
    print(f"\n{'module':<16} {'mutants':>8} {'killed':>7} {'equiv.':>7} {'score':>7}")
    for o in outcomes:
        print(f"{o.module:<16} {o.total:>8} {o.killed:>7} {o.equivalent:>7} {o.score:>6.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
