"""``planrun mcp``: serve planrun to language-model clients (SPEC §10, Agents).

The ``mcp`` SDK is an optional extra, imported only here, inside the command.
"""

from __future__ import annotations

from .guard import fail, guard, leave, settings_of
from .options import JournalOpt, ProjectOpt, VerboseOpt

MISSING_EXTRA = ("planrun mcp needs the MCP SDK, an optional extra: "
                 "pip install 'planrun[mcp]'")


def mcp(
    journal: JournalOpt = None,
    project: ProjectOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Serve this project to an MCP client over stdio (a client can never clear a step)."""
    from ..errors import UsageError

    settings = guard(lambda: settings_of(project, journal), verbose)
    try:
        from .. import mcp_server
    except ModuleNotFoundError as exc:
        if exc.name is not None and (exc.name == "mcp" or exc.name.startswith(
                ("mcp.", "mcp_types"))):
            fail(UsageError(MISSING_EXTRA, hint="See docs/agents.md."), verbose)
        raise
    leave(0, mcp_server.serve(settings))
