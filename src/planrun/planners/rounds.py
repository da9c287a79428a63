"""The planner protocol's rounds: request, answer, validation, report back (SPEC §10).

:func:`propose` asks a planner for a plan, validates each answer like any plan file
(registry, policy, parameters, and an ``extra_check`` such as repair's), and while it is
refused sends the report back (``previous``) for another round, at most ``max_rounds``.
A planner that fails, times out or writes something that is not a plan ends its round
with an issue coded ``planner``, sent back like any other. Past the bound:
:class:`~planrun.errors.Refused` with code ``replan_exhausted`` and the last report.

Every round can be journaled through a :class:`Session` (``plan_proposed`` with round and
digest, ``plan_refused`` with the report); see :mod:`planrun.planners.session`.

Secrets (SPEC §7): a planner gets a given value of a secret parameter only as its
reference (U+FDD0 NAME U+FDD1), never the value; see :class:`PlannerParams`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import Refused, UsageError
from ..issues import Issue, PlanReport, Report
from ..redact import Secrets
from .spec import Planner

#: The protocol version planrun speaks (the request's ``protocol``).
PROTOCOL = 1


class Session(Protocol):
    """Where the rounds are journaled (:class:`planrun.planners.session.JournalSession`)."""

    def proposed(self, round_no: int, digest: str | None, plan: Any) -> None:
        """A round's answer: its digest and the plan (reference form), or None for none."""

    def refused(self, round_no: int, issues: list[dict[str, Any]]) -> None:
        """A round's answer was refused: the report's issues (reference form)."""


@dataclass
class Accepted:
    """The plan a planner proposed and validation accepted.

    Attributes:
        plan: the checked plan.
        data: the plan document as the planner wrote it (values, not references).
        round: the round it was proposed in (1-based).
        report: its validation report (warnings only).
        issues_sent: how many issues were sent back before it, over all rounds.
    """

    plan: Any
    data: dict[str, Any]
    round: int
    report: PlanReport
    issues_sent: int = 0


@dataclass
class PlannerParams:
    """The given parameter values as a planner sees them (the request's ``params``).

    ``-p`` values are sent as the text given (the plan's declared type applies when it is
    validated), ``--params-file`` values as they are. A value is sent as its reference
    (never the value) when its name is in ``secret_names`` (declared ``secret: true`` by
    the plan being replaced or repaired) or declared secret by any plan proposed so far
    (:meth:`learn`). Values given in the environment (``PLANRUN_PARAM_<NAME>``, the way to
    give a secret without a command line) are always sent as references.

    Args:
        given: the values (:class:`~planrun.validation.ParamInput`), or None.
        secret_names: names known to be secret before the first round.
    """

    given: Any = None
    secret_names: set[str] = field(default_factory=set)

    def _env_names(self) -> list[str]:
        env = self.given.env if self.given is not None else {}
        return [k for k in env if k.lower() == k or k.lower() not in env]

    def learn(self, plan_data: Any) -> None:
        """Treat as secret every parameter ``plan_data`` declares ``secret: true``."""
        params = plan_data.get("params") if isinstance(plan_data, dict) else None
        if isinstance(params, dict):
            self.secret_names.update(n for n, s in params.items() if isinstance(n, str)
                                     and isinstance(s, dict) and s.get("secret") is True)

    def values(self) -> dict[str, Any]:
        """Every given value by name (file below ``-p``; environment below both)."""
        if self.given is None:
            return {}
        out: dict[str, Any] = {k: self.given.env[k] for k in self._env_names()}
        out.update(self.given.file_values)
        out.update(self.given.cli)
        return out

    def hidden(self) -> set[str]:
        """Names whose value a planner never gets."""
        given = self.given
        named = set(given.cli) | set(given.file_values) if given is not None else set()
        return set(self.secret_names) | (set(self._env_names()) - named)

    def why_hidden(self) -> dict[str, str]:
        """:meth:`hidden` names → why each is a secret here (words of an issue message)."""
        env = set(self._env_names())
        out = {n: "the plan it replaces, or an earlier answer, declares it `secret: true`"
               for n in self.secret_names}
        given = self.given
        named = set(given.cli) | set(given.file_values) if given is not None else set()
        for n in env - named:
            out.setdefault(n, "its value is given in the environment (a PLANRUN_PARAM_ "
                              "variable), which a planner gets as a reference only")
        return out

    def request(self) -> dict[str, Any]:
        """The request's ``params``: values, secrets as references."""
        from ..redact import escape_value, reference

        hidden = self.hidden()
        return {name: reference(name) if name in hidden else escape_value(value)
                for name, value in sorted(self.values().items())}

    def secrets(self) -> Secrets:
        """The hidden values, to mask wherever planner output or reports carry them."""
        values = self.values()
        return Secrets({n: values[n] for n in sorted(self.hidden()) if n in values})


