"""``treellm mcp-proxy``: the SDK's own client talks to the proxy, which runs tests/mcp_server.py.

Every call that reaches the server is appended to a file (``$MCP_TEST_CALLS``), so each test
counts exactly which calls the proxy let through. Messages the SDK's session never sends (an
object id, list arguments) go through the SDK's own stdio transport (:meth:`Harness.streams`).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytest.importorskip("mcp")

import anyio
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCError, JSONRPCMessage, JSONRPCNotification, JSONRPCRequest, JSONRPCResponse
from pydantic import ConfigDict

from treellm.cli import main

SERVER = str(Path(__file__).resolve().parent / "mcp_server.py")
LIMITS = """\
[defaults]
max_repeats_per_signature = 1

[tools.search]
max_repeats = 2

[tools.flaky]
max_repeats = 2
"""
T = TypeVar("T")
MiB = 1024 * 1024
EXIT_STATUS = (  # runs the proxy, then writes its exit status to a file
    "import subprocess, sys; code = subprocess.call(sys.argv[2:]); "
    "open(sys.argv[1], 'w', encoding='utf-8').write(str(code)); sys.exit(code)"
)
CAPPED_PROXY = (  # the proxy with another cap (the constructor's option)
    "import sys; from treellm.integrations.mcp import run_mcp_proxy; "
    "run_mcp_proxy(sys.argv[2:], max_message_bytes=int(sys.argv[1]))"
)


class Loose(JSONRPCNotification):
    """A message with any extra member (an invalid id), as the SDK's transport sends it."""

    model_config = ConfigDict(extra="allow")


