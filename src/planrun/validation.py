"""Every static check of a plan, gathered into one report (SPEC §4).

:func:`check_plan` takes a loaded document, the registry and the parameter values and
returns a :class:`~planrun.issues.PlanReport` with *every* issue (never only the first)
and, when there is no error, a :class:`CheckedPlan` ready to run. Nothing is repaired:
no coercion, no dropping of unknown fields, no trimming.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import graph, redact
from .canonical import digest
from .issues import Issue, PlanReport
from .loading import Document, has_surrogate, pointer
from .params import (
    UNKNOWN,
    IndexRef,
    ItemRef,
    ParamRef,
    Problem,
    StepRef,
    Template,
    has_templates,
    parse_cli_value,
    references,
    substitute,
)
from .paths import Settings
from .patterns import search
from .registry import ToolRegistry, ToolSpec, schema_problems, strict_validator

_FANOUT_ONLY = ("max_parallel", "max_items", "on_item_error")


@dataclass
class CheckedStep:
    """A step that passed every check.

    Attributes:
        index: position in the plan file (0-based; breaks ties between ready steps).
        id: the step id.
        tool: the registry entry it calls.
        arguments: arguments with parameters substituted, in reference form
            (:mod:`planrun.redact`: a secret parameter's value is a reference, what is stored,
            keyed and shown; :func:`planrun.redact.reveal` gives the values to call with);
            strings still holding run-time references are :class:`~planrun.params.Template`.
        for_each: the fan-out source (a list, or a Template) or None, in reference form.
        depends_on: ids this step waits on.
        raw: the step mapping as written.
        approval_reason: why the step needs a person (``irreversible`` …) or None.
    """

    index: int
    id: str
    tool: ToolSpec
    arguments: dict[str, Any]
    for_each: Any
    depends_on: list[str]
    raw: dict[str, Any]
    approval_reason: str | None = None
    #: arguments hold no run-time placeholder: fully known and checked at validation.
    static: bool = False

    @property
    def intent(self) -> str | None:
        """The step's ``intent`` (for people)."""
        value = self.raw.get("intent")
        return value if isinstance(value, str) else None

    @property
    def when(self) -> str | None:
        """The step's CEL condition, if any."""
        value = self.raw.get("when")
        return value if isinstance(value, str) else None

    @property
    def timeout(self) -> float | None:
        """Seconds per call: the step's ``timeout``, else the tool's, else None."""
        value = self.raw.get("timeout")
        return float(value) if value is not None else self.tool.entry.timeout

    @property
    def retries(self) -> dict[str, Any]:
        """The effective retry policy: the step's ``retries`` over the tool's."""
        out = {"max_attempts": 1, "backoff_s": 0.0, "on_exit_codes": None}
        if self.tool.entry.retries is not None:
            out.update(self.tool.entry.retries.model_dump())
        if isinstance(self.raw.get("retries"), dict):
            out.update(self.raw["retries"])
        return out


@dataclass
class CheckedPlan:
    """A plan that passed validation, with parameters substituted.

    Attributes:
        file: the plan file as shown to users.
        name: the plan name (``name:`` or the file stem).
        revision: the plan's revision.
        goal: the plan's goal.
        document: the plan as written (JSON data; what the journal stores), a secret
            parameter's ``default`` replaced by a reference (:func:`planrun.redact.stored_plan`).
        digest: SHA-256 of the canonical JSON of ``document``.
        params: parameter values, defaults applied (secret ones too: never store these).
        secret_params: names of parameters marked ``secret: true``.
        steps: the steps, in the order written.
        deps: step id → ids it depends on.
        max_parallel: the plan's ``max_parallel`` or None.
        timeout: the plan's whole-run ``timeout`` in seconds, or None.
    """

    file: str
    name: str
    revision: int
    goal: str
    document: dict[str, Any]
    digest: str
    params: dict[str, Any]
    secret_params: set[str]
    steps: list[CheckedStep]
    deps: dict[str, list[str]]
    max_parallel: int | None = None
    timeout: float | None = None
    #: the policy it was checked against (``planrun.policy.Policy``), if any.
    policy: Any = None
    by_id: dict[str, CheckedStep] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_id = {s.id: s for s in self.steps}

    def order(self) -> list[str]:
        """Step ids in one-at-a-time dispatch order."""
        return graph.run_order([s.id for s in self.steps], self.deps)


