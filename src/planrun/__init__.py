"""planrun: validate, approve, run and resume plans of tool calls, journaled in SQLite.

Public names are kept light so that ``import planrun`` costs almost nothing at start-up;
the heavy modules (jsonschema, rich, the executor) load only when a command needs them.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
