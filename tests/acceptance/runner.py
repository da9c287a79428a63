"""Run one acceptance case against planrun, for pytest.

A case file (``cases/<name>.yaml``) is a mapping with ``about``, ``files`` and ``steps``;
the format is defined by ``../shared/cases/run_cases.py`` and this module gives it the same
meaning:

* ``files`` are written into a fresh work directory, then the fixtures (``fixtures/*.py``,
  ``fixtures/*.yaml``) are copied in unless the case brings a file of the same name.
* Every command runs in the work directory with ``PLANRUN_JOURNAL`` pointing into it,
  ``NO_COLOR=1``, ``COLUMNS=200``, ``CASE_DIR`` set to it and no other ``PLANRUN_*``
  variable from the caller.
* A step is one of ``{run: ...}`` (with its expectations), ``{write: {path: text}}``,
  ``{sleep: seconds}`` or ``{wait: name}`` (finish and check a ``background`` step).

The first expectation that does not hold raises :class:`CaseFailure` (an
``AssertionError``) carrying the command and the tail of its output. A malformed case file
raises :class:`CaseFileError`.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final, NoReturn

import yaml

HERE: Final = Path(__file__).resolve().parent
CASES_DIR: Final = HERE / "cases"
FIXTURES_DIR: Final = HERE / "fixtures"

#: How the cases run planrun: the interpreter running the tests, so PATH does not matter.
PLANRUN: Final[tuple[str, ...]] = (sys.executable, "-m", "planrun")

DEFAULT_TIMEOUT: Final = 60.0
POLL_INTERVAL: Final = 0.02
TRACEBACK: Final = "Traceback (most recent call last)"
OUTPUT_TAIL: Final = 1500
SCREEN_TAIL: Final = 800
TTY_DIMENSIONS: Final = (50, 200)
FIXTURE_SUFFIXES: Final = (".py", ".yaml")

RUN_KEYS: Final = frozenset({
    "run", "stdin", "env", "timeout", "exit", "tty", "expect", "kill_when", "background",
    "stdout_has", "stderr_has", "output_has", "output_lacks", "traceback_ok",
    "stdout_json", "json_includes", "json_equals", "json_matches", "save",
    "file_has", "file_lacks", "calls", "files_exist", "files_absent",
})
KILL_WHEN_KEYS: Final = frozenset({"calls_has", "signal", "delay", "group"})

Step = Mapping[str, Any]


class CaseFailure(AssertionError):
    """An expectation of a case did not hold."""


class CaseFileError(ValueError):
    """A case file does not follow the case format."""


# ---------------------------------------------------------------------------------------
# Loading


@dataclass(frozen=True)
class Case:
    """One parsed case file."""

    name: str
    about: str
    files: Mapping[str, str]
    steps: Sequence[Step]

    @classmethod
    def load(cls, path: Path) -> Case:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise CaseFileError(f"{path.name}: a case file is a mapping")
        files = data.get("files") or {}
        steps = data.get("steps") or []
        if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
            raise CaseFileError(f"{path.name}: files must map paths to text")
        if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
            raise CaseFileError(f"{path.name}: steps must be a list of mappings")
        return cls(path.stem, str(data.get("about", "")), files, steps)


def case_paths(directory: Path = CASES_DIR) -> list[Path]:
    """The case files in ``directory``, sorted by name."""
    return sorted(directory.glob("*.yaml"))


# ---------------------------------------------------------------------------------------
# Pure helpers


def find_path(data: Any, path: str) -> list[Any]:
    """Values at a dotted path; ``*`` fans out over a list or mapping, ``-1`` counts back."""
    current = [data]
    for part in path.split(".") if path else []:
        current = [found for value in current for found in _step_into(value, part)]
    return current


def _step_into(value: Any, part: str) -> list[Any]:
    if part == "*":
        if isinstance(value, list):
            return list(value)
        return list(value.values()) if isinstance(value, dict) else []
    if isinstance(value, list) and part.lstrip("-").isdigit():
        index = int(part)
        return [value[index]] if -len(value) <= index < len(value) else []
    if isinstance(value, dict) and part in value:
        return [value[part]]
    return []


def is_subset(expected: Any, actual: Any) -> bool:
    """Whether ``actual`` holds ``expected``: mappings by key, lists item by item, scalars by
    value and exact type (so ``1`` does not match ``true`` or ``1.0``)."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            key in actual and is_subset(value, actual[key]) for key, value in expected.items()
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(expected) == len(actual)
            and all(is_subset(e, a) for e, a in zip(expected, actual, strict=True))
        )
    return type(expected) is type(actual) and expected == actual


