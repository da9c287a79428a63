"""Masking the values of ``secret: true`` parameters (SPEC §3, §7).

The values are registered once per process (when a plan's parameters are resolved) and
then replaced by ``***`` wherever planrun writes or prints text: every JSON value the
journal stores (outputs, errors, events, reports, parameters), the manifest, validation
reports and error messages. Tools still receive the real values.
"""

from __future__ import annotations

from typing import Any

MASK = "***"
_VALUES: list[str] = []
_NUMBERS: set[float] = set()


def register(values: list[Any]) -> None:
    """Add secret values to mask from now on.

    Strings are masked wherever they appear in text, also in their JSON-escaped spellings;
    numbers are masked where they stand alone and in text; an object or array secret has
    each of its leaves registered.
    """
    import json

    stack = list(values)
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
            continue
        if isinstance(v, list | tuple):
            stack.extend(v)
            continue
        if v is None or isinstance(v, bool):
            continue
        if isinstance(v, int | float):
            _NUMBERS.add(v)
        text = v if isinstance(v, str) else json.dumps(v)
        for form in (text, json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1]):
            if form and form not in _VALUES:
                _VALUES.append(form)
    _VALUES.sort(key=len, reverse=True)  # longest first: no partial leftovers


def active() -> bool:
    """True when any secret is registered."""
    return bool(_VALUES)


def text(s: str) -> str:
    """``s`` with every registered secret replaced by ``***``."""
    for v in _VALUES:
        if v in s:
            s = s.replace(v, MASK)
    return s


def value(obj: Any) -> Any:
    """A JSON value with every string (keys too) masked."""
    if not _VALUES:
        return obj
    if isinstance(obj, str):
        return text(obj)
    if isinstance(obj, dict):
        return {text(k): value(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [value(v) for v in obj]
    if isinstance(obj, int | float) and not isinstance(obj, bool) and obj in _NUMBERS:
        return MASK
    return obj


def clear() -> None:
    """Forget every registered secret (tests)."""
    _VALUES.clear()
    _NUMBERS.clear()
