"""The plain facts of planrun's file formats, and a check of them without pydantic (issue 16).

Two parts, neither importing pydantic:

* the constants of the formats (supported versions, id and name patterns, bounds, the
  choices of each ``Literal``), which :mod:`planrun.models` builds its models from and
  re-exports, so that code needing a constant does not load pydantic (~100 ms);
* a fast path for the three mappings planrun validates on every start: a step
  (``models.Step``), a plan's top-level fields (``models.PlanHead``) and a ``tools.yaml``
  entry (``models.Tool``). :func:`step_data`, :func:`head_data` and :func:`tool_data`
  return a :class:`StepData`, :class:`HeadData` or :class:`ToolData` only when the
  mapping *certainly* validates as the model (exact ``str``/``int``/``float``/``bool``/
  ``dict``/``list`` types, the same patterns, bounds, choices, required fields, no other
  field), with the attributes and defaults the model would give (ints of float fields
  become floats, dicts and lists are copied). Else they return None and the caller
  validates with the pydantic model exactly as before, so every error message, code and
  location comes from pydantic; a mapping the model accepts but the fast path does not
  (a ``str`` subclass, an int beyond 64 bits, ``nan`` in ``dedupe_ttl``) gets the model's
  values through :meth:`StepData.of_model` and friends, so code after validation sees
  one type.

Why two descriptions of one format: pydantic (``from pydantic import BaseModel``, ~390 M
instructions) and building the models (~300 M more) were paid by every ``planrun
validate`` and ``execute``, while pydantic's errors, what users read, are rare.
:mod:`planrun.models` stays the one source of the formats' documentation (``planrun
schema plan|tools``) and of every error; this module only decides acceptance early. What
keeps the two equal: the constants are defined here once and used by both; and
``tests/test_formats.py`` checks that each ``*Data`` class has the model's fields in order
with its required fields, defaults and ``Literal`` choices; that with each edge value (bool
for int, 0, bounds, huge ints, nan, inf, patterns just outside, keys that are not text,
nested ``retries``/``facets``) at each field of a valid mapping, and in hypothesis's
combinations, the fast path accepts only what pydantic accepts, with every attribute and
dump equal; and that it accepts every plan and registry of the repository and its tests
and generated valid ones (so it cannot pass by declining everything). A field given that
this module does not know makes the fast path decline (the model then answers); a field
added to a model and not here fails the field test.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, ClassVar, Literal, TypeVar

#: Plan format versions this planrun reads (the ``planrun:`` field).
SUPPORTED_FORMATS = (1,)

STEP_ID_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]*$"
PARAM_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_-]*$"
#: A facet's name (``facets.counts.NAME``).
FACET_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
#: ``python: module:callable`` of a tool.
PYTHON_TARGET_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$"
#: ``accepts: module:Model`` of a python tool.
ACCEPTS_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"
#: A tool's name in ``tools.yaml``.
TOOL_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]*$"

#: The largest integer SQLite stores (a signed 64-bit integer).
MAX_STORED_INT = 2**63 - 1
#: The longest wait planrun accepts, in seconds (~31 years): every timer the OS offers
#: (``threading.TIMEOUT_MAX``, ``select``) takes it.
MAX_SECONDS = 1e9
#: The most calls ``retries.max_attempts`` may ask for (``backoff_s * 2^999`` stays finite).
MAX_ATTEMPTS = 1000
#: The longest first wait between retries (``retries.backoff_s``), in seconds (a day).
MAX_BACKOFF_S = 86_400
#: The most group keys ``facets.max_group_keys`` may keep.
MAX_GROUP_KEYS = 1000

#: The choices of each ``Literal`` field of the models.
ON_ITEM_ERROR = ("fail", "continue", "skip", "collect")
RUN_IF = ("success", "failure", "always")
APPROVE = ("resolved",)
OUTPUT_MODES = ("none", "text", "json")
DEDUPE_SCOPES = ("run", "plan")

_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def duration_s(text: str) -> float | None:
    """Seconds of a duration such as ``45s``, ``90m``, ``12h``, ``30d``, ``2w``, else None.

    The grammar of ``planrun prune --older-than``: a positive whole number and one unit
    (s, m, h, d, w), spaces around allowed; anything else (``1.5h``, ``0d``, ``10``) is None.
    """
    m = re.fullmatch(r"\s*(\d{1,12})\s*([smhdw])\s*", text)
    if not m or int(m.group(1)) == 0:
        return None
    return float(int(m.group(1)) * _DURATION_UNITS[m.group(2)])


# --- the fast path ---------------------------------------------------------------------

#: A checker's answer "not certainly valid" (None is a valid value of optional fields).
_NO: Any = object()
Check = Callable[[Any], Any]
_MIN_INT, _MAX_INT = -MAX_STORED_INT - 1, MAX_STORED_INT
#: ints a float field takes exactly (pydantic converts them; beyond, rounding may differ).
_EXACT_FLOAT_INT = 2**53

D = TypeVar("D", bound="_Data")


def _fullmatch(pattern: str) -> Callable[[str], Any]:
    r"""``pattern`` (``^…$``) as a whole-string match, ASCII classes only.

    pydantic's (Rust) ``$`` is the end of the text (``"a\n"`` fails) and its ``\w`` is
    Unicode: an ASCII-only full match accepts a subset of what it accepts.
    """
    assert pattern.startswith("^"), pattern
    assert pattern.endswith("$"), pattern
    return re.compile(pattern[1:-1], re.ASCII).fullmatch


def _text(pattern: str | None = None, min_length: int = 0, optional: bool = False) -> Check:
    match = _fullmatch(pattern) if pattern else None

    def check(v: Any) -> Any:
        if type(v) is str:
            return v if len(v) >= min_length and (match is None or match(v)) else _NO
        return None if v is None and optional else _NO
    return check


def _int(lo: int = _MIN_INT, hi: int = _MAX_INT, optional: bool = False) -> Check:
    def check(v: Any) -> Any:
        if type(v) is int:
            return v if lo <= v <= hi else _NO
        return None if v is None and optional else _NO
    return check


def _number(v: Any) -> float | None:
    """``v`` as a float field's value, or None when not certainly one."""
    if type(v) is float:
        return v
    if type(v) is int and -_EXACT_FLOAT_INT <= v <= _EXACT_FLOAT_INT:
        return float(v)
    return None


