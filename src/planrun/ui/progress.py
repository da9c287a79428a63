"""Live progress of a run on stderr: a line per event, or rich bars on a terminal.

Part of :mod:`planrun.ui` (the only package that imports :mod:`rich`).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from .. import redact
from ..loading import visible
from . import _console, err, is_terminal

# --- live progress -----------------------------------------------------------------------------


class PlainProgress:
    """One line per event on stderr (not a terminal): no escape codes, easy to grep.

    Every line of a run starts ``planrun: run RUN_ID`` — its first line (``planrun: run
    ID (PLAN rN) started at …``), each step's (``planrun: run ID: STEP started``), its
    notes and its last line (:func:`planrun.ui.print_run_end`) — so that a log several
    runs write to at once (cron jobs sharing a file, CI steps in parallel) can be split
    by run with ``grep 'planrun: run ID'``. A terminal shows one run at a time: its live
    view names no run.
    """

    #: A fan-out step prints a progress line every this many seconds at most apart...
    EVERY_S = 30.0
    #: ... and every tenth of its items (whichever comes first).
    EVERY_FRACTION = 10

    def __init__(self, verbose: bool = False) -> None:
        self.verbose = verbose
        #: ``run ID: `` once the run's first event named it (then on every line).
        self.tag = ""
        self.started: dict[str, float] = {}
        #: fan-out step → [done, total, done when started here, last line's time, last done]
        self.fans: dict[str, list[Any]] = {}

    def _fan_line(self, sid: str, now: float) -> None:
        done, total, first, _last_t, _last_done = self.fans[sid]
        took = now - self.started.get(sid, now)
        rate = item_rate(done - first, took)
        self._say(f"{sid} {done}/{total} items" + (f", {rate}" if rate else ""))
        self.fans[sid][3] = now
        self.fans[sid][4] = done

    def _say(self, text: str) -> None:
        err(f"planrun: {self.tag}{text}")

    def __call__(self, kind: str, sid: str, info: dict[str, Any]) -> None:
        """Report one executor event.

        Off a terminal a fan-out step also prints ``planrun: STEP DONE/TOTAL items, R
        items/s`` every tenth of its items or every :attr:`EVERY_S` seconds (a cron log
        shows it moving), counted when an item ends.
        """
        import time

        now = time.monotonic()
        if kind == "stderr":
            if self.verbose:
                _stderr_lines(sid, info, self.tag)
            return
        if kind == "item_done" and sid in self.fans:
            fan = self.fans[sid]
            fan[0] += 1
            step = max(1, fan[1] // self.EVERY_FRACTION)
            if fan[0] < fan[1] and (fan[0] - fan[4] >= step or now - fan[3] >= self.EVERY_S):
                self._fan_line(sid, now)
            return
        if kind == "run":
            # the first line of a run in a log: which run, which plan, when (a cron log
            # of many nights must say where each run begins; found by a fresh operator)
            self.tag = f"run {info.get('run_id')}: "
            err(f"planrun: run {info.get('run_id')} ({info.get('plan')} "
                f"r{info.get('revision')}) {info.get('begun')} at {info.get('at')}")
            return
        if kind == "started":
            self.started[sid] = now
            if "items" in info:
                done = int(info.get("done") or 0)
                self.fans[sid] = [done, int(info["items"]), done, now, done]
            items = f" ({info['items']} items)" if "items" in info else ""
            attempt = f" (attempt {info['attempt']})" if info.get("attempt", 1) > 1 else ""
            self._say(f"{sid} started{items}{attempt}")
        elif kind in ("succeeded", "partial", "failed", "indeterminate", "replayed"):
            took = now - self.started.pop(sid, now)
            self.fans.pop(sid, None)
            detail = ""
            if info.get("error"):  # one line per event, also for a message of several
                message = " ".join(str(info["error"].get("message")).split())
                detail = f": [{info['error'].get('code')}] {message}"
            self._say(f"{sid} {kind} in {took:.2f}s{detail}")
        elif kind == "skipped":
            self._say(f"{sid} skipped ({info.get('reason')}): {info.get('message')}")
        elif kind == "retried":
            e = info.get("error") or {}
            self._say(f"{sid} attempt {info.get('attempt')} failed ({e.get('code')}); "
                      "retrying")
        else:
            _special(kind, info, self.tag)


def item_rate(items: int, seconds: float) -> str:
    """``"1.0 items/s"``: items finished here over the seconds since the step started.

    Empty until there is something to measure (no item yet, or under 0.5 s): a rate
    from a sampling window of two items reads as nonsense ("37 items/s" for 2 items in
    2 s). Below 10 items/s one decimal, else whole numbers.
    """
    if items <= 0 or seconds < 0.5:
        return ""
    rate = items / seconds
    return f"{rate:.1f} items/s" if rate < 10 else f"{rate:.0f} items/s"


def _stderr_lines(where: str, info: dict[str, Any], tag: str = "") -> None:
    """``-v``: what a command that succeeded wrote on stderr (its kept tail)."""
    for line in str(info.get("text") or "").splitlines():
        err(f"planrun: {tag}{where} stderr: {line}")


def _special(kind: str, info: dict[str, Any], tag: str = "") -> None:
    """The lines of a run's other events; ``tag``: ``run ID: `` after ``planrun: ``."""
    if kind == "interrupt":
        n = info.get("running", 0)
        again = ("press Ctrl-C again to cancel them now" if is_terminal(sys.stdin)  # no
                 else f"kill -INT {os.getpid()} cancels them now")  # keyboard under cron
        err(f"planrun: {tag}interrupted; no new step starts. Waiting up to {info.get('grace_s')}"
            f" s for {n} running call(s); {again}.")
    elif kind == "note":
        err(f"planrun: {tag}note: {info.get('text')}")
    elif kind == "overlap":
        err(f"planrun: {tag}note: run {info.get('run_id')} of this plan is running now too "
            f"({info.get('owner')}); each run does all its steps, so both do them (a cron "
            "job: see 'Running from cron' in the docs)")
    elif kind == "cancel":
        err(f"planrun: {tag}cancelling the running calls now")
    elif kind == "timeout":
        err(f"planrun: {tag}the run's timeout ran out; cancelling the running calls")
    elif kind == "lease_lost":
        err(f"planrun: {tag}another process took this run's lease; stopping"
            if not info.get("why")
            else f"planrun: {tag}{info['why']}; giving the run up before its lease runs out")


