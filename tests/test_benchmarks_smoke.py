"""The benchmark script runs end to end (``--smoke``: a few steps each, no targets checked).

Only that it works is asserted, never a timing: timings belong to the benchmark's table.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "run.py"


def test_benchmarks_smoke() -> None:
    env = {k: v for k, v in os.environ.items() if k != "BENCH_LUIGI_PYTHON"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke"], capture_output=True,
                          text=True, timeout=180, check=False, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("Raw durable SQLite commit", "W1", "W2", "W3", "W4", "W5", "W6"):
        assert f"| {name}" in proc.stdout, (name, proc.stdout)
    for row in ("`planrun --help`", "`planrun validate`", "`planrun execute`"):
        assert row in proc.stdout, (row, proc.stdout)
    assert "| luigi" in proc.stdout  # the peer's column
    if importlib.util.find_spec("luigi") is None:  # luigi is never a planrun dependency
        assert "luigi not installed: pip install luigi" in proc.stdout
    assert "ERROR" not in proc.stdout
    assert "FAILED" not in proc.stdout + proc.stderr


@pytest.mark.browser
def test_report_benchmark_smoke() -> None:
    """``benchmarks/report.py`` on a small fan-out: it runs and reports its figures."""
    script = SCRIPT.with_name("report.py")
    proc = subprocess.run([sys.executable, str(script), "--items", "40"], capture_output=True,
                          text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "report size: " in proc.stdout
    assert "browser load time: " in proc.stdout
    if "not measured" not in proc.stdout:
        assert "requests other than the file: 0 []" in proc.stdout
        assert "console errors: 0 []" in proc.stdout
