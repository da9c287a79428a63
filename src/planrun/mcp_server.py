"""``planrun mcp``: planrun served to language-model clients over MCP (SPEC §10, Agents).

An MCP server over stdio, built on the official ``mcp`` SDK (the optional extra
``pip install 'planrun[mcp]'``; this module imports it, so only the ``mcp`` command imports
this module). One project and one journal per session, fixed when the server starts. Every
tool goes through :mod:`planrun.api`.

Tools (each result: structured content, the same JSON as the CLI's ``--json``, plus a
one-paragraph text summary):

- ``list_tools``: the allowed tool catalog (registry ∩ policy).
- ``list_plans``: the project's plans.
- ``validate_plan``: a plan by name/file, or inline (JSON or YAML text): the report of
  ``validate --format json``. A refused plan is a normal result (``isError`` false,
  ``ok`` false); the client reads codes and JSON pointers from ``plans[].issues``.
- ``show_plan``, ``dry_run``: the substituted plan, the order, the steps needing approval.
- ``execute_plan``, ``resume_run``: drive a run with deferred approval: nothing here can
  clear a step (no approve argument exists, nobody is asked); a run with a step needing a
  person ends ``awaiting_approval`` and the result names ``planrun approve RUN``.
- ``run_status``, ``list_runs``, ``run_log``, ``run_output``: read the journal.

A planrun error (unknown run, refused plan …) is a tool result with ``isError`` true and
``{"ok": false, "error": {"code", "message", "hint", "exit_status"}}``.

Threads: the SDK serves the protocol in a thread of its own; runs are driven on the main
thread (:class:`Driver`), one at a time, so that SIGINT/SIGTERM reach the run's scheduler
(the run is journaled ``interrupted`` and resumable) and a tool call that waits while its
run goes on leaves no thread behind when the session ends; ``execute_plan`` and
``resume_run`` wait holding no thread at all (the SDK's worker threads are bounded, and
the read tools need them meanwhile). The SDK's stdio transport
serves the protocol on private duplicates of file descriptors 0 and 1 and points 0 at
the null device and 1 at stderr: what a tool prints never reaches the protocol channel.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import queue
import threading
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from . import __version__, api, redact
from .errors import PlanrunError

__all__ = ["Driver", "build_server", "serve"]

INSTRUCTIONS = (
    "planrun validates, runs and journals plans of tool calls in one project. Read the "
    "catalog (list_tools) and the plans (list_plans); validate a draft (validate_plan, "
    "inline text is fine) until it is ok; look at it (show_plan, dry_run); run a plan of "
    "the project (execute_plan). You can never clear a step that needs approval: such a "
    "run ends 'awaiting_approval' and a person runs 'planrun approve RUN'; then call "
    "resume_run. Read runs with run_status, run_log, run_output.")

#: Names and paths hold no NUL (no file name can; ``os.path`` raised ValueError on one).
NO_NUL = r"^[^\x00]*$"
PlanRef = Annotated[str, Field(
    description="A plan name (in the project's plans folder) or a plan file path "
    "(relative to the project folder).", min_length=1, pattern=NO_NUL)]
Params = Annotated[dict[str, Any] | None, Field(
    description="Parameter values by name (native JSON values, like a --params-file). "
    "Values of secret parameters are shown as *** in every result.")]
RunRef = Annotated[str, Field(
    description="Run id, unique prefix (4+ characters) or 'last' (this project's latest "
    "run).", min_length=1, pattern=NO_NUL)]

# Exactly ``str`` (not ``str | None``): the SDK would parse a JSON text into an object.
OptPlanRef = Annotated[str, Field(
    description="A plan name or file of the project (or give 'text').", pattern=NO_NUL)]
PlanText = Annotated[str, Field(
    description="An inline plan, JSON or YAML text (or give 'plan').")]
StepRef = Annotated[str, Field(description="A step id of the run.", min_length=1,
                                pattern=NO_NUL)]
#: The journal's integers are 64-bit (an item index beyond overflowed in SQLite).
Item = Annotated[int | None, Field(description="A fan-out item's index.", ge=0,
                                   le=2**63 - 1)]
KeepGoing = Annotated[bool, Field(
    description="After a failure, go on with steps that do not depend on it.")]
MaxParallel = Annotated[int | None, Field(description="Calls running at once.", ge=1,
                                          le=1024)]
PlanFilter = Annotated[str | None, Field(description="Only runs of this plan.")]
StatusFilter = Annotated[str | None, Field(description="Only runs in this status.")]
Limit = Annotated[int, Field(description="At most this many runs.", ge=1, le=1000)]
EventsAfter = Annotated[int, Field(
    description="Only events after this event id: the next_after of the page before (0: "
    "from the first).", ge=0, le=2**63 - 1)]
EventsLimit = Annotated[int, Field(description="At most this many events.", ge=1,
                                   le=10_000)]

_READ = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                        open_world_hint=False)


class Driver:
    """Runs submitted calls one at a time on the thread that calls :meth:`serve`.

    A tool queues a call (:meth:`start`) and awaits its future, holding no thread; the
    main thread runs it (signal handlers of a run's scheduler need the main thread).
    """

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = (
            queue.Queue())
        #: python tool calls left running in threads by the runs driven (timed out): the
        #: process must then end without waiting for them.
        self.abandoned = 0

    def start(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Queue ``fn`` for the serving thread; the future of its result (not waited for)."""
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._jobs.put((fn, done))
        return done

    def serve(self, until: threading.Thread) -> None:
        """Run submitted calls until ``until`` has ended and none is left."""
        while True:
            try:
                fn, done = self._jobs.get(timeout=0.2)
            except queue.Empty:
                if not until.is_alive():
                    return
                continue
            if not done.set_running_or_notify_cancel():
                continue
            try:
                done.set_result(fn())
            except BaseException as exc:  # handed to the waiting tool, re-raised here
                done.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise


#: Fields whose values are planrun's own words: ids, statuses, codes, kinds, times, counts
#: (SPEC §7: never masked, however short the secret). A value under them comes from the
#: journal or from planrun, where a secret is a reference already.
_PLANRUN_WORDS = frozenset({
    "run_id", "root_run_id", "parent_run_id", "id", "step", "step_id", "tool", "status",
    "code", "kind", "severity", "revision", "digest", "key", "idempotency_key",
    "created_at", "started_at", "finished_at", "ts", "next", "exit_status", "run",
})


def _secrets_shown(value: Any, secrets: dict[str, Any]) -> Any:
    r"""``value`` as a client sees it: every secret parameter's value as ``***``.

    The references planrun stores are shown as ``***``; then a value the client gave (of
    :func:`_echoable` length) is concealed wherever it may be echoed (strings), except
    in planrun's own words (:data:`_PLANRUN_WORDS`, keys, numbers and booleans), which a
    short or numeric secret garbled (``"status": "compl***t***d"``, a run id no client
    could use; found by attack). Text that does not encode as UTF-8 (a lone surrogate
    from an undecodable file name in a tool's message) is shown with the surrogate
    escaped (``\udce9``): the SDK could not send it and the session stopped answering.
    """
    from .loading import utf8_text

    echoed = _echoable(secrets)
    found = redact.Secrets(echoed) if echoed else None

    def walk(v: Any, word: bool) -> Any:
        if isinstance(v, str):
            v = redact.display_text(v)  # the references planrun stores, as ***
            if found is not None and not word:
                v = redact.display_text(found.conceal_text(v))
            return utf8_text(v)
        if isinstance(v, dict):
            return {utf8_text(redact.display_text(k)) if isinstance(k, str) else k:
                    walk(x, isinstance(k, str) and k in _PLANRUN_WORDS)
                    for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [walk(x, word) for x in v]
        return v

    return walk(value, False)


def _echoable(secrets: dict[str, Any]) -> dict[str, list[str]]:
    """The spellings of the client's secret values looked for in what it is sent.

    Only those of :data:`planrun.redact.KEY_SECRET_CHARS` characters or more: planrun
    itself already shows every secret parameter's value as ``***`` (its stored data holds
    references); looking for a short one as text garbled planrun's own words (a secret
    ``e`` sent ``"file": "plans/h***llo.yaml"``, ``"depends_on": ["gr******t"]``,
    ``"run_if": "succ***ss"``, found by an attacker), as SPEC §7 forbids; a short value
    in a longer text is taken for a coincidence, as in an object's keys.
    """
    from .pointers import leaves

    out: dict[str, list[str]] = {}
    for name, value in secrets.items():
        found = []
        for _, leaf in leaves(value):
            if isinstance(leaf, int | float) and not isinstance(leaf, bool):
                leaf = json.dumps(leaf)
            if isinstance(leaf, str) and len(leaf) >= redact.KEY_SECRET_CHARS:
                found.append(leaf)
        if found:
            out[name] = found
    return out


def _result(data: Any, summary: str, *, error: bool = False,
            secrets: dict[str, Any] | None = None) -> CallToolResult:
    from .loading import utf8_text

    secrets = _echoable(secrets or {})
    shown = _secrets_shown(data, secrets)
    text = redact.display_text(summary)
    if secrets:
        # planrun's words in the summary are kept as they are (never one inside a secret:
        # Secrets.conceal_text)
        keep = sorted({w for w in _words(shown) if w in summary}, key=len, reverse=True)
        text = redact.display_text(redact.Secrets(secrets).conceal_text(text, keep=keep))
    text = utf8_text(text)
    structured = shown if isinstance(shown, dict) else {"result": shown}
    return CallToolResult(content=[TextContent(type="text", text=text)],
                          structured_content=structured, is_error=error)


def _words(value: Any) -> set[str]:
    """The strings of ``value`` under :data:`_PLANRUN_WORDS` keys (kept in a summary)."""
    out: set[str] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            for k, x in v.items():
                if k in _PLANRUN_WORDS and isinstance(x, str):
                    out.add(x)
                elif isinstance(x, dict | list):
                    stack.append(x)
        elif isinstance(v, list):
            stack.extend(v)
    return out


def _failure(exc: PlanrunError, secrets: dict[str, Any] | None = None) -> CallToolResult:
    data: dict[str, Any] = {"ok": False, "error": {
        "code": exc.code, "message": exc.unplaced(), "hint": exc.hint,
        "exit_status": exc.exit_code}}
    report = getattr(exc, "report", None)
    if isinstance(report, api.Report):
        data.update(report.to_json())
    lines = [f"error[{exc.code}]: {exc.unplaced()}"]  # its report comes after it here
    if isinstance(report, api.Report):
        lines += [_issue_line(i) for i in report.all_issues()]
    if exc.hint:
        lines.append(exc.hint)
    return _result(data, "\n".join(lines), error=True, secrets=secrets)


def _issue_line(issue: Any) -> str:
    where = issue.path or ""
    return f"{issue.severity}[{issue.code}] {issue.file or ''}#{where}: {issue.message}"


class Session:
    """The tools of one server session: a project, a journal, a driver."""

    def __init__(self, settings: Any, driver: Driver) -> None:
        self.settings = settings
        self.driver = driver

    # --- parameters and secrets -------------------------------------------------------

    def _given(self, params: dict[str, Any] | None, *, inline: bool = False) -> Any:
        """The values a plan is checked or run with (a ``ParamInput``).

        The client's ``params``; below them the server's ``PLANRUN_PARAM_*``, for a plan
        of the project only. An inline plan (``validate_plan`` ``text``) is the client's
        own: it gets the client's values only. Given the environment's, it read them back:
        a draft that declares ``token`` without ``secret: true`` showed the value of
        ``PLANRUN_PARAM_TOKEN`` in its substituted steps, and a ``pattern`` or ``enum`` of
        its own made ``param_type`` an oracle for it (found by an attacker).
        """
        import dataclasses

        from .validation import ParamInput

        base = ParamInput() if inline else api.param_input([], None)
        return dataclasses.replace(base, file_values=dict(params or {}))

    def _secrets(self, params: dict[str, Any] | None, plan: str | None,
                 text: str | None) -> dict[str, Any]:
        """The client's values of the parameters the plan (``plan`` or ``text``) declares secret.

        When the plan's declarations cannot be read, every value given is treated as a
        secret (nothing the client gave is shown back). The plan is read for this only
        when values were given: it was read and checked once more on every call, which
        doubled the time of a large plan (a 3 MB inline plan of 60,000 steps: 14.5 s, now
        5.7 s).
        """
        if not params:
            return {}
        document = self._document(plan, text)
        declared = document.get("params") if isinstance(document, dict) else None
        if not isinstance(declared, dict):
            return {n: v for n, v in params.items() if isinstance(v, str)}
        return {n: v for n, v in params.items()
                if isinstance(declared.get(n), dict) and declared[n].get("secret") is True}

    def _run_secrets(self, run: str, params: dict[str, Any] | None) -> dict[str, Any]:
        """The client's values of a journaled run's secret parameters.

        A run's manifest holds a reference where a secret parameter's value was.
        """
        if not params:
            return {}
        try:
            journaled = api.status(self.settings, run).get("params") or {}
        except PlanrunError:
            return {n: v for n, v in params.items() if isinstance(v, str)}
        return {n: v for n, v in params.items()
                if n in journaled and redact.display(journaled[n]) != journaled[n]}

    def _document(self, plan: str | None, text: str | None) -> Any:
        if text is not None:
            from .loading import DocumentError, load_stdin

            try:
                return load_stdin(text.encode("utf-8", "surrogatepass")).data
            except (DocumentError, UnicodeError):
                return None
        assert plan is not None
        try:
            registry = api.load_registry(self.settings)
        except PlanrunError:
            return None
        return api.check(self.settings, plan, registry, None, concrete=False).document

    def _outside(self, plan: str) -> CallToolResult | None:
        """A tool error when ``plan`` is a file path outside the project folder, else None.

        A client reads and runs the project's plans only: not any file of the machine,
        also not through a plan name whose file in the plans folder is a symlink to one
        elsewhere (found by attack: ``plans/evil.yaml`` → ``/etc/passwd``).
        """
        project = os.path.realpath(self.settings.project)
        if "/" not in plan and "\\" not in plan and ".." not in plan:
            from .paths import PlanLookupError, find_plan

            try:  # a name: the file it is looked up as in the plans folder
                found = find_plan(plan, self.settings.plans_dir, self.settings.project)
            except PlanLookupError:
                return None  # the tool itself says what is wrong
            target = os.path.realpath(found)
            plans = os.path.realpath(self.settings.plans_dir)  # it may be elsewhere
            if os.path.commonpath([plans, target]) == plans:
                return None
        else:
            target = os.path.realpath(os.path.join(project, plan))
        if os.path.commonpath([project, target]) == project:
            return None
        return _failure(_usage(f"plan {plan!r} is outside the project folder; name a plan "
                               "of the project (or give an inline plan as 'text')"))

    def _mine(self, run: str) -> str | CallToolResult:
        """``run`` as this project's full run id (``last`` as it is), or a tool error.

        A journal may be shared by projects (the default: one per user); a client reads
        and resumes this project's runs only, as ``list_runs`` lists them. A prefix is
        matched against this project's runs alone: matched against the whole journal, an
        ambiguous one named other projects' run ids, and a unique one told a foreign run
        from no run (found by an attacker). Another project's run is ``unknown_run``.
        """
        if run == "last":
            return run
        from .errors import RunError
        from .journal.base import MIN_PREFIX

        try:
            mine = [str(r.get("run_id")) for r in api.runs(self.settings)]
        except PlanrunError:
            return run  # the tool itself says what is wrong
        if run in mine or len(run) < MIN_PREFIX:
            return run
        found = [r for r in mine if r.startswith(run)]
        if len(found) == 1:
            return found[0]
        if found:
            return _failure(RunError(
                f"run id prefix {run!r} is ambiguous ({', '.join(found[:3])}…); give more "
                "characters", code="unknown_run"))
        return _failure(RunError(f"no run {run!r} of this project "
                                 f"({self.settings.project})", code="unknown_run",
                                 hint="List this project's runs with list_runs."))

    # --- the tools --------------------------------------------------------------------

    def list_tools(self) -> CallToolResult:
        """The tools a plan may use here: the registry ∩ the policy's allowlist.

        Each: name, description, arguments (JSON Schema), output_schema, irreversible,
        idempotent. Tools the policy refuses are not listed.
        """
        try:
            tools = api.describe_tools(api.load_registry(self.settings), allowed=True)
        except PlanrunError as exc:
            return _failure(exc)
        names = ", ".join(t["name"] for t in tools) or "(none)"
        return _result({"tools": tools}, f"{len(tools)} allowed tool(s): {names}")

    def list_plans(self) -> CallToolResult:
        """The project's plans: name, file, revision, goal, steps, needs_approval, ok."""
        try:
            rows = api.plans(self.settings)
        except PlanrunError as exc:
            return _failure(exc)
        lines = [f"{r['name']} (rev {r['revision']}, {r['steps']} steps"
                 f"{', refused' if not r['ok'] else ''})" for r in rows]
        return _result({"plans": rows}, "\n".join(lines) or "no plans")

    def validate_plan(self, plan: OptPlanRef = "", text: PlanText = "",
                      params: Params = None) -> CallToolResult:
        """Validate a plan of the project (``plan``) or an inline plan (``text``).

        The result is the report of ``planrun validate --format json``: ``{"ok",
        "issues", "plans": [{"file", "ok", "issues": [{"code", "severity", "pointer",
        "line", "column", "message", ...}], "plan"}]}``; a plan free of errors has
        ``plan.steps`` as substituted. A refused plan is a normal result (not an error):
        read ``ok`` and the issues' codes and pointers, fix, validate again.
        """
        if bool(plan) == bool(text):
            return _failure(_usage("give exactly one of 'plan' (a name or file) or 'text' "
                                   "(an inline plan, JSON or YAML)"))
        refused = self._outside(plan) if plan else None
        if refused is not None:
            return refused
        secrets = self._secrets(params, plan, text or None)
        try:
            given = self._given(params, inline=bool(text))
            if text:
                report = api.validate(self.settings, ["-"], given,
                                      stdin=text.encode("utf-8", "surrogatepass"))
            else:
                report = api.validate(self.settings, [plan], given)
        except PlanrunError as exc:
            return _failure(exc, secrets)
        except UnicodeError:
            return _failure(_usage("'text' is not UTF-8 text"))
        issues = report.all_issues()
        head = "ok" if report.ok() else "refused"
        lines = [f"{head}: {sum(i.severity == 'error' for i in issues)} error(s), "
                 f"{sum(i.severity != 'error' for i in issues)} warning(s)"]
        lines += [_issue_line(i) for i in issues]
        return _result(report.to_json(), "\n".join(lines), secrets=secrets)

    def show_plan(self, plan: PlanRef, params: Params = None) -> CallToolResult:
        """A plan as ``planrun show --json`` prints it.

        Parameters, steps in run order, which steps need approval and why
        (``warnings``: steps no grant can clear).
        """
        refused = self._outside(plan)
        if refused is not None:
            return refused
        secrets = self._secrets(params, plan, None)
        try:
            checked = api.plan_for_viewing(self.settings, plan, self._given(params))
            data = api.describe_plan(checked)
            data["warnings"] = [i.to_json() for i in api.grant_warnings(checked)]
        except PlanrunError as exc:
            return _failure(exc, secrets)
        needs = [s for s in data.get("steps", []) if isinstance(s, dict) and s.get("approval")]
        return _result(data, f"plan {checked.name}: {len(checked.steps)} step(s), "
                       f"{len(needs)} need approval", secrets=secrets)

    def dry_run(self, plan: PlanRef, params: Params = None) -> CallToolResult:
        """What ``execute_plan`` would do, running and journaling nothing.

        ``{"plan", "order", "approvals": [step ids a person or a grant must clear],
        "steps": [{"id", "tool", "when", "for_each", "arguments"}]}``.
        """
        refused = self._outside(plan)
        if refused is not None:
            return refused
        secrets = self._secrets(params, plan, None)
        try:
            dry = api.execute(self.settings, plan, self._given(params), dry_run=True)
        except PlanrunError as exc:
            return _failure(exc, secrets)
        assert isinstance(dry, api.DryRun)
        data = dry.to_json()
        return _result(data, f"order: {', '.join(data['order'])}; needs approval: "
                       f"{', '.join(data['approvals']) or 'nothing'}", secrets=secrets)

    async def execute_plan(self, plan: PlanRef, params: Params = None,
                           keep_going: KeepGoing = False, max_parallel: MaxParallel = None
                           ) -> CallToolResult:
        """Run a plan of the project, journaled like any run; blocks until the run ends.

        Never clears a step: a step that needs a person (no grant clears it) leaves the
        run ``awaiting_approval`` with nothing run; ``next`` says what a person runs
        (``planrun approve RUN``), then call ``resume_run``. Result: ``{"ok", "run_id",
        "status", "exit_status", "next", "manifest"}``.
        """
        def prepare() -> CallToolResult | _Drive:
            refused = self._outside(plan)
            if refused is not None:
                return refused
            secrets = self._secrets(params, plan, None)
            given = self._given(params)
            return _Drive(lambda: api.execute(self.settings, plan, given,
                                              max_parallel=max_parallel,
                                              keep_going=keep_going, **_DEFERRED), secrets)

        return await self._drive(prepare)

    async def resume_run(self, run: RunRef, params: Params = None) -> CallToolResult:
        """Continue a run without repeating finished steps; never clears a step.

        For a run ``interrupted``, or ``awaiting_approval`` once a person approved it
        (``planrun approve RUN``). Result as ``execute_plan``'s; a run still waiting
        for a person stays ``awaiting_approval``.
        """
        def prepare() -> CallToolResult | _Drive:
            mine = self._mine(run)
            if not isinstance(mine, str):
                return mine
            secrets = self._run_secrets(mine, params)
            given = self._given(params)
            return _Drive(lambda: api.resume(self.settings, mine, given, **_DEFERRED),
                          secrets, resume=True)

        return await self._drive(prepare)

    async def _drive(self, prepare: Callable[[], CallToolResult | _Drive]) -> CallToolResult:
        """``prepare`` in a worker thread, then its run on the driver; the run's result.

        The wait for the run holds no thread: the SDK runs a tool in one of a bounded set
        of worker threads (40), and calls waiting for their runs held one each, so 40 of
        them queued behind a long run left ``run_status`` and every other tool without an
        answer until the runs ended (found by an attacker). Preparing and starting are one
        call: a client that cancels still gets its run started (and run to its end), as
        before; its answer is not awaited.
        """
        import anyio.to_thread

        def start() -> CallToolResult | tuple[_Drive, concurrent.futures.Future[Any]]:
            prepared = prepare()
            if isinstance(prepared, CallToolResult):
                return prepared
            return prepared, self.driver.start(self._counted(prepared.job))

        started = await anyio.to_thread.run_sync(start)
        if isinstance(started, CallToolResult):
            return started
        drive, future = started
        await _settled(future)
        return await anyio.to_thread.run_sync(drive.result, future)

    def _counted(self, job: Callable[[], Any]) -> Callable[[], Any]:
        """``job``, counting the python tool calls its run abandoned (on the main thread)."""
        def run() -> Any:
            outcome = job()
            self.driver.abandoned += outcome.abandoned_calls
            return outcome

        return run

    def run_status(self, run: RunRef = "last") -> CallToolResult:
        """A run's manifest as ``planrun status --json`` prints it.

        Status, counts, and each step with its status, attempts, error.
        """
        mine = self._mine(run)
        if not isinstance(mine, str):
            return mine
        run = mine
        try:
            m = api.status(self.settings, run)
        except PlanrunError as exc:
            return _failure(exc)
        steps = ", ".join(f"{s['id']}={s['status']}" for s in m.get("steps", [])
                          if isinstance(s, dict) and "id" in s)
        return _result(m, f"run {m.get('run_id')}: {m.get('status')} ({steps})")

    def list_runs(self, plan: PlanFilter = None, status: StatusFilter = None,
                  limit: Limit = 20) -> CallToolResult:
        """This project's runs, newest first (``planrun runs --json``)."""
        try:
            rows = api.runs(self.settings, plan=plan, status=status, limit=limit)
        except PlanrunError as exc:
            return _failure(exc)
        lines = [f"{r.get('run_id')} {r.get('plan')} {r.get('status')}" for r in rows]
        return _result({"runs": rows}, "\n".join(lines) or "no runs")

    def run_log(self, run: RunRef = "last", after: EventsAfter = 0,
                limit: EventsLimit = 1000) -> CallToolResult:
        """A run's events in order (``planrun log --json``, without tracebacks), by page.

        At most ``limit`` events after event id ``after``; ``next_after`` is the ``after``
        of the next page, null after the last.
        """
        mine = self._mine(run)
        if not isinstance(mine, str):
            return mine
        run = mine
        try:
            run_id, events, next_after = api.log_page(self.settings, run, after=after,
                                                      limit=limit)
        except PlanrunError as exc:
            return _failure(exc)
        for event in events:
            if isinstance(event.get("data"), dict):
                event["data"].pop("traceback", None)
        lines = [f"{e.get('kind')} {e.get('step') or ''}".rstrip() for e in events]
        more = ("" if next_after is None else
                f"\nmore: run_log with after={next_after} for the next page")
        return _result({"run_id": run_id, "events": events, "next_after": next_after},
                       f"run {run_id}: {len(events)} event(s)"
                       + (f" after event {after}" if after else "") + "\n"
                       + "\n".join(lines) + more)

    def run_output(self, step: StepRef, run: RunRef = "last", item: Item = None
                   ) -> CallToolResult:
        """One succeeded step's output (``planrun output RUN STEP``): ``{"output"}``."""
        mine = self._mine(run)
        if not isinstance(mine, str):
            return mine
        run = mine
        try:
            value = api.output(self.settings, run, step, item)
        except PlanrunError as exc:
            return _failure(exc)
        return _result({"run": run, "step": step, "output": value},
                       json.dumps(redact.display(value), ensure_ascii=False)[:4000])


class _Drive:
    """A run for the driver (``job``) and how its outcome is shown to the client."""

    def __init__(self, job: Callable[[], Any], secrets: dict[str, Any], *,
                 resume: bool = False) -> None:
        self.job = job
        self.secrets = secrets
        self.resume = resume

    def result(self, future: concurrent.futures.Future[Any]) -> CallToolResult:
        """The finished run as a tool result (a planrun error as a tool error)."""
        try:
            outcome = future.result()
        except PlanrunError as exc:
            if self.resume and exc.code == "param_missing" and "secret" in exc.message:
                exc.hint = SECRET_AGAIN_HINT  # it said: give -p NAME=VALUE to this command
            return _failure(exc, self.secrets)
        return _outcome(outcome, self.secrets)


async def _settled(future: concurrent.futures.Future[Any]) -> None:
    """Wait, holding no thread, until ``future`` is done (cancelling the wait leaves it)."""
    import asyncio

    loop = asyncio.get_running_loop()
    settled = loop.create_future()

    def wake() -> None:
        if not settled.done():
            settled.set_result(None)

    def done(_: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the session ended
            loop.call_soon_threadsafe(wake)

    future.add_done_callback(done)
    await settled


#: How every run started or continued here is cleared: never by the client.
_DEFERRED: dict[str, Any] = {"approver": None, "defer_approval": True}


def _usage(message: str) -> PlanrunError:
    from .errors import UsageError

    return UsageError(message)


def _outcome(outcome: Any, secrets: dict[str, Any]) -> CallToolResult:
    """A driven run as a tool result.

    ``{"ok", "run_id", "status", "exit_status", "next", "waiting", "manifest"}``.

    ``next``: what to do now, as the manifest says (for a run ``awaiting_approval``: the
    ``planrun approve`` command a person runs); ``waiting``: the steps waiting for a
    person (``[{"step", "tool", "reason"}]``).
    """
    m = outcome.manifest
    run_id = m.get("run_id")
    status = outcome.status
    approval = m.get("approval") if isinstance(m.get("approval"), dict) else {}
    waiting = approval.get("waiting") or []
    data: dict[str, Any] = {"ok": status == "completed" and outcome.error is None,
                            "run_id": run_id, "status": status,
                            "exit_status": outcome.exit_code, "next": m.get("next"),
                            "waiting": waiting, "manifest": m}
    if status == "awaiting_approval":
        command = approval.get("approve") or f"planrun approve {run_id}"
        data["next"] = command
        steps = ", ".join(f"{w.get('step')} ({w.get('reason')})" for w in waiting
                          if isinstance(w, dict))
        # An `approve: resolved` step waits after the steps before it ran: "nothing has
        # run" was false there (found by a fresh operator), as the CLI says it.
        from .manifest import ran_before_waiting

        ran = ran_before_waiting(m, "nothing has run")
        summary = (f"run {run_id} is awaiting approval; {ran}. Waiting for a "
                   f"person: {steps or 'see manifest'}. This server cannot clear a step: "
                   f"a person runs `{command}` (or `planrun deny {run_id}`), then call "
                   f"resume_run with run {run_id!r}{_secrets_again(m)}.")
    else:
        summary = f"run {run_id}: {status} (exit {outcome.exit_code})"
        if outcome.error is not None:
            summary += f"; error[{outcome.error.code}]: {outcome.error.message}"
        for step in m.get("steps") or []:
            error = step.get("error") if isinstance(step, dict) else None
            if isinstance(error, dict) and step.get("status") in ("failed",
                                                                  "indeterminate"):
                # the failed step and why, not only "failed" (the manifest has the rest)
                summary += (f"; step {step.get('id')} {step.get('status')}: "
                            f"[{error.get('code')}] {error.get('message')}")
                break
        if data["next"]:
            summary += f"; next: {data['next']}"
    if outcome.notes:
        summary += "\n" + "\n".join(f"note: {n}" for n in outcome.notes)
    return _result(data, summary, secrets=secrets)


def _secrets_again(m: dict[str, Any]) -> str:
    """``, with params giving NAME again ...`` for a run with secret parameters, or ``""``."""
    params = m.get("params")
    names = [n for n, v in params.items() if redact.display(v) != v] if isinstance(
        params, dict) else []
    if not names:
        return ""
    return (f" and params giving the secret parameter(s) {', '.join(map(repr, names))} "
            "again (a secret is never journaled)")


#: The hint of a resume_run whose run's secret was not given again: the CLI's names -p.
SECRET_AGAIN_HINT = ("Call resume_run again with params holding the value of each secret "
                     "parameter named (a secret is never journaled); nothing else of the "
                     "plan changed.")


class StrictArguments:
    """Middleware: a tool call with an argument its tool does not declare is refused.

    The SDK ignores unknown arguments; here ``approve_all: true`` (or any misspelt
    argument) is a tool error naming it, not silently dropped.

    Arguments are also checked against the tool's input schema (as ``tools/list`` shows
    it) here: a wrong type, a value out of range or a missing required argument is a
    planrun ``usage`` error (exit status 2) in the shape of every planrun error, not the
    SDK's validation text.

    Args:
        accepted: tool name → the argument names it declares.

    Attributes:
        listed: the server's ``list_tools`` (async): where the input schemas are read from,
            at the first call.
    """

    def __init__(self, accepted: dict[str, set[str]]) -> None:
        self.accepted = accepted
        self.listed: Callable[[], Awaitable[list[Any]]] | None = None
        self.schemas: dict[str, dict[str, Any]] | None = None

    async def __call__(self, ctx: Any, call_next: Any) -> Any:
        """Refuse the call (a tool result, ``isError`` true) or pass it on.

        ``tools/list`` says so too: each input schema has ``additionalProperties: false``.
        """
        if ctx.method == "tools/list":
            listed = await call_next(ctx)  # the wire form: {"tools": [{"inputSchema"…}]}
            tools = listed.get("tools") if isinstance(listed, dict) else None
            for tool in tools if isinstance(tools, list) else []:
                schema = tool.get("inputSchema") if isinstance(tool, dict) else None
                if tool.get("name") in self.accepted and isinstance(schema, dict):
                    schema.setdefault("additionalProperties", False)
            return listed
        if ctx.method == "prompts/get":
            # The SDK raised ValueError for any name (this server has no prompts) and
            # logged its traceback on stderr for a client's mistake (found by an attacker).
            from mcp.shared.exceptions import MCPError
            from mcp_types import INVALID_PARAMS

            name = ctx.params.get("name") if isinstance(ctx.params, dict) else None
            raise MCPError(code=INVALID_PARAMS, message=f"no prompt {name!r}: planrun "
                           "serves tools only (tools/list)")
        params = ctx.params if ctx.method == "tools/call" else None
        if isinstance(params, dict) and isinstance(params.get("name"), str) and (
                params["name"] not in self.accepted):
            # the SDK's answer was the bare text "Unknown tool: NAME", not a planrun error
            from .issues import did_you_mean

            return _failure(_usage(
                f"no tool {params['name']!r} here.{did_you_mean(params['name'], self.accepted)}"
                f" The tools: {', '.join(sorted(self.accepted))}"))
        if isinstance(params, dict):
            known = self.accepted.get(str(params.get("name")))
            given = params.get("arguments")
            if known is not None and isinstance(given, dict):
                unknown = sorted(str(k) for k in given if k not in known)
                if unknown:
                    takes = ", ".join(sorted(known)) or "no arguments"
                    return _failure(_usage(
                        f"{params['name']} does not take {', '.join(map(repr, unknown))}; "
                        f"it takes: {takes}"))
            if self.schemas is None and self.listed is not None:
                self.schemas = {t.name: dict(t.input_schema) for t in await self.listed()}
            schema = (self.schemas or {}).get(str(params.get("name")))
            if schema is not None:
                wrong = _schema_error(schema, given if given is not None else {})
                if wrong is not None:
                    return _failure(_usage(f"{params['name']}: {wrong}"))
        return await call_next(ctx)


def _schema_error(schema: dict[str, Any], arguments: Any) -> str | None:
    """The first way ``arguments`` break ``schema`` (one line, naming the argument), or None."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    error = errors[0]
    where = ".".join(str(p) for p in error.absolute_path)
    message = error.message if len(error.message) <= 200 else error.message[:200] + "…"
    return f"argument {where!r}: {message}" if where else message


def build_server(settings: Any, driver: Driver) -> MCPServer[Any]:
    """The MCP server of one session on ``settings``' project and journal."""
    session = Session(settings, driver)
    write = ToolAnnotations(read_only_hint=False, destructive_hint=True,
                            idempotent_hint=False, open_world_hint=True)
    tools: list[tuple[Callable[..., CallToolResult | Awaitable[CallToolResult]],
                      ToolAnnotations]] = [
        (session.list_tools, _READ), (session.list_plans, _READ),
        (session.validate_plan, _READ), (session.show_plan, _READ), (session.dry_run, _READ),
        (session.execute_plan, write), (session.resume_run, write),
        (session.run_status, _READ), (session.list_runs, _READ), (session.run_log, _READ),
        (session.run_output, _READ)]
    import inspect

    accepted = {fn.__name__: set(inspect.signature(fn).parameters) for fn, _ in tools}
    strict = StrictArguments(accepted)
    server: MCPServer[Any] = MCPServer(
        name="planrun", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING",
        subscriptions=False, middleware=[strict])
    for fn, hints in tools:
        server.add_tool(fn, name=fn.__name__, annotations=hints)
    strict.listed = server.list_tools
    return server


def _client_left(exc: BaseException) -> bool:
    """True when ``exc`` says only that the client's end of stdout is closed.

    The SDK's writer fails with BrokenPipeError on an answer nobody reads any more (a
    client that closed its side of the server's stdout, then or later its stdin; or the
    SDK's "Connection closed" answer to a call still waiting for its run when the client
    left): the session is over, as when stdin ends; it was a traceback and exit status 1
    (found by an attacker).
    """
    if isinstance(exc, BaseExceptionGroup):
        _, rest = exc.split((BrokenPipeError, ConnectionResetError))
        return rest is None
    return isinstance(exc, BrokenPipeError | ConnectionResetError)


def serve(settings: Any) -> int:
    """Serve one MCP session over this process's stdin/stdout until the client leaves.

    The protocol runs in a thread; runs are driven on this (the main) thread.

    Returns:
        The number of python tool calls the session's runs left running in threads (timed
        out): when not 0, the process should end without waiting for them.

    Raises:
        Whatever the server thread raised (a bug), after the session ended.
    """
    import anyio

    with contextlib.suppress(OSError):
        os.chdir(settings.project)  # relative plan paths are the project's
    driver = Driver()
    server = build_server(settings, driver)
    failed: list[BaseException] = []

    def protocol() -> None:
        try:
            anyio.run(server.run_stdio_async)
        except BaseException as exc:
            if not _client_left(exc):
                failed.append(exc)

    thread = threading.Thread(target=protocol, name="planrun-mcp", daemon=True)
    thread.start()
    driver.serve(until=thread)
    thread.join()
    if failed:
        raise failed[0]
    return driver.abandoned