def _seconds(lo: float, hi: float, lo_open: bool, optional: bool = False) -> Check:
    def check(v: Any) -> Any:
        x = _number(v)
        if x is None:
            return None if v is None and optional else _NO
        # nan fails both comparisons, inf the upper bound
        return x if (lo < x if lo_open else lo <= x) and x <= hi else _NO
    return check


def _choice(choices: tuple[str, ...], optional: bool = False) -> Check:
    def check(v: Any) -> Any:
        if type(v) is str:
            return v if v in choices else _NO
        return None if v is None and optional else _NO
    return check


def _flag(v: Any) -> Any:
    return v if type(v) is bool else _NO


def _opt_flag(v: Any) -> Any:
    return v if v is None or type(v) is bool else _NO


def _mapping(v: Any) -> Any:
    """``dict[str, Any]``: a copy, as pydantic gives."""
    if type(v) is not dict:
        return _NO
    for k in v:
        if type(k) is not str:
            return _NO
    return dict(v)


def _opt_mapping(v: Any) -> Any:
    return None if v is None else _mapping(v)


def _texts(min_length: int = 0, optional: bool = False) -> Check:
    """``list[str]``: a copy."""
    def check(v: Any) -> Any:
        if type(v) is not list:
            return None if v is None and optional else _NO
        for x in v:
            if type(x) is not str:
                return _NO
        return list(v) if len(v) >= min_length else _NO
    return check


def _ints(v: Any) -> Any:
    """``list[int] | None`` (64-bit ints)."""
    if v is None:
        return None
    if type(v) is not list:
        return _NO
    for x in v:
        if type(x) is not int or not _MIN_INT <= x <= _MAX_INT:
            return _NO
    return list(v)


def _for_each(v: Any) -> Any:
    """``str | list[Any] | None``."""
    if v is None or type(v) is str:
        return v
    return list(v) if type(v) is list else _NO


_TEXTS = _texts()


def _option_values(v: Any) -> Any:
    """``bool | list[str] | None``."""
    if v is None or type(v) is bool:
        return v
    return _TEXTS(v)