def dump(model: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = model.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dumped


def text(result: Any) -> str:
    return "\n".join(block.text for block in result.content)


class Harness:
    """Runs one client session against the proxy (or the bare server) in a temp folder."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.calls_file = tmp_path / "calls.txt"
        self.limits = tmp_path / "limits.toml"
        self.limits.write_text(LIMITS, encoding="utf-8")
        self.stderr_file = tmp_path / "stderr.txt"
        self.status_file = tmp_path / "status.txt"

    def calls(self) -> list[str]:
        if not self.calls_file.exists():
            return []
        return self.calls_file.read_text(encoding="utf-8").splitlines()

    def stderr(self) -> str:
        return self.stderr_file.read_text(encoding="utf-8")

    def exit_status(self) -> int:
        return int(self.status_file.read_text(encoding="utf-8"))

    @asynccontextmanager
    async def streams(
        self, *options: str, proxy: bool = True, cap: int | None = None
    ) -> AsyncIterator[tuple[Any, Any]]:
        """The SDK's stdio transport to the proxy (``cap``: run with that ``max_message_bytes``);
        the proxy's exit status and stderr are kept (:meth:`exit_status`, :meth:`stderr`)."""
        server = [sys.executable, SERVER]
        if not proxy:
            command = server
        elif cap is None:
            command = [sys.executable, "-m", "treellm", "mcp-proxy", *options, "--", *server]
        else:
            command = [sys.executable, "-c", CAPPED_PROXY, str(cap), *server]
        if proxy:
            command = [sys.executable, "-c", EXIT_STATUS, str(self.status_file), *command]
        params = StdioServerParameters(
            command=command[0], args=command[1:], env={"MCP_TEST_CALLS": str(self.calls_file)}
        )
        with self.stderr_file.open("w", encoding="utf-8") as errlog:
            async with stdio_client(params, errlog=errlog) as streams:
                yield streams

    @asynccontextmanager
    async def session(self, *options: str, proxy: bool = True, cap: int | None = None) -> AsyncIterator[ClientSession]:
        async with self.streams(*options, proxy=proxy, cap=cap) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session

    def run(
        self,
        body: Callable[[ClientSession], Awaitable[T]],
        *options: str,
        proxy: bool = True,
        cap: int | None = None,
    ) -> T:
        async def go() -> T:
            async with self.session(*options, proxy=proxy, cap=cap) as session:
                return await body(session)

        return asyncio.run(go())


@pytest.fixture
def harness(tmp_path: Path) -> Harness:
    return Harness(tmp_path)


def test_initialize_and_tools_list_pass_through_unchanged(harness: Harness) -> None:
    async def listing(session: ClientSession) -> tuple[dict[str, Any], dict[str, Any]]:
        initialized = session.initialize_result
        assert initialized is not None
        return dump(initialized), dump(await session.list_tools())

    direct = harness.run(listing, proxy=False)
    proxied = harness.run(listing, "--limits", str(harness.limits))
    assert proxied == direct
    assert [tool["name"] for tool in proxied[1]["tools"]] == ["search", "flaky", "hang", "crash", "big"]


@pytest.mark.parametrize("action", ["prune", "nudge", "cache"])
def test_identical_calls_past_max_repeats_get_the_configured_answer_without_reaching_the_server(
    harness: Harness, action: str
) -> None:
    async def four_searches(session: ClientSession) -> list[Any]:
        return [await session.call_tool("search", {"query": "loops"}) for _ in range(4)]

    results = harness.run(four_searches, "--limits", str(harness.limits), "--on-repeat", action)

    assert harness.calls() == ['search {"query": "loops"}'] * 2  # max_repeats = 2 reach the server
    first, second, *caught = results
    assert dump(first) == dump(second)
    assert text(first) == "3 notes match loops" and not first.is_error
    for result in caught:
        if action == "prune":
            assert result.is_error
            assert "already made 2 times in this session" in text(result) and "pruned" in text(result)
        elif action == "nudge":
            assert not result.is_error
            assert "already called 2 times" in text(result) and text(result).endswith("3 notes match loops")
            assert result.structured_content == first.structured_content  # the tool has an output schema
        else:
            assert dump(result) == dump(first)  # the earlier result, replayed whole


def test_max_repeats_on_the_command_line_sets_the_default_limit(harness: Harness) -> None:
    async def three_searches(session: ClientSession) -> list[bool]:
        return [(await session.call_tool("search", {"query": "q"})).is_error for _ in range(3)]

    assert harness.run(three_searches, "--max-repeats", "3") == [False, False, False]
    assert len(harness.calls()) == 3


def test_identical_calls_sent_concurrently_count_against_each_other(harness: Harness) -> None:
    async def five_at_once(session: ClientSession) -> list[Any]:
        return list(await asyncio.gather(*(session.call_tool("search", {"query": "same"}) for _ in range(5))))

    results = harness.run(five_at_once, "--limits", str(harness.limits))

    assert harness.calls() == ['search {"query": "same"}'] * 2
    assert sorted(result.is_error for result in results) == [False, False, True, True, True]


def test_a_different_call_passes_after_a_caught_one(harness: Harness) -> None:
    async def searches(session: ClientSession) -> list[bool]:
        queries = ["a", "a", "a", "b"]
        return [(await session.call_tool("search", {"query": q})).is_error for q in queries]

    assert harness.run(searches, "--limits", str(harness.limits)) == [False, False, True, False]
    assert harness.calls() == ['search {"query": "a"}'] * 2 + ['search {"query": "b"}']


def test_a_retry_after_an_is_error_result_passes_and_the_failure_counts(harness: Harness) -> None:
    async def flaky_three_times(session: ClientSession) -> list[Any]:
        return [await session.call_tool("flaky", {}) for _ in range(3)]

    failed, retried, third = harness.run(flaky_three_times, "--limits", str(harness.limits))

    assert failed.is_error and "warming up" in text(failed)
    assert not retried.is_error and text(retried) == "flaky is up"
    assert third.is_error and "pruned" in text(third)  # a failed call counts on the path, as in a tree
    assert harness.calls() == ["flaky {}", "flaky {}"]


def test_resources_pass_through_unchanged(harness: Harness) -> None:
    async def resources(session: ClientSession) -> tuple[dict[str, Any], dict[str, Any]]:
        return dump(await session.list_resources()), dump(await session.read_resource("notes://readme"))

    direct = harness.run(resources, proxy=False)
    proxied = harness.run(resources, "--limits", str(harness.limits))
    assert proxied == direct
    assert proxied[1]["contents"][0]["text"] == "These are the notes."


def test_the_trace_ingests_into_a_store_whose_report_counts_calls_and_prunes_once(harness: Harness) -> None:
    pytest.importorskip("duckdb")
    from treellm.analysis.report import report
    from treellm.store.connection import open_store
    from treellm.store.ingest import ingest

    async def calls(session: ClientSession) -> None:
        for query in ["x", "x", "x", "y"]:
            await session.call_tool("search", {"query": query})

    trace = harness.tmp_path / "proxy.jsonl"
    harness.run(calls, "--limits", str(harness.limits), "--trace", str(trace))

    db = str(harness.tmp_path / "runs.duckdb")
    ingest(db, [trace])
    ingest(db, [trace])  # re-ingesting adds nothing
    con = open_store(db, read_only=True)
    try:
        data = report(con)
    finally:
        con.close()
    assert (data["runs"], data["tool_calls"], data["pruned"]) == (1, 3, 1)  # executed calls, and the prune
    (search,) = data["tools"]
    assert (search["tool"], search["calls"], search["pruned"], search["exact_repeats"]) == ("search", 3, 1, 1)


def test_the_command_says_in_one_line_what_is_missing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mcp-proxy", "--"]) == 1
    assert (
        capsys.readouterr().err.strip() == "treellm: error: treellm mcp-proxy needs the MCP server's command after --"
    )
    assert main(["mcp-proxy", "--", "no-such-mcp-server-anywhere"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("treellm: error: cannot start the MCP server") and err.count("\n") == 0


async def reply_to(streams: tuple[Any, Any], message: JSONRPCMessage) -> JSONRPCMessage:
    """Send one message through the SDK's transport and take the next message back (a proxy
    that never answers fails the test instead of hanging it)."""
    read, write = streams
    await write.send(SessionMessage(message))
    with anyio.fail_after(120):
        item = await read.receive()
    assert isinstance(item, SessionMessage), item
    return item.message


async def initialize(streams: tuple[Any, Any]) -> None:
    """MCP's handshake, as raw messages."""
    params = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}
    reply = await reply_to(streams, JSONRPCRequest(jsonrpc="2.0", id="init", method="initialize", params=params))
    assert isinstance(reply, JSONRPCResponse), reply
    await streams[1].send(SessionMessage(JSONRPCNotification(jsonrpc="2.0", method="notifications/initialized")))


def test_a_server_that_dies_mid_call_fails_every_waiting_request_and_the_proxy_exits_non_zero_saying_why(
    harness: Harness,
) -> None:
    async def hang_and_crash(session: ClientSession) -> list[Any]:
        hang = session.call_tool("hang", {})
        crash = session.call_tool("crash", {"status": 3, "after_hang": True})  # exits once hang runs
        return list(await asyncio.gather(hang, crash, return_exceptions=True))

    results = harness.run(hang_and_crash)

    assert harness.calls() == ["hang {}", 'crash {"after_hang": true, "status": 3}']
    for result in results:
        assert isinstance(result, MCPError), result
        assert result.code == -32000
        assert result.message == "the MCP server exited with status 3 before answering this request (tools/call)"
    assert harness.exit_status() == 1
    assert harness.stderr().splitlines() == [  # one line, no traceback
        "treellm: error: the MCP server exited with status 3 while the client was connected; "
        "2 waiting requests got a JSON-RPC error"
    ]


def test_a_session_the_client_ends_exits_zero(harness: Harness) -> None:
    async def one_search(session: ClientSession) -> str:
        return text(await session.call_tool("search", {"query": "q"}))

    assert harness.run(one_search) == "3 notes match q"
    assert harness.exit_status() == 0
    assert "error" not in harness.stderr()


def test_every_request_is_answered_an_id_that_is_not_a_string_or_integer_gets_invalid_request_with_id_null(
    harness: Harness,
) -> None:
    message = {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "search", "arguments": {"query": "q"}}}

    async def go() -> tuple[list[JSONRPCMessage], str]:
        async with harness.streams() as streams:
            replies = [
                await reply_to(streams, Loose.model_validate({**message, "id": bad}))
                for bad in ({"an": "object"}, [1], True, None)
            ]
            async with ClientSession(*streams) as session:  # the session goes on
                await session.initialize()
                return replies, text(await session.call_tool("search", {"query": "q"}))

    replies, after = asyncio.run(go())

    for reply in replies:
        assert isinstance(reply, JSONRPCError) and reply.id is None, reply
        assert reply.error.code == -32600
        assert reply.error.message.startswith("Invalid Request: an MCP request id is a string or an integer, got ")
    assert [reply.error.message.rsplit("got ", 1)[1] for reply in replies if isinstance(reply, JSONRPCError)] == [
        "an object",
        "an array",
        "a boolean",
        "null",
    ]
    assert after == "3 notes match q"
    assert harness.calls() == ['search {"query": "q"}']  # none of the invalid ones reached the server


def test_a_tools_call_without_a_string_tool_name_gets_invalid_params_and_never_reaches_the_server(
    harness: Harness,
) -> None:
    requests = [
        JSONRPCRequest(jsonrpc="2.0", id=1, method="tools/call", params={"name": 5, "arguments": {}}),
        JSONRPCRequest(jsonrpc="2.0", id=2, method="tools/call", params={"name": ["search"]}),
        JSONRPCRequest(jsonrpc="2.0", id=3, method="tools/call", params={"arguments": {"query": "q"}}),
        JSONRPCRequest(jsonrpc="2.0", id=4, method="tools/call"),
    ]

    async def go() -> list[JSONRPCMessage]:
        async with harness.streams() as streams:
            return [await reply_to(streams, request) for request in requests]

    replies = asyncio.run(go())

    assert [(reply.id, reply.error.code) for reply in replies if isinstance(reply, JSONRPCError)] == [
        (1, -32602),
        (2, -32602),
        (3, -32602),
        (4, -32602),
    ]
    assert harness.calls() == []


def test_arguments_are_keyed_as_given_lists_and_strings_included(harness: Harness) -> None:
    arguments: list[Any] = [[1], [2], [1], "[1]", "[1]", {"query": "q"}]

    async def go() -> list[JSONRPCMessage]:
        async with harness.streams("--max-repeats", "1") as streams:
            await initialize(streams)
            return [
                await reply_to(
                    streams,
                    JSONRPCRequest(
                        jsonrpc="2.0", id=n, method="tools/call", params={"name": "search", "arguments": value}
                    ),
                )
                for n, value in enumerate(arguments)
            ]

    replies = asyncio.run(go())

    pruned = [
        isinstance(reply, JSONRPCResponse) and "[treellm] search was pruned" in str(reply.result) for reply in replies
    ]
    assert pruned == [False, False, True, False, True, False]  # [1] and [2] differ; the text "[1]" is not [1]
    assert harness.calls() == ['search {"query": "q"}']  # the server refuses the others (not an object)


def test_a_request_over_the_default_cap_gets_an_error_naming_the_cap_and_the_session_goes_on(
    harness: Harness,
) -> None:
    async def oversized_then_normal(session: ClientSession) -> tuple[MCPError, str]:
        with pytest.raises(MCPError) as refused:
            await session.call_tool("search", {"query": "x" * (16 * MiB)})
        return refused.value, text(await session.call_tool("search", {"query": "after"}))

    error, after = harness.run(oversized_then_normal)

    assert error.code == -32600
    size = re.fullmatch(
        r"Request too large: the message is (\d+) bytes, over the proxy's cap of 16777216 bytes "
        r"\(max_message_bytes\); it was not relayed",
        error.message,
    )
    assert size is not None and int(size[1]) > 16 * MiB, error.message
    assert after == "3 notes match after"
    assert harness.calls() == ['search {"query": "after"}']


def test_the_cap_is_the_constructors_option_and_holds_both_ways(harness: Harness) -> None:
    cap = 256 * 1024

    async def calls(session: ClientSession) -> tuple[MCPError, MCPError, str]:
        with pytest.raises(MCPError) as big_result:
            await session.call_tool("big", {"size": 300_000})
        with pytest.raises(MCPError) as big_request:
            await session.call_tool("search", {"query": "x" * 300_000})
        return big_result.value, big_request.value, text(await session.call_tool("big", {"size": 50_000}))

    result_error, request_error, under_cap = harness.run(calls, cap=cap)

    over_cap = rf"(\d+) bytes, over the proxy's cap of {cap} bytes \(max_message_bytes\); it was not relayed"
    result_size = re.fullmatch(rf"Response too large: the MCP server's response is {over_cap}", result_error.message)
    assert result_error.code == -32603 and result_size is not None and int(result_size[1]) > 300_000
    request_size = re.fullmatch(rf"Request too large: the message is {over_cap}", request_error.message)
    assert request_error.code == -32600 and request_size is not None and int(request_size[1]) > 300_000
    assert under_cap == "y" * 50_000
    assert harness.calls() == ['big {"size": 300000}', 'big {"size": 50000}']


def test_a_large_message_under_the_cap_is_relayed_whole(harness: Harness) -> None:
    query = "q" * (6 * MiB)  # the SDK's own client reads a long line in quadratic time: kept moderate

    async def large(session: ClientSession) -> str:
        return text(await session.call_tool("search", {"query": query}))

    assert harness.run(large) == f"3 notes match {query}"
    assert harness.calls() == [f'search {{"query": "{query}"}}']


# -- the session's bookkeeping, in process (no subprocesses) ----------------------------------


def request(request_id: int, query: str = "q") -> Any:
    from mcp_types import JSONRPCRequest

    params = {"name": "search", "arguments": {"query": query}}
    return JSONRPCRequest(jsonrpc="2.0", id=request_id, method="tools/call", params=params)


def response(request_id: int, result: dict[str, Any]) -> Any:
    from mcp_types import JSONRPCResponse

    return JSONRPCResponse(jsonrpc="2.0", id=request_id, result=result)


def guarded(on_repeat: Any = "prune") -> Any:
    from treellm import LoopGuard
    from treellm.integrations.mcp import GuardedSession

    return GuardedSession(LoopGuard(on_repeat=on_repeat, telemetry=False), "s1")


def test_a_call_the_client_cancels_or_that_needs_input_does_not_count() -> None:
    from mcp_types import JSONRPCNotification

    session = guarded()
    assert session.from_client(request(1)) is None  # forwarded
    cancel = JSONRPCNotification(jsonrpc="2.0", method="notifications/cancelled", params={"requestId": 1})
    assert session.from_client(cancel) is None  # forwarded too, and the call is released
    assert session.from_client(request(2)) is None
    session.from_server(response(2, {"resultType": "input_required", "inputRequests": {}}))
    assert session.from_client(request(3)) is None  # the retry with the input
    session.from_server(response(3, {"content": [{"type": "text", "text": "ok"}]}))
    caught = session.from_client(request(4))
    assert caught is not None and caught.id == 4 and caught.result["isError"] is True


def test_a_json_rpc_error_is_a_failed_call_that_counts_and_cache_replays_it() -> None:
    from mcp_types import ErrorData, JSONRPCError

    session = guarded("cache")
    assert session.from_client(request(1)) is None
    session.from_server(JSONRPCError(jsonrpc="2.0", id=1, error=ErrorData(code=-32602, message="bad query")))
    caught = session.from_client(request(2))
    assert caught.result == {"content": [{"type": "text", "text": "Error: bad query"}], "isError": True}


def test_nudge_and_cache_while_the_identical_call_is_still_running_say_so_as_an_error() -> None:
    for action in ("nudge", "cache"):
        session = guarded(action)
        assert session.from_client(request(1)) is None
        caught = session.from_client(request(2))
        assert caught.result["isError"] is True and "still running" in caught.result["content"][0]["text"]


def test_without_the_mcp_extra_the_command_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mcp" else find_spec(name, *a))
    assert main(["mcp-proxy", "--", sys.executable, SERVER]) == 1
    err = capsys.readouterr().err.strip()
    assert "pip install 'treellm[mcp]'" in err and err.count("\n") == 0


# -- the proxy's JSON-RPC side, in process ------------------------------------------------------


def protocol(on_repeat: Any = "prune", cap: int = 1024) -> Any:
    from treellm.integrations.mcp import ProxyProtocol

    return ProxyProtocol(guarded(on_repeat), max_message_bytes=cap)


def line(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode()


def decoded(lines: tuple[bytes, ...]) -> list[Any]:
    return [json.loads(data) for data in lines]


def test_the_line_splitter_works_in_linear_time_however_the_stream_is_chunked() -> None:
    from treellm.integrations.mcp import LineSplitter, Oversized

    splitter = LineSplitter(32 * MiB)
    long = b"x" * (16 * MiB)
    lines: list[Any] = []
    for start in range(0, len(long), 1024):  # 16,384 chunks: rejoining them per chunk would copy terabytes
        lines += splitter.feed(long[start : start + 1024])
    lines += splitter.feed(b"\na\nb\n\nc")
    lines += splitter.end()
    assert [len(item) for item in lines] == [16 * MiB, 1, 1, 0, 1]
    assert lines[0] == long and lines[1:] == [b"a", b"b", b"", b"c"]

    capped = LineSplitter(1000)
    head = b'{"id": 7, "method": "tools/call", "params": "'
    items = capped.feed(head + b"y" * 100_000) + capped.feed(b'"}\n{"id": 8}\n')
    assert items == [Oversized(len(head) + 100_002, (head + b"y" * 100_000)[: 64 * 1024]), b'{"id": 8}']


def test_the_id_of_an_oversized_message_is_read_from_its_head_at_the_top_level_only() -> None:
    from treellm.integrations.mcp import head_fields

    assert head_fields(b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"x": "yyy') == (7, "request")
    assert head_fields(b'{"params": {"id": 3, "list": [{"id": 4}]}, "id": "a\\"b", "result": {"cut') == (
        'a"b',
        "response",
    )
    assert head_fields(b'{"params": {"id": 3}, "id": 12') == (None, None)  # a value cut at the end is not read
    assert head_fields(b'{"id": true, "error": {') == (None, "response")
    assert head_fields(b"[1, 2]") == (None, None)


@pytest.mark.parametrize(
    ("raw", "request_id", "code"),
    [
        (b"not json", None, -32700),
        (b"[1]", None, -32600),  # no batches in MCP
        (b'{"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"}', None, -32600),
        (b'{"jsonrpc": "2.0", "id": [1], "method": "ping"}', None, -32600),
        (b'{"jsonrpc": "2.0", "id": false, "method": "ping"}', None, -32600),
        (b'{"jsonrpc": "2.0", "id": null, "method": "ping"}', None, -32600),  # JSON-RPC allows it, MCP not
        (b'{"jsonrpc": "2.0", "id": 1.5, "method": "ping"}', 1.5, -32600),  # a JSON-RPC id: echoed
        (b'{"jsonrpc": "1.0", "id": 2, "method": "ping"}', 2, -32600),
        (b'{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": [1]}', 3, -32602),
        (b'{"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": null}}', 4, -32602),
    ],
)
def test_every_invalid_message_from_the_client_is_answered_with_the_id_json_rpc_allows(
    raw: bytes, request_id: Any, code: int
) -> None:
    relayed = protocol().from_client(raw)
    assert relayed.to_server == ()
    (answer,) = decoded(relayed.to_client)
    assert answer["id"] == request_id and type(answer["id"]) is type(request_id)
    assert answer["error"]["code"] == code


def test_valid_messages_pass_unchanged_byte_for_byte() -> None:
    proxy = protocol()
    raw = b'{ "method":"tools/list" ,"id":"a", "jsonrpc":"2.0", "extra": [1] }'
    assert proxy.from_client(raw).to_server == (raw + b"\n",)
    answer = b'{"jsonrpc":"2.0","id":"a","result":{"tools":[]},"_x":1}'
    assert proxy.from_server(answer).to_client == (answer + b"\n",)


def test_when_the_server_ends_every_waiting_request_gets_an_error_and_a_tool_call_counts_as_failed() -> None:
    proxy = protocol()
    call = line({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "search", "arguments": [1]}})
    proxy.from_client(call)
    proxy.from_client(line({"jsonrpc": "2.0", "id": "r", "method": "resources/read", "params": {"uri": "x://y"}}))
    proxy.from_client(line({"jsonrpc": "2.0", "id": 3, "method": "ping"}))
    proxy.from_server(line({"jsonrpc": "2.0", "id": 3, "result": {}}))  # answered: no error for it
    proxy.from_client(line({"jsonrpc": "2.0", "id": 4, "method": "ping"}))
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 4}}
    proxy.from_client(line(cancel))  # cancelled: nobody waits for it

    answers = decoded(proxy.server_ended("exited with status 3").to_client)

    assert [(a["id"], a["error"]["code"], a["error"]["message"]) for a in answers] == [
        (1, -32000, "the MCP server exited with status 3 before answering this request (tools/call)"),
        ("r", -32000, "the MCP server exited with status 3 before answering this request (resources/read)"),
    ]
    assert proxy.session.guard.count("search", "[1]", "s1") == 1  # the call failed, and counts
    assert proxy.server_ended("exited with status 3").to_client == ()


