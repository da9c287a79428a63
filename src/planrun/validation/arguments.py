"""A step's arguments against its tool's contract (``accepts`` schema or model, argv)."""

from __future__ import annotations

from typing import Any

from .. import fits, redact
from ..issues import Suggestions, listed
from ..jsontext import plain_json_text
from ..params import UNKNOWN, IndexRef, Template
from ..patterns import search
from ..pointers import pointer_of
from ..registry import ToolSpec
from .report import secret_rule
from .shapes import shape_determined, shape_of

#: (JSON Pointer inside the arguments, message, the pointer names a key)
ArgumentProblem = tuple[str, str, bool]

#: Arguments found to fit a contract: (the tool's ``contract_key``, what was checked,
#: SHA-256 of it) — what was checked is the arguments' JSON (``value``), or only their shape
#: (``shape``: keys, lengths, scalar types; :mod:`.shapes`) when the contract's verdict
#: depends on nothing else. Only fits are kept (a problem is always worked out again, so
#: its message is never one from another run); bounded, cleared when full.
_FITS: set[tuple[str, str, str]] = set()
FITS_KEPT = 100_000

#: ``contract_key`` → (whether that contract is shape-determined (:func:`.shapes.
#: shape_determined`), whether its fits may be kept between processes (:func:`_keepable`)).
_TRAITS: dict[str, tuple[bool, bool]] = {}


def _keepable(schema: Any) -> bool:
    """Whether fits of ``schema`` may outlive this process (:mod:`planrun.fits`).

    Not when any object in it has a ``format`` key: jsonschema asserts most formats
    (``date-time``, ``hostname``, ``uri``…) only when an optional package for it can be
    imported, so the verdict depends on what is installed, which the fits' checker does
    not name. Within one process, what is installed does not change.
    """
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "format" in node:
                return False
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return True


def _traits(tool: ToolSpec) -> tuple[bool, bool] | None:
    key = tool.contract_key
    if key is None:
        return None
    traits = _TRAITS.get(key)
    if traits is None:
        if len(_TRAITS) >= FITS_KEPT:  # a long-lived process (MCP) seeing many registries
            _TRAITS.clear()
        traits = _TRAITS[key] = (shape_determined(tool.contract), _keepable(tool.contract))
    return traits


def _fit_key(tool: ToolSpec, arguments: Any) -> tuple[str, str, str] | None:
    """The memo key of a check of ``arguments`` against ``tool``; None: not memoized.

    Not for a tool with an ``accepts`` model (its validators are code, run every time),
    nor for arguments with a value not known yet (a placeholder: not JSON data).
    """
    if tool.model is not None:
        return None
    traits = _traits(tool)
    if traits is None:
        return None
    import hashlib

    if traits[0]:
        try:
            kind, text = "shape", shape_of(arguments)
        except TypeError:
            return None
    else:
        value_text = plain_json_text(arguments)
        if value_text is None:
            return None
        kind, text = "value", value_text
    assert tool.contract_key is not None
    return (tool.contract_key, kind,
            hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest())


def _probe(value: Any, path: tuple[Any, ...], opaque: set[tuple[Any, ...]],
           text: set[tuple[Any, ...]]) -> Any:
    """A stand-in instance for checking arguments whose values are not known yet."""
    if value is UNKNOWN:
        opaque.add(path)
        return None
    if isinstance(value, Template):
        if value.exact is not None and not isinstance(value.exact, IndexRef):
            opaque.add(path)
            return None
        if value.exact is not None:  # {index} is always an integer
            return 0
        text.add(path)
        return ""
    if isinstance(value, dict):
        return {k: _probe(v, (*path, k), opaque, text) for k, v in value.items()}
    if isinstance(value, list):
        return [_probe(v, (*path, i), opaque, text) for i, v in enumerate(value)]
    return value


def argument_problems(tool: ToolSpec, arguments: dict[str, Any],
                      stored: Any = None, suggestions: Suggestions | None = None
                      ) -> list[ArgumentProblem]:
    """(JSON Pointer inside arguments, message, points-at-a-key) per contract violation.

    Values not known before the run (an unknown parameter, a run-time placeholder) are
    checked only as far as they are known: an embedded placeholder is text. For a command
    tool, a known value that would become an option (starts with ``-``) is a violation too
    (:func:`planrun.argv.option_value_problems`). With ``stored`` (the same arguments in
    reference form), a violation by a value that holds a secret is worded without quoting
    the value.

    Arguments that fitted the same contract before (same ``tools.yaml`` entry, same JSON
    text — or, for a contract that looks only at keys and types, the same shape) are not
    checked against the schema again in this process (:data:`_FITS`), nor in a later one
    of the same code (:mod:`planrun.fits`); a command tool's option-value rule, which
    reads values, still is.

    ``suggestions``: the report's bound on "did you mean" work (one of its own if None).
    """
    key = _fit_key(tool, arguments)
    if key is not None and key not in _FITS and fits.known(fits.key("arguments", *key)):
        _remember(key)
    if key is not None and key in _FITS:
        if key[1] == "shape" and tool.entry.command is not None:
            return _option_problems(tool, arguments)
        return []
    out = _problems(tool, arguments, stored, suggestions or Suggestions())
    if key is not None and not out:
        _remember(key)
        if _may_keep(tool, key, arguments, stored):
            fits.learn(fits.key("arguments", *key))
    return out


