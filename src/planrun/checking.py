"""Locating, loading and checking one plan with the project's registry and policy.

What both the front door (:mod:`planrun.api`) and the after-a-crash commands
(:mod:`planrun.lifecycle`) need: parameter input, the registry with its policy, one plan's
check, ``--approve`` checking, and how a plan file and project are journaled. Functions
here never print and never touch the journal.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import childenv
from .errors import Refused, UsageError
from .issues import Issue, PlanReport, Report
from .paths import PlanLookupError, Settings, find_plan, shown_path
from .validation import CheckedPlan, ParamInput


@dataclass(eq=False)
class Loaded:
    """A registry plus one located plan file and its check."""

    report: PlanReport
    plan: CheckedPlan | None
    document: Any = None
    path: Path | None = None


def load_params_file(path: str | None) -> dict[str, Any]:
    """Values of ``--params-file`` (YAML or JSON mapping, native types).

    Raises:
        Refused: unreadable, invalid, or not a mapping (codes ``syntax``, ``duplicate_key``,
            ``too_large``, ``schema``; exit 3).
    """
    if path is None:
        return {}
    from .loading import DocumentError, load_file

    p = Path(path)
    from .paths import probe

    if not probe(p, "is_file"):
        what = "is not a file" if probe(p) else "does not exist"
        raise UsageError(f"--params-file {path!r} {what}")
    try:
        doc = load_file(p)
    except DocumentError as exc:
        raise Refused(f"cannot read parameters from {path}: {exc}",
                      code=exc.issues[0].code, report=Report(issues=exc.issues)) from None
    if not isinstance(doc.data, dict):
        issue = Issue(code="schema", file=path, message="a params file must be a mapping of "
                      "parameter names to values")
        raise Refused(issue.message, code="schema", report=Report(issues=[issue]))
    return dict(doc.data)


def param_input(cli: Sequence[str] = (), params_file: str | None = None) -> ParamInput:
    """Parse ``-p NAME=VALUE`` options and ``--params-file``.

    ``PLANRUN_PARAM_<NAME>`` environment values are offered too (used only for declared
    parameters, below ``-p``).

    Raises:
        UsageError: a ``-p`` without ``=`` (exit 2).
    """
    values: dict[str, str] = {}
    for item in cli:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"-p {item!r}: write -p NAME=VALUE")
        if name in values:
            raise UsageError(f"-p {name} is given twice; give each parameter once")
        values[name] = value
    env = {k[len("PLANRUN_PARAM_"):]: v for k, v in childenv.param_variables().items()}
    env.update({k.lower(): v for k, v in env.items() if k.lower() not in env})
    return ParamInput(cli=values, file_values=load_params_file(params_file), env=env)


def load_registry(settings: Settings) -> Any:
    """The registry with its policy attached.

    Raises:
        Refused: code ``registry`` (every registry issue) or ``config`` (every policy
            issue), exit 3.
    """
    from .registry import load_registry as _load

    registry, issues = _load(settings.registry, settings.pools)
    if issues:
        raise Refused(f"{settings.registry} has {len(issues)} problem(s)", code="registry",
                      report=Report(issues=issues))
    if settings.policy:
        from .policy import load_policy  # only a project with [policy] needs it

        shown = shown_path(settings.config_file) if settings.config_file else None
        registry.policy, problems = load_policy(settings.policy, set(registry.tools), shown)
        if problems:
            raise Refused(f"the policy in {shown} has {len(problems)} problem(s)",
                          code="config", report=Report(issues=problems))
    return registry


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a large document is loaded and checked.

    Loading allocates millions of acyclic objects, and the collector's passes over them
    made validation time grow faster than the plan (2-3x slower at 100,000 steps).
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def check(settings: Settings, name: str, registry: Any, given: ParamInput | None,
          *, concrete: bool | None = None) -> Loaded:
    """Locate, load and check one plan; problems are in the report, never raised."""
    with no_gc():
        return _check(settings, name, registry, given, concrete=concrete)


def _check(settings: Settings, name: str, registry: Any, given: ParamInput | None,
           *, concrete: bool | None = None) -> Loaded:
    from .loading import DocumentError, load_file
    from .validation import check_plan, plan_name

    try:
        path = find_plan(name, settings.plans_dir)
    except PlanLookupError as exc:
        return Loaded(PlanReport(file=exc.issue.file, issues=[exc.issue]), None)
    shown = _shown(path, settings)
    try:
        doc = load_file(path, display=shown, keep=True)
    except DocumentError as exc:
        return Loaded(PlanReport(file=shown, issues=list(exc.issues)), None, path=path)
    report, plan = check_plan(doc, registry, settings, given, concrete=concrete,
                              name_hint=plan_name(path, doc))
    if plan is not None:
        report.issues.extend(grant_warnings(plan, doc))
    return Loaded(report, plan, document=doc.data, path=path)


def check_stdin(settings: Settings, raw: bytes, registry: Any, given: ParamInput | None,
                *, concrete: bool | None = None) -> Loaded:
    """Load and check one plan read from standard input (named ``<stdin>`` in the report).

    A plan without ``name`` is called ``stdin``. Problems are in the report, never raised.
    """
    from .loading import STDIN_NAME, DocumentError, load_stdin
    from .validation import check_plan

    with no_gc():
        try:
            doc = load_stdin(raw)
        except DocumentError as exc:
            return Loaded(PlanReport(file=STDIN_NAME, issues=list(exc.issues)), None)
        report, plan = check_plan(doc, registry, settings, given, concrete=concrete,
                                  name_hint="stdin")
        if plan is not None:
            report.issues.extend(grant_warnings(plan, doc))
        return Loaded(report, plan, document=doc.data)


def grant_warnings(plan: CheckedPlan, doc: Any = None) -> list[Issue]:
    """``ungrantable`` warnings: steps the policy means grants to clear, that none ever can.

    A step needing clearance whose tool (or class) a grant names, or whose class is
    ``act``, but whose arguments (or ``for_each``) are only known at run time: no grant
    can check them before the run, so an unattended run always stops with exit 4
    (issue 10, bug 1). ``doc`` (a :class:`~planrun.loading.Document`) locates the issue.
    """
    from .params import StepRef, Template

    def steps_read(value: Any) -> bool:  # a Template holding {steps.…}: run time only
        if isinstance(value, Template):
            return any(isinstance(r, StepRef) for r in value.refs())
        if isinstance(value, dict):
            return any(steps_read(v) for v in value.values())
        if isinstance(value, list):
            return any(steps_read(v) for v in value)
        return False

    def templated(value: Any) -> bool:
        if isinstance(value, Template):
            return True
        if isinstance(value, dict):
            return any(templated(v) for v in value.values())
        if isinstance(value, list):
            return any(templated(v) for v in value)
        return False

    policy = plan.policy
    if policy is None:
        return []
    out: list[Issue] = []
    for step in plan.steps:
        if not step.approval_reason or step.approval_reason == "escalate" \
                or step.deferred_approval:  # its grant is checked at dispatch
            continue
        literal = isinstance(step.for_each, list) and not templated(step.for_each)
        if step.for_each is not None and not literal:
            what = "for_each"
        elif (steps_read(step.arguments) if step.for_each is not None
              else templated(step.arguments)):
            what = "arguments"
        else:
            continue
        c = step.tool.name
        cls = policy.class_of(c)
        names = [g.id for g in policy.grants
                 if g.tool == c or (cls is not None and g.cls == cls[0])]
        if not names and not (cls is not None and cls[1] == "act"):
            continue
        which = (f"grant {', '.join(repr(n) for n in names)} names"
                 if names else f"class {cls[0]!r} (level act) holds" if cls else "")
        path = f"/steps/{step.index}/{what}"
        line = col = None
        if doc is not None:
            with contextlib.suppress(Exception):
                line, col = doc.locate(path)
        out.append(Issue(
            code="ungrantable", severity="warning", step=step.id, path=path,
            file=plan.file or None, line=line, column=col,
            message=f"step {step.id!r}: no grant can ever clear it unattended: "
            f"{which} its tool {c!r}, but its {what} are only known at run time, and a "
            "grant checks arguments before the run. An unattended run (cron, CI) stops "
            f"with exit 4; give the {what} from parameters or literals, give the step "
            "approve: resolved (a grant then checks the resolved values when it is "
            f"reached), or clear the step with --approve {step.id}"))
    return out


def _shown(path: Path, settings: Settings) -> str:
    return shown_path(path)


def check_approve(approve: Sequence[str], plan: CheckedPlan) -> None:
    """Refuse ``--approve`` naming no step of the plan, suggesting the closest step.

    Raises:
        UsageError: ``usage`` (exit 2), e.g. ``--approve 'pubish': the plan has no such
            step. Did you mean 'publish'?``.
    """
    from .issues import did_you_mean

    unknown = [s for s in approve if s not in plan.by_id]
    if unknown:
        needs = [s.id for s in plan.steps if s.approval_reason]
        raise UsageError(f"--approve {unknown[0]!r}: the plan has no such step."
                         + did_you_mean(unknown[0], plan.by_id),
                         hint=f"Steps: {', '.join(plan.by_id)}"
                         + (f"; needing approval: {', '.join(needs)}." if needs else "."))


def project_key(settings: Settings) -> str:
    """The project folder as journaled with each run: absolute, symlinks resolved."""
    try:
        return str(settings.project.resolve())
    except OSError:
        return str(settings.project)


def journaled_path(path: Path | None, settings: Settings) -> str | None:
    """A plan file's path as journaled: relative to the project folder when inside it.

    With the run's ``project`` column it means the same from any current folder (issue
    10, bug 3); a file outside the project is journaled absolute.
    """
    if path is None:
        return None
    try:
        full = path.resolve()
    except OSError:
        full = path.absolute()
    try:
        return str(full.relative_to(project_key(settings)))
    except ValueError:
        return str(full)


def file_sha256(path: Path | None, plan: CheckedPlan | None = None) -> str | None:
    """SHA-256 of a plan file's bytes (to notice later edits cheaply), or None.

    None too for a plan whose file holds a secret parameter's ``default``: a digest of
    those bytes would let the secret be guessed from the journal.
    """
    import hashlib

    declared = plan.document.get("params") if plan is not None else None
    if isinstance(declared, dict) and any(
            isinstance(declared.get(n), dict) and "default" in declared[n]
            for n in plan.secret_params):  # type: ignore[union-attr]
        return None
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path else None
    except OSError:
        return None


def _first_code(report: PlanReport) -> str:
    return report.issues[0].code if report.issues else "refused"