def _ttl(v: Any) -> Any:
    """``float | str | None`` (a finite number; the registry checks the bounds)."""
    if v is None or type(v) is str:
        return v
    x = _number(v)
    return x if x is not None and x - x == 0.0 else _NO


def _names_to(key: Check, value: Check) -> Check:
    """``dict[NAME, VALUE]`` with names checked by ``key`` (a copy, values converted)."""
    def check(v: Any) -> Any:
        if type(v) is not dict:
            return _NO
        out = {}
        for k, x in v.items():
            y = value(x)
            if key(k) is _NO or y is _NO:
                return _NO
            out[k] = y
        return out
    return check


def _nested(make: Callable[[dict[str, Any]], Any]) -> Check:
    """An optional nested model given as a mapping."""
    def check(v: Any) -> Any:
        if v is None:
            return None
        if type(v) is not dict:
            return _NO
        got = make(v)
        return _NO if got is None else got
    return check


def _build(cls: type[D], checks: dict[str, Check], raw: dict[str, Any]) -> D | None:
    """A ``cls`` of ``raw`` when every field is certainly valid, else None."""
    values: dict[str, Any] = {}
    for key, value in raw.items():
        check = checks.get(key) if type(key) is str else None
        if check is None:
            return None  # an unknown field (or a key that is not text)
        got = check(value)
        if got is _NO:
            return None
        values[key] = got
    for name in cls._required:
        if name not in values:
            return None
    for name, factory in cls._factories.items():  # each object its own dict or list
        if name not in values:
            values[name] = factory()
    obj = object.__new__(cls)  # the values are checked: no need for __init__'s checks
    obj.__dict__.update(values)
    return obj


def _jsonable(v: Any) -> Any:
    """JSON data with each non-finite float None (pydantic's ``ser_json_inf_nan="null"``)."""
    if type(v) is float:
        return v if v - v == 0.0 else None
    if type(v) is dict:
        return {k: _jsonable(x) for k, x in v.items()}
    if type(v) is list:
        return [_jsonable(x) for x in v]
    return v


class _Data:
    """Shared by the ``*Data`` classes: frozen records with the models' fields.

    Not ``dataclasses``: building five frozen dataclasses cost more at import (~35 M
    instructions) than a small plan's whole check. Fields are the class's annotations,
    in order; a class attribute is a field's default, ``_factories`` makes fresh ones.
    """

    _fields: ClassVar[tuple[str, ...]] = ()
    _required: ClassVar[tuple[str, ...]] = ()
    _factories: ClassVar[dict[str, Callable[[], Any]]] = {}
    _nested_fields: ClassVar[dict[str, type[_Data]]] = {}

    def __init_subclass__(cls) -> None:
        notes = cls.__annotations__  # its own (3.10+), not inspect: no import
        cls._fields = tuple(k for k, v in notes.items() if not str(v).startswith("ClassVar"))
        cls._required = tuple(f for f in cls._fields
                              if f not in cls._factories and not hasattr(cls, f))

    def __init__(self, **values: Any) -> None:
        unknown = set(values).difference(self._fields)
        missing = [f for f in self._required if f not in values]
        if unknown or missing:
            raise TypeError(f"{type(self).__name__}: unknown {sorted(unknown)}, "
                            f"missing {missing}")
        for name, factory in self._factories.items():
            if name not in values:
                values[name] = factory()
        self.__dict__.update(values)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(
            getattr(self, f) == getattr(other, f) for f in self._fields)

    __hash__ = None  # type: ignore[assignment]  # its dicts and lists are not hashable

    def __repr__(self) -> str:
        inner = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields)
        return f"{type(self).__name__}({inner})"

    def model_dump(self, mode: Literal["python", "json"] = "python") -> dict[str, Any]:
        """The fields as a dict, nested models as dicts (what the model's dump gives).

        ``mode="json"``: as pydantic's for JSON data (what the loader gives): a float that
        is not finite (``.inf`` in a schema) becomes None. (pydantic would also turn keys
        that are not text into text; the loader refuses such keys.)
        """
        out: dict[str, Any] = {}
        for name in self._fields:
            v = getattr(self, name)
            if isinstance(v, _Data):
                v = v.model_dump(mode)
            elif mode == "json":
                v = _jsonable(v)
            out[name] = v
        return out

    @classmethod
    def of_model(cls: type[D], model: Any) -> D:
        """The same values as a pydantic model instance of this format."""
        values = {}
        for name in cls._fields:
            v = getattr(model, name)
            sub = cls._nested_fields.get(name)
            values[name] = sub.of_model(v) if sub is not None and v is not None else v
        return cls(**values)


