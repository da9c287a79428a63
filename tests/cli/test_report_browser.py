"""``planrun report`` pages in a real browser: headless Chromium of the OS (issue 18).

Each page is loaded by ``file://``: no console error, no request but the file itself,
every step's node visible with its status word, the failed step's error shown, nothing
wider than the window at 1280 and at 600 px. Screenshots go to ``test-artifacts/`` (git
ignores it) and the test's ``tmp_path``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from browser import binaries, chromium, open_page
from conftest import Project

from .report_support import NIGHTLY, NIGHTLY_STATUSES, SECRET, report
from .support import execute_json

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(binaries() is None, reason="no chromium and chromedriver installed "
                       "(Debian packages chromium, chromium-driver)"),
]

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    with chromium(1280, 800) as d:
        yield d


def _keep(shot: Path) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copyfile(shot, ARTIFACTS / shot.name)


def _written(proj: Project, tmp_path: Path, name: str) -> Path:
    target = tmp_path / f"{name}.html"
    result = report(proj, "--out", str(target))
    assert result.returncode == 0, result.stderr
    return target


def _overflow(driver: Any) -> int:
    """How many px the page is wider than the window (wide pictures scroll in a box)."""
    return int(driver.execute_script(
        "return document.documentElement.scrollWidth - window.innerWidth"))


@pytest.mark.parametrize("width", [1280, 600])
def test_report_in_chromium(proj: Project, tmp_path: Path, driver: Any, width: int) -> None:
    from selenium.webdriver.common.by import By

    proj.write_plan("nightly", NIGHTLY)
    result, _ = execute_json(proj, "nightly", "-p", f"token={SECRET}", "--keep-going")
    assert result.exit_code == 1, result.output
    page = _written(proj, tmp_path, "nightly")
    driver.set_window_size(width, 800)
    loaded = open_page(driver, page)
    assert loaded.console_errors == []
    assert loaded.other_requests == []
    assert loaded.requests == [loaded.url]  # the performance log did see the page itself
    for step, status in NIGHTLY_STATUSES.items():
        node = driver.find_element(By.CSS_SELECTOR, f'a.node[data-step="{step}"]')
        assert node.is_displayed(), step
        assert node.get_attribute("data-status") == status
        assert status in node.text, (step, node.text)
        label = node.get_attribute("aria-label") or ""
        assert label.startswith(f"step {step}: {status}"), label
    row = driver.find_element(By.ID, "step-bad")
    assert row.is_displayed()
    assert "cannot handle" in row.text
    assert "tool_error" in row.text
    assert SECRET not in driver.page_source
    assert _overflow(driver) <= 0
    events = driver.find_element(By.CSS_SELECTOR, "table.events")
    assert not events.is_displayed()  # collapsed until asked
    driver.find_element(By.CSS_SELECTOR, "#events + details > summary").click()
    assert events.is_displayed()
    assert "step_failed" in events.text
    shot = loaded.screenshot(tmp_path / f"report-{width}.png")
    assert shot.stat().st_size > 10_000
    _keep(shot)


def test_fifty_step_dag_stays_legible(proj: Project, tmp_path: Path, driver: Any) -> None:
    """50 steps: ten wide layers, each step waiting on two of the layer above."""
    lines = ["planrun: 1", "name: fifty", "goal: Fifty steps", "steps:"]
    for i in range(50):
        layer, pos = divmod(i, 5)
        above = (layer - 1) * 5
        deps = [] if layer == 0 else sorted({f"s{above + pos:02d}",
                                             f"s{above + (pos + 1) % 5:02d}"})
        lines.append(f"  - {{id: s{i:02d}, tool: echo, depends_on: {deps}, "
                     f"arguments: {{value: {i}}}}}")
    proj.write_plan("fifty", "\n".join(lines) + "\n")
    result, _ = execute_json(proj, "fifty")
    assert result.exit_code == 0, result.output
    page = _written(proj, tmp_path, "fifty")
    driver.set_window_size(1280, 800)
    loaded = open_page(driver, page)
    assert loaded.console_errors == []
    assert loaded.other_requests == []
    boxes = driver.execute_script(
        "return [...document.querySelectorAll('a.node rect')].map(r => {"
        "const b = r.getBoundingClientRect(); return [b.left, b.top, b.width, b.height]; })")
    assert len(boxes) == 50
    for i, (x, y, w, h) in enumerate(boxes):
        assert w >= 150, "nodes are drawn at their size, not shrunk to fit"
        assert h >= 40
        for x2, y2, w2, h2 in boxes[i + 1:]:
            assert x + w <= x2 or x2 + w2 <= x or y + h <= y2 or y2 + h2 <= y, "overlap"
    size = driver.execute_script(
        "return parseFloat(getComputedStyle(document.querySelector('a.node text.st'))"
        ".fontSize)")
    assert size >= 12
    assert _overflow(driver) <= 0
    # five boxes side by side fit a 1280 px window: the picture needs no sideways scroll
    assert driver.execute_script(
        "const f = document.querySelector('.scroll.pic'); return f.scrollWidth <= f.clientWidth")
    shot = loaded.screenshot(tmp_path / "report-fifty-steps.png")
    _keep(shot)
