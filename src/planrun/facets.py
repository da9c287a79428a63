"""Facets: small summaries of a step's output, computed when the step succeeds (issue 17).

A step declares them under ``facets``::

    facets:
      paths: {root: "root"}                 # the value a path reaches
      counts: {files: "files[]"}            # how many values a path reaches
      group_counts: {by_ext: "files[].ext"} # how many times each value is reached
      max_group_keys: 25                    # the most keys (values) a facet keeps

**Paths.** A path is segments joined by ``.``: a key of an object (``files``; a number
such as ``0`` is also an index into a list), optionally followed by ``[]``, or ``[]``
alone; ``[]`` flattens a list (its elements, each, go on along the path). The path ``.``
is the output itself. Keys are ``[A-Za-z0-9_-]+``, as in ``{steps.ID.output.PATH}``.
A path *reaches* a list of values: a key that is missing, an index past the end, or a
``[]`` over something that is not a list reaches nothing (no error: a count is 0).

**Values** (JSON, stored in the journal with the step, :func:`compute`):

- ``paths``: a path without ``[]`` on a step without ``for_each``: the value it reaches,
  or ``null``. Otherwise (a ``[]``, or a fan-out): the list of the distinct values it
  reaches (distinct as canonical JSON), in the order first reached, at most
  ``max_group_keys`` of them (the facet is then *cut*: the manifest says so). A value
  whose canonical JSON is longer than :data:`MAX_VALUE_BYTES` (1,024 bytes) is left out
  (a single value is then ``null``), and the facet is cut too.
- ``counts``: how many values the path reaches that are not ``null``.
- ``group_counts``: an object, value → how many times it is reached (``null`` is not
  counted). A string is its own key; any other value is keyed by its canonical JSON
  (``3``, ``true``, ``{"a":1}``). The first ``max_group_keys`` distinct keys are kept in
  the order first reached; every later key's count, and that of a key longer than
  :data:`MAX_VALUE_BYTES`, goes to :data:`OTHER` (``"(other)"``), which comes last.

A fan-out step's facets are computed over its items' outputs (each item's output is
where the paths start; items that failed are left out): counts are summed, group counts
merged, path values gathered as distinct values. Facets are computed on the stored
(reference) form of an output: a secret's value is never in them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .canonical import canonical_json

#: Facet kinds, as written under ``facets``.
KINDS = ("paths", "counts", "group_counts")
#: The group key that holds the counts of every key past ``max_group_keys``.
OTHER = "(other)"
#: The largest value a ``paths`` facet keeps, and the longest ``group_counts`` key: bytes
#: of canonical JSON (UTF-8). A facet is a small summary, never a copy of the output.
MAX_VALUE_BYTES = 1024


def _fits(key: str) -> bool:
    """Whether canonical JSON (or a group key) ``key`` is at most MAX_VALUE_BYTES long."""
    return len(key) <= MAX_VALUE_BYTES // 4 or len(key.encode("utf-8")) <= MAX_VALUE_BYTES
#: ``max_group_keys`` when a step does not say.
DEFAULT_MAX_KEYS = 25
#: The largest ``max_group_keys`` accepted.
MAX_KEYS_LIMIT = 1000
#: A facet name: a CEL identifier, so that ``steps.ID.facets.NAME`` reads it.
NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"

_KEY = r"[A-Za-z0-9_-]+"
_SEGMENT = re.compile(rf"^(?:({_KEY})((?:\[\])*)|((?:\[\])+))$")

#: One step of a path: ("key", NAME) or ("flat", "").
Token = tuple[str, str]


class PathError(ValueError):
    """A facet path that is not well formed."""


def parse_path(text: str) -> tuple[Token, ...]:
    """The tokens of a facet path (``files[].ext`` → key files, flat, key ext).

    ``.`` is the output itself (no token).

    Raises:
        PathError: the path is not well formed (the message says why).
    """
    if text == ".":
        return ()
    if not text:
        raise PathError("a path cannot be empty (the output itself is '.')")
    tokens: list[Token] = []
    for part in text.split("."):
        m = _SEGMENT.match(part)
        if m is None:
            shown = repr(part) if part else "an empty segment"
            raise PathError(f"{shown} is not a path segment; a segment is a key "
                            "(letters, digits, _ or -), optionally followed by [], or []")
        key, flats = m.group(1), m.group(2) or m.group(3) or ""
        if key is not None:
            tokens.append(("key", key))
        tokens.extend(("flat", "") for _ in range(len(flats) // 2))
    return tuple(tokens)


def reach(value: Any, tokens: tuple[Token, ...]) -> list[Any]:
    """The values ``tokens`` reach from ``value`` (nothing reached: ``[]``)."""
    found = [value]
    for kind, key in tokens:
        nxt: list[Any] = []
        for v in found:
            if kind == "flat":
                if isinstance(v, list):
                    nxt.extend(v)
            elif isinstance(v, dict):
                if key in v:
                    nxt.append(v[key])
            elif isinstance(v, list) and key.isdigit() and int(key) < len(v):
                nxt.append(v[int(key)])
        found = nxt
        if not found:
            break
    return found


def group_key(value: Any) -> str:
    """The key a value counts under in a group count: a string itself, else its JSON."""
    return value if isinstance(value, str) else canonical_json(value)


@dataclass(frozen=True)
class Facet:
    """One declared facet: its name, kind, path (as written) and tokens."""

    name: str
    kind: str
    path: str
    tokens: tuple[Token, ...]

    @property
    def flattens(self) -> bool:
        """Whether the path holds a ``[]``."""
        return any(kind == "flat" for kind, _ in self.tokens)


@dataclass(frozen=True)
class FacetSpec:
    """A step's declared facets (``facets`` of the plan, checked at validation)."""

    facets: tuple[Facet, ...]
    max_keys: int = DEFAULT_MAX_KEYS

    @property
    def names(self) -> tuple[str, ...]:
        """The facet names, in declaration order (paths, counts, group_counts)."""
        return tuple(f.name for f in self.facets)


