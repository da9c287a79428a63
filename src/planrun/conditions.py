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
def compile_condition(expr: str) -> Any:
    """The compiled CEL program of ``expr``.

    Raises:
        ConditionError: the expression does not compile.
    """
    import celpy.celparser

    env = _environment()
    try:
        return env.program(env.compile(expr))
    except celpy.celparser.CELParseError as exc:
        detail = " ".join(str(exc).split())
        raise ConditionError(detail) from None
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
