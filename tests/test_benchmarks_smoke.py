"""The benchmark script runs end to end (``--smoke``: a few steps each, no targets checked).

Only that it works is asserted, never a timing: timings belong to the benchmark's table.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "run.py"


def test_benchmarks_smoke() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke"], capture_output=True,
                          text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("Raw durable SQLite commit", "W1", "W2", "W3", "W4", "W5", "W6"):
        assert f"| {name}" in proc.stdout, (name, proc.stdout)
    assert "ERROR" not in proc.stdout
    assert "FAILED" not in proc.stdout + proc.stderr
