"""``planrun mcp``: serve planrun to language-model clients (SPEC §10, Agents).

The ``mcp`` SDK is an optional extra, imported only here, inside the command.
"""

from __future__ import annotations

import sys

from .guard import fail, guard, leave, settings_of
from .options import JournalOpt, ProjectOpt, VerboseOpt

MISSING_EXTRA = ("planrun mcp needs the MCP SDK, an optional extra: "
                 "pip install 'planrun[mcp]'")
#: Said on stderr when a person starts the server by hand (stdin is a terminal): it reads
#: JSON-RPC from an MCP client and prints nothing else, so it looked like a hang.
ON_A_TERMINAL = ("planrun: this is an MCP server for {project}: it speaks the Model Context "
                 "Protocol (JSON-RPC) on stdin/stdout to an MCP client (an agent that "
                 "starts `planrun mcp`), so there is nothing to type here; Ctrl-D or "
                 "Ctrl-C stops it (see docs/agents.md)")


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
    from ..ui import err, is_terminal

    if is_terminal(sys.stdin):  # a person, not a client: say what this is and how to stop
        err(ON_A_TERMINAL.format(project=settings.project))
    leave(0, mcp_server.serve(settings))