def spec_of(raw: Any) -> FacetSpec | None:
    """The facets a step's ``facets`` field declares, or None (no field, or malformed).

    Validation refuses a malformed field before anything runs, so a running step's spec is
    always whole; a path that does not parse is left out here.
    """
    if not isinstance(raw, dict):
        return None
    found: list[Facet] = []
    for kind in KINDS:
        table = raw.get(kind)
        if not isinstance(table, dict):
            continue
        for name, path in table.items():
            if not isinstance(path, str):
                continue
            try:
                tokens = parse_path(path)
            except PathError:
                continue
            found.append(Facet(str(name), kind, path, tokens))
    limit = raw.get("max_group_keys", DEFAULT_MAX_KEYS)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        limit = DEFAULT_MAX_KEYS
    return FacetSpec(tuple(found), limit)


class Folder:
    """Facets computed one output at a time (a fan-out's items stream through it).

    ``fanout``: the outputs are a fan-out's item outputs (``paths`` facets become lists of
    distinct values).
    """

    def __init__(self, spec: FacetSpec, *, fanout: bool) -> None:
        self.spec, self.fanout = spec, fanout
        self.counts: dict[str, int] = {}
        self.groups: dict[str, dict[str, int]] = {}
        self.other: dict[str, int] = {}
        self.seen: dict[str, dict[str, Any]] = {}
        self.single: dict[str, Any] = {}
        self.cut: set[str] = set()

    def add(self, output: Any) -> None:
        """Fold one output (a step's, or one item's) into the facets."""
        limit = self.spec.max_keys
        for f in self.spec.facets:
            values = reach(output, f.tokens)
            if f.kind == "counts":
                self.counts[f.name] = self.counts.get(f.name, 0) + sum(
                    1 for v in values if v is not None)
            elif f.kind == "group_counts":
                groups = self.groups.setdefault(f.name, {})
                for v in values:
                    if v is None:
                        continue
                    key = group_key(v)
                    if key in groups:
                        groups[key] += 1
                    elif len(groups) < limit and key != OTHER and _fits(key):
                        groups[key] = 1
                    else:
                        self.other[f.name] = self.other.get(f.name, 0) + 1
            elif not self.fanout and not f.flattens:
                value = values[0] if values else None
                if value is not None and not isinstance(value, bool | int | float) \
                        and not _fits(canonical_json(value)):
                    self.cut.add(f.name)
                    value = None
                self.single[f.name] = value
            else:
                seen = self.seen.setdefault(f.name, {})
                for v in values:
                    key = canonical_json(v)
                    if key in seen:
                        continue
                    if len(seen) >= limit or not _fits(key):
                        self.cut.add(f.name)
                        continue
                    seen[key] = v

    def result(self) -> dict[str, Any]:
        """``{"values": {NAME: value}, "cut": [NAME, …]}`` as the journal stores it.

        ``cut`` names the ``paths`` facets that reached more distinct values than
        ``max_group_keys`` (only the first ones are kept) or a value longer than
        :data:`MAX_VALUE_BYTES` (left out; a single value is then ``null``).
        """
        values: dict[str, Any] = {}
        for f in self.spec.facets:
            if f.kind == "counts":
                values[f.name] = self.counts.get(f.name, 0)
            elif f.kind == "group_counts":
                groups = dict(self.groups.get(f.name, {}))
                if self.other.get(f.name):
                    groups[OTHER] = self.other[f.name]
                values[f.name] = groups
            elif not self.fanout and not f.flattens:
                values[f.name] = self.single.get(f.name)
            else:
                values[f.name] = list(self.seen.get(f.name, {}).values())
        return {"values": values, "cut": sorted(self.cut)}


