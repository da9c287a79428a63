"""Validation issues and reports (SPEC §4).

An :class:`Issue` is one problem found in a plan, the registry or the configuration; a
:class:`Report` gathers every issue of one ``validate``/``execute`` call so that a user sees
all problems at once. Issues are plain frozen dataclasses: cheap to create by the hundred
thousand when a large plan is checked.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

#: Stable issue codes (SPEC §4) → meaning. The README's table is checked against this.
ISSUE_CODES: dict[str, str] = {
    "registry": "`tools.yaml` is invalid (file-level issue)",
    "config": "`planrun.toml` is invalid (file-level issue)",
    "too_large": "the file, or what its aliases expand to, is over the size bound; or the "
                 "values its `{params.X}` placeholders place come to more than 64 Mi "
                 "characters (each counted every time it is placed); or checking which "
                 "steps its placeholders and conditions read walks more than 2,000,000 "
                 "steps of its graph",
    "not_found": "no plan of that name (message lists those that exist)",
    "bad_name": "plan name escapes the plans folder",
    "syntax": "the file is not valid YAML/JSON",
    "duplicate_key": "a mapping repeats a key",
    "schema": "the document does not have the plan format's shape (unknown field, wrong type)",
    "format_version": "`planrun:` missing or not a supported version",
    "param_missing": "a placeholder names an undeclared parameter, or a required one has no value",
    "param_unused": "a declared parameter is used nowhere",
    "param_unknown": "a value was given for an undeclared parameter",
    "param_type": "a parameter value fails its schema or does not parse as its type",
    "placeholder": "malformed placeholder or unknown placeholder root",
    "empty": "no steps",
    "too_long": "more steps than `max_steps` (refused, never trimmed)",
    "duplicate_id": "two steps share an id",
    "unknown_tool": "the registry has no such tool (message suggests the closest name)",
    "not_allowed": "the tool is outside the policy's allowed tools",
    "arguments": "an argument is missing, undeclared, or not of the declared type",
    "dependency": "`depends_on` names a step that does not exist, or the step itself",
    "cycle": "steps wait on each other (message names the cycle)",
    "reference": "a run-time placeholder names a step that is not an ancestor, "
    "or `{item}` outside `for_each`",
    "refused": "the policy refuses this tool outright",
    "repair_changes_succeeded": "a repair's revision changes or removes a step the failed "
    "run completed",
    "approve_resolved": "`approve: resolved` on a step it cannot apply to (arguments "
    "known before the run, a fan-out step, a step that needs no approval)",
    "condition": "a `when` expression does not compile, is past the limits of a condition, "
    "or reads a step that is not an ancestor",
    "planner": "a planner failed, timed out, or wrote something that is not a plan",
    "replan_exhausted": "no valid plan within `--max-rounds` rounds of a planner",
    "unmappable": "`planrun import`: a seed-plan construct with no planrun equivalent "
    "(nothing is guessed)",
    "ungrantable": "(warning) a grant names the step's tool, but no grant can ever clear the "
    "step: its arguments are only known at run time",
}

Severity = Literal["error", "warning"]


def closest(name: str, choices: Any) -> str | None:
    """The one of ``choices`` (turned into text) closest to ``name``, or None if none is close.

    "Close" is :func:`difflib.get_close_matches` with its default cutoff (0.6).
    """
    import difflib

    close = difflib.get_close_matches(name, [str(c) for c in choices], n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(name: str, choices: Any) -> str:
    """`` Did you mean 'x'?`` for the closest of ``choices`` to ``name``, or ``""``."""
    close = closest(name, choices)
    return f" Did you mean {close!r}?" if close is not None else ""


#: The most names one report compares to unknown names for "did you mean" suggestions
#: (:class:`Suggestions`): each suggestion compares the name with every choice, so a plan
#: of N steps whose every ``depends_on`` names no step asked N x N comparisons (2,000 such
#: steps took 54 s in ``validate``).
MAX_SUGGESTION_WORK = 50_000
#: A name longer than this gets no suggestion (a typo is in a short name; comparing long
#: texts costs the product of their lengths).
MAX_SUGGESTED_NAME = 100


class Suggestions:
    """"Did you mean" for one report, within :data:`MAX_SUGGESTION_WORK` comparisons.

    A suggestion that would take the report past the bound is left out (the issue is the
    same, without its hint); smaller ones after it are still made. The work is therefore
    bounded by the plan's size, whatever it holds.
    """

    __slots__ = ("left",)

    def __init__(self, budget: int = MAX_SUGGESTION_WORK) -> None:
        self.left = budget

    def did_you_mean(self, name: str, choices: Any) -> str:
        """Like :func:`did_you_mean`, or ``""`` past the report's bound.

        ``choices``: a sized collection (dict, set, list) of names.
        """
        n = len(choices)
        if n > self.left or len(name) > MAX_SUGGESTED_NAME:
            return ""
        self.left -= n
        return did_you_mean(name, choices)


def listed(names: Any, most: int = 20) -> str:
    """``names`` joined by commas, at most ``most`` of them then ``… (N more)``.

    For messages that name the choices: one such message per issue must not grow with the
    plan (a list of 10,000 declared parameters in each of 10,000 issues is 1 GB of text).
    """
    shown: list[str] = []
    for i, name in enumerate(names):
        if i == most:
            return ", ".join(shown) + f", … ({len(names) - most:,} more)"
        shown.append(str(name))
    return ", ".join(shown)


@dataclass(frozen=True, slots=True)
class Issue:
    """One problem (SPEC §4).

    Attributes:
        code: a key of :data:`ISSUE_CODES`.
        message: what is wrong and how to fix it.
        severity: ``error`` (the plan is refused) or ``warning``.
        step: the step id the issue belongs to, or None.
        path: JSON Pointer into the document (``/steps/2/arguments/keep``), "" for the root.
        file: the file the issue is in, or None (e.g. a value given with ``-p``).
        line: 1-based line of the offending node, or None when it has no node in a file.
        column: 1-based column, or None.
    """

    code: str
    message: str
    severity: Severity = "error"
    step: str | None = None
    path: str | None = None
    file: str | None = None
    line: int | None = None
    column: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The issue as the JSON object of ``validate --format json``."""
        return asdict(self)


