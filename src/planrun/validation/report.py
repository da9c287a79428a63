"""The issues of one plan, each located in its document."""

from __future__ import annotations

import json
from typing import Any

from ..issues import Issue, Suggestions
from ..loading import Document
from ..pointers import pointer_of


class Collector:
    """Issues of one plan, each located in its document (line and column from its path)."""

    def __init__(self, doc: Document) -> None:
        self.doc = doc
        self.issues: list[Issue] = []
        #: the report's bound on "did you mean" work, shared by all its issues
        self.suggestions = Suggestions()

    def did_you_mean(self, name: str, choices: Any) -> str:
        """`` Did you mean 'x'?`` (or ``""``) within the report's bound on suggestions.

        See :class:`planrun.issues.Suggestions`: the work of all suggestions of one plan's
        report is bounded, however many names it gets wrong.
        """
        return self.suggestions.did_you_mean(name, choices)

    def add(self, code: str, message: str, *, step: str | None = None,
            path: str | None = None, key: bool = False, located: bool = True) -> None:
        """Add one error; ``key``: locate the key at ``path`` rather than its value."""
        line = col = None
        if located and path is not None:
            line, col = self.doc.locate_key(path) if key else self.doc.locate(path)
        self.issues.append(Issue(code=code, message=message, step=step, path=path,
                                 file=self.doc.file, line=line, column=col))


def pydantic_issues(out: Collector, exc: Any, base: str, data: Any,
                    step: str | None) -> None:
    """One ``schema`` issue per error of a pydantic ``ValidationError`` under ``base``."""
    from ..models import error_message
    from ..registry import _real_loc

    for err in exc.errors():
        ptr = base + pointer_of(_real_loc(data, err["loc"]))
        what = f"step {step!r}: " if step else ""
        out.add("schema", what + error_message(err), step=step, path=ptr,
                key=err["type"] == "extra_forbidden")


def secret_rule(err: Any) -> str:
    """The schema rule a secret value fails, as JSON cut at 200 characters (no value)."""
    rule = json.dumps(err.validator_value, ensure_ascii=False, default=str)
    return rule if len(rule) <= 200 else rule[:200] + "…"
