"""Every example in ``docs/*.md`` is run (the conventions are in docs/index.md).

Each page runs in an empty project folder of its own, with its own journal
(``PLANRUN_JOURNAL`` in ``tmp_path``) and ``HOME``. Fenced code blocks, in page order:

* ````` ```LANG file=PATH ````` writes the block to ``PATH`` in the project folder.
* ````` ```console ````` runs each ``$ `` line with bash in the project folder (stdin is
  not a terminal; ``planrun`` is the planrun under test). A trailing ``# exit N`` is the
  expected exit status (default 0). The lines after a command are expected output: each
  must be found in a line of its stdout or stderr (whitespace runs count as one space,
  ``...`` matches anything). ``RUN`` stands for the id of the journal's most recent run.
* ````` ```LANG norun ````` is not run; ``yaml``, ``json`` and ``toml`` ones must parse.
* Any other fenced block fails the test: every example is either run or marked.

``planrun`` in those commands is served by ``tests/planrun_forkserver.py`` (planrun's own
``cli.main()`` in a process forked from one that imported planrun once), which saves the
interpreter start-up of each command. ``DOCS_EXAMPLES_REAL_PROCESSES=1`` runs a fresh
``python -m planrun`` process per command instead.

After a page, a plan file whose first line is a ``# yaml-language-server: $schema=PATH``
modeline must validate against that schema file (as an editor would check it).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema
import pytest

from planrun.errors import EXIT_CODES
from planrun.issues import ISSUE_CODES
from planrun.journal import Journal
from planrun.loading import parse_text

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
REQUIRED_PAGES = {
    "index.md", "plans.md", "params-and-placeholders.md", "tools-and-contracts.md",
    "approvals-and-policy.md", "journal-and-resume.md", "ci.md", "exit-and-error-codes.md",
    "planners.md", "repair.md", "agents.md", "postgres-journal.md",
}
WORKFLOW = DOCS / "github-actions-example.yml"
FORKSERVER = Path(__file__).with_name("planrun_forkserver.py")
#: Hang guard for one documented command.
COMMAND_TIMEOUT_S = 60
MODELINE = re.compile(r"^# yaml-language-server: \$schema=(\S+)")
EXIT_MARK = re.compile(r"\s+#\s*exit\s+(\d+)\s*$")
RUN_WORD = re.compile(r"\bRUN\b")


class ExampleError(AssertionError):
    """A documented example does not do what the page says."""


@dataclass
class Block:
    """One fenced code block of a page."""

    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    attrs: dict[str, str]
    flags: set[str]
    body: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


@dataclass
class Command:
    """One ``$`` line of a console block with what the page expects of it."""

    line: int
    text: str
    exit: int = 0
    expected: list[str] = field(default_factory=list)


def parse_blocks(text: str, page: str) -> list[Block]:
    """The fenced (```) code blocks of a Markdown text, in order."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(.*)$", lines[i])
        if not m:
            i += 1
            continue
        words = m.group(1).split()
        lang = words[0] if words else ""
        attrs = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        flags = {w for w in words[1:] if "=" not in w}
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise ExampleError(f"{page}:{start + 1}: code block is never closed")
        blocks.append(Block(page, start + 1, lang, attrs, flags, "\n".join(body) + "\n"))
        i += 1
    return blocks


def kind_of(block: Block) -> str:
    """``file``, ``console`` or ``norun``; anything else is an unmarked example."""
    if "norun" in block.flags:
        return "norun"
    if "file" in block.attrs:
        return "file"
    if block.lang == "console":
        return "console"
    raise ExampleError(f"{block.where}: a ```{block.lang} block must be run or marked: add "
                       "file=PATH, use ```console, or mark it norun")


