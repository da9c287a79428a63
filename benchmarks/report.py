"""Benchmark of ``planrun report`` (issue 18): a 10,000-item fan-out run's report.

Builds a throw-away project (a no-op python tool; 1 item in 100 fails, so the report has
failures to show), runs ``planrun execute`` of a plan fanning out over N items (default
10,000) with ``on_item_error: continue``, writes the run's report with ``planrun report``
and prints: the seconds ``planrun report`` took (whole process), the report's size in
bytes, and the browser's load time — headless Chromium of the OS (``/usr/bin/chromium``
with ``chromedriver``, via selenium, as the browser tests drive it): from the start of
the ``file://`` navigation to the end of its load event, median of 5 loads in one
browser. Also the requests other than the file (must be none) and console errors.

Targets (issue 18): under 2 MB, opens in under 2 s. Not a test: nothing asserts a
timing; exit status 1 only when something could not run.

    python benchmarks/report.py [--items N] [--keep]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

TOOLS = """\
tools:
  noop:
    python: benchtools:noop
    arguments: {type: object, properties: {n: {type: integer}}, required: [n],
                additionalProperties: false}
"""
MODULE = """\
def noop(n):
    if n % 100 == 99:
        raise ValueError(f"item {n} fails on purpose")
    return n
"""
def _plan(items: int) -> str:
    """The plan: ``start`` then ``many`` over ``range(items)`` (a literal list)."""
    listed = "[" + ", ".join(str(i) for i in range(items)) + "]"
    return ("planrun: 1\nname: wide\ngoal: Fan out over many items\nsteps:\n"
            "  - {id: start, tool: noop, arguments: {n: 0}}\n"
            "  - id: many\n    tool: noop\n    depends_on: [start]\n"
            "    on_item_error: continue\n"
            f"    max_items: {max(items, 1)}\n"
            f"    for_each: {listed}\n    arguments: {{n: \"{{item}}\"}}\n"
            "  - {id: after, tool: noop, depends_on: [many], arguments: {n: 1}}\n")


def _planrun(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "planrun", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900, check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    opts = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="planrun-bench-report-"))
    try:
        project = base / "proj"
        (project / "plans").mkdir(parents=True)
        (project / "tools.yaml").write_text(TOOLS)
        (project / "benchtools.py").write_text(MODULE)
        (project / "planrun.toml").write_text("max_parallel = 8\n")
        (project / "plans" / "wide.yaml").write_text(_plan(opts.items))
        env = {k: v for k, v in os.environ.items() if not k.startswith("PLANRUN_")}
        env.update(PLANRUN_JOURNAL=str(base / "journal.sqlite3"), HOME=str(base),
                   NO_COLOR="1")
        t = time.perf_counter()
        run = _planrun("execute", "wide", "--json", cwd=project, env=env)
        print(f"execute {opts.items:,} items: exit {run.returncode}, "
              f"{time.perf_counter() - t:.1f} s")
        if run.returncode not in (0, 1):
            print(run.stdout[-2000:], run.stderr[-2000:], sep="\n")
            return 1
        out = base / "report.html"
        t = time.perf_counter()
        made = _planrun("report", "--out", str(out), cwd=project, env=env)
        took = time.perf_counter() - t
        if made.returncode != 0:
            print(made.stderr)
            return 1
        size = out.stat().st_size
        print(f"planrun report (whole process): {took:.2f} s")
        print(f"report size: {size:,} bytes ({size / 1e6:.2f} MB; target < 2 MB)")
        from browser import binaries, chromium, open_page

        if binaries() is None:
            print("browser load time: not measured (no chromium and chromedriver)")
            return 0
        with chromium(1280, 800) as driver:
            loads = [open_page(driver, out) for _ in range(5)]
        times = [p.load_s for p in loads]
        print(f"browser load time: median {statistics.median(times):.3f} s "
              f"(min {min(times):.3f}, max {max(times):.3f}; target < 2 s)")
        others = sorted({u for p in loads for u in p.other_requests})
        errors = [m for p in loads for m in p.console_errors]
        print(f"requests other than the file: {len(others)} {others[:5]}")
        print(f"console errors: {len(errors)} {errors[:3]}")
        if opts.keep:
            print(f"kept {base}")
        return 0
    finally:
        if not opts.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
