"""JSON Pointer (RFC 6901): the one place that escapes and splits reference tokens.

Every issue, argument problem and stored reference names a place in a document with a
JSON Pointer (``/steps/2/arguments/a~1b``). This module has no imports of its own so that
any layer can use it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any


def pointer_escape(token: str) -> str:
    """Escape one reference token: ``~`` → ``~0``, ``/`` → ``~1`` (RFC 6901 §3)."""
    if "~" in token or "/" in token:
        return token.replace("~", "~0").replace("/", "~1")
    return token


def pointer(*parts: object) -> str:
    """A JSON Pointer from tokens: ``pointer("steps", 2, "a/b")`` → ``/steps/2/a~1b``.

    Each part is turned into text with :class:`str` and escaped; no parts gives ``""``
    (the whole document).
    """
    return "".join("/" + pointer_escape(str(p)) for p in parts)


def pointer_of(parts: Iterable[object]) -> str:
    """:func:`pointer` of an iterable (a pydantic or jsonschema error location)."""
    return "".join("/" + pointer_escape(str(p)) for p in parts)


def split_pointer(ptr: str) -> list[str]:
    """The reference tokens of a JSON Pointer, unescaped (``""`` → ``[]``)."""
    if not ptr:
        return []
    return [t.replace("~1", "/").replace("~0", "~") for t in ptr.split("/")[1:]]


def leaves(value: Any, ptr: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf of a JSON value (not an object or array) with its pointer, in order.

    Object keys are turned into text (:class:`str`) and escaped; ``ptr`` is the pointer of
    ``value`` itself.
    """
    if isinstance(value, dict):
        for k, v in value.items():
            yield from leaves(v, f"{ptr}/{pointer_escape(str(k))}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from leaves(v, f"{ptr}/{i}")
    else:
        yield ptr, value