class LiveProgress:
    """A live view on a terminal.

    A spinner and elapsed time per running step, a bar per fan-out step (done/total,
    rate), and a line per finished step above them.
    """

    def __init__(self, no_color: bool = False, verbose: bool = False) -> None:
        self.verbose = verbose
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.text import Text

        self.console = _console(stderr=True, no_color=no_color)
        class FanBar(BarColumn):
            """A bar for fan-out steps only: a step without items has no "0/?"."""

            def render(self, task: Any) -> Any:
                return super().render(task) if task.total is not None else Text("")

        class FanCount(MofNCompleteColumn):
            def render(self, task: Any) -> Any:
                return super().render(task) if task.total is not None else Text("")

        class FanPercent(TaskProgressColumn):
            def render(self, task: Any) -> Any:
                return super().render(task) if task.total is not None else Text("")

        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), FanBar(), FanCount(),
            FanPercent(), TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(), console=self.console, transient=True,
            redirect_stdout=False, redirect_stderr=False)  # stdout is for results only
        #: fan-out step → (items done when it started here, monotonic start)
        self.fan_start: dict[str, tuple[int, float]] = {}
        self.tasks: dict[str, Any] = {}
        self.live = False

    def __enter__(self) -> LiveProgress:
        return self  # the display starts with the first step (after any prompt)

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.progress.stop()

    def __call__(self, kind: str, sid: str, info: dict[str, Any]) -> None:
        """Report one executor event (``pause``: stop drawing until the next one)."""
        p = self.progress
        if kind == "run":
            return  # a terminal shows the run's summary on stdout at its end
        if kind == "pause":
            if self.live:
                self.live = False
                p.stop()
            return
        if not self.live:
            self.live = True
            p.start()
        if kind == "started":
            total = info.get("items")
            if sid in self.tasks:
                return
            self.tasks[sid] = p.add_task(sid, total=total, completed=info.get("done", 0),
                                         rate="")
            if total is not None:
                import time

                self.fan_start[sid] = (int(info.get("done") or 0), time.monotonic())
        elif kind == "item_done" and sid in self.tasks:
            import time

            task = self.tasks[sid]
            p.advance(task)
            done = int(p.tasks[p.task_ids.index(task)].completed)
            first, t0 = self.fan_start.get(sid, (0, time.monotonic()))
            p.update(task, rate=item_rate(done - first, time.monotonic() - t0))
        elif kind in ("succeeded", "partial", "failed", "indeterminate", "replayed",
                      "skipped"):
            task = self.tasks.pop(sid, None)
            took = ""
            if task is not None:
                elapsed = p.tasks[p.task_ids.index(task)].elapsed
                took = f" {elapsed:.2f}s" if elapsed is not None else ""
                p.remove_task(task)
            mark = {"succeeded": "[green]✓[/]", "replayed": "[green]↺[/]",
                    "partial": "[yellow]◐[/]",
                    "failed": "[red]✗[/]", "indeterminate": "[magenta]?[/]",
                    "skipped": "[dim]-[/]"}[kind]
            detail = ""
            if info.get("error"):
                detail = f" [{info['error'].get('code')}] {info['error'].get('message')}"
            elif kind == "skipped":
                detail = f" ({info.get('reason')})"
            from rich.markup import escape

            self.console.print(f"{mark} {escape(sid)}{took}"
                               f"{escape(visible(redact.display_text(detail)))}")
        elif kind == "stderr":
            if self.verbose:
                from rich.markup import escape

                for line in str(info.get("text") or "").splitlines():
                    self.console.print(
                        escape(visible(redact.display_text(f"  {sid} stderr: {line}"))))
        elif kind not in ("item_started", "retried"):
            _special(kind, info)


def progress_reporter(quiet: bool, no_color: bool, verbose: bool = False) -> Any:
    """The progress display for a run.

    Live on a terminal, plain lines elsewhere, nothing with ``--quiet``. ``verbose``
    (``-v``) adds what commands that succeeded wrote on stderr. Use it as a context
    manager around the run.
    """
    import contextlib

    if quiet:
        return contextlib.nullcontext(None)
    if is_terminal(sys.stderr) and os.environ.get("TERM") != "dumb":
        return LiveProgress(no_color, verbose)
    return contextlib.nullcontext(PlainProgress(verbose))
