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


def register(values: list[Any]) -> None:
    """Add secret values (their text forms) to mask from now on."""
    import json

    for v in values:
        text = v if isinstance(v, str) else json.dumps(v)
        if text and text not in _VALUES:
            _VALUES.append(text)
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
    return obj


def clear() -> None:
    """Forget every registered secret (tests)."""
    _VALUES.clear()