@dataclass
class ParamInput:
    """Parameter values as given.

    ``-p`` texts (parsed by declared type), a params file (native values), and environment
    values (``PLANRUN_PARAM_<NAME>``, texts).
    """

    cli: dict[str, str] = field(default_factory=dict)
    file_values: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def given(self) -> bool:
        """True when any value was given on the command line or in a file."""
        return bool(self.cli or self.file_values)


class _Collector:
    """Issues of one plan, each located in its document."""

    def __init__(self, doc: Document) -> None:
        self.doc = doc
        self.issues: list[Issue] = []

    def add(self, code: str, message: str, *, step: str | None = None,
            path: str | None = None, key: bool = False, located: bool = True) -> None:
        line = col = None
        if located and path is not None:
            line, col = self.doc.locate_key(path) if key else self.doc.locate(path)
        self.issues.append(Issue(code=code, message=message, step=step, path=path,
                                 file=self.doc.file, line=line, column=col))


def _suggest(name: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""


def _pydantic_issues(out: _Collector, exc: Any, base: str, data: Any,
                     step: str | None) -> None:
    from .models import error_message
    from .registry import _real_loc

    for err in exc.errors():
        loc = _real_loc(data, err["loc"])
        ptr = base + "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in loc)
        what = f"step {step!r}: " if step else ""
        out.add("schema", what + error_message(err), step=step, path=ptr,
                key=err["type"] == "extra_forbidden")


def _secret_problem(name: str, err: Any) -> str:
    """A schema violation of a secret parameter, worded without its value."""
    rule = json.dumps(err.validator_value, ensure_ascii=False, default=str)
    if len(rule) > 200:
        rule = rule[:200] + "…"
    return (f"parameter {name!r}: the value given (secret, not shown) fails "
            f"{err.validator!r}: {rule} of its schema")


def _resolve_params(declared: dict[str, Any], given: ParamInput, concrete: bool,
                    out: _Collector, secret: set[str] | None = None) -> dict[str, Any]:
    values: dict[str, Any] = {}
    raw: dict[str, Any] = dict(given.file_values)
    # -p beats --params-file beats PLANRUN_PARAM_<NAME>
    cli_names = set(given.cli) | {k for k in given.env
                                  if k in declared and k not in given.file_values}
    for name in sorted((set(given.cli) | set(given.file_values)) - set(declared)):
        out.add("param_unknown",
                f"parameter {name!r} is not declared by this plan.{_suggest(name, declared)} "
                f"Declared: {', '.join(declared) or 'none'}", located=False)
    for name, schema in declared.items():
        if name in cli_names:
            text = given.cli.get(name, given.env.get(name))
            assert text is not None
            if has_surrogate(text):
                out.add("param_type", f"parameter {name!r}: the value is not UTF-8 text "
                        "(it holds bytes that do not decode); give it as UTF-8",
                        located=False)
                continue
            try:
                raw[name] = parse_cli_value(text, schema)
            except ValueError as exc:
                why = str(exc) if name not in (secret or ()) else (
                    "the value given (secret, not shown) does not parse as its declared "
                    f"type {json.dumps(schema.get('type') if isinstance(schema, dict) else None)}")
                out.add("param_type", f"parameter {name!r}: {why}", located=False)
                continue
        if name in raw:
            values[name] = raw[name]
            problems = list(strict_validator(_without_secret(schema)).iter_errors(raw[name]))
            for err in problems:
                out.add("param_type", f"parameter {name!r}: {err.message}"
                        if name not in (secret or ()) else _secret_problem(name, err),
                        located=False)
            if problems:
                values[name] = UNKNOWN
        elif isinstance(schema, dict) and "default" in schema:
            values[name] = schema["default"]
        elif concrete:
            out.add("param_missing",
                    f"parameter {name!r} is required and has no value: give -p {name}=VALUE "
                    "or --params-file", path=pointer("params", name), key=True)
            values[name] = UNKNOWN
        else:
            values[name] = UNKNOWN
    return values


def _without_secret(schema: Any) -> Any:
    if isinstance(schema, dict) and "secret" in schema:
        return {k: v for k, v in schema.items() if k != "secret"}
    return schema


def _probe(value: Any, path: tuple[Any, ...], opaque: set[tuple[Any, ...]],
           text: set[tuple[Any, ...]]) -> Any:
    """A stand-in instance for checking arguments whose values are not known yet."""
    if value is UNKNOWN:
        opaque.add(path)
        return None
    if isinstance(value, Template):
        if value.exact is not None and not isinstance(value.exact, IndexRef):
            opaque.add(path)
            return None
        if value.exact is not None:  # {index} is always an integer
            return 0
        text.add(path)
        return ""
    if isinstance(value, dict):
        return {k: _probe(v, (*path, k), opaque, text) for k, v in value.items()}
    if isinstance(value, list):
        return [_probe(v, (*path, i), opaque, text) for i, v in enumerate(value)]
    return value


def argument_problems(tool: ToolSpec, arguments: dict[str, Any],
                      stored: Any = None) -> list[tuple[str, str, bool]]:
    """(JSON Pointer inside arguments, message, points-at-a-key) per contract violation.

    Values not known before the run (an unknown parameter, a run-time placeholder) are
    checked only as far as they are known: an embedded placeholder is text. For a command
    tool, a known value that would become an option (starts with ``-``) is a violation too
    (:func:`planrun.argv.option_value_problems`). With ``stored`` (the same arguments in
    reference form), a violation by a value that holds a secret is worded without quoting
    the value.
    """
    opaque: set[tuple[Any, ...]] = set()
    text: set[tuple[Any, ...]] = set()
    probe = _probe(arguments, (), opaque, text)
    out: list[tuple[str, str, bool]] = []
    props = tool.contract.get("properties") if isinstance(tool.contract, dict) else None
    for err in tool.validator.iter_errors(probe):
        loc = tuple(err.absolute_path)
        if any(loc[:n] in opaque for n in range(len(loc) + 1)):
            continue
        if loc in text and err.validator != "type":
            continue
        if err.validator in ("additionalProperties", "unevaluatedProperties") and isinstance(
                err.instance, dict):
            schema = err.schema if isinstance(err.schema, dict) else {}
            known = schema.get("properties") or {}
            patterns = schema.get("patternProperties") or {}
            extras = [k for k in err.instance if k not in known
                      and not any(search(p, k) for p in patterns)]
            for k in extras or list(err.instance):
                hint = _suggest(k, known) if known else ""
                out.append((_ptr((*loc, k)), f"argument {k!r} is not declared by tool "
                            f"{tool.name!r}.{hint} Declared: "
                            f"{', '.join(known) or 'none'}", True))
            continue
        where = _ptr(loc)
        if err.validator == "required":
            out.append((where, f"tool {tool.name!r}: {err.message}", False))
            continue
        name = ".".join(str(p) for p in loc) or "arguments"
        if stored is not None and redact.hides(stored, loc):
            rule = json.dumps(err.validator_value, ensure_ascii=False, default=str)
            out.append((where, f"argument {name!r}: its value (it holds a secret, not "
                        f"shown) fails {err.validator!r}: "
                        f"{rule if len(rule) <= 200 else rule[:200] + '…'}", False))
            continue
        if loc in text:
            out.append((where, f"argument {name!r} holds a placeholder inside text, so it is "
                        f"a string; the tool declares {err.validator_value!r}", False))
            continue
        out.append((where, f"argument {name!r}: {err.message}", False))
    del props
    if tool.entry.command is not None and not out:
        from .argv import option_value_problems

        out.extend((ptr, msg, False) for ptr, msg in option_value_problems(tool.entry,
                                                                          arguments))
    if tool.model is not None and not out and not opaque and not text:
        # An ``accepts`` model is checked the way the call checks it (SPEC §2): from JSON,
        # in strict mode; its JSON Schema alone lets through what the model refuses.
        from .tools import validate_model

        _model, problems = validate_model(tool.model, arguments)
        for where, message in problems:
            out.append((where, f"tool {tool.name!r} ({tool.entry.accepts}): {message}",
                        False))
    return out


def _ptr(loc: Iterable[Any]) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in loc)


