"""Bounds on the work of checking a value against a JSON Schema from a user (SPEC §4).

A parameter's schema, a tool's ``arguments`` and ``output_schema``, a grant's
``arguments`` and the plans a planner answers with are hostile data. Checking a value
against one of them must end quickly and must never raise; this module holds what makes
sure of it, for every validator planrun builds (:func:`planrun.registry.strict_validator`
and the metaschema check of :func:`planrun.registry.schema_problems`):

* :func:`expanded_size` — a static bound, checked before a schema is ever used: the number
  of subschemas one check can apply, with each ``$ref``/``$dynamicRef`` target counted once
  per reference path that reaches it (``allOf: [{$ref: next}, {$ref: next}]`` twenty-four
  levels deep is 2^24 subschemas in 1.8 KB of text). Counted with memoization, so the count
  itself is linear in the schema. A reference back into a schema it is inside (recursion,
  e.g. a tree's ``children: {items: {$ref: "#"}}``) counts as one subschema: each such
  step goes one level into the value (:func:`planrun.registry._ref_loops` refuses those
  that do not), so a recursive schema costs work in proportion to the value it checks.
  A schema over :data:`MAX_SCHEMA_SIZE` is refused.
* :data:`REFERENCE_BUDGET` — a bound at validation time for what the static count cannot
  see: recursion that fans out at the *same* place of the value (``properties: {c:
  {allOf: [{$ref: "#"}, {$ref: "#"}]}}`` applies the root 2^k times to a value k levels
  deep). One check may apply at most ``REFERENCE_BUDGET`` references plus
  :data:`REFERENCES_PER_NODE` per node of the value; beyond, the value is refused with a
  message (never a hang).
* ``uniqueItems`` in linear time (:func:`unique`), ``multipleOf`` exact on the JSON
  numbers (:func:`multiple_of`), and :class:`Guarded`: any exception inside jsonschema
  (an overflow, a format checker's error, a recursion limit) becomes a violation of the
  value, never a traceback or an ``internal`` step failure.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

#: The most subschemas one check of a value may apply, references expanded (see above).
MAX_SCHEMA_SIZE = 10_000

#: The deepest a schema may nest (objects and arrays, data keywords such as ``const`` not
#: entered): jsonschema checks a schema against the metaschema by recursion, which a
#: schema nested ~150 levels deep exhausted (a RecursionError traceback).
MAX_SCHEMA_DEPTH = 64

#: References (``$ref``/``$dynamicRef``) one check of a value may apply, whatever its size…
REFERENCE_BUDGET = 10_000
#: …plus this many per node (object, array or scalar) of the value checked.
REFERENCES_PER_NODE = 2


# --- the static bound -------------------------------------------------------------------

#: Keywords whose value is a subschema (applied to the instance or to a part of it).
_ONE = ("not", "if", "then", "else", "items", "additionalProperties", "contains",
        "propertyNames", "unevaluatedItems", "unevaluatedProperties", "additionalItems",
        "contentSchema")
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")
_MAP = ("properties", "patternProperties", "dependentSchemas")


def _children(node: dict[str, Any]) -> Iterator[Any]:
    for kw in _ONE:
        if kw in node:
            yield node[kw]
    for kw in _LIST:
        if isinstance(node.get(kw), list):
            yield from node[kw]
    for kw in _MAP:
        if isinstance(node.get(kw), dict):
            yield from node[kw].values()


def expanded_size(schema: Any, targets: dict[int, list[Any]], cap: int = MAX_SCHEMA_SIZE
                  ) -> tuple[int, int | None]:
    """(subschemas one check may apply, ``id`` of the first subschema found over ``cap``).

    ``targets`` maps ``id(node)`` of each subschema holding references to the subschemas
    they resolve to. Each reference target is counted once per reference path (memoized:
    linear work); a reference to a subschema on the current path (recursion) counts one.
    Counts stop growing past ``cap + 1``. The second value is the innermost subschema whose
    count is over ``cap`` (None when the whole is within it).
    """
    size: dict[int, int] = {}
    on_path: set[int] = set()
    over: int | None = None
    # iterative post-order: (node, its successors, index of the next one, sum so far)
    stack: list[list[Any]] = []

    def push(node: Any) -> None:
        succ = list(_children(node)) + targets.get(id(node), [])
        on_path.add(id(node))
        stack.append([node, succ, 0, 1])

    if not isinstance(schema, dict):
        return 1, None
    push(schema)
    while stack:
        frame = stack[-1]
        node, succ, i, total = frame
        if i < len(succ):
            frame[2] = i + 1
            child = succ[i]
            if not isinstance(child, dict) or id(child) in on_path:
                frame[3] = min(total + 1, cap + 1)
            elif id(child) in size:
                frame[3] = min(total + size[id(child)], cap + 1)
            else:
                push(child)
            continue
        stack.pop()
        on_path.discard(id(node))
        size[id(node)] = total
        if total > cap and over is None:
            over = id(node)
        if stack:
            stack[-1][3] = min(stack[-1][3] + total, cap + 1)
    return size[id(schema)], over


def too_deep(schema: Any) -> str | None:
    """The JSON Pointer of a place in ``schema`` nested over :data:`MAX_SCHEMA_DEPTH`, or None.

    Data keywords (``const``, ``enum``, ``default``, ``examples``) are not entered.
    """
    from .pointers import pointer_escape

    stack: list[tuple[Any, str, int]] = [(schema, "", 0)]
    while stack:
        node, ptr, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            return ptr
        if isinstance(node, dict):
            stack.extend((v, f"{ptr}/{pointer_escape(k)}", depth + 1) for k, v in node.items()
                         if k not in ("const", "enum", "default", "examples"))
        elif isinstance(node, list):
            stack.extend((v, f"{ptr}/{i}", depth + 1) for i, v in enumerate(node))
    return None


# --- keywords replacing jsonschema's ----------------------------------------------------


def canonical(value: Any) -> Any:
    """A hashable form of JSON data with JSON Schema's equality (``uniqueItems``, ``enum``).

    ``1 == 1.0``; ``true`` is not ``1`` nor ``false`` ``0``; object key order does not
    count; arrays and objects compare element by element.
    """
    if value is True or value is False:
        return ("b", value)
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, list | tuple):
        return ("a", tuple(canonical(v) for v in value))
    if isinstance(value, dict):
        return ("o", frozenset((k, canonical(v)) for k, v in value.items()))
    if isinstance(value, int | float):
        return ("n", value)  # Python's int/float equality and hash are exact: 1 == 1.0
    return ("?", value)


def duplicate(items: Any) -> tuple[int, int] | None:
    """The indexes of the first two equal elements of ``items`` as JSON values, or None.

    Linear time (jsonschema compares unhashable elements pairwise: 8,000 objects took
    over two minutes).
    """
    seen: dict[Any, int] = {}
    for i, item in enumerate(items):
        first = seen.setdefault(canonical(item), i)
        if first != i:
            return first, i
    return None


def unique(items: Any) -> bool:
    """Whether no two elements of ``items`` are equal as JSON values (linear time)."""
    return duplicate(items) is None


def _unique_items(validator: Any, ui: Any, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if ui and validator.is_type(instance, "array"):
        pair = duplicate(instance)
        if pair is not None:
            yield ValidationError(f"has non-unique elements: items {pair[0]} and {pair[1]} "
                                  "are equal")


def _exact(number: Any) -> Any:
    """The JSON number as a ``Fraction`` (a float as the decimal it is written as), or None."""
    import math
    from decimal import Decimal
    from fractions import Fraction

    if isinstance(number, int):
        return Fraction(number)
    if isinstance(number, float) and math.isfinite(number):
        return Fraction(Decimal(repr(number)))
    return None


def multiple_of(instance: int | float, divisor: int | float) -> bool:
    """Whether ``instance`` is a whole multiple of ``divisor``, exactly (no float rounding).

    A float is taken as the shortest decimal that reads back as it, which is how it is
    written in JSON: ``0.3`` is a multiple of ``0.1``, ``10**400`` of ``0.5``.
    """
    if isinstance(instance, int) and isinstance(divisor, int):
        return divisor != 0 and instance % divisor == 0
    a, b = _exact(instance), _exact(divisor)
    return a is not None and b is not None and b != 0 and (a / b).denominator == 1


def _multiple_of(validator: Any, db: Any, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if validator.is_type(instance, "number") and not multiple_of(instance, db):
        yield ValidationError(f"{instance!r} is not a multiple of {db}")


class _Exhausted(Exception):
    """Raised inside a check that applied more references than its budget."""


class _Budget:
    def __init__(self, instance: Any) -> None:
        self.instance = instance
        self.used = 0
        self.limit = REFERENCE_BUDGET
        self.sized = False

    def spend(self) -> None:
        self.used += 1
        if self.used <= self.limit:
            return
        if not self.sized:  # counted only when the plain budget is spent (rare)
            self.sized = True
            self.limit = REFERENCE_BUDGET + REFERENCES_PER_NODE * json_nodes(self.instance)
            if self.used <= self.limit:
                return
        raise _Exhausted


_LOCAL = threading.local()


def _counted(keyword: Any) -> Any:
    """``keyword`` ($ref, $dynamicRef) spending one reference of the current check's budget."""

    def counted(validator: Any, ref: Any, instance: Any, schema: Any) -> Iterator[Any]:
        budget = getattr(_LOCAL, "budget", None)
        if budget is not None:
            budget.spend()
        yield from keyword(validator, ref, instance, schema)

    return counted


