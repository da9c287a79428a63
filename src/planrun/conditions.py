"""``when`` conditions in CEL, via the ``cel-python`` package (SPEC §3).

An expression sees ``params`` (the plan's parameter values) and ``steps.ID.output`` for
the step's ancestors. It is compiled at validation (``condition`` issues) and evaluated
just before the step would be dispatched: false skips the step and its dependents
(reason ``condition``); an evaluation error or a non-boolean result fails the step.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any


class ConditionError(ValueError):
    """A condition that does not compile, fails to evaluate, or is not a boolean."""


@lru_cache(maxsize=1)
def _environment() -> Any:
    import celpy

    return celpy.Environment()


@lru_cache(maxsize=4096)
def _tree(expr: str) -> Any:
    import celpy.celparser

    try:
        return _environment().compile(expr)
    except celpy.celparser.CELParseError as exc:
        raise ConditionError(" ".join(str(exc).split())) from None
    except Exception as exc:  # cel-python raises assorted errors on odd input
        raise ConditionError(f"{type(exc).__name__}: {exc}") from None


def _root_ident(member: Any) -> str | None:
    """``params`` for the CEL subtree ``member > primary > ident params``."""
    from lark import Tree

    node = member
    for kind in ("member", "primary", "ident"):
        if not isinstance(node, Tree) or node.data != kind or not node.children:
            return None
        if kind == "ident":
            return str(node.children[0])
        node = node.children[0]
    return None


def _string_literal(expr: Any) -> str | None:
    """The text of an index expression that is one string literal, else None."""
    import json

    from lark import Token, Tree

    node = expr
    while isinstance(node, Tree) and len(node.children) == 1:
        if node.data == "literal":
            tok = node.children[0]
            if isinstance(tok, Token) and tok.startswith(('"', "'")):
                try:
                    return str(json.loads('"' + str(tok)[1:-1] + '"'))
                except ValueError:
                    return str(tok)[1:-1]
            return None
        node = node.children[0]
    return None


@lru_cache(maxsize=4096)
def references(expr: str) -> tuple[frozenset[str], frozenset[str]]:
    """(parameter names, step ids) that ``expr`` reads.

    ``params.X`` / ``params["X"]`` and ``steps.ID`` / ``steps["ID"]``, found in the parsed
    expression (text inside string literals is not a reference).

    Raises:
        ConditionError: the expression does not compile.
    """
    from lark import Tree

    found: dict[str, set[str]] = {"params": set(), "steps": set()}
    for node in _tree(expr).iter_subtrees():
        if node.data not in ("member_dot", "member_index") or len(node.children) < 2:
            continue
        root = _root_ident(node.children[0])
        if root not in found:
            continue
        key = node.children[1]
        name = str(key) if node.data == "member_dot" and not isinstance(key, Tree) \
            else _string_literal(key)
        if name is not None:
            found[root].add(name)
    return frozenset(found["params"]), frozenset(found["steps"])


@lru_cache(maxsize=4096)
def compile_condition(expr: str) -> Any:
    """The compiled CEL program of ``expr``.

    Raises:
        ConditionError: the expression does not compile.
    """
    tree = _tree(expr)
    try:
        return _environment().program(tree)
    except Exception as exc:  # cel-python raises assorted errors on odd input
        raise ConditionError(f"{type(exc).__name__}: {exc}") from None


def evaluate(expr: str, params: dict[str, Any], outputs: dict[str, Any]) -> bool:
    """Evaluate ``expr`` with ``params`` and ``steps.ID.output`` = ``outputs[ID]``.

    Raises:
        ConditionError: evaluation failed or the result is not a boolean.
    """
    from celpy.adapter import json_to_cel

    program = compile_condition(expr)
    activation = {
        "params": json_to_cel(params),
        "steps": json_to_cel({sid: {"output": out} for sid, out in outputs.items()}),
    }
    try:
        result = program.evaluate(activation)
    except Exception as exc:  # CELEvalError and friends
        raise ConditionError(f"cannot evaluate {expr!r}: {exc}") from None
    if isinstance(result, Exception):
        raise ConditionError(f"cannot evaluate {expr!r}: {result}")
    from celpy import celtypes

    if not isinstance(result, celtypes.BoolType):
        raise ConditionError(f"{expr!r} gave {result!r}, not true or false")
    return bool(result)