def check_plan(doc: Document, registry: ToolRegistry, settings: Settings,
               given: ParamInput | None = None, *, concrete: bool | None = None,
               name_hint: str | None = None, known_digest: str | None = None
               ) -> tuple[PlanReport, CheckedPlan | None]:
    """Check one plan document completely.

    Args:
        doc: the loaded plan file.
        registry: the loaded tools registry.
        settings: project settings (``max_steps``, pools).
        given: parameter values given by the user.
        concrete: check with concrete values (missing required parameters are errors);
            default: when any value was given.
        name_hint: the plan's name when the document has no ``name`` (the file stem).
        known_digest: the digest of ``doc.data`` when already known (a journaled plan).

    Returns:
        The report, and the checked plan when the report has no error.
    """
    from pydantic import ValidationError

    from .models import SUPPORTED_FORMATS, PlanHead, Step

    given = given or ParamInput()
    concrete = given.given if concrete is None else concrete
    out = _Collector(doc)
    report = PlanReport(file=doc.file, issues=out.issues)
    data = doc.data
    if not isinstance(data, dict):
        out.add("schema", "a plan must be a mapping with planrun, goal and steps", path="")
        return report, None
    version = data.get("planrun")
    if "planrun" not in data:
        out.add("format_version", "the plan has no 'planrun:' field; add 'planrun: 1' as its "
                "first line", path="")
        return report, None
    if isinstance(version, bool) or version not in SUPPORTED_FORMATS:
        out.add("format_version",
                f"planrun: {version!r} is not a supported plan format version "
                f"(supported: {', '.join(map(str, SUPPORTED_FORMATS))})", path="/planrun")
        return report, None
    try:
        head = PlanHead.model_validate(data)
    except ValidationError as exc:
        _pydantic_issues(out, exc, "", data, None)
        head = None
    raw_name = data.get("name")
    name: str = raw_name if isinstance(raw_name, str) else name_hint or "plan"
    report.plan = {"name": name, "revision": data.get("revision", 1), "goal": data.get("goal")}
    raw_steps = data.get("steps")
    if not isinstance(raw_steps, list):
        return report, None
    if not raw_steps:
        out.add("empty", "the plan has no steps", path="/steps")
    if len(raw_steps) > settings.max_steps:
        out.add("too_long", f"the plan has {len(raw_steps):,} steps, more than max_steps "
                f"({settings.max_steps:,}); split it or raise max_steps in planrun.toml "
                "(plans are never trimmed)", path="/steps")

    # --- parameters -------------------------------------------------------------
    raw_params = data.get("params")
    declared: dict[str, Any] = raw_params if isinstance(raw_params, dict) else {}
    secrets: set[str] = set()
    good_params: dict[str, Any] = {}
    for pname, schema in declared.items():
        ptr = pointer("params", pname)
        if not isinstance(schema, dict):
            continue  # reported by the shape check
        secret = schema.get("secret", False)
        if not isinstance(secret, bool):
            out.add("schema", f"parameter {pname!r}: 'secret' must be true or false",
                    path=ptr + "/secret")
        elif secret:
            secrets.add(pname)
        bad_schema = schema_problems(_without_secret(schema))
        for sub, msg in bad_schema:
            out.add("schema", f"parameter {pname!r}: {msg}", path=ptr + sub)
        if bad_schema:
            continue
        if "default" in schema:
            for err in strict_validator(_without_secret(schema)).iter_errors(schema["default"]):
                out.add("param_type", f"parameter {pname!r}: default {err.message}"
                        if pname not in secrets else _secret_problem(pname, err),
                        path=ptr + "/default")
        good_params[pname] = schema
    values = _resolve_params(good_params, given, concrete, out, secrets)
    for pname in set(declared) - set(good_params):
        values[pname] = UNKNOWN
    # What is stored, keyed and shown (reference form): a secret's value is a reference,
    # other values and the plan's own text have the reference markers escaped.
    stored_values = {k: v if v is UNKNOWN else (redact.reference(k) if k in secrets
                                                  else redact.escape_value(v))
                     for k, v in values.items()}
    plain = not secrets and not any(redact.has_marks(v) for v in values.values()
                                    if v is not UNKNOWN)
    # the source text tells at once whether any string could hold a marker character
    marks = not isinstance(doc.text, str) or redact.text_may_hold_marks(doc.text)

    # --- steps: shape, ids, tools --------------------------------------------------
    steps: list[tuple[int, dict[str, Any], Any]] = []
    ids: dict[str, int] = {}
    for i, raw in enumerate(raw_steps):
        base = pointer("steps", i)
        sid = raw.get("id") if isinstance(raw, dict) else None
        sid = sid if isinstance(sid, str) else None
        if not isinstance(raw, dict):
            out.add("schema", f"step {i} must be a mapping", path=base)
            continue
        try:
            model = Step.model_validate(raw)
        except ValidationError as exc:
            _pydantic_issues(out, exc, base, raw, sid)
            model = None
        if sid is not None:
            if sid in ids:
                out.add("duplicate_id", f"step id {sid!r} is used by steps {ids[sid]} and "
                        f"{i}; ids must be unique", step=sid, path=base + "/id")
            else:
                ids[sid] = i
        if model is None:
            continue
        if model.for_each is None:
            for fld in _FANOUT_ONLY:
                if fld in raw:
                    out.add("schema", f"step {sid!r}: {fld!r} applies only to a step with "
                            "for_each", step=sid, path=f"{base}/{fld}", key=True)
        if model.pool is not None and model.pool not in settings.pools:
            out.add("schema", f"step {sid!r}: pool {model.pool!r} is not declared in "
                    f"[pools] of planrun.toml.{_suggest(model.pool, settings.pools)}",
                    step=sid, path=base + "/pool")
        steps.append((i, raw, model))

    # --- dependencies and cycles ---------------------------------------------------
    deps: dict[str, list[str]] = {}
    for i, _raw, model in steps:
        mine: list[str] = []
        for j, dep in enumerate(model.depends_on):
            where = f"{pointer('steps', i)}/depends_on/{j}"
            if dep == model.id:
                out.add("dependency", f"step {model.id!r} depends on itself", step=model.id,
                        path=where)
            elif dep not in ids:
                out.add("dependency", f"step {model.id!r} depends on {dep!r}, which is not a "
                        f"step of this plan.{_suggest(dep, ids)}", step=model.id, path=where)
            elif dep not in mine:
                mine.append(dep)
        deps.setdefault(model.id, mine)
    cycle = graph.find_cycle(deps)
    if cycle is not None:
        loop = list(reversed(cycle))
        first = loop[0]
        out.add("cycle", f"steps wait on each other: {' -> '.join(loop)} (each waits on the "
                "next); break the loop", step=first,
                path=f"{pointer('steps', ids[first])}/depends_on")

    # --- placeholders, parameters used, arguments, references --------------------------
    used: set[str] = set()
    checked: list[CheckedStep] = []
    for i, raw, model in steps:
        base = pointer("steps", i)
        sid = model.id
        for ptr, ref in references(raw.get("arguments", {})):
            _check_ref(out, ref, sid, f"{base}/arguments{ptr}", model.for_each is not None,
                       ids, deps, cycle is None, registry, steps, used, declared)
        fe = model.for_each
        if isinstance(fe, str | list):
            for ptr, ref in references(fe):
                if isinstance(ref, ItemRef | IndexRef):
                    out.add("reference", f"step {sid!r}: for_each cannot use {ref.source()}",
                            step=sid, path=f"{base}/for_each{ptr}")
                    continue
                _check_ref(out, ref, sid, f"{base}/for_each{ptr}", True, ids, deps,
                           cycle is None, registry, steps, used, declared)
        if model.when is not None:
            _check_when(out, model.when, sid, base, ids, deps, cycle is None, declared, used)
        problems: list[Problem] = []
        arguments = substitute(model.arguments, values, f"{base}/arguments", problems)
        for_each = substitute(fe, values, f"{base}/for_each", problems) if fe is not None \
            else None
        if plain and not (marks and (redact.has_marks(model.arguments)
                                     or redact.has_marks(fe))):
            stored, stored_fe = arguments, for_each
        else:
            stored = substitute(redact.escape_value(model.arguments), stored_values)
            stored_fe = substitute(redact.escape_value(fe), stored_values) \
                if fe is not None else None
        for p in problems:
            out.add(p.code, f"step {sid!r}: {p.message}", step=sid, path=p.path)
        if for_each is not None and not (
                isinstance(for_each, list) or for_each is UNKNOWN
                or (isinstance(for_each, Template) and isinstance(for_each.exact, StepRef))):
            out.add("schema", f"step {sid!r}: for_each must be a list or exactly one "
                    "placeholder such as {steps.ID.output.items}", step=sid,
                    path=f"{base}/for_each")
        tool = registry.tools.get(model.tool)
        if tool is None:
            if model.tool not in registry:
                hint = registry.suggest(model.tool)
                out.add("unknown_tool", f"step {sid!r}: no tool named {model.tool!r} in "
                        f"{registry.file.name}." + (f" Did you mean {hint!r}?" if hint else ""),
                        step=sid, path=f"{base}/tool")
            continue
        if not problems:
            for sub, msg, is_key in argument_problems(
                    tool, arguments, None if stored is arguments else stored):
                out.add("arguments", f"step {sid!r}: {msg}", step=sid,
                        path=f"{base}/arguments{sub}", key=is_key)
        policy = registry.policy
        reason = "irreversible" if tool.entry.irreversible else None
        if policy is not None:
            if policy.allowed_tools is not None and tool.name not in policy.allowed_tools:
                out.add("not_allowed", f"step {sid!r}: tool {tool.name!r} is not in the "
                        "policy's allowed_tools", step=sid, path=f"{base}/tool")
            cls = policy.class_of(tool.name)
            if cls is not None and cls[1] == "refuse":
                out.add("refused", f"step {sid!r}: the policy refuses tool {tool.name!r} "
                        f"outright (class {cls[0]!r})", step=sid, path=f"{base}/tool")
            reason = policy.clearance(tool.name, tool.entry.irreversible)
        checked.append(CheckedStep(index=i, id=sid, tool=tool, arguments=stored,
                                   for_each=stored_fe, depends_on=deps.get(sid, []), raw=raw,
                                   approval_reason=reason,
                                   static=for_each is None and not has_templates(arguments)))
    for pname in declared:
        if pname not in used:
            out.add("param_unused", f"parameter {pname!r} is declared but no step uses it; "
                    f"use {{params.{pname}}} or remove it", path=pointer("params", pname),
                    key=True)

    if not report.ok or head is None:
        return report, None
    document = redact.stored_plan(data)
    plan = CheckedPlan(
        file=doc.file or "", name=name, revision=head.revision, goal=head.goal,
        document=document, digest=known_digest or digest(document), params=values,
        secret_params=secrets,
        steps=checked, deps={s.id: s.depends_on for s in checked},
        max_parallel=head.max_parallel, timeout=head.timeout, policy=registry.policy)
    report.plan["digest"] = plan.digest
    return report, plan