def _may_keep(tool: ToolSpec, key: tuple[str, str, str], arguments: dict[str, Any],
              stored: Any) -> bool:
    """Whether this fit may be written for later processes (:mod:`planrun.fits`).

    Not for a contract that uses ``format`` (:func:`_keepable`), and not for arguments
    that hold a secret (``stored``, their reference form, differs): a fit keyed by their
    value would let whoever reads the cache file confirm a guess of the secret, and one
    keyed by their shape its length, its keys or its number type (SPEC §7: a secret's
    value lives only in the process's memory; found by a fresh helper). Such a fit is
    still remembered in this process.
    """
    traits = _traits(tool)
    if traits is None or not traits[1]:
        return False
    return stored is None or stored is arguments or stored == arguments


def _remember(key: tuple[str, str, str]) -> None:
    if len(_FITS) >= FITS_KEPT:
        _FITS.clear()
    _FITS.add(key)


def _problems(tool: ToolSpec, arguments: dict[str, Any], stored: Any,
              suggestions: Suggestions) -> list[ArgumentProblem]:
    opaque: set[tuple[Any, ...]] = set()
    text: set[tuple[Any, ...]] = set()
    probe = _probe(arguments, (), opaque, text)
    out: list[ArgumentProblem] = []
    for err in tool.validator.iter_errors(probe):
        loc = tuple(err.absolute_path)
        if any(loc[:n] in opaque for n in range(len(loc) + 1)):
            continue
        if loc in text and err.validator != "type":
            continue
        if err.validator in ("additionalProperties", "unevaluatedProperties") and isinstance(
                err.instance, dict):
            out.extend(_undeclared(tool, err, loc, suggestions))
        else:
            out.append(_violation(tool, err, loc, stored, loc in text))
    if tool.entry.command is not None and not out:
        out.extend(_option_problems(tool, arguments))
    if tool.model is not None and not out and not opaque and not text:
        # An ``accepts`` model is checked the way the call checks it (SPEC §2): from JSON,
        # in strict mode; its JSON Schema alone lets through what the model refuses.
        from ..tools import validate_model

        _model, problems = validate_model(tool.model, arguments)
        for where, message in problems:
            out.append((where, f"tool {tool.name!r} ({tool.entry.accepts}): {message}",
                        False))
    return out


def _option_problems(tool: ToolSpec, arguments: dict[str, Any]) -> list[ArgumentProblem]:
    """A command tool's known values that would become options (:mod:`planrun.argv`)."""
    from ..argv import option_value_problems

    return [(ptr, msg, False) for ptr, msg in option_value_problems(tool.entry, arguments)]


def _undeclared(tool: ToolSpec, err: Any, loc: tuple[Any, ...],
                suggestions: Suggestions) -> list[ArgumentProblem]:
    """One problem per argument the contract does not declare."""
    schema = err.schema if isinstance(err.schema, dict) else {}
    known = schema.get("properties") or {}
    patterns = schema.get("patternProperties") or {}
    extras = [k for k in err.instance if k not in known
              and not any(search(p, k) for p in patterns)]
    return [(pointer_of((*loc, k)), f"argument {k!r} is not declared by tool {tool.name!r}."
             f"{suggestions.did_you_mean(k, known) if known else ''} Declared: "
             f"{listed(known) or 'none'}", True)
            for k in extras or list(err.instance)]


def _violation(tool: ToolSpec, err: Any, loc: tuple[Any, ...], stored: Any,
               is_text: bool) -> ArgumentProblem:
    """One schema violation, worded without the value when it holds a secret."""
    where = pointer_of(loc)
    if err.validator == "required":
        return (where, f"tool {tool.name!r}: {err.message}", False)
    name = ".".join(str(p) for p in loc) or "arguments"
    if stored is not None and redact.hides(stored, loc):
        return (where, f"argument {name!r}: its value (it holds a secret, not shown) fails "
                f"{err.validator!r}: {secret_rule(err)}", False)
    if is_text:
        return (where, f"argument {name!r} holds a placeholder inside text, so it is "
                f"a string; the tool declares {err.validator_value!r}", False)
    return (where, f"argument {name!r}: {err.message}", False)