def parse_console(block: Block) -> list[Command]:
    """The commands of a console block, with expected exit statuses and output lines."""
    commands: list[Command] = []
    lines = block.body.splitlines()
    n = 0
    while n < len(lines):
        line = lines[n]
        number = block.line + 1 + n
        n += 1
        if line.startswith("$ "):
            text = line[2:]
            while text.endswith("\\") and n < len(lines):
                text = text[:-1] + lines[n]
                n += 1
            status = 0
            m = EXIT_MARK.search(text)
            if m:
                status = int(m.group(1))
                text = text[:m.start()]
            commands.append(Command(number, text.strip(), status))
        elif not commands:
            if line.strip():
                raise ExampleError(f"{block.page}:{number}: output before any `$ ` command")
        elif line.strip() and line.strip() != "...":
            commands[-1].expected.append(line)
    if not commands:
        raise ExampleError(f"{block.where}: a console block without a `$ ` command")
    return commands


def _squash(text: str) -> str:
    return " ".join(text.split())


def line_matches(expected: str, actual_lines: list[str]) -> bool:
    """``expected`` (``...`` matches anything) is found in one of ``actual_lines``."""
    pattern = ".*".join(re.escape(_squash(part)) for part in _squash(expected).split("..."))
    rx = re.compile(pattern)
    return any(rx.search(_squash(line)) for line in actual_lines)


def check_norun(block: Block) -> None:
    """A block that is not run must at least parse when it is data."""
    try:
        if block.lang in ("yaml", "yml"):
            parse_text(block.body, kind="yaml", file=block.where)
        elif block.lang == "json":
            json.loads(block.body)
        elif block.lang == "toml":
            tomllib.loads(block.body)
    except Exception as exc:
        raise ExampleError(f"{block.where}: the {block.lang} block does not parse: "
                           f"{exc}") from None


@dataclass
class Sandbox:
    """A page's project folder, journal, HOME and the environment its commands get.

    ``planrun`` is the shell command line that runs planrun (see :func:`planrun_command`).
    """

    base: Path
    planrun: str

    def __post_init__(self) -> None:
        self.project = self.base / "project"
        self.home = self.base / "home"
        self.journal = self.base / "docs-journal.sqlite3"
        bin_dir = self.base / "bin"
        for folder in (self.project, self.home, bin_dir):
            folder.mkdir(parents=True, exist_ok=True)
        # `planrun` and `python3` are the interpreter running these tests.
        for name, argv in (("planrun", self.planrun), ("python3", shlex.quote(sys.executable))):
            shim = bin_dir / name
            shim.write_text(f'#!/bin/sh\nexec {argv} "$@"\n', encoding="utf-8")
            shim.chmod(shim.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PLANRUN_", "XDG_")) and k not in ("FORCE_COLOR",
                                                                       "CLICOLOR_FORCE")}
        env.update(HOME=str(self.home), PLANRUN_JOURNAL=str(self.journal), NO_COLOR="1",
                   COLUMNS="200", PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}")
        self.env = env
        self.written: list[Path] = []

    def latest_run(self, block: Block, command: Command) -> str:
        with Journal(self.journal, write=False) as journal:
            rows = journal.list_runs(limit=1)
        if not rows:
            raise ExampleError(f"{block.page}:{command.line}: RUN is used but the journal "
                               "has no run yet")
        return str(rows[0]["run_id"])

    def write(self, block: Block) -> None:
        relative = Path(block.attrs["file"])
        target = (self.project / relative).resolve()
        if relative.is_absolute() or not target.is_relative_to(self.project.resolve()):
            raise ExampleError(f"{block.where}: file={relative} is outside the project")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.body, encoding="utf-8")
        self.written.append(target)

    def run(self, block: Block, command: Command) -> None:
        text = command.text
        if RUN_WORD.search(text):
            text = RUN_WORD.sub(self.latest_run(block, command), text)
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", text], cwd=self.project,
                              env=self.env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=COMMAND_TIMEOUT_S, check=False)
        # A command killed by a signal: report it as a shell does (128 + signal).
        status = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        shown = (f"{block.page}:{command.line}: $ {text}\n--- exit {status}\n--- stdout\n"
                 f"{proc.stdout}--- stderr\n{proc.stderr}")
        if status != command.exit:
            raise ExampleError(f"exit status {status}, the page says {command.exit}\n{shown}")
        actual = (proc.stdout + "\n" + proc.stderr).splitlines()
        needs_run = any(RUN_WORD.search(e) for e in command.expected)
        run_id = self.latest_run(block, command) if needs_run else ""
        for expected in command.expected:
            wanted = RUN_WORD.sub(run_id, expected) if needs_run else expected
            if not line_matches(wanted, actual):
                raise ExampleError(f"expected output not found: {expected!r}\n{shown}")

    def check_modelines(self) -> None:
        """Plan files that name a schema in a modeline validate against it."""
        for path in dict.fromkeys(self.written):
            if not path.is_file():
                continue  # the page removed it again
            first = path.read_text(encoding="utf-8").partition("\n")[0]
            m = MODELINE.match(first)
            if not m:
                continue
            schema_file = (path.parent / m.group(1)).resolve()
            if not schema_file.is_file():
                raise ExampleError(f"{path.name}: its modeline names {m.group(1)}, which the "
                                   "page never creates")
            schema = json.loads(schema_file.read_text(encoding="utf-8"))
            data = parse_text(path.read_text(encoding="utf-8"), kind="yaml").data
            errors = [e.message for e in jsonschema.Draft202012Validator(schema)
                      .iter_errors(data)]
            if errors:
                raise ExampleError(f"{path.name} does not fit {m.group(1)}: {errors}")