def _check_ref(out: _Collector, ref: Any, sid: str, where: str, fanout: bool,
               ids: dict[str, int], deps: dict[str, list[str]], acyclic: bool,
               registry: ToolRegistry, steps: list[tuple[int, dict[str, Any], Any]],
               used: set[str], declared: dict[str, Any]) -> None:
    if isinstance(ref, ParamRef):
        used.add(ref.name)
        if ref.name not in declared:
            out.add("param_missing", f"step {sid!r}: {{params.{ref.name}}} names a parameter "
                    f"the plan does not declare.{_suggest(ref.name, declared)} Declare it "
                    "under params:", step=sid, path=where)
        return
    if isinstance(ref, ItemRef | IndexRef):
        if not fanout:
            out.add("reference", f"step {sid!r}: {ref.source()} is only available in a step "
                    "with for_each", step=sid, path=where)
        return
    if isinstance(ref, StepRef):
        if ref.step not in ids:
            out.add("reference", f"step {sid!r}: {ref.source()} names no step of this plan."
                    f"{_suggest(ref.step, ids)}", step=sid, path=where)
        elif ref.step == sid:
            out.add("reference", f"step {sid!r}: {ref.source()} reads the step's own output",
                    step=sid, path=where)
        elif acyclic and not graph.is_ancestor(ref.step, sid, deps):
            out.add("reference", f"step {sid!r}: {ref.source()} reads step {ref.step!r}, "
                    f"which {sid!r} does not depend on; add {ref.step!r} to its depends_on",
                    step=sid, path=where)
        else:
            _check_output_path(out, ref, sid, where, registry, steps, ids)