def secrets_kept(doc: Any, hidden: dict[str, str]) -> list[Issue]:
    """``param_type`` issues: the parameters of ``hidden`` the answer declares not secret.

    A planner gets such a value as a reference only; an answer that declared the
    parameter without ``secret: true`` made it a plain value: ``execute --planner`` then
    journaled and showed the value of ``PLANRUN_PARAM_TOKEN`` in clear, and a revision of
    a plan (or a repair) dropped the secrecy its person had declared (found by an
    attacker). Refused and sent back, never repaired.

    Args:
        doc: the answer (a :class:`~planrun.loading.Document`).
        hidden: :meth:`PlannerParams.why_hidden` before the answer.
    """
    data = doc.data
    declared = data.get("params") if isinstance(data, dict) else None
    if not isinstance(declared, dict) or not hidden:
        return []
    from ..pointers import pointer
    from .invoke import OUTPUT_NAME

    out = []
    for name, schema in declared.items():
        if name not in hidden or (isinstance(schema, dict) and schema.get("secret") is True):
            continue
        ptr = pointer("params", name)
        line, column = doc.locate(ptr)
        out.append(Issue(code="param_type", path=ptr, file=OUTPUT_NAME, line=line,
                         column=column, message=f"parameter {name!r} is a secret here "
                         f"({hidden[name]}): declare it `secret: true`; a planner cannot "
                         "make a secret a plain value"))
    return out


def catalog(registry: Any) -> list[dict[str, Any]]:
    """The request's ``catalog``: only the tools the policy lets a plan use.

    Each: ``{"name", "description", "arguments" (the JSON Schema of its arguments),
    "output_schema" (or null), "irreversible", "idempotent"}`` — the same tools as
    ``planrun tools --allowed``.
    """
    from ..views import describe_tools

    out = []
    for row in describe_tools(registry, allowed=True):
        spec = registry.tools[row["name"]]
        out.append({"name": spec.name, "description": spec.entry.description,
                    "arguments": spec.contract, "output_schema": spec.entry.output_schema,
                    "irreversible": spec.entry.irreversible,
                    "idempotent": spec.entry.idempotent})
    return out


def request_base(registry: Any, *, goal: str, mode: str = "plan",
                 params: dict[str, Any] | None = None, run: Any = None) -> dict[str, Any]:
    """The parts of a request that stay the same from round to round.

    ``{"protocol": 1, "mode", "goal", "plan_schema", "catalog", "params", "run"}``;
    :func:`propose` adds ``round``, ``max_rounds`` and ``previous`` (and, given a
    :class:`PlannerParams`, replaces ``params`` each round).
    """
    from ..views import json_schema

    return {"protocol": PROTOCOL, "mode": mode, "goal": goal, "round": 1, "max_rounds": 1,
            "plan_schema": json_schema("plan"), "catalog": catalog(registry),
            "params": dict(params or {}), "previous": None, "run": run}