class RetriesData(_Data):
    """``models.Retries`` (``retries`` of a tool or step)."""

    max_attempts: int = 1
    backoff_s: float = 0.0
    on_exit_codes: list[int] | None = None


class FacetsData(_Data):
    """``models.Facets`` (``facets`` of a step)."""

    _factories: ClassVar[dict[str, Callable[[], Any]]] = {
        "paths": dict, "counts": dict, "group_counts": dict}
    paths: dict[str, str]
    counts: dict[str, str]
    group_counts: dict[str, str]
    max_group_keys: int = 25


class StepData(_Data):
    """``models.Step``: one step of a plan (SPEC §3)."""

    _nested_fields: ClassVar[dict[str, type[_Data]]] = {
        "retries": RetriesData, "facets": FacetsData}
    _factories: ClassVar[dict[str, Callable[[], Any]]] = {"arguments": dict, "depends_on": list}
    id: str
    tool: str
    arguments: dict[str, Any]
    depends_on: list[str]
    intent: str | None = None
    for_each: str | list[Any] | None = None
    max_parallel: int | None = None
    max_items: int | None = None
    on_item_error: str | None = None
    timeout: float | None = None
    retries: RetriesData | None = None
    when: str | None = None
    run_if: str | None = None
    approve: str | None = None
    pool: str | None = None
    max_recoveries: int | None = None
    facets: FacetsData | None = None


class HeadData(_Data):
    """``models.PlanHead``: a plan's top-level fields."""

    _factories: ClassVar[dict[str, Callable[[], Any]]] = {"params": dict}
    planrun: int
    name: str | None = None
    revision: int = 1
    goal: str
    params: dict[str, dict[str, Any]]
    max_parallel: int | None = None
    timeout: float | None = None
    steps: list[Any]


class ToolData(_Data):
    """``models.Tool``: one entry of ``tools.yaml`` (SPEC §2)."""

    _nested_fields: ClassVar[dict[str, type[_Data]]] = {"retries": RetriesData}
    description: str | None = None
    command: list[str] | None = None
    python: str | None = None
    arguments: dict[str, Any] | None = None
    accepts: str | None = None
    output: str | None = None
    output_schema: dict[str, Any] | None = None
    irreversible: bool = False
    idempotent: bool = False
    key_arguments: list[str] | None = None
    dedupe: str = "run"
    dedupe_ttl: float | str | None = None
    timeout: float | None = None
    retries: RetriesData | None = None
    cwd: str | None = None
    pool: str | None = None
    approve: str | None = None
    allow_embedded: list[str] | None = None
    allow_option_values: bool | list[str] | None = None
    blocking: bool | None = None


_RETRIES: dict[str, Check] = {
    "max_attempts": _int(1, MAX_ATTEMPTS),
    "backoff_s": _seconds(0, MAX_BACKOFF_S, lo_open=False),
    "on_exit_codes": _ints,
}


def retries_data(raw: dict[str, Any]) -> RetriesData | None:
    """``raw`` as a :class:`RetriesData` when it certainly is a valid ``Retries``."""
    return _build(RetriesData, _RETRIES, raw)


_FACET_TABLE = _names_to(_text(FACET_NAME_PATTERN), _text())
_FACETS: dict[str, Check] = {
    "paths": _FACET_TABLE, "counts": _FACET_TABLE, "group_counts": _FACET_TABLE,
    "max_group_keys": _int(1, MAX_GROUP_KEYS),
}


def facets_data(raw: dict[str, Any]) -> FacetsData | None:
    """``raw`` as a :class:`FacetsData` when it certainly is a valid ``Facets``."""
    return _build(FacetsData, _FACETS, raw)