def test_an_oversized_response_answers_the_waiting_side_with_an_error_naming_the_cap() -> None:
    from treellm.integrations.mcp import Oversized

    proxy = protocol(cap=100)
    call = {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "big", "arguments": {}}}
    proxy.from_client(line(call))
    relayed = proxy.from_server(Oversized(5000, b'{"jsonrpc": "2.0", "id": 5, "result": {"content": [{"te'))
    (answer,) = decoded(relayed.to_client)
    assert answer["id"] == 5 and answer["error"]["code"] == -32603
    assert answer["error"]["message"] == (
        "Response too large: the MCP server's response is 5000 bytes, over the proxy's cap of 100 bytes "
        "(max_message_bytes); it was not relayed"
    )
    caught = decoded(proxy.from_client(line({**call, "id": 6})).to_client)  # the failed call counts
    assert "pruned" in caught[0]["result"]["content"][0]["text"]

    proxy.from_server(line({"jsonrpc": "2.0", "id": 9, "method": "sampling/createMessage", "params": {}}))
    refused = proxy.from_client(Oversized(7000, b'{"jsonrpc": "2.0", "id": 9, "result": {"content": {"t'))
    assert refused.to_client == ()
    (to_server,) = decoded(refused.to_server)
    assert to_server["id"] == 9 and "the client's response is 7000 bytes" in to_server["error"]["message"]


def test_how_a_server_ended_is_said_in_one_phrase() -> None:
    from treellm.integrations.mcp import ServerExitedError, exit_reason

    assert exit_reason(3) == "exited with status 3"
    assert exit_reason(0) == "exited with status 0"
    assert exit_reason(-9) == "was killed by signal 9 (SIGKILL)"
    assert exit_reason(None) == "closed its output"
    error = ServerExitedError(exit_reason(-15), returncode=-15, failed_requests=1)
    assert str(error) == (
        "the MCP server was killed by signal 15 (SIGTERM) while the client was connected; "
        "1 waiting request got a JSON-RPC error"
    )


def test_a_cap_that_is_not_a_positive_integer_is_refused() -> None:
    from treellm.errors import ConfigError
    from treellm.integrations.mcp import run_mcp_proxy

    bad: Any
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="max_message_bytes: expected a positive number of bytes"):
            run_mcp_proxy([sys.executable, SERVER], max_message_bytes=bad)