def propose(settings: Any, planner: Planner, base: dict[str, Any], *, max_rounds: int,
            registry: Any, given: Any = None, concrete: bool | None = None,
            name_hint: str = "plan",
            extra_check: Callable[[Any, Any], Iterable[Issue]] | None = None,
            session: Session | None = None, params: PlannerParams | None = None,
            on_round: Callable[[int, PlanReport | None], None] | None = None,
            given_for: Callable[[Any], Any] | None = None) -> Accepted:
    """Ask ``planner`` for a plan, at most ``max_rounds`` times, until one passes.

    Args:
        settings: the invocation's settings (``max_steps``, ``pools``).
        planner: who to ask (:func:`planrun.planners.resolve_planner`).
        base: :func:`request_base` (``mode``, ``goal``, ``run``, …).
        max_rounds: the bound (>= 1).
        registry: the registry with its policy (:func:`planrun.api.load_registry`).
        given: parameter values to validate with (a ``ParamInput``), or None.
        concrete: validate with concrete values (as ``execute``); default: when values
            were given (as ``validate``).
        name_hint: the plan's name when it has no ``name`` field.
        extra_check: ``extra_check(checked_plan, data)`` → more issues (errors refuse the
            plan), e.g. repair's ``repair_changes_succeeded``; also called with
            ``checked_plan`` None for a mapping that failed validation.
        session: journals each round; None journals nothing.
        params: the request's ``params`` from given values (secrets as references);
            None keeps ``base["params"]``.
        on_round: called after each round with its report (None when accepted).
        given_for: ``given_for(data)`` → the values to validate this answer with, instead
            of ``given`` (repair: the run's values of the parameters the revision declares).

    Returns:
        The accepted plan.

    Raises:
        Refused: code ``replan_exhausted`` (exit 3) past the bound; ``report`` is the last
            round's report, ``details`` ``{"rounds": N}``.
        UsageError: ``max_rounds`` below 1 (exit 2).
    """
    from ..canonical import digest
    from ..checking import grant_warnings, no_gc
    from ..redact import stored_plan
    from ..validation import check_plan
    from .invoke import OUTPUT_NAME, PlannerFailed, ask

    if max_rounds < 1:
        raise UsageError(f"max_rounds must be at least 1, not {max_rounds}")
    previous: dict[str, Any] | None = None
    last = PlanReport(file=OUTPUT_NAME)
    sent = 0
    for round_no in range(1, max_rounds + 1):
        request = {**base, "round": round_no, "max_rounds": max_rounds,
                   "previous": previous}
        secrets = params.secrets() if params is not None else Secrets({})
        if params is not None:
            request["params"] = params.request()
        try:
            doc = ask(planner, request, secrets)
        except PlannerFailed as exc:
            if session is not None:
                session.proposed(round_no, None, None)
            last = PlanReport(file=OUTPUT_NAME, issues=[exc.issue()])
            data: Any = None
        else:
            data = doc.data
            # what this answer was sent as references, before it declares anything itself
            hidden = params.why_hidden() if params is not None else {}
            if params is not None:
                params.learn(data)
                secrets = params.secrets()
            shown = secrets.conceal(stored_plan(data))
            try:
                dig: str | None = digest(shown)
            except (TypeError, ValueError):
                dig = None
            if session is not None:
                session.proposed(round_no, dig, shown)
            with no_gc():
                last, checked = check_plan(doc, registry, settings, given if given_for is None
                                           else given_for(data), concrete=concrete,
                                           name_hint=name_hint)
            last.file = OUTPUT_NAME
            last.issues.extend(secrets_kept(doc, hidden))
            if extra_check is not None and (checked is not None or isinstance(data, dict)):
                # also beside other issues (checked is None then): all sent back at once
                last.issues.extend(extra_check(checked, data))
            if checked is not None and not any(i.severity == "error" for i in last.issues):
                last.issues.extend(grant_warnings(checked, doc))
                if on_round is not None:
                    on_round(round_no, None)
                return Accepted(plan=checked, data=data, round=round_no, report=last,
                                issues_sent=sent)
        issues = [secrets.conceal(i.to_json()) for i in last.issues]
        last = PlanReport(file=OUTPUT_NAME, issues=[Issue(**i) for i in issues])
        sent += len(issues)
        if session is not None:
            session.refused(round_no, issues)
        if on_round is not None:
            on_round(round_no, last)
        previous = {"plan": secrets.conceal(data) if data is not None else None,
                    "issues": issues}
    raise Refused(f"no valid plan in {max_rounds} round(s) (replan_exhausted)",
                  code="replan_exhausted",
                  report=Report(plans=[last]), details={"rounds": max_rounds})