_POSITIVE = _int(1, MAX_STORED_INT, optional=True)
_TIMEOUT = _seconds(0, MAX_SECONDS, lo_open=True, optional=True)
_OPT_TEXT = _text(optional=True)
_STEP: dict[str, Check] = {
    "id": _text(STEP_ID_PATTERN),
    "tool": _text(min_length=1),
    "arguments": _mapping,
    "depends_on": _TEXTS,
    "intent": _OPT_TEXT,
    "for_each": _for_each,
    "max_parallel": _POSITIVE,
    "max_items": _POSITIVE,
    "on_item_error": _choice(ON_ITEM_ERROR, optional=True),
    "timeout": _TIMEOUT,
    "retries": _nested(retries_data),
    "when": _OPT_TEXT,
    "run_if": _choice(RUN_IF, optional=True),
    "approve": _choice(APPROVE, optional=True),
    "pool": _OPT_TEXT,
    "max_recoveries": _int(0, optional=True),
    "facets": _nested(facets_data),
}
_STEP_KEYS = frozenset(_STEP)
#: the fields most steps have, checked inline (a big plan is mostly these).
_STEP_COMMON = frozenset({"id", "tool", "arguments", "depends_on"})
_STEP_ID = _fullmatch(STEP_ID_PATTERN)


def step_data(raw: dict[str, Any]) -> StepData | None:
    """``raw`` as a :class:`StepData` when it certainly is a valid ``models.Step``, else None.

    What :func:`_build` does with ``_STEP``, with the common fields inline: validation
    of a large plan is a feature (benchmark W6), this runs once per step.
    """
    keys = raw.keys()
    if not keys <= _STEP_KEYS:
        return None
    sid, tool = raw.get("id"), raw.get("tool")
    if type(sid) is not str or type(tool) is not str or not tool or not _STEP_ID(sid):
        return None
    seen = 2
    args = raw.get("arguments", _NO)
    if args is _NO:
        args = {}
    elif type(args) is dict:
        for k in args:
            if type(k) is not str:
                return None
        args = args.copy()
        seen += 1
    else:
        return None
    deps = raw.get("depends_on", _NO)
    if deps is _NO:
        deps = []
    elif type(deps) is list:
        for d in deps:
            if type(d) is not str:
                return None
        deps = deps.copy()
        seen += 1
    else:
        return None
    obj = object.__new__(StepData)  # the values are checked: no need for __init__'s checks
    values = obj.__dict__
    values["id"], values["tool"], values["arguments"], values["depends_on"] = \
        sid, tool, args, deps
    if len(raw) > seen:
        for key in keys - _STEP_COMMON:
            got = _STEP[key](raw[key])
            if got is _NO:
                return None
            values[key] = got
    return obj


def _steps_list(v: Any) -> Any:
    return list(v) if type(v) is list else _NO


_HEAD: dict[str, Check] = {
    "planrun": _int(),
    "name": _text(min_length=1, optional=True),
    "revision": _int(1, MAX_STORED_INT),
    "goal": _text(),
    "params": _names_to(_text(PARAM_NAME_PATTERN), _mapping),
    "max_parallel": _POSITIVE,
    "timeout": _TIMEOUT,
    "steps": _steps_list,
}


def head_data(raw: dict[str, Any]) -> HeadData | None:
    """``raw`` as a :class:`HeadData` when it certainly is a valid ``models.PlanHead``."""
    return _build(HeadData, _HEAD, raw)


_TOOL: dict[str, Check] = {
    "description": _OPT_TEXT,
    "command": _texts(min_length=1, optional=True),
    "python": _text(PYTHON_TARGET_PATTERN, optional=True),
    "arguments": _opt_mapping,
    "accepts": _text(ACCEPTS_PATTERN, optional=True),
    "output": _choice(OUTPUT_MODES, optional=True),
    "output_schema": _opt_mapping,
    "irreversible": _flag,
    "idempotent": _flag,
    "key_arguments": _texts(optional=True),
    "dedupe": _choice(DEDUPE_SCOPES),
    "dedupe_ttl": _ttl,
    "timeout": _TIMEOUT,
    "retries": _nested(retries_data),
    "cwd": _OPT_TEXT,
    "pool": _OPT_TEXT,
    "approve": _choice(APPROVE, optional=True),
    "allow_embedded": _texts(optional=True),
    "allow_option_values": _option_values,
    "blocking": _opt_flag,
}


def tool_data(raw: dict[str, Any]) -> ToolData | None:
    """``raw`` as a :class:`ToolData` when it certainly is a valid ``models.Tool``."""
    return _build(ToolData, _TOOL, raw)
