r"""Regular expressions from users, compiled and matched in bounded time (SPEC §4).

Every regular expression planrun takes from a user — ``pattern`` and ``patternProperties``
in a parameter schema, a tool contract, an ``output_schema`` or a grant, and values checked
against ``format: regex`` — goes through this module. Patterns are compiled with RE2
(`google-re2`), an automaton-based engine whose matching time is linear in the length of
the text: no pattern can make planrun hang, however it is written (``^(a+)+$`` against
``aaa…a!`` answers at once).

The dialect is RE2's, which covers the portable subset of ECMA-262 that JSON Schema
recommends (classes, anchors, groups, alternation, counted repetition, ``(?<name>…)``,
``\d`` ``\w`` ``\s`` ``\b``, ``\p{…}``), plus ECMA-262's ``\uXXXX`` escape, which is
translated to RE2's ``\x{XXXX}``. What needs backtracking is refused, with a message,
when the schema is checked: lookahead and lookbehind (``(?=…)``, ``(?!…)``, ``(?<=…)``,
``(?<!…)``), backreferences (``\1``, ``\k<name>``), and counted repetition above 1,000
(``a{1001}``; RE2's bound). Differences that change a match, not validity: ``\s`` and
``\d`` are ASCII only, ``.`` stops only at ``\n`` (ECMA also at ``\r``, U+2028,
U+2029).

A pattern is searched for (not anchored), as JSON Schema says: ``^…$`` to match whole.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from .pointers import pointer_escape

#: RE2's largest repetition count; a larger ``{n}`` is refused, never read as text.
MAX_REPEAT = 1000

_COUNT = re.compile(r"\{([0-9]+)(?:,([0-9]*))?\}")


class PatternError(ValueError):
    """A regular expression planrun cannot use; the message says why and what to do."""


def _translate(pattern: str) -> str:
    r"""ECMA-262 → RE2: ``\uXXXX`` becomes ``\x{XXXX}``; counts over the bound refused.

    Raises:
        PatternError: a counted repetition over :data:`MAX_REPEAT`.
    """
    out: list[str] = []
    i, n, in_class = 0, len(pattern), False
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            nxt = pattern[i + 1]
            hexa = pattern[i + 2:i + 6]
            if nxt == "u" and len(hexa) == 4 and all(h in "0123456789abcdefABCDEF"
                                                     for h in hexa):
                out.append("\\x{" + hexa + "}")
                i += 6
                continue
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "{":
            m = _COUNT.match(pattern, i)
            if m is not None:
                counts = [int(g) for g in m.groups() if g]
                if any(k > MAX_REPEAT for k in counts):
                    raise PatternError(
                        f"the repetition {m.group(0)} is over {MAX_REPEAT:,}, the most a "
                        "linear-time pattern allows; use + or * or a smaller count")
        out.append(c)
        i += 1
    return "".join(out)


_UNSUPPORTED = (
    ("(?=", "lookahead (?=…)"), ("(?!", "negative lookahead (?!…)"),
    ("(?<=", "lookbehind (?<=…)"), ("(?<!", "negative lookbehind (?<!…)"),
)


@lru_cache(maxsize=1024)
def compile_pattern(pattern: str) -> Any:
    """The RE2 program of a user's regular expression (cached).

    Args:
        pattern: the expression as written in a schema (ECMA-262 / RE2 syntax).

    Returns:
        A compiled RE2 object with ``search(text)``.

    Raises:
        PatternError: the expression does not compile, or needs backtracking
            (lookaround, backreference) or a count over :data:`MAX_REPEAT`. Callers turn
            it into an issue coded ``schema`` (plan parameters), ``registry``
            (``tools.yaml``) or ``config`` (``planrun.toml``).
    """
    import re2

    try:
        translated = _translate(pattern)
    except PatternError as exc:
        raise PatternError(f"regular expression {_short(pattern)} cannot be used: "
                           f"{exc}") from None
    options = re2.Options()
    options.log_errors = False  # the reason is in the exception; never on our stderr
    try:
        return re2.compile(translated, options)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "invalid"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        for token, what in _UNSUPPORTED:
            if token in pattern:
                reason = f"{what} needs backtracking, which planrun does not run"
                break
        else:
            if re.search(r"\\[1-9]|\\k<", pattern):
                reason = "a backreference needs backtracking, which planrun does not run"
        raise PatternError(f"regular expression {_short(pattern)} cannot be used: "
                           f"{reason} (planrun matches patterns with RE2, in linear "
                           "time)") from None
    except (TypeError, ValueError) as exc:  # e.g. a lone surrogate in the pattern
        raise PatternError(f"regular expression {_short(pattern)} cannot be used: "
                           f"{exc}") from None


def _short(pattern: str) -> str:
    shown = pattern if len(pattern) <= 80 else pattern[:77] + "..."
    return repr(shown)


def search(pattern: str, text: str) -> bool:
    """Whether ``pattern`` matches somewhere in ``text``, in time linear in ``len(text)``.

    Raises:
        PatternError: the pattern cannot be compiled (see :func:`compile_pattern`).
    """
    program = compile_pattern(pattern)
    try:
        return program.search(text) is not None
    except UnicodeEncodeError:  # lone surrogates (e.g. in a tool's output): not text
        return program.search(text.encode("utf-8", "replace").decode("utf-8")) is not None


#: Keywords whose value is a subschema, a list of them, or a mapping of them.
_ONE = ("not", "if", "then", "else", "items", "additionalProperties", "contains",
        "propertyNames", "unevaluatedItems", "unevaluatedProperties", "additionalItems",
        "contentSchema")
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def schema_patterns(schema: Any) -> Iterator[tuple[str, str]]:
    """(JSON Pointer inside ``schema``, pattern) of every regular expression it holds.

    ``pattern`` values and ``patternProperties`` keys, found only in schema positions (a
    property *named* ``pattern`` is not a pattern).
    """
    stack: list[tuple[Any, str]] = [(schema, "")]
    while stack:
        node, ptr = stack.pop()
        if not isinstance(node, dict):
            continue
        if isinstance(node.get("pattern"), str):
            yield ptr + "/pattern", node["pattern"]
        pp = node.get("patternProperties")
        if isinstance(pp, dict):
            for key in pp:
                yield f"{ptr}/patternProperties/{pointer_escape(key)}", key
        for kw in _ONE:
            if kw in node:
                stack.append((node[kw], f"{ptr}/{kw}"))
        for kw in _LIST:
            if isinstance(node.get(kw), list):
                stack.extend((v, f"{ptr}/{kw}/{i}") for i, v in enumerate(node[kw]))
        for kw in _MAP:
            if isinstance(node.get(kw), dict):
                stack.extend((v, f"{ptr}/{kw}/{pointer_escape(k)}") for k, v in node[kw].items())


def pattern_problems(schema: Any) -> list[tuple[str, str]]:
    """(JSON Pointer inside ``schema``, message) per pattern that cannot be used."""
    out: list[tuple[str, str]] = []
    for ptr, pattern in schema_patterns(schema):
        try:
            compile_pattern(pattern)
        except PatternError as exc:
            out.append((ptr, str(exc)))
    return out


# --- jsonschema keywords matched with RE2 -------------------------------------------------


def _pattern_keyword(validator: Any, patrn: Any, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if validator.is_type(instance, "string") and not search(patrn, instance):
        yield ValidationError(f"{_short(instance)} does not match {patrn!r}")


def _pattern_properties(validator: Any, pp: Any, instance: Any, schema: Any
                        ) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for patrn, subschema in pp.items():
        for k, v in instance.items():
            if search(patrn, k):
                yield from validator.descend(v, subschema, path=k, schema_path=patrn)


def _extras(instance: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    return [k for k in instance
            if k not in properties and not any(search(p, k) for p in patterns)]


def _additional_properties(validator: Any, ap: Any, instance: Any, schema: Any
                           ) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "object"):
        return
    extras = _extras(instance, schema)
    if validator.is_type(ap, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], ap, path=extra)
    elif not ap and extras:
        joined = ", ".join(repr(e) for e in sorted(extras))
        if "patternProperties" in schema:
            patterns = ", ".join(repr(p) for p in sorted(schema["patternProperties"]))
            verb = "does" if len(extras) == 1 else "do"
            yield ValidationError(f"{joined} {verb} not match any of the regexes: {patterns}")
        else:
            verb = "was" if len(extras) == 1 else "were"
            yield ValidationError(f"Additional properties are not allowed ({joined} {verb} "
                                  "unexpected)")


def _valid(validator: Any, instance: Any, schema: Any) -> bool:
    return next(iter(validator.descend(instance, schema)), None) is None


def _evaluated_keys(validator: Any, instance: dict[str, Any], schema: Any) -> set[str]:
    """Keys of ``instance`` evaluated by ``schema`` (for ``unevaluatedProperties``).

    The rules of JSON Schema 2020-12 §11.3, as jsonschema applies them, with
    ``patternProperties`` matched by RE2.
    """
    if not isinstance(schema, dict):
        return set()
    keys: set[str] = set()
    for ref_kw in ("$ref", "$dynamicRef"):
        ref = schema.get(ref_kw)
        if isinstance(ref, str):
            resolved = validator._resolver.lookup(ref)
            sub = validator.evolve(schema=resolved.contents, _resolver=resolved.resolver)
            keys |= _evaluated_keys(sub, instance, resolved.contents)
    props = schema.get("properties")
    if isinstance(props, dict):
        keys |= props.keys() & instance.keys()
    for kw in ("additionalProperties", "unevaluatedProperties"):
        sub = schema.get(kw)
        if sub is not None:
            keys |= {k for k, v in instance.items() if _valid(validator, v, sub)}
    pp = schema.get("patternProperties")
    if isinstance(pp, dict):
        keys |= {k for k in instance if any(search(p, k) for p in pp)}
    deps = schema.get("dependentSchemas")
    if isinstance(deps, dict):
        for name, sub in deps.items():
            if name in instance:
                keys |= _evaluated_keys(validator, instance, sub)
    for kw in ("allOf", "oneOf", "anyOf"):
        for sub in schema.get(kw, []) if isinstance(schema.get(kw), list) else []:
            if _valid(validator, instance, sub):
                keys |= _evaluated_keys(validator, instance, sub)
    if "if" in schema:
        if validator.evolve(schema=schema["if"]).is_valid(instance):
            keys |= _evaluated_keys(validator, instance, schema["if"])
            if "then" in schema:
                keys |= _evaluated_keys(validator, instance, schema["then"])
        elif "else" in schema:
            keys |= _evaluated_keys(validator, instance, schema["else"])
    return keys


def _unevaluated_properties(validator: Any, up: Any, instance: Any, schema: Any
                            ) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "object"):
        return
    evaluated = _evaluated_keys(validator, instance, schema)
    bad = [k for k in instance if k not in evaluated
           and not _valid(validator, instance[k], up)]
    if bad:
        joined = ", ".join(repr(k) for k in sorted(bad))
        verb = "was" if len(bad) == 1 else "were"
        if up is False:
            yield ValidationError(f"Unevaluated properties are not allowed ({joined} {verb} "
                                  "unexpected)")
        else:
            yield ValidationError(f"Unevaluated properties are not valid under the given "
                                  f"schema ({joined} {verb} unevaluated and invalid)")


#: Keyword implementations that replace jsonschema's (which match with Python's ``re``).
KEYWORDS = {
    "pattern": _pattern_keyword,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "unevaluatedProperties": _unevaluated_properties,
}


def is_regex(instance: object) -> bool:
    """The ``regex`` format: a string planrun could use as a pattern (RE2 dialect)."""
    if not isinstance(instance, str):
        return True
    compile_pattern(instance)
    return True
