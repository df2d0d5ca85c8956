"""``treellm mcp-proxy``: the SDK's own client talks to the proxy, which runs tests/mcp_server.py.

Every call that reaches the server is appended to a file (``$MCP_TEST_CALLS``), so each test
counts exactly which calls the proxy let through.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytest.importorskip("mcp")

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

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

    def calls(self) -> list[str]:
        if not self.calls_file.exists():
            return []
        return self.calls_file.read_text(encoding="utf-8").splitlines()

    @asynccontextmanager
    async def session(self, *options: str, proxy: bool = True) -> AsyncIterator[ClientSession]:
        server = [sys.executable, SERVER]
        command = [sys.executable, "-m", "treellm", "mcp-proxy", *options, "--", *server] if proxy else server
        params = StdioServerParameters(
            command=command[0], args=command[1:], env={"MCP_TEST_CALLS": str(self.calls_file)}
        )
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session

    def run(self, body: Callable[[ClientSession], Awaitable[T]], *options: str, proxy: bool = True) -> T:
        async def go() -> T:
            async with self.session(*options, proxy=proxy) as session:
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
    assert [tool["name"] for tool in proxied[1]["tools"]] == ["search", "flaky"]


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
