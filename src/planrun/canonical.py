"""Canonical JSON and digests (SPEC §5, §6, §7).

Canonical JSON: object keys sorted, no spaces, strings in Unicode NFC, one float spelling
(an integral float is written as the integer, ``2.0`` → ``2``; others use Python's shortest
round-trip ``repr``), UTF-8. Plan digests, argument digests (approvals) and idempotency
keys are SHA-256 hex digests of it.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from typing import Any


def _normalise(value: Any) -> Any:
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value)
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e21:
            return int(value)
        return value
    if isinstance(value, dict):
        return {unicodedata.normalize("NFC", str(k)): _normalise(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normalise(v) for v in value]
    raise TypeError(f"{type(value).__name__} is not JSON data")


#: One encoder for every canonical text: ``json.dumps`` with options builds a new
#: :class:`json.JSONEncoder` per call (~3 µs of the ~6 a small value takes; issue 16).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                              allow_nan=False)


def canonical_json(value: Any) -> str:
    """The canonical JSON text of a JSON value.

    Raises:
        TypeError: ``value`` holds something that is not JSON data.
        ValueError: a NaN or infinite float.
    """
    return _CANONICAL.encode(_normalise(value))


def digest(value: Any) -> str:
    """SHA-256 (hex) of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()