@dataclass
class PlanReport:
    """The issues of one plan file; ``plan`` summarises it when it could be read."""

    file: str | None
    issues: list[Issue] = field(default_factory=list)
    plan: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        """True when no issue is an error."""
        return not any(i.severity == "error" for i in self.issues)

    def to_json(self) -> dict[str, Any]:
        """``{"file", "ok", "issues", "plan"}`` as in SPEC §4."""
        return {
            "file": self.file,
            "ok": self.ok,
            "issues": [i.to_json() for i in self.issues],
            "plan": self.plan,
        }


@dataclass
class Report:
    """Everything one validation found: file-level issues plus one report per plan."""

    issues: list[Issue] = field(default_factory=list)
    plans: list[PlanReport] = field(default_factory=list)

    def all_issues(self) -> list[Issue]:
        """Registry/config issues first, then each plan's, in order."""
        out = list(self.issues)
        for p in self.plans:
            out.extend(p.issues)
        return out

    def ok(self, *, strict: bool = False) -> bool:
        """True when nothing is an error (with ``strict``, nothing is a warning either)."""
        bad = {"error", "warning"} if strict else {"error"}
        return not any(i.severity in bad for i in self.all_issues())

    def to_json(self, *, strict: bool = False) -> dict[str, Any]:
        """The ``validate --format json`` object: ``{"ok", "issues", "plans"}``."""
        return {
            "ok": self.ok(strict=strict),
            "issues": [i.to_json() for i in self.issues],
            "plans": [p.to_json() for p in self.plans],
        }
