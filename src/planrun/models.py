"""Pydantic models of planrun's file formats (SPEC §2, §3): strict, frozen, no extra fields.

Only planrun's own structures are modelled here; the JSON Schemas inside them (parameter
schemas, tool contracts, grants) are kept as plain dicts and checked against the 2020-12
metaschema by :mod:`planrun.validation` and :mod:`planrun.registry`.
``planrun schema plan|tools`` prints ``model_json_schema()`` of :class:`Plan` and
:class:`Registry`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# The constants live in the light planrun.formats (no pydantic), re-exported here; it also
# holds the fast path that accepts a certainly valid step, head or tool without these models.
from .formats import (
    ACCEPTS_PATTERN,
    FACET_NAME_PATTERN,
    MAX_BACKOFF_S,
    MAX_GROUP_KEYS,
    PYTHON_TARGET_PATTERN,
    TOOL_NAME_PATTERN,
)
from .formats import MAX_ATTEMPTS as MAX_ATTEMPTS
from .formats import MAX_SECONDS as MAX_SECONDS
from .formats import MAX_STORED_INT as MAX_STORED_INT
from .formats import PARAM_NAME_PATTERN as PARAM_NAME_PATTERN
from .formats import STEP_ID_PATTERN as STEP_ID_PATTERN
from .formats import SUPPORTED_FORMATS as SUPPORTED_FORMATS
from .formats import duration_s as duration_s

_STRICT = ConfigDict(extra="forbid", frozen=True, strict=True)

PositiveInt = Annotated[int, Field(ge=1, le=MAX_STORED_INT)]
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS)]


class Retries(BaseModel):
    """``retries`` of a tool or step.

    ``max_attempts`` calls at most, waiting ``backoff_s * 2^(attempt-1)`` seconds between
    them; ``on_exit_codes`` limits retrying to those exit statuses.
    """

    model_config = _STRICT
    max_attempts: Annotated[int, Field(ge=1, le=MAX_ATTEMPTS)] = 1
    backoff_s: Annotated[float, Field(ge=0, le=MAX_BACKOFF_S)] = 0.0
    on_exit_codes: list[int] | None = None


FacetName = Annotated[str, Field(pattern=FACET_NAME_PATTERN)]


class Facets(BaseModel):
    """``facets`` of a step: small summaries of its output.

    Each kind maps a facet name to a path into the output (``files[].ext``).
    """

    # Issue 17; computed by planrun.facets. A model's docstring is its description in
    # `planrun schema` (an editor shows it): user words only there.

    model_config = _STRICT
    paths: dict[FacetName, str] = Field(default_factory=dict)
    counts: dict[FacetName, str] = Field(default_factory=dict)
    group_counts: dict[FacetName, str] = Field(default_factory=dict)
    max_group_keys: Annotated[int, Field(ge=1, le=MAX_GROUP_KEYS)] = 25


class Step(BaseModel):
    """One step of a plan: a tool called with arguments."""

    # SPEC §3

    model_config = _STRICT
    id: Annotated[str, Field(pattern=STEP_ID_PATTERN)]
    tool: Annotated[str, Field(min_length=1)]
    arguments: dict[str, Any] = Field(default_factory=dict)
    depends_on: list[str] = Field(default_factory=list)
    intent: str | None = None
    for_each: str | list[Any] | None = None
    max_parallel: PositiveInt | None = None
    max_items: PositiveInt | None = None
    on_item_error: Literal["fail", "continue", "skip", "collect"] | None = None
    timeout: Seconds | None = None
    retries: Retries | None = None
    when: str | None = None
    #: which outcome of its ancestors lets the step run: ``success`` (default: every
    #: dependency succeeded), ``failure`` (some ancestor failed, ended indeterminate or
    #: was skipped other than by its condition), ``always`` (once they all finished).
    run_if: Literal["success", "failure", "always"] | None = None
    #: ``resolved``: clear the step when its arguments are resolved, at dispatch.
    approve: Literal["resolved"] | None = None
    pool: str | None = None
    max_recoveries: Annotated[int, Field(ge=0)] | None = None
    facets: Facets | None = None


class PlanHead(BaseModel):
    """A plan's top-level fields; ``steps`` are checked one by one as :class:`Step`."""

    model_config = _STRICT
    planrun: int
    name: Annotated[str, Field(min_length=1)] | None = None
    revision: PositiveInt = 1
    goal: str
    params: dict[Annotated[str, Field(pattern=PARAM_NAME_PATTERN)], dict[str, Any]] = Field(
        default_factory=dict)
    max_parallel: PositiveInt | None = None
    timeout: Seconds | None = None
    steps: list[Any]


