"""When a contract's verdict depends only on the *shape* of the arguments.

Many contracts say only which keys an object has and what JSON type each value is
(``{type: object, properties: {n: {type: integer}}, required: [n], additionalProperties:
false}``). For such a contract, every arguments object of the same shape — the same keys
at every level, the same number of list elements, the same JSON type for every scalar —
gets the same verdict from the validator. So a fit found once holds for every other value
of that shape: a 10,000-item fan-out of ``{x: "{item}"}`` is checked once, not 10,000
times (issue 16: the per-item schema check was a sixth of an item's cost).

This module only decides *when* that is true; the check itself is always the library's
(jsonschema, :func:`planrun.registry.strict_validator`), and a problem is always worked out
by it again (:mod:`.arguments` memoizes fits only).

A schema is *shape-determined* when it uses only the keywords of :data:`SHAPE_KEYWORDS`
(whose outcome depends on keys, counts and types) and the annotations of
:data:`ANNOTATIONS`, at every level. Anything else — ``enum``, ``const``, ``minimum``,
``pattern``, ``format``, ``uniqueItems``, ``$ref``, ``unevaluatedProperties``, an unknown
keyword — makes it not shape-determined, and its checks are memoized by the whole value.
"""

from __future__ import annotations

import json
from typing import Any

#: Keywords whose verdict depends only on an instance's keys, lengths and JSON types,
#: with the kind of value each takes: ``schema`` (one subschema), ``schemas`` (a list),
#: ``named`` (NAME → subschema), ``plain`` (no subschema: types, names, counts).
SHAPE_KEYWORDS: dict[str, str] = {
    "type": "plain", "required": "plain", "dependentRequired": "plain",
    "minProperties": "plain", "maxProperties": "plain", "minItems": "plain",
    "maxItems": "plain", "minContains": "plain", "maxContains": "plain",
    "properties": "named", "patternProperties": "named", "dependentSchemas": "named",
    "additionalProperties": "schema", "items": "schema", "contains": "schema",
    "propertyNames": "schema", "not": "schema", "if": "schema", "then": "schema",
    "else": "schema",
    "prefixItems": "schemas", "allOf": "schemas", "anyOf": "schemas", "oneOf": "schemas",
}

#: Keywords that assert nothing (2020-12 annotations, identifiers, comments). ``$defs`` is
#: only ever applied through ``$ref``, which is not a shape keyword.
ANNOTATIONS = frozenset({
    "$schema", "$id", "$comment", "$defs", "$anchor", "title", "description", "default",
    "examples", "deprecated", "readOnly", "writeOnly",
})


def shape_determined(schema: Any) -> bool:
    """True when the verdict of ``schema`` on a value depends only on :func:`shape_of` it.

    ``propertyNames`` applies its subschema to each key as a string: the keys are part of
    the shape, so any shape keyword there is fine too. Raises nothing: a schema this does
    not understand is simply not shape-determined.
    """
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, bool):
            continue
        if not isinstance(node, dict):
            return False
        for key, value in node.items():
            kind = SHAPE_KEYWORDS.get(key)
            if kind is None:
                if key in ANNOTATIONS:
                    continue
                return False
            if kind == "schema":
                stack.append(value)
            elif kind == "schemas":
                if not isinstance(value, list):
                    return False
                stack.extend(value)
            elif kind == "named":
                if not isinstance(value, dict):
                    return False
                stack.extend(value.values())
    return True


#: The JSON type tag of each scalar Python type in JSON data. ``int`` and ``float`` differ
#: (planrun's strict ``integer`` refuses ``2.0``), and ``bool`` is not a number.
_TAGS: dict[type, str] = {bool: "b", int: "i", float: "f", str: "s", type(None): "z"}


def _shape(value: Any) -> Any:
    kind = type(value)
    tag = _TAGS.get(kind)
    if tag is not None:
        return tag
    if kind is dict:
        for k in value:
            if type(k) is not str:  # {1: x} must not share {"1": x}'s shape
                raise TypeError(f"a {type(k).__name__} key is not JSON data")
        return {k: _shape(v) for k, v in value.items()}
    if kind is list:  # jsonschema's "array" is a list: a tuple is no JSON data here
        return [_shape(v) for v in value]
    raise TypeError(f"{type(value).__name__} is not plain JSON data")


_SHAPE_TEXT = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def shape_of(value: Any) -> str:
    """The shape of JSON data as text: keys, list lengths and scalar types, no values.

    ``{"x": 3, "tags": ["a", "b"]}`` → ``{"tags":["s","s"],"x":"i"}``.

    Raises:
        TypeError: ``value`` holds something that is not JSON data (a placeholder not
            resolved yet, say).
    """
    return _SHAPE_TEXT.encode(_shape(value))
