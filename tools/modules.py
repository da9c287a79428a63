"""Module sizes and the intra-package import graph of ``src/planrun``.

Usage::

    python tools/modules.py            # sizes, largest classes/functions, limits, graph
    python tools/modules.py --top 20   # more rows in the "largest" tables
    python tools/modules.py --strict   # exit 1 when a limit is exceeded or a cycle exists

Reads the sources with :mod:`ast` (nothing is imported or run). Limits (STYLE.md):
a module over 500 lines, a class over 250, a function over 60 is flagged. The import graph
counts every ``import`` of a ``planrun`` module, at module level or inside a function
(a function-level or ``if TYPE_CHECKING:`` import is marked ``(lazy)``); a cycle is
reported among module-level imports only, since a lazy import is how a lower layer
reaches an upper one at run time without a load-order cycle — those are listed apart.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "planrun"
LIMITS = {"module": 500, "class": 250, "function": 60}


@dataclass
class Module:
    """One source file: its dotted name, line count, definitions and imports."""

    name: str
    path: Path
    lines: int
    defs: list[tuple[str, str, int, int]] = field(default_factory=list)  # kind, name, line, n
    imports: dict[str, bool] = field(default_factory=dict)  # target → lazy/typing only


def module_name(path: Path) -> str:
    """``src/planrun/journal/store.py`` → ``planrun.journal.store``."""
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(current: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    """Absolute module names an ``ImportFrom`` node reaches (``from . import x`` → ``x``)."""
    if node.level:
        base = current.split(".")
        base = base if is_package else base[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base)
        target = f"{prefix}.{node.module}" if node.module else prefix
    else:
        target = node.module or ""
    if node.module is None:  # from . import a, b: each name may be a module
        return [f"{target}.{a.name}" for a in node.names] + [target]
    return [target]


def read(path: Path, known: set[str]) -> Module:
    """Parse one file into a :class:`Module`."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text, filename=str(path))
    name = module_name(path)
    mod = Module(name=name, path=path, lines=len(text.splitlines()))
    is_package = path.name == "__init__.py"

    def visit(node: ast.AST, prefix: str, depth: int) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                kind = "class" if isinstance(child, ast.ClassDef) else "function"
                qual = f"{prefix}{child.name}"
                size = (child.end_lineno or child.lineno) - child.lineno + 1
                mod.defs.append((kind, qual, child.lineno, size))
                visit(child, qual + ".", depth + 1)
                continue
            if (isinstance(child, ast.If) and isinstance(child.test, ast.Name)
                    and child.test.id == "TYPE_CHECKING"):
                visit(child, prefix, depth + 1)  # annotations only: like a lazy import
                continue
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                targets = _resolve(name, is_package, child)
            for target in targets:
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target.startswith("planrun") and target != name and target != "planrun":
                    lazy = depth > 0
                    mod.imports[target] = mod.imports.get(target, True) and lazy
            visit(child, prefix, depth)

    visit(tree, "", 0)
    return mod


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary cycle found by a depth-first walk (one per back edge)."""
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt):], nxt])
            elif nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            walk(node)
    return cycles


def load(package: Path = PACKAGE) -> list[Module]:
    """Every module of the package, sorted by name."""
    files = sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)
    known = {module_name(p) for p in files}
    return sorted((read(p, known) for p in files), key=lambda m: m.name)


def report(modules: list[Module], top: int) -> int:
    """Print the tables; return how many limits are exceeded plus cycles found."""
    over = 0
    print(f"{'module':40} {'lines':>6}")
    for m in sorted(modules, key=lambda m: -m.lines):
        flag = "  > 500" if m.lines > LIMITS["module"] else ""
        over += bool(flag)
        print(f"{m.name:40} {m.lines:6}{flag}")
    print(f"{'total':40} {sum(m.lines for m in modules):6}\n")
    for kind in ("class", "function"):
        rows = sorted(((n, m.name, q, line) for m in modules
                       for k, q, line, n in m.defs if k == kind), reverse=True)
        print(f"largest {kind}{'es' if kind == 'class' else 's'} (lines; limit {LIMITS[kind]})")
        for n, mname, qual, line in rows[:top]:
            flag = f"  > {LIMITS[kind]}" if n > LIMITS[kind] else ""
            print(f"  {n:5}  {mname}:{line} {qual}{flag}")
        extra = [r for r in rows[top:] if r[0] > LIMITS[kind]]
        for n, mname, qual, line in extra:
            print(f"  {n:5}  {mname}:{line} {qual}  > {LIMITS[kind]}")
        over += sum(1 for r in rows if r[0] > LIMITS[kind])
        print()
    print("import graph (module -> planrun modules it imports; (lazy): inside a function)")
    eager: dict[str, set[str]] = {}
    for m in modules:
        eager[m.name] = {t for t, lazy in m.imports.items() if not lazy}
        targets = ", ".join(t.removeprefix("planrun.") + (" (lazy)" if lazy else "")
                            for t, lazy in sorted(m.imports.items()))
        print(f"  {m.name.removeprefix('planrun.') or 'planrun'} -> {targets or '-'}")
    cycles = find_cycles(eager)
    lazy_graph = {m.name: set(m.imports) for m in modules}
    lazy_cycles = [c for c in find_cycles(lazy_graph) if c not in cycles]
    print("\nimport cycles (module level): " + ("none" if not cycles else ""))
    for c in cycles:
        print("  " + " -> ".join(c))
    print("cycles through lazy imports (an upper layer reached at run time): "
          + ("none" if not lazy_cycles else str(len(lazy_cycles))))
    for c in lazy_cycles:
        print("  " + " -> ".join(c))
    return over + len(cycles)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=10, help="rows per 'largest' table")
    parser.add_argument("--strict", action="store_true",
                        help="exit 1 when a limit is exceeded or a module-level cycle exists")
    args = parser.parse_args(argv)
    found = report(load(), args.top)
    return 1 if args.strict and found else 0


if __name__ == "__main__":
    sys.exit(main())