def compute(spec: FacetSpec, outputs: Iterable[Any], *, fanout: bool) -> dict[str, Any]:
    """The facets of a step's output (``fanout``: of its items' outputs); see :class:`Folder`."""
    folder = Folder(spec, fanout=fanout)
    for out in outputs:
        folder.add(out)
    return folder.result()


def of_output(raw: Any, output: Any) -> dict[str, Any] | None:
    """The stored facets of a step (no ``for_each``) whose ``facets`` field is ``raw``.

    None when the step declares no facets.
    """
    spec = spec_of(raw)
    if spec is None or not spec.facets:
        return None
    return compute(spec, [output], fanout=False)


def _types(schema: dict[str, Any]) -> set[str] | None:
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list) and all(isinstance(k, str) for k in kind):
        return set(kind)
    return None


def schema_problem(tokens: tuple[Token, ...], schema: Any) -> str | None:
    """Why a path can never reach anything in outputs of ``schema``, or None.

    The check of references (``{steps.ID.output.PATH}``) against ``output_schema``: a key
    an object with ``additionalProperties: false`` does not declare, and also a ``[]``
    over a value whose declared ``type`` is not ``array``. Stops (None) where the schema
    says no more.
    """
    walked: list[str] = []
    for kind, key in tokens:
        if not isinstance(schema, dict):
            return None
        types = _types(schema)
        at = ".".join(walked) or "the output"
        if kind == "flat":
            if types is not None and "array" not in types:
                return f"{at} is declared {'/'.join(sorted(types))}, not an array, so [] " \
                       "reaches nothing"
            items = schema.get("items")
            schema = items if isinstance(items, dict) else None
            walked[-1:] = [f"{walked[-1]}[]" if walked else "[]"]
            continue
        props = schema.get("properties")
        walked.append(key)
        if isinstance(props, dict) and key in props:
            schema = props[key]
            continue
        if "items" in schema and key.isdigit():
            schema = schema["items"]
            continue
        if types is not None and not types & {"object", "array"}:
            return (f"{at} is declared {'/'.join(sorted(types))}, so it has no "
                    f"{key!r}")
        if schema.get("additionalProperties") is False and isinstance(props, dict):
            return (f"{at} has no {key!r} (the output_schema declares "
                    f"{', '.join(props) or 'nothing'})")
        return None
    return None