def _check_output_path(out: _Collector, ref: StepRef, sid: str, where: str,
                       registry: ToolRegistry, steps: list[tuple[int, dict[str, Any], Any]],
                       ids: dict[str, int]) -> None:
    """With an ``output_schema``, refuse a path the output can never have."""
    target = next((m for _i, _r, m in steps if m.id == ref.step), None)
    if target is None or target.for_each is not None:
        return
    tool = registry.tools.get(target.tool)
    schema = tool.entry.output_schema if tool else None
    for tok in ref.path:
        if not isinstance(schema, dict):
            return
        props = schema.get("properties")
        if isinstance(props, dict) and tok in props:
            schema = props[tok]
            continue
        if "items" in schema and tok.isdigit():
            schema = schema["items"]
            continue
        if schema.get("additionalProperties") is False and isinstance(props, dict):
            out.add("reference", f"step {sid!r}: {ref.source()}: the output of tool "
                    f"{target.tool!r} has no {tok!r} (its output_schema declares "
                    f"{', '.join(props) or 'nothing'})", step=sid, path=where)
        return


def _check_when(out: _Collector, expr: str, sid: str, base: str, ids: dict[str, int],
                deps: dict[str, list[str]], acyclic: bool, declared: dict[str, Any],
                used: set[str]) -> None:
    from .conditions import ConditionError, compile_condition, references, unknown_names

    try:
        compile_condition(expr)
        param_refs, step_refs = references(expr)
        names, calls = unknown_names(expr)
    except ConditionError as exc:
        out.add("condition", f"step {sid!r}: when does not compile: {exc}", step=sid,
                path=base + "/when")
        return
    for name in names:  # SPEC §3: a condition reads params and steps, nothing else
        out.add("condition", f"step {sid!r}: when reads {name!r}, but a condition can only "
                "read params.NAME and steps.ID.output", step=sid, path=base + "/when")
    for name in calls:
        out.add("condition", f"step {sid!r}: when calls {name}(), which is not a CEL "
                "function", step=sid, path=base + "/when")
    used.update(param_refs)
    for ref in sorted(step_refs):
        if ref not in ids or ref == sid or (acyclic and not graph.is_ancestor(ref, sid, deps)):
            out.add("condition", f"step {sid!r}: when reads steps.{ref}, which is not a step "
                    f"{sid!r} depends on", step=sid, path=base + "/when")
    for pname in sorted(param_refs):
        if pname not in declared:
            out.add("condition", f"step {sid!r}: when reads params.{pname}, which the plan "
                    "does not declare", step=sid, path=base + "/when")


def plan_name(path: Path, doc: Document) -> str:
    """The plan's ``name`` field, else the file stem."""
    data = doc.data
    if isinstance(data, dict) and isinstance(data.get("name"), str):
        return str(data["name"])
    return path.stem
