"""Headless Chromium from the OS packages, driven by selenium, for report tests (issue 18).

Only the Debian ``chromium`` and ``chromium-driver`` binaries are used: both paths are
given to selenium, so selenium-manager never looks for (or downloads) a browser or a
driver. :func:`open_page` loads a file by ``file://`` and returns what the page asked the
network for (every request Chromium's DevTools saw, from the performance log) and what it
wrote to its console.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
DRIVER_CANDIDATES = ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars")


def binaries() -> tuple[str, str] | None:
    """(chromium, chromedriver) paths from the OS packages, or None when either is missing."""
    browser = next((p for p in CHROMIUM_CANDIDATES if os.access(p, os.X_OK)), None)
    driver = next((p for p in DRIVER_CANDIDATES if os.access(p, os.X_OK)), None)
    return (browser, driver) if browser and driver else None


@dataclass
class Loaded:
    """A page as the browser loaded it."""

    driver: Any
    url: str
    load_s: float
    requests: list[str] = field(default_factory=list)
    console: list[dict[str, Any]] = field(default_factory=list)

    @property
    def other_requests(self) -> list[str]:
        """Every requested URL other than the page itself (``data:`` ones included)."""
        return [u for u in self.requests if u != self.url]

    @property
    def console_errors(self) -> list[dict[str, Any]]:
        """Console messages of level SEVERE (errors, CSP violations, failed loads)."""
        return [m for m in self.console if m.get("level") == "SEVERE"]

    def screenshot(self, path: Path) -> Path:
        """The whole page as a PNG at ``path`` (the window grown to the page's height)."""
        self.driver.execute_script("window.scrollTo(0, 0)")
        height = self.driver.execute_script(
            "return Math.max(document.body.scrollHeight, document.documentElement.scrollHeight)")
        width = self.driver.execute_script("return window.outerWidth")
        self.driver.set_window_size(width, min(int(height) + 100, 12000))
        self.driver.save_screenshot(str(path))
        return path


@contextmanager
def chromium(width: int = 1280, height: int = 800) -> Iterator[Any]:
    """A headless Chromium (a fresh profile folder, removed afterwards) via chromedriver.

    Raises:
        RuntimeError: no chromium or chromedriver is installed.
    """
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    found = binaries()
    if found is None:
        raise RuntimeError("chromium and chromium-driver (OS packages) are not installed")
    browser, driver_path = found
    profile = tempfile.mkdtemp(prefix="planrun-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.add_argument(f"--window-size={width},{height}")
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    os.environ.setdefault("SE_AVOID_STATS", "true")
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _requests(driver: Any) -> list[str]:
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def open_page(driver: Any, path: Path) -> Loaded:
    """Load ``path`` by ``file://`` and wait for its load event.

    ``load_s``: seconds from the navigation's start to the end of its load event, as the
    page's Navigation Timing says. The performance and console logs are read (and so
    emptied) after the load.
    """
    driver.get("about:blank")
    time.sleep(0.2)
    driver.get_log("performance")  # what the start page did is not this page's
    url = path.resolve().as_uri()
    driver.get(url)
    deadline = time.monotonic() + 30
    load_ms = 0.0
    while time.monotonic() < deadline:
        load_ms = float(driver.execute_script(
            "const n = performance.getEntriesByType('navigation')[0];"
            "return n && n.loadEventEnd > 0 ? n.loadEventEnd - n.startTime : 0;"))
        if load_ms > 0:
            break
        time.sleep(0.05)
    time.sleep(0.3)  # late requests (favicon, lazy pictures) would show up by now
    seen = _requests(driver)
    # From the page's own navigation on: whatever it, or anything it loaded, asked for.
    mine = seen[seen.index(url):] if url in seen else seen
    return Loaded(driver=driver, url=url, load_s=load_ms / 1000, requests=mine,
                  console=driver.get_log("browser"))
