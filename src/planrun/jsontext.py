"""JSON text: strict numbers, duplicate keys, and where each value starts.

:mod:`planrun.loading` parses JSON with :mod:`json`; this module gives it what :mod:`json`
does not: a hook that records duplicate keys, number parsing that refuses non-finite
values, and :func:`index_json`, a small structural scanner that finds the line and column
of any value (and, for an object member, of its key) only when an issue needs one.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from .issues import Issue
from .pointers import pointer_escape


class NotFinite(ValueError):
    """A JSON number or constant that is not a finite number."""


def reject_constant(name: str) -> Any:
    """``parse_constant`` hook: ``NaN``/``Infinity`` raise :class:`NotFinite`."""
    raise NotFinite(f"{name} is not a number JSON can hold")


def finite_float(text: str) -> float:
    """``parse_float`` hook: a float, or :class:`NotFinite` when it overflows."""
    value = float(text)
    if math.isinf(value) or math.isnan(value):
        raise NotFinite(f"{text} is too large for a number")
    return value


def json_pairs(dups: list[str]) -> Any:
    """An ``object_pairs_hook`` that appends each repeated key to ``dups``."""
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                dups.append(k)
            out[k] = v
        return out

    return hook


#: JSON text with sorted keys and nothing normalised: ``2`` and ``2.0``, ``"é"`` in either
#: Unicode form, stay different texts (a strict contract may tell them apart).
_PLAIN_TEXT = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                               allow_nan=False)
_SCALARS = frozenset({str, int, bool, type(None)})


def _plain(value: Any) -> bool:
    kind = type(value)
    if kind in _SCALARS:
        return True
    if kind is float:
        return math.isfinite(value)
    if kind is dict:
        return all(type(k) is str and _plain(v) for k, v in value.items())
    if kind is list:
        return all(_plain(v) for v in value)
    return False


def plain_json_text(value: Any) -> str | None:
    """The JSON text of ``value`` (keys sorted), or None when it is not plain JSON data.

    Plain JSON data is what :func:`json.loads` gives: ``dict`` with ``str`` keys, ``list``,
    ``str``, ``int``, finite ``float``, ``bool``, ``None``, exactly those types. Anything
    else (a tuple, an ``int`` key, a subclass, a datetime from YAML) is None, because
    :func:`json.dumps` would write it as something it is not (``{1: x}`` as ``{"1": x}``),
    and two values a check tells apart must never share a text (:mod:`planrun.fits`).
    """
    if not _plain(value):
        return None
    return _PLAIN_TEXT.encode(value)


_JSON_WS = re.compile(r"[ \t\n\r]*")
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")


@dataclass(eq=False)
class JsonIndex:
    """Where every value of a JSON text starts (and, for object members, its key).

    Built by a small structural scanner only when an issue needs a position, so JSON
    documents get lines and columns without going through a YAML parser.
    """

    where: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    duplicates: list[tuple[str, int]] = field(default_factory=list)
    not_finite: list[int] = field(default_factory=list)


def index_json(text: str, max_depth: int) -> JsonIndex:
    """Scan ``text`` (valid JSON) for where each value starts; stop at ``max_depth``."""
    from json import decoder

    scanstring: Any = getattr(decoder, "scanstring")  # noqa: B009 - untyped in typeshed
    index = JsonIndex()

    def ws(i: int) -> int:
        m = _JSON_WS.match(text, i)
        return m.end() if m else i

    def value(i: int, ptr: str, key_at: int | None, depth: int) -> int:
        if depth > max_depth:
            raise ValueError("too deep")
        index.where.setdefault(ptr, (i, key_at))
        c = text[i]
        if c in "{[":
            closing = "}" if c == "{" else "]"
            i = ws(i + 1)
            if text[i] == closing:
                return i + 1
            n = 0
            seen: set[str] = set()
            while True:
                if c == "{":
                    k_at = i
                    key, i = scanstring(text, i + 1)
                    sub = f"{ptr}/{pointer_escape(key)}"
                    if key in seen:
                        index.duplicates.append((sub, k_at))
                    seen.add(key)
                    i = ws(ws(i) + 1)  # past ':'
                    i = value(i, sub, k_at, depth + 1)
                else:
                    i = value(i, f"{ptr}/{n}", None, depth + 1)
                    n += 1
                i = ws(i)
                if text[i] == ",":
                    i = ws(i + 1)
                    continue
                return i + 1
        if c == '"':
            return int(scanstring(text, i + 1)[1])
        for word in ("true", "false", "null"):
            if text.startswith(word, i):
                return i + len(word)
        for word in ("NaN", "Infinity", "-Infinity"):
            if text.startswith(word, i):
                index.not_finite.append(i)
                return i + len(word)
        m = _JSON_NUMBER.match(text, i)
        if m is None or m.end() == i:
            raise ValueError(f"unexpected JSON at {i}")
        number = m.group(0)
        if any(ch in number for ch in ".eE") and not math.isfinite(float(number)):
            index.not_finite.append(i)
        return m.end()

    with contextlib.suppress(ValueError, IndexError, RecursionError):
        value(ws(0), "", None, 0)  # on a problem, the index covers what could be scanned
    return index


def line_col(text: str, offset: int) -> tuple[int, int]:
    """1-based (line, column) of character ``offset`` in ``text``.

    Reads the text up to ``offset``: to place many offsets in one text, use :class:`Lines`.
    """
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


class Lines:
    """Where each line of a text starts: (line, column) of an offset in log time.

    :func:`line_col` counts the newlines before the offset each time: placing one issue
    per node of a large document that way is quadratic (20,000 issues in a 1 MB plan
    took 8 s, each issue reading the file up to its node).
    """

    __slots__ = ("_starts",)

    def __init__(self, text: str) -> None:
        starts = [0]
        at = text.find("\n")
        while at >= 0:
            starts.append(at + 1)
            at = text.find("\n", at + 1)
        self._starts = starts

    def at(self, offset: int) -> tuple[int, int]:
        """1-based (line, column) of character ``offset``, as :func:`line_col` gives it."""
        line = bisect.bisect_right(self._starts, offset)
        return line, offset - self._starts[line - 1] + 1


def json_issue(code: str, message: str, text: str, file: str | None, offset: int | None,
                path: str | None = None, lines: Lines | None = None) -> Issue:
    """An issue at character ``offset`` of ``text`` (no position when None)."""
    line = col = None
    if offset is not None:
        line, col = lines.at(offset) if lines is not None else line_col(text, offset)
    return Issue(code=code, message=message, file=file, line=line, column=col, path=path)
