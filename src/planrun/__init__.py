"""planrun: validate, approve, run and resume plans of tool calls, journaled in SQLite.

Public names are kept light so that ``import planrun`` costs almost nothing at start-up;
the heavy modules (jsonschema, rich, the executor) load only when a command needs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["StepContext", "__version__", "context"]

if TYPE_CHECKING:
    from .tools import StepContext, context


def __getattr__(name: str) -> Any:
    """Load ``context``/``StepContext`` on first use (keeps ``import planrun`` cheap)."""
    if name in ("context", "StepContext"):
        from . import tools

        return getattr(tools, name)
    raise AttributeError(f"module 'planrun' has no attribute {name!r}")
