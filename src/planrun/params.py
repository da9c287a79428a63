"""Placeholder grammar and substitution (SPEC §3 "Placeholders"). Pure functions.

Grammar, inside any string of a step's ``arguments`` or ``for_each``:

* ``{params.NAME}`` (also spelt ``<params.NAME>``) — load time, a declared parameter;
* ``{steps.ID.output}``, ``{steps.ID.output.a.b.0}`` — run time, an ancestor's output;
* ``{item}``, ``{item.a.b}``, ``{index}`` — run time, inside a ``for_each`` step;
* ``{{`` and ``}}`` — literal braces;
* ``{word}`` or any ``{...}`` that does not look like a dotted name — literal text;
* any other ``{root.something}`` — a ``placeholder`` error (almost always a typo).

A string that is exactly one placeholder becomes the value with its own type; a
placeholder inside a longer string is rendered as text (numbers and booleans in their JSON
spelling); an object or array there is an error. Parameters are substituted once, at load
time; what remains is a :class:`Template` resolved when its step runs.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .pointers import leaves, pointer_escape

_NAME = r"[A-Za-z_][A-Za-z0-9_-]*"
_SEG = r"[A-Za-z0-9_-]+"
_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|<(params\.[^<>]*)>")
_DOTTED = re.compile(rf"^{_NAME}(?:\.{_SEG})*$")
_PARAM_NAME = re.compile(rf"^{_NAME}$")
ROOTS = ("params", "steps", "item", "index")


@dataclass(frozen=True, slots=True)
class ParamRef:
    """``{params.NAME}``."""

    name: str

    def source(self) -> str:
        """The placeholder as written with braces."""
        return "{params." + self.name + "}"


@dataclass(frozen=True, slots=True)
class StepRef:
    """``{steps.ID.output[.path...]}``; ``path`` holds the tokens after ``output``."""

    step: str
    path: tuple[str, ...] = ()

    def source(self) -> str:
        """The placeholder as written."""
        return "{" + ".".join(("steps", self.step, "output", *self.path)) + "}"


@dataclass(frozen=True, slots=True)
class ItemRef:
    """``{item[.path...]}``."""

    path: tuple[str, ...] = ()

    def source(self) -> str:
        """The placeholder as written."""
        return "{" + ".".join(("item", *self.path)) + "}"


@dataclass(frozen=True, slots=True)
class IndexRef:
    """``{index}``."""

    def source(self) -> str:
        """The placeholder as written."""
        return "{index}"


Ref = ParamRef | StepRef | ItemRef | IndexRef
Segment = str | Ref


class PlaceholderError(ValueError):
    """A malformed placeholder or unknown root (issue code ``placeholder``)."""


def _ref(inner: str) -> Ref | None:
    """The reference for ``{inner}``; None when it is literal text; raise if malformed."""
    root, _, rest = inner.partition(".")
    if root not in ROOTS:
        if _DOTTED.match(inner) and "." in inner:
            raise PlaceholderError(
                f"{{{inner}}} has unknown root {root!r}; placeholders start with "
                "params., steps., item or index (write {{ and }} for literal braces)")
        return None
    if not _DOTTED.match(inner):
        raise PlaceholderError(f"malformed placeholder {{{inner}}}")
    parts = rest.split(".") if rest else []
    if root == "params":
        if len(parts) != 1:
            raise PlaceholderError(
                f"{{{inner}}}: a parameter placeholder is {{params.NAME}}, one name")
        return ParamRef(parts[0])
    if root == "steps":
        if len(parts) < 2 or parts[1] != "output":
            raise PlaceholderError(
                f"{{{inner}}}: a step placeholder is {{steps.ID.output}} or "
                "{steps.ID.output.PATH}")
        return StepRef(parts[0], tuple(parts[2:]))
    if root == "item":
        return ItemRef(tuple(parts))
    if parts:
        raise PlaceholderError(f"{{{inner}}}: {{index}} has no fields")
    return IndexRef()


@lru_cache(maxsize=65536)
def parse(text: str) -> tuple[Segment, ...]:
    """Split ``text`` into literal strings and references, braces unescaped.

    Adjacent literal pieces are merged, so a string with no placeholder parses to a
    one-element tuple holding the unescaped string (or an empty tuple for "").

    Raises:
        PlaceholderError: a malformed placeholder or unknown root (code ``placeholder``).
    """
    if "{" not in text and "}" not in text and "<params." not in text:
        return (text,) if text else ()
    out: list[Segment] = []
    buf: list[str] = []
    pos = 0
    for m in _TOKEN.finditer(text):
        buf.append(text[pos:m.start()])
        pos = m.end()
        tok = m.group(0)
        if tok == "{{":
            buf.append("{")
            continue
        if tok == "}}":
            buf.append("}")
            continue
        if m.group(2) is not None:  # <params.NAME>
            name = m.group(2)[len("params."):]
            if not _PARAM_NAME.match(name):
                raise PlaceholderError(f"malformed placeholder <{m.group(2)}>")
            ref: Ref | None = ParamRef(name)
        else:
            ref = _ref(m.group(1))
        if ref is None:
            buf.append(tok)
            continue
        if buf:
            lit = "".join(buf)
            if lit:
                out.append(lit)
            buf = []
        out.append(ref)
    buf.append(text[pos:])
    lit = "".join(buf)
    if lit:
        out.append(lit)
    return tuple(out)


def escape(text: str) -> str:
    """Literal text as a template: braces doubled."""
    return text.replace("{", "{{").replace("}", "}}")


@dataclass(frozen=True, slots=True)
class Template:
    """A string that still holds run-time references after parameters were substituted."""

    segments: tuple[Segment, ...]

    def source(self) -> str:
        """The template as it would be written (placeholders in braces, braces escaped)."""
        return "".join(escape(s) if isinstance(s, str) else s.source() for s in self.segments)

    @property
    def exact(self) -> Ref | None:
        """The reference when the whole string is exactly one placeholder."""
        if len(self.segments) == 1 and not isinstance(self.segments[0], str):
            return self.segments[0]
        return None

    def refs(self) -> Iterator[Ref]:
        """The references, in order."""
        for s in self.segments:
            if not isinstance(s, str):
                yield s


class _Unknown:
    """A parameter value not given (``validate`` without ``-p``): checks that need it skip."""

    _instance: _Unknown | None = None

    def __new__(cls) -> _Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Any = _Unknown()


def render(value: Any) -> str:
    """A scalar as text inside a longer string: strings as-is, others in JSON spelling.

    Raises:
        TypeError: for an object or array (it has no single text form).
    """
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        raise TypeError("an object or array cannot be embedded in text")
    return json.dumps(value)


def walk_strings(value: Any, ptr: str = "") -> Iterator[tuple[str, str]]:
    """Every string in a JSON value with its JSON Pointer (object keys are not visited)."""
    return ((p, v) for p, v in leaves(value, ptr) if isinstance(v, str))


#: Characters of values (as compact JSON) that placeholders may place into a plan's steps at
#: load time (every
#: ``{params.X}`` counted once per place), and into one step's (or fan-out item's)
#: arguments at run time: 64 MiB, a tool's output bound. A few placeholders of a long
#: value, or many of a short one, would otherwise build gigabytes from a small plan (the
#: sibling of YAML aliases, which are bounded as well).
MAX_PLACED_BYTES = 64 * 1024 * 1024


#: Compact JSON, characters as they are (what :func:`json_size` measures with).
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def json_size(value: Any, memo: dict[int, int] | None = None) -> int:
    """About how many characters ``value`` takes as compact JSON.

    A string counts its length and two quotes (escapes not counted), a number its JSON
    spelling; a list or object is written once by the C encoder and measured (3-6 times
    faster than walking it here; the values measured come from parsed JSON, which holds
    no value twice, so the text is at most what the value is). ``memo`` (id → size) sizes
    a list or object met again (one value placed in many places) once; it must not
    outlive the values it holds ids of.
    """
    if isinstance(value, str):
        return len(value) + 2
    if isinstance(value, dict | list):
        memo = {} if memo is None else memo
        known = memo.get(id(value))
        if known is None:
            try:
                known = len(_COMPACT.encode(value))
            except (TypeError, ValueError, RecursionError):  # not JSON data: walk it
                known = _walk_size(value)
            memo[id(value)] = known
        return known
    return _walk_size(value)


def _walk_size(value: Any) -> int:
    """:func:`json_size` by a walk (iterative: any depth) of what the encoder refused."""
    total = 0
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v) + 2
        elif isinstance(v, dict):
            total += 2 + max(len(v) - 1, 0) + len(v)  # braces, commas, colons
            stack.extend(v)
            stack.extend(v.values())
        elif isinstance(v, list | tuple):
            total += 2 + max(len(v) - 1, 0)
            stack.extend(v)
        elif v is None or isinstance(v, bool):
            total += 4 if v is not False else 5
        elif isinstance(v, int):
            total += (v.bit_length() * 1233 >> 12) + 2  # digits (log10 2 ~ 1233/4096), sign
        else:
            total += len(repr(v))
    return total


class Placed:
    """What placeholders placed so far against :data:`MAX_PLACED_BYTES` (a budget).

    Counted in characters (:func:`json_size`; a string placed in text by its length).

    One per plan check (load time), or per call's arguments or ``for_each`` resolved (run
    time); ``what`` says what holds the values, for the message. ``add`` counts a value
    each time it is placed; a value met again is sized once (:func:`json_size`).
    """

    __slots__ = ("_memo", "bound", "over", "used", "what")

    def __init__(self, what: str, bound: int = MAX_PLACED_BYTES) -> None:
        self.what = what
        self.bound = bound
        self.used = 0
        self.over = False
        self._memo: dict[int, int] = {}

    def add(self, value: Any) -> bool:
        """Count ``value`` placed once more; False once the total is past the bound."""
        if isinstance(value, str):
            self.used += len(value)
        else:
            self.used += json_size(value, self._memo)
        if self.used > self.bound:
            self.over = True
        return not self.over

    def message(self) -> str:
        """What went past the bound (``what``: "the plan's steps hold", say)."""
        return (f"{self.what} more than {self.bound:,} characters (64 Mi) of values once their "
                "placeholders are replaced (a long value placed, or one placed many "
                "times): pass a file's path instead")


@dataclass(frozen=True, slots=True)
class Problem:
    """A substitution problem at a JSON Pointer: ``code`` is an issue code of SPEC §4."""

    path: str
    code: str
    message: str


def substitute(value: Any, params: dict[str, Any], ptr: str = "",
               problems: list[Problem] | None = None, placed: Placed | None = None) -> Any:
    """Replace ``{params.X}`` in every string of ``value`` (load time).

    Args:
        value: a JSON value (a step's ``arguments`` or ``for_each``).
        params: parameter values; a missing name or :data:`UNKNOWN` value yields UNKNOWN
            for exact leaves (the check needing it is skipped).
        ptr: the JSON Pointer of ``value`` (for problems).
        problems: list receiving :class:`Problem` entries (``placeholder``, ``param_type``,
            ``too_large``).
        placed: the plan's budget of placed values (:class:`Placed`, shared by its steps):
            past it, one ``too_large`` problem, and every value placed after is UNKNOWN
            (nothing long is built). None: no bound.

    Returns:
        The value with parameters substituted: strings holding run-time references become
        :class:`Template`; an embedded parameter whose value is unknown makes the string
        a :class:`Template` too (with the parameter reference kept).
    """
    if problems is None:
        problems = []
    if isinstance(value, str):
        try:
            segs = parse(value)
        except PlaceholderError as exc:
            problems.append(Problem(ptr, "placeholder", str(exc)))
            return UNKNOWN
        if not segs:
            return ""
        if len(segs) == 1 and isinstance(segs[0], str):
            return segs[0]
        if len(segs) == 1 and isinstance(segs[0], ParamRef):
            v = params.get(segs[0].name, UNKNOWN)
            if placed is not None and v is not UNKNOWN and not _place(placed, v, ptr,
                                                                     problems):
                return UNKNOWN
            return v
        out: list[Segment] = []
        text: list[str] = []  # the text since the last reference, joined once (not += )
        for s in segs:
            if isinstance(s, ParamRef):
                v = params.get(s.name, UNKNOWN)
                if v is UNKNOWN:
                    if text:
                        out.append("".join(text))
                        text = []
                    out.append(s)
                    continue
                ref_name = s.name
                try:
                    rendered = render(v)
                except TypeError:
                    problems.append(Problem(
                        ptr, "param_type",
                        f"parameter {ref_name!r} is an object or array and cannot be embedded "
                        "in text; use it as the whole value"))
                    return UNKNOWN
                if placed is not None and not _place(placed, rendered, ptr, problems):
                    return UNKNOWN
                text.append(rendered)
            elif isinstance(s, str):
                text.append(s)
            else:
                if text:
                    out.append("".join(text))
                    text = []
                out.append(s)
        if text:
            out.append("".join(text))
        if len(out) == 1 and isinstance(out[0], str):
            return out[0]
        return Template(tuple(out))
    if isinstance(value, dict):
        return {k: substitute(v, params, f"{ptr}/{pointer_escape(k)}",
                              problems, placed) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, params, f"{ptr}/{i}", problems, placed)
                for i, v in enumerate(value)]
    return value


def _place(placed: Placed, value: Any, ptr: str, problems: list[Problem]) -> bool:
    """Count ``value`` placed at ``ptr``; the first time past the bound, a problem."""
    if placed.over:
        return False
    if placed.add(value):
        return True
    problems.append(Problem(ptr, "too_large", placed.message()))
    return False


class ResolveError(LookupError):
    """A run-time reference could not be resolved (code ``reference``)."""

    code = "reference"


class PlacedTooLarge(ResolveError):
    """The values placed into one step's arguments went past :data:`MAX_PLACED_BYTES`."""

    code = "arguments"


def dig(value: Any, path: tuple[str, ...], what: str) -> Any:
    """Follow ``path`` into ``value`` (object keys, list indices).

    Raises:
        ResolveError: when a token does not exist.
    """
    for i, tok in enumerate(path):
        if isinstance(value, dict) and tok in value:
            value = value[tok]
        elif isinstance(value, list) and tok.isdigit() and int(tok) < len(value):
            value = value[int(tok)]
        else:
            at = ".".join((what, *path[:i])) if i else what
            raise ResolveError(f"{at} has no {tok!r}")
    return value


def resolve(value: Any, lookup: Callable[[Ref], Any], placed: Placed | None = None) -> Any:
    """Resolve the :class:`Template` values inside ``value`` (run time).

    ``lookup`` maps a reference to its value (raising :class:`ResolveError`). Exact leaves
    keep native types; embedded references render as text. ``placed``: the budget of
    values placed into this one call's arguments (:class:`Placed`), or None (no bound).

    Raises:
        ResolveError: a missing path, or an object/array embedded in text.
        PlacedTooLarge: the values placed went past ``placed``'s bound (code
            ``arguments``); nothing long was built.
    """
    if isinstance(value, Template):
        exact = value.exact
        if exact is not None:
            return _placed(placed, lookup(exact))
        parts: list[str] = []
        for s in value.segments:
            if isinstance(s, str):
                parts.append(s)
                continue
            try:
                parts.append(_placed(placed, render(lookup(s))))
            except TypeError:
                raise ResolveError(
                    f"{s.source()} is an object or array and cannot be embedded in text"
                ) from None
        return "".join(parts)
    if isinstance(value, dict):
        return {k: resolve(v, lookup, placed) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, lookup, placed) for v in value]
    return value


