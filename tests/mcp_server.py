"""A small MCP server for tests/test_mcp_proxy.py, run as a script over stdio.

``search(query)`` returns a fixed text and ``flaky()`` fails (``isError``) the first time;
every call that reaches this server appends ``<tool> <arguments as JSON>`` to the file
named by ``$MCP_TEST_CALLS``. ``notes://readme`` is a resource.
"""

from __future__ import annotations

import json
import os

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("test-server")
_flaky_calls = 0


def _count(tool: str, arguments: dict[str, object]) -> None:
    with open(os.environ["MCP_TEST_CALLS"], "a", encoding="utf-8") as calls:
        calls.write(f"{tool} {json.dumps(arguments, sort_keys=True)}\n")


@server.tool()
def search(query: str) -> str:
    """Search the notes."""
    _count("search", {"query": query})
    return f"3 notes match {query}"


@server.tool()
def flaky() -> str:
    """Fail the first time, then answer."""
    global _flaky_calls
    _flaky_calls += 1
    _count("flaky", {})
    if _flaky_calls == 1:
        raise ToolError("Error: the backend is warming up, try again")
    return "flaky is up"


@server.resource("notes://readme", mime_type="text/plain")
def readme() -> str:
    """The notes' readme."""
    return "These are the notes."


if __name__ == "__main__":
    server.run()