def run_markdown(text: str, page: str, base: Path, planrun: str) -> Sandbox:
    """Run every example of one page in a fresh sandbox under ``base``."""
    box = Sandbox(base, planrun)
    for block in parse_blocks(text, page):
        kind = kind_of(block)
        if kind == "norun":
            check_norun(block)
        elif kind == "file":
            box.write(block)
        else:
            for command in parse_console(block):
                box.run(block, command)
    box.check_modelines()
    return box


# --- the pages -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def planrun_command(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The command line a ``planrun`` of the examples runs (a fork server's client)."""
    real = f"{shlex.quote(sys.executable)} -m planrun"
    if os.environ.get("DOCS_EXAMPLES_REAL_PROCESSES"):
        yield real
        return
    sock = tmp_path_factory.mktemp("forkserver") / "planrun.sock"
    if len(str(sock)) > 100:  # beyond what a Unix socket path may hold
        yield real
        return
    server = subprocess.Popen([sys.executable, str(FORKSERVER), "serve", str(sock)],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "ready":  # pragma: no cover - shown on failure
            raise RuntimeError("the planrun fork server did not start")
        yield (f"{shlex.quote(sys.executable)} -S {shlex.quote(str(FORKSERVER))} client "
               f"{shlex.quote(str(sock))}")
    finally:
        server.terminate()
        server.wait(timeout=10)


def _run_page(page: Path, base: Path, planrun: str) -> Exception | None:
    try:
        run_markdown(page.read_text(encoding="utf-8"), f"docs/{page.name}", base, planrun)
    except Exception as exc:  # reported by the page's own test below
        return exc
    return None


@pytest.fixture(scope="module")
def page_failures(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                  planrun_command: str) -> dict[str, Exception | None]:
    """Run the selected pages at the same time (each in its own sandbox): page → failure.

    Most of the time goes into starting planrun processes, so the pages run in threads.
    """
    selected = [item.callspec.params["page"] for item in request.session.items
                if getattr(item, "originalname", "") == "test_page_examples_run"]
    bases = {page: tmp_path_factory.mktemp(page.stem) for page in selected}
    with ThreadPoolExecutor(max_workers=max(1, len(bases))) as pool:
        futures = {page.name: pool.submit(_run_page, page, base, planrun_command)
                   for page, base in bases.items()}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_page_examples_run(page: Path, page_failures: dict[str, Exception | None]) -> None:
    failure = page_failures[page.name]
    if failure is not None:
        raise failure


def test_every_block_is_run_or_marked() -> None:
    kinds: dict[str, int] = {}
    for page in PAGES:
        for block in parse_blocks(page.read_text(encoding="utf-8"), page.name):
            kind = kind_of(block)
            kinds[kind] = kinds.get(kind, 0) + 1
            if kind == "console":
                parse_console(block)
    assert kinds.get("console", 0) >= len(REQUIRED_PAGES)


def test_the_pages_exist_and_the_index_links_each() -> None:
    assert {p.name for p in PAGES} >= REQUIRED_PAGES
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    for name in REQUIRED_PAGES - {"index.md"}:
        assert f"]({name})" in index, f"docs/index.md does not link {name}"


def _slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    in_code = False
    out = set()
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (m := re.match(r"^#{1,6}\s+(.*)$", line)):
            out.add(_slug(m.group(1)))
    return out


@pytest.mark.parametrize("source", [*PAGES, ROOT / "README.md"], ids=lambda p: p.name)
def test_relative_links_resolve(source: Path) -> None:
    text = re.sub(r"```.*?```", "", source.read_text(encoding="utf-8"), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue  # an external link
        file_part, _, fragment = target.partition("#")
        path = (source.parent / file_part).resolve() if file_part else source
        assert path.exists(), f"{source.name}: link to missing {target}"
        if fragment and path.suffix == ".md":
            assert fragment in _anchors(path), f"{source.name}: no heading for {target}"


def test_readme_points_to_the_docs_and_the_completions() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "](docs/index.md)" in readme
    assert "## Shell completion" in readme
    for shell in ("bash", "zsh", "fish"):
        assert f"completions/planrun.{shell}" in readme
        assert (ROOT / "completions" / f"planrun.{shell}").is_file()


# --- tables that must match the code ----------------------------------------------------------


def _table_after(text: str, heading: str) -> dict[str, str]:
    section = text.split(f"## {heading}\n", 1)[1]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells[0] == "code" or set(cells[0]) <= {"-"}:
                continue
            rows[cells[0].strip("`")] = cells[1]
        elif rows:
            break
    return rows


def test_code_tables_match_the_code() -> None:
    text = (DOCS / "exit-and-error-codes.md").read_text(encoding="utf-8")
    exits = {int(k): v for k, v in _table_after(text, "Exit statuses").items()}
    assert exits == EXIT_CODES
    assert _table_after(text, "Validation issue codes") == ISSUE_CODES


# --- the GitHub Actions example ----------------------------------------------------------------


def test_github_workflow_example() -> None:
    text = WORKFLOW.read_text(encoding="utf-8")
    workflow = parse_text(text, kind="yaml", file=str(WORKFLOW)).data  # YAML 1.2: `on` stays
    assert set(workflow["on"]) >= {"push", "pull_request"}
    runs = [step.get("run", "") for job in workflow["jobs"].values() for step in job["steps"]]
    assert any("pip install" in r for r in runs)
    validate = [r for r in runs if r.startswith("planrun validate")]
    assert validate == ["planrun validate --format github"]
    ci = (DOCS / "ci.md").read_text(encoding="utf-8")
    assert "](github-actions-example.yml)" in ci
    shown = [b.body for b in parse_blocks(ci, "ci.md") if "jobs:" in b.body]
    assert shown == [text], "docs/ci.md must show docs/github-actions-example.yml as it is"
    # The workflow's validate step passes on this repository's own plans.
    proc = subprocess.run([sys.executable, "-m", "planrun", *validate[0].split()[1:]],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "::error" not in proc.stdout


# --- the runner catches broken examples ----------------------------------------------------------


BROKEN = {
    "wrong output": "```console\n$ planrun --version\nplanrun 0.0.0-not-this\n```\n",
    "wrong exit status": "```console\n$ planrun status 0000\n```\n",
    "unmarked block": "```yaml\nplanrun: 1\n```\n",
    "norun data that does not parse": "```json norun\n{\"a\": }\n```\n",
    "plan that does not validate": (
        "```yaml file=plans/p.yaml\nplanrun: 1\ngoal: g\nsteps: []\n```\n"
        "```console\n$ planrun validate\n```\n"),
    "file outside the project": "```text file=../escape.txt\nx\n```\n",
    "RUN before any run": "```console\n$ planrun status RUN\n```\n",
    "modeline without its schema": (
        "```yaml file=plans/p.yaml\n# yaml-language-server: $schema=../plan.schema.json\n"
        "planrun: 1\n```\n"),
    "unclosed block": "```console\n$ planrun --version\n",
}


@pytest.mark.parametrize("case", BROKEN, ids=list(BROKEN))
def test_a_broken_example_fails(case: str, tmp_path: Path, planrun_command: str) -> None:
    with pytest.raises(ExampleError):
        run_markdown(BROKEN[case], f"broken-{case}.md", tmp_path, planrun_command)


def test_a_working_example_passes(tmp_path: Path, planrun_command: str) -> None:
    page = ("```console\n$ planrun --version\nplanrun ...\n"
            "$ planrun status 0000   # exit 5\nerror[unknown_run]\n"
            "$ PLANRUN_TEST_CRASH=x planrun execute nothing < /dev/null | cat   # exit 3\n"
            "no plan named 'nothing'\n```\n")
    run_markdown(page, "good.md", tmp_path, planrun_command)


# --- the README's unattended recipe ------------------------------------------------------------


def _readme_section_blocks(heading: str) -> list[Block]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return parse_blocks(section, f"README.md#{heading}")


def _copy_project(target: Path) -> None:
    """This repository's planrun project (tools, their modules, plans) into ``target``."""
    import shutil

    target.mkdir(parents=True)
    for name in ("tools.yaml", "backup_tools.py", "tree_tools.py"):
        shutil.copy(ROOT / name, target / name)
    shutil.copytree(ROOT / "plans", target / "plans")


def test_readme_unattended_recipe_runs_as_written(tmp_path: Path) -> None:
    """Issue 10, bug 1: the cron line and planrun.toml of "Running unattended", verbatim.

    No terminal, no ``--approve``: the grant must clear ``prune`` every night. The cron
    command (the crontab line without its five time fields) runs with ``sh`` as cron runs
    it, with ``HOME`` a fresh folder holding the project in ``~/app`` and the data in
    ``~/data``; the journal is the default one of that user.
    """
    blocks = _readme_section_blocks("Running unattended")
    toml_text = next(b.body for b in blocks if b.lang == "toml")
    cron = next(b.body for b in blocks if b.lang == "cron")
    entry = next(line for line in cron.splitlines() if line.strip() and
                 not line.startswith("#"))
    command = entry.split(None, 5)[5]
    home = tmp_path / "cronhome"
    _copy_project(home / "app")
    (home / "app" / "planrun.toml").write_text(toml_text, encoding="utf-8")
    data = home / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.txt").write_text("alpha\n", encoding="utf-8")
    (data / "sub" / "b.txt").write_text("beta\n", encoding="utf-8")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "planrun"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m planrun "$@"\n',
                    encoding="utf-8")
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PLANRUN_", "XDG_"))}
    env.update(HOME=str(home), PATH=f"{bin_dir}:/usr/bin:/bin", NO_COLOR="1")

    def sh(cmd: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", "-c", cmd], cwd=tmp_path, env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=120, check=False)

    proc = sh(command)
    err = (home / "planrun.err").read_text(encoding="utf-8")
    assert proc.returncode == 0, (proc, err)
    manifest = json.loads((home / "planrun.json").read_text(encoding="utf-8"))
    assert manifest["status"] == "completed", (manifest, err)
    steps = {s["id"]: s for s in manifest["steps"]}
    assert steps["prune"]["approved_by"] == "nightly-prune"
    # issue 18: the run's report, written next to the log
    report = (home / "planrun-report.html").read_text(encoding="utf-8")
    assert manifest["run_id"] in report
    assert 'data-step="prune" data-status="succeeded"' in report
    archives = sorted((home / "backups").glob("backup-*.tar.gz"))
    assert len(archives) == 1
    check = subprocess.run(["sha256sum", "-c", archives[0].name + ".sha256"],
                           cwd=home / "backups", capture_output=True, text=True, check=False)
    assert check.returncode == 0, check
    # The static checks agree that nothing in the project is beyond its grants.
    for static in ("planrun policy check --strict", "planrun validate --strict nightly-backup"):
        proc = sh(f'cd "$HOME/app" && {static}')
        assert proc.returncode == 0, (static, proc)
        assert "ungrantable" not in proc.stdout + proc.stderr
