"""A small MCP server for tests/test_mcp_proxy.py, run as a script over stdio.

``search(query)`` returns a fixed text and ``flaky()`` fails (``isError``) the first time;
``hang()`` never answers; ``crash(status, after_hang)`` exits with ``status`` without
answering (once a ``hang`` call is running, with ``after_hang``, so both calls are in
flight); ``big(size)`` returns a text of ``size`` bytes. Every call that reaches this server
appends ``<tool> <arguments as JSON>`` to the file named by ``$MCP_TEST_CALLS``.
``notes://readme`` is a resource.
"""

from __future__ import annotations

import asyncio
import json
import os

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("test-server")
_flaky_calls = 0
_hanging = asyncio.Event()


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


@server.tool()
async def hang() -> str:
    """Never answer."""
    _count("hang", {})
    _hanging.set()
    await asyncio.Event().wait()
    return "unreachable"


@server.tool()
async def crash(status: int, after_hang: bool = False) -> str:
    """Exit with ``status`` without answering (once ``hang`` runs, with ``after_hang``)."""
    _count("crash", {"after_hang": after_hang, "status": status})
    if after_hang:
        await _hanging.wait()
    os._exit(status)


@server.tool()
def big(size: int) -> str:
    """A text of ``size`` bytes."""
    _count("big", {"size": size})
    return "y" * size


@server.resource("notes://readme", mime_type="text/plain")
def readme() -> str:
    """The notes' readme."""
    return "These are the notes."


if __name__ == "__main__":
    server.run()