def shell_status(returncode: int) -> int:
    """An exit status as a shell reports it: a death by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def count_calls(work: Path) -> dict[str, int]:
    """How many lines of ``calls.log`` start with each first word."""
    log = work / "calls.log"
    counts: dict[str, int] = {}
    if log.exists():
        for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
            words = line.split()
            if words:
                counts[words[0]] = counts.get(words[0], 0) + 1
    return counts


def expand_argv(run: str | Sequence[Any], planrun: Sequence[str],
                saved: Mapping[str, str]) -> list[str]:
    """The argv of a ``run``: a leading ``planrun`` becomes the planrun command, ``${PLANRUN}``
    its shell spelling and ``${name}`` a saved value (unknown names are left alone)."""
    argv = shlex.split(run) if isinstance(run, str) else [str(arg) for arg in run]
    if argv and argv[0] == "planrun":
        argv = [*planrun, *argv[1:]]
    values = {**saved, "PLANRUN": shlex.join(planrun)}

    def substitute(match: re.Match[str]) -> str:
        return values.get(match.group(1), match.group(0))

    return [re.sub(r"\$\{([^}]*)\}", substitute, arg) for arg in argv]


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def tail(text: str, size: int = OUTPUT_TAIL) -> str:
    return text[-size:]


# ---------------------------------------------------------------------------------------
# What a command did, and the checks on it


@dataclass
class Outcome:
    """The result of one ``run`` step, with the means to fail it helpfully."""

    label: str
    code: int
    stdout: str
    stderr: str
    _json: Any = field(default=None, repr=False)
    _json_parsed: bool = field(default=False, repr=False)

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def fail(self, message: str) -> NoReturn:
        raise CaseFailure(
            f"{self.label}: {message}\n"
            f"--- exit status {self.code}\n"
            f"--- stdout ---\n{tail(self.stdout)}\n--- stderr ---\n{tail(self.stderr)}"
        )

    def json(self) -> Any:
        if not self._json_parsed:
            try:
                self._json = json.loads(self.stdout)
            except json.JSONDecodeError as exc:
                self.fail(f"stdout is not JSON: {exc}")
            self._json_parsed = True
        return self._json


def check_exit(step: Step, outcome: Outcome) -> None:
    if "exit" in step:
        allowed = as_list(step["exit"])
        if outcome.code not in allowed:
            outcome.fail(f"exited {outcome.code}, expected {allowed}")


def check_text(step: Step, outcome: Outcome) -> None:
    streams = {
        "stdout_has": outcome.stdout, "stderr_has": outcome.stderr, "output_has": outcome.output,
    }
    for key, text in streams.items():
        for needle in step.get(key) or []:
            if needle not in text:
                outcome.fail(f"{key.split('_')[0]} lacks {needle!r}")
    for needle in step.get("output_lacks") or []:
        if needle in outcome.output:
            outcome.fail(f"output contains {needle!r}")
    if TRACEBACK in outcome.output and not step.get("traceback_ok"):
        outcome.fail("printed a traceback")


def check_json(step: Step, outcome: Outcome, saved: dict[str, str]) -> None:
    if "stdout_json" in step and not is_subset(step["stdout_json"], outcome.json()):
        outcome.fail(f"JSON does not contain {step['stdout_json']!r}")
    for path, wanted in (step.get("json_includes") or {}).items():
        found = find_path(outcome.json(), path)
        for value in as_list(wanted):
            if value not in found:
                outcome.fail(f"JSON {path} = {found!r} lacks {value!r}")
    for path, wanted in (step.get("json_equals") or {}).items():
        found = find_path(outcome.json(), path)
        if found != [wanted] or type(found[0]) is not type(wanted):
            outcome.fail(f"JSON {path} = {found!r}, expected {wanted!r}")
    for path, pattern in (step.get("json_matches") or {}).items():
        found = find_path(outcome.json(), path)
        if not found or not all(isinstance(v, str) and re.search(pattern, v) for v in found):
            outcome.fail(f"JSON {path} = {found!r} does not match {pattern!r}")
    for name, path in (step.get("save") or {}).items():
        found = find_path(outcome.json(), path)
        if len(found) != 1:
            outcome.fail(f"JSON {path} = {found!r}: cannot save one value as {name}")
        saved[name] = str(found[0])


def check_files(step: Step, outcome: Outcome, work: Path) -> None:
    for name, needles in (step.get("file_has") or {}).items():
        target = work / name
        if not target.exists():
            outcome.fail(f"{name} does not exist (expected it to hold {needles!r})")
        blob = target.read_bytes().decode("utf-8", "replace")
        for needle in needles:
            if needle not in blob:
                outcome.fail(f"{name} lacks {needle!r}; it holds:\n{tail(blob)}")
    for name, needles in (step.get("file_lacks") or {}).items():
        # ``journal.sqlite3`` also covers ``journal.sqlite3-wal`` and friends.
        for candidate in sorted(work.glob(glob.escape(name) + "*")):
            blob = candidate.read_bytes()
            for needle in needles:
                if needle.encode() in blob:
                    outcome.fail(f"{candidate.relative_to(work)} contains {needle!r}")
    if "calls" in step:
        counts = count_calls(work)
        for name, expected in step["calls"].items():
            if counts.get(name, 0) != expected:
                outcome.fail(f"{name} was called {counts.get(name, 0)} times, expected "
                             f"{expected}; calls: {counts}")
    for name in step.get("files_exist") or []:
        if not (work / name).exists():
            outcome.fail(f"{name} does not exist")
    for name in step.get("files_absent") or []:
        if (work / name).exists():
            outcome.fail(f"{name} exists but must not")


def check_outcome(step: Step, outcome: Outcome, work: Path, saved: dict[str, str]) -> None:
    """Every expectation of ``step``, in the order run_cases.py checks them."""
    check_exit(step, outcome)
    check_text(step, outcome)
    check_json(step, outcome, saved)
    check_files(step, outcome, work)


# ---------------------------------------------------------------------------------------
# Processes


class Spawned:
    """A command in its own session (so its whole group can be signalled), with stdout and
    stderr captured in temporary files (so a chatty process never blocks on a full pipe)."""

    def __init__(self, argv: Sequence[str], work: Path, env: Mapping[str, str],
                 stdin_text: str | None) -> None:
        self.argv = list(argv)
        # The capture files outlive __init__ (a background step is read steps later);
        # finish() closes them through this stack.
        self._files = contextlib.ExitStack()
        self._stdout: IO[bytes] = self._files.enter_context(tempfile.TemporaryFile())  # noqa: SIM115
        self._stderr: IO[bytes] = self._files.enter_context(tempfile.TemporaryFile())  # noqa: SIM115
        try:
            self.proc = self._start(work, env, stdin_text)
        except BaseException:
            self._files.close()
            raise

    def _start(self, work: Path, env: Mapping[str, str],
               stdin_text: str | None) -> subprocess.Popen[bytes]:
        with contextlib.ExitStack() as stack:
            stdin: IO[bytes] | int = subprocess.DEVNULL
            if stdin_text is not None:
                stdin = stack.enter_context(tempfile.TemporaryFile())
                stdin.write(stdin_text.encode())
                stdin.seek(0)
            return subprocess.Popen(
                self.argv, cwd=work, env=dict(env), stdin=stdin, stdout=self._stdout,
                stderr=self._stderr, start_new_session=True,
            )

    def running(self) -> bool:
        return self.proc.poll() is None

    def send_signal(self, sig: signal.Signals, *, group: bool = True) -> None:
        try:
            if group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)
        except ProcessLookupError:
            pass

    def finish(self, deadline: float) -> tuple[int, str, str]:
        """Wait until ``deadline`` (at least a second); a process still running then is
        killed with its group and the step fails."""
        try:
            self.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            stdout, stderr = self._read()
            raise CaseFailure(
                f"`{shlex.join(self.argv)}` hung past its timeout (a prompt waiting on a "
                f"non-TTY?)\n--- stdout ---\n{tail(stdout)}\n--- stderr ---\n{tail(stderr)}"
            ) from None
        stdout, stderr = self._read()
        return shell_status(self.proc.returncode), stdout, stderr

    def kill(self) -> None:
        """Kill the process group if its leader was not reaped yet (its id is still ours)."""
        if self.running():
            self.send_signal(signal.SIGKILL)
            self.proc.wait()

    def _read(self) -> tuple[str, str]:
        texts = []
        for stream in (self._stdout, self._stderr):
            stream.seek(0)
            texts.append(stream.read().decode("utf-8", "replace"))
        self._files.close()
        return texts[0], texts[1]


@dataclass
class Background:
    step: Step
    label: str
    process: Spawned
    deadline: float


def _signal_named(name: str) -> signal.Signals:
    try:
        return signal.Signals["SIG" + name.upper().removeprefix("SIG")]
    except KeyError:
        raise CaseFileError(f"kill_when: unknown signal {name!r}") from None


def _answer(child: Any, answer: str) -> None:
    if answer == "<EOF>":
        child.sendeof()
    elif answer == "<INT>":
        child.sendintr()
    else:
        child.sendline(answer)


# ---------------------------------------------------------------------------------------
# The runner


class CaseRunner:
    """Runs the steps of one case in one work directory."""

    def __init__(self, work: Path, planrun: Sequence[str] = PLANRUN,
                 fixtures: Path = FIXTURES_DIR, journal: str | None = None) -> None:
        self.work = work
        #: The journal location (a ``postgresql://`` URL); default a file in ``work``.
        self.journal = journal or str(work / "journal.sqlite3")
        self.planrun = tuple(planrun)
        self.fixtures = fixtures
        self.saved: dict[str, str] = {}
        self.background: dict[str, Background] = {}
        self.env = self._base_env()

    def _base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PLANRUN_")}
        env.update(
            PLANRUN_JOURNAL=self.journal, NO_COLOR="1", COLUMNS="200",
            CASE_DIR=str(self.work), PYTHONDONTWRITEBYTECODE="1",
        )
        return env

    # -- the case -----------------------------------------------------------------------

    def run(self, case: Case) -> None:
        self.prepare(case)
        try:
            for number, step in enumerate(case.steps, start=1):
                self.run_step(number, step)
            if self.background:
                names = ", ".join(sorted(self.background))
                raise CaseFileError(f"background steps never waited for: {names}")
        finally:
            self.stop_background()

    def prepare(self, case: Case) -> None:
        self.write_files(case.files)
        for fixture in sorted(self.fixtures.iterdir()):
            target = self.work / fixture.name
            if fixture.suffix in FIXTURE_SUFFIXES and not target.exists():
                shutil.copyfile(fixture, target)

    def write_files(self, files: Mapping[str, Any]) -> None:
        for name, text in files.items():
            if not isinstance(text, str):
                raise CaseFileError(f"file {name}: content must be text, not {text!r}")
            target = self.work / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")

    def stop_background(self) -> None:
        for job in self.background.values():
            job.process.kill()
            job.process.finish(time.monotonic())
        self.background.clear()

    # -- steps --------------------------------------------------------------------------

    def run_step(self, number: int, step: Step) -> None:
        if "run" in step:
            self.run_command(number, step)
            return
        if len(step) != 1:
            raise CaseFileError(f"step {number}: expected one of run/write/sleep/wait: {step!r}")
        ((kind, value),) = step.items()
        if kind == "write":
            self.write_files(value)
        elif kind == "sleep":
            time.sleep(float(value))
        elif kind == "wait":
            self.wait_for(number, str(value))
        else:
            raise CaseFileError(f"step {number}: unknown step {kind!r}")

    def run_command(self, number: int, step: Step) -> None:
        unknown = set(step) - RUN_KEYS
        if unknown:
            raise CaseFileError(f"step {number}: unknown keys {sorted(unknown)}")
        label = f"step {number} `{self._describe(step['run'])}`"
        argv = expand_argv(step["run"], self.planrun, self.saved)
        env = {**self.env, **{k: str(v) for k, v in (step.get("env") or {}).items()}}
        timeout = float(step.get("timeout", DEFAULT_TIMEOUT))
        if step.get("background"):
            self.start_background(step, label, argv, env, timeout)
            return
        if step.get("tty"):
            code, stdout, stderr = self.run_tty(step, argv, env, timeout)
        elif step.get("kill_when"):
            code, stdout, stderr = self.run_and_kill(step, argv, env, timeout)
        else:
            process = Spawned(argv, self.work, env, step.get("stdin"))
            code, stdout, stderr = process.finish(time.monotonic() + timeout)
        check_outcome(step, Outcome(label, code, stdout, stderr), self.work, self.saved)

    @staticmethod
    def _describe(run: str | Sequence[Any]) -> str:
        return run if isinstance(run, str) else " ".join(map(str, run))

    def start_background(self, step: Step, label: str, argv: list[str],
                         env: Mapping[str, str], timeout: float) -> None:
        name = str(step["background"])
        if name in self.background:
            raise CaseFileError(f"{label}: background {name!r} is already running")
        process = Spawned(argv, self.work, env, step.get("stdin"))
        self.background[name] = Background(step, label, process, time.monotonic() + timeout)

    def wait_for(self, number: int, name: str) -> None:
        job = self.background.pop(name, None)
        if job is None:
            raise CaseFileError(f"step {number}: no background step named {name!r}")
        code, stdout, stderr = job.process.finish(job.deadline)
        outcome = Outcome(f"{job.label} (background {name})", code, stdout, stderr)
        check_outcome(job.step, outcome, self.work, self.saved)

    def run_and_kill(self, step: Step, argv: list[str], env: Mapping[str, str],
                     timeout: float) -> tuple[int, str, str]:
        """Run in the background; once ``calls.log`` has a line starting with
        ``kill_when.calls_has``, wait ``delay`` seconds and send ``signal`` (to the whole
        process group unless ``group: false``)."""
        kill = step["kill_when"]
        unknown = set(kill) - KILL_WHEN_KEYS
        if unknown or "calls_has" not in kill:
            raise CaseFileError(f"kill_when needs calls_has, and knows only {KILL_WHEN_KEYS}")
        sig = _signal_named(str(kill.get("signal", "KILL")))
        deadline = time.monotonic() + timeout
        process = Spawned(argv, self.work, env, step.get("stdin"))
        while time.monotonic() < deadline and process.running():
            if count_calls(self.work).get(str(kill["calls_has"]), 0):
                time.sleep(float(kill.get("delay", 0.05)))
                process.send_signal(sig, group=bool(kill.get("group", True)))
                break
            time.sleep(POLL_INTERVAL)
        return process.finish(deadline)

    def run_tty(self, step: Step, argv: list[str], env: Mapping[str, str],
                timeout: float) -> tuple[int, str, str]:
        """Run under a pseudo-terminal, answering each ``[regex, answer]`` of ``expect``.
        What the terminal showed counts as stdout; stderr is empty."""
        import pexpect

        if "stdin" in step:
            raise CaseFileError("a tty step takes its input from expect, not stdin")
        child = pexpect.spawn(
            argv[0], argv[1:], cwd=str(self.work), env=dict(env), encoding="utf-8",
            codec_errors="replace", timeout=timeout, dimensions=TTY_DIMENSIONS,
        )
        screen: list[str] = []
        try:
            for pair in step.get("expect") or []:
                pattern, answer = self._expect_pair(pair)
                self._expect(child, pattern, screen, argv)
                _answer(child, answer)
            self._expect(child, pexpect.EOF, screen, argv)
        finally:
            child.close(force=True)
        if child.exitstatus is not None:
            code = int(child.exitstatus)
        else:
            code = 128 + int(child.signalstatus or 0)
        return code, "".join(screen), ""

    @staticmethod
    def _expect_pair(pair: Any) -> tuple[str, str]:
        if (not isinstance(pair, list) or len(pair) != 2
                or not all(isinstance(part, str) for part in pair)):
            raise CaseFileError(f"expect entries are [regex, answer] strings, not {pair!r}")
        return pair[0], pair[1]

    @staticmethod
    def _expect(child: Any, pattern: Any, screen: list[str], argv: list[str]) -> None:
        import pexpect

        try:
            child.expect(pattern)
        except (pexpect.TIMEOUT, pexpect.EOF) as exc:
            screen.append(child.before if isinstance(child.before, str) else "")
            wanted = "the end of output" if pattern is pexpect.EOF else repr(pattern)
            raise CaseFailure(
                f"`{shlex.join(argv)}` on a tty: never saw {wanted} "
                f"({type(exc).__name__}); screen:\n{tail(''.join(screen), SCREEN_TAIL)}"
            ) from None
        after = child.after if isinstance(child.after, str) else ""
        screen.append((child.before or "") + after)


def run_case(path: Path, work: Path, planrun: Sequence[str] = PLANRUN,
             journal: str | None = None) -> None:
    """Run the case file at ``path`` in the (empty) directory ``work``.

    ``journal``: the journal location (as ``--journal-cmd`` of ``run_cases.py`` gives,
    e.g. a fresh PostgreSQL database); default ``work/journal.sqlite3``.
    """
    CaseRunner(work, planrun, journal=journal).run(Case.load(path))