def _placed(placed: Placed | None, value: Any) -> Any:
    """``value``, counted in ``placed``; :class:`PlacedTooLarge` past its bound."""
    if placed is not None and not placed.add(value):
        raise PlacedTooLarge(placed.message())
    return value


def has_templates(value: Any) -> bool:
    """True when ``value`` holds a :class:`Template` or :data:`UNKNOWN` anywhere."""
    if isinstance(value, Template) or value is UNKNOWN:
        return True
    if isinstance(value, dict):
        return any(has_templates(v) for v in value.values())
    if isinstance(value, list):
        return any(has_templates(v) for v in value)
    return False


def as_written(value: Any) -> Any:
    """``value`` with templates shown as their source text (for display and digests)."""
    if isinstance(value, Template):
        return value.source()
    if value is UNKNOWN:
        return "<unknown>"
    if isinstance(value, dict):
        return {k: as_written(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_written(v) for v in value]
    return value


def shown_as_written(value: Any, written: Any) -> Any:
    """``value`` as :func:`as_written` shows it, or ``written`` when a parameter is unknown.

    ``written`` is the plan's own text: ``planrun show`` of a plan whose list parameter is
    not given printed ``fan-out over "<unknown>"`` for ``{params.sites}``.
    """
    stack = [value]
    while stack:
        v = stack.pop()
        if v is UNKNOWN:
            return written
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return as_written(value)


def references(value: Any) -> Iterator[tuple[str, Ref]]:
    """(JSON Pointer, reference) for every placeholder in the strings of ``value``.

    Malformed placeholders are skipped here (``substitute`` reports them).
    """
    for ptr, s in walk_strings(value):
        try:
            segs = parse(s)
        except PlaceholderError:
            continue
        for seg in segs:
            if not isinstance(seg, str):
                yield ptr, seg


_INTEGER = re.compile(r"[-+]?[0-9]+")
_DECIMAL = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
#: Python prints integers of at most this many digits (``sys.get_int_max_str_digits``).
_MAX_DIGITS = 4300


def _clip(raw: str) -> str:
    return repr(raw if len(raw) <= 60 else raw[:57] + "...")


def parse_cli_value(raw: str, schema: Any) -> Any:
    """A ``-p NAME=VALUE`` value parsed by the parameter's declared type (SPEC §3).

    integer → int, number → int or float, boolean → ``true``/``false`` only, array/object
    → JSON, string (or no declared type) → the text as-is. A list of types tries each in
    order, string last.

    Raises:
        ValueError: the text does not parse as the declared type (code ``param_type``).
    """
    declared = schema.get("type") if isinstance(schema, dict) else None
    types = declared if isinstance(declared, list) else [declared]
    errors: list[str] = []
    for t in sorted(types, key=lambda t: t == "string" or t is None):
        if t in (None, "string"):
            return raw
        if t in ("integer", "number") and _INTEGER.fullmatch(raw):
            if len(raw.lstrip("+-")) > _MAX_DIGITS:
                raise ValueError(f"{_clip(raw)} has more than {_MAX_DIGITS:,} digits, more "
                                 "than an integer planrun can print")
            return int(raw)
        if t == "integer":
            errors.append("an integer")
        elif t == "number":
            # one way to read each text (no nested repetition): linear time on any input
            if _DECIMAL.fullmatch(raw):
                number = float(raw)
                if math.isfinite(number):
                    return number
            errors.append("a finite number")
        elif t == "boolean":
            if raw in ("true", "false"):
                return raw == "true"
            errors.append("true or false")
        elif t == "null":
            if raw == "null":
                return None
            errors.append("null")
        elif t in ("array", "object"):
            from .loading import DocumentError, parse_text

            try:  # the rules of a JSON file: finite numbers, bounded depth, text, no dup keys
                v = parse_text(raw, kind="json").data
            except DocumentError as exc:
                errors.append(f"a JSON {t} ({exc.issues[0].message})")
                continue
            if isinstance(v, list if t == "array" else dict):
                return v
            errors.append(f"a JSON {t}")
        else:
            errors.append(str(t))
    raise ValueError(f"{_clip(raw)} is not {' or '.join(errors)}")