class Plan(PlanHead):
    """The whole plan file (for ``planrun schema plan``)."""

    # Only `planrun schema` uses it: its validator is built then, not at every start.
    model_config = ConfigDict(**_STRICT, defer_build=True)
    steps: list[Step]


class Tool(BaseModel):
    """One entry of ``tools.yaml``: a tool and its contract."""

    # SPEC §2

    model_config = _STRICT
    description: str | None = None
    command: Annotated[list[str], Field(min_length=1)] | None = None
    python: Annotated[str, Field(pattern=PYTHON_TARGET_PATTERN)] | None = None
    arguments: dict[str, Any] | None = None
    accepts: Annotated[str, Field(pattern=ACCEPTS_PATTERN)] | None = None
    output: Literal["none", "text", "json"] | None = None
    output_schema: dict[str, Any] | None = None
    irreversible: bool = False
    idempotent: bool = False
    key_arguments: list[str] | None = None
    #: whose calls an idempotency key tells apart: ``run`` (each root run, the default) or
    #: ``plan`` (every run of the plan: a later run replays what an earlier one did).
    dedupe: Literal["run", "plan"] = "run"
    #: ``dedupe: plan`` only: a succeeded key older than this is not replayed; seconds
    #: (a number) or a duration such as ``12h`` (s, m, h, d, w), see :func:`duration_s`.
    #: (bounds checked by the registry, so that a bad value is one issue, not one per type)
    dedupe_ttl: float | str | None = None
    timeout: Seconds | None = None
    retries: Retries | None = None
    cwd: str | None = None
    pool: str | None = None
    #: ``resolved``: steps of this tool are cleared with their resolved arguments, at
    #: dispatch, instead of before the run.
    approve: Literal["resolved"] | None = None
    #: command tools: arguments whose placeholder may sit inside a larger argv element.
    allow_embedded: list[str] | None = None
    #: command tools: arguments (or ``true``: all) whose value may start with ``-``, ``+``
    #: or ``@`` (:func:`planrun.argv.option_value_problems`).
    allow_option_values: bool | list[str] | None = None
    #: sync python tools: ``false`` declares that each call returns at once and keeps
    #: nothing bound to a thread, so it is called on the event loop's own thread, not in
    #: a worker thread (:mod:`planrun.dispatch.inline`). None (the default): a thread.
    blocking: bool | None = None


class Registry(BaseModel):
    """``tools.yaml``: a mapping of tool names to their entries."""

    # Only `planrun schema` uses it (tools are checked one by one as Tool).
    model_config = ConfigDict(**_STRICT, defer_build=True)
    tools: dict[Annotated[str, Field(pattern=TOOL_NAME_PATTERN)], Tool]


def loc_pointer(prefix: str, loc: tuple[int | str, ...]) -> str:
    """JSON Pointer of a pydantic error location under ``prefix``."""
    from .pointers import pointer_of

    return prefix + pointer_of(loc)


def _fields_at(model: Any, loc: tuple[Any, ...]) -> list[str]:
    """The field names of the model reached from ``model`` along ``loc`` (may be [])."""
    import typing

    for part in loc:
        fields = getattr(model, "model_fields", None)
        if not isinstance(part, str) or not fields or part not in fields:
            if isinstance(part, int):
                continue  # an item of a list: the same model
            return []
        ann = fields[part].annotation
        found = None
        for cand in (ann, *typing.get_args(ann)):
            for inner in (cand, *typing.get_args(cand)):
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    found = inner
        if found is None:
            return []
        model = found
    return list(getattr(model, "model_fields", {}) or {})


def error_message(err: Any, model: Any = None) -> str:
    """A pydantic error as one readable sentence.

    ``model`` (the pydantic class validated): an unknown field gets a "Did you mean"
    suggestion among the fields at its place (``retry`` → ``retries``).
    """
    loc = err.get("loc", ())
    field = str(loc[-1]) if loc else "document"
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        from .issues import did_you_mean

        known = _fields_at(model, tuple(loc[:-1])) if model is not None else []
        suggestion = did_you_mean(field, known)
        return f"unknown field {field!r}" + (f".{suggestion}" if suggestion else "")
    if kind == "missing":
        return f"required field {field!r} is missing"
    return f"{field}: {err.get('msg', 'invalid')} (got {err.get('input')!r})"