def keywords(base: Any) -> dict[str, Any]:
    """The keyword implementations planrun puts into every validator class built on ``base``."""
    return {"uniqueItems": _unique_items, "multipleOf": _multiple_of,
            "$ref": _counted(base.VALIDATORS["$ref"]),
            "$dynamicRef": _counted(base.VALIDATORS["$dynamicRef"])}


def json_nodes(value: Any) -> int:
    """How many values (objects, arrays, scalars) ``value`` holds, itself included."""
    count, stack = 0, [value]
    while stack:
        v = stack.pop()
        count += 1
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list | tuple):
            stack.extend(v)
    return count


class Guarded:
    """A jsonschema validator whose checks end within budget and never raise.

    ``iter_errors`` works out all errors at once, under the reference budget of one
    check. Any exception from inside jsonschema becomes one more error of the value (at
    its root), worded without the value (it may be a secret).
    """

    def __init__(self, validator: Any) -> None:
        self.validator = validator

    def __getattr__(self, name: str) -> Any:
        return getattr(self.validator, name)

    def errors(self, instance: Any) -> list[Any]:
        """Every violation of ``instance`` (a list: the budget covers one whole check)."""
        from jsonschema.exceptions import ValidationError

        outer = getattr(_LOCAL, "budget", None)
        _LOCAL.budget = _Budget(instance)
        found: list[Any] = []
        try:
            for err in self.validator.iter_errors(instance):
                found.append(err)
        except _Exhausted:
            found.append(ValidationError(
                f"checking the value applies more than {_LOCAL.budget.limit:,} references "
                "($ref) of its schema: a recursive reference is applied several times to "
                "the same part of the value (such as allOf: [{$ref: X}, {$ref: X}] inside "
                "X); refer back to a schema from one place per level of the value",
                validator="$ref", validator_value="(budget)", instance=None, schema={}))
        except RecursionError:
            found.append(ValidationError(
                "the value is nested too deeply to be checked against its schema",
                validator="schema", validator_value="(depth)", instance=None, schema={}))
        except Exception as exc:
            found.append(ValidationError(
                f"the value cannot be checked against its schema ({type(exc).__name__} in "
                f"the keyword {_keyword_of(exc)!r})", validator=_keyword_of(exc),
                validator_value="(error)", instance=None, schema={}))
        finally:
            _LOCAL.budget = outer
        return found

    def iter_errors(self, instance: Any) -> Iterator[Any]:
        """Like jsonschema's, within budget and without exceptions."""
        return iter(self.errors(instance))

    def is_valid(self, instance: Any) -> bool:
        """Whether ``instance`` has no violation."""
        return not self.errors(instance)


def _keyword_of(exc: BaseException) -> str:
    """The jsonschema keyword the exception went through last (or ``schema``)."""
    tb = exc.__traceback__
    name = "schema"
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename.replace("\\", "/").endswith("jsonschema/_keywords.py"):
            name = code.co_name
        tb = tb.tb_next
    return name
