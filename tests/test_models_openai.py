"""OpenAICompatibleModel against a real loopback Chat Completions server (tests/openai_server.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import openai
import pytest
from openai_server import (
    Call,
    ErrorReply,
    OpenAIServer,
    StreamErrorReply,
    Turn,
    history_problem,
    slow,
)

from treellm.errors import ModelError
from treellm.models.base import (
    ChatModel,
    Message,
    ModelDelta,
    ModelRequest,
    ModelTurn,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    Usage,
    UsageDelta,
    assemble,
)
from treellm.models.openai import OpenAICompatibleModel

SEARCH = ToolSpec(
    "search",
    "Search the web.",
    {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
)
FETCH = ToolSpec("fetch", "Fetch a URL.", {"type": "object", "properties": {"url": {"type": "string"}}})
USER = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Find loop detection."}]


def request(messages: Sequence[Message] = USER, tools: Sequence[ToolSpec] = (SEARCH, FETCH)) -> ModelRequest:
    return ModelRequest(messages=messages, tools=tools, node_id="n1", depth=0)


def collect(model: OpenAICompatibleModel, req: ModelRequest | None = None) -> list[ModelDelta]:
    async def run() -> list[ModelDelta]:
        return [delta async for delta in model.stream(req or request())]

    return asyncio.run(run())


def turn_of(model: OpenAICompatibleModel, req: ModelRequest | None = None) -> ModelTurn:
    return assemble(collect(model, req))


def failure(model: OpenAICompatibleModel, req: ModelRequest | None = None) -> ModelError:
    with pytest.raises(ModelError) as caught:
        collect(model, req)
    return caught.value


def test_the_model_is_a_chat_model_and_reports_its_name() -> None:
    model = OpenAICompatibleModel("http://127.0.0.1:9/v1", "qwen2.5:7b")
    assert isinstance(model, ChatModel)
    assert model.model_name == "qwen2.5:7b"


def test_a_text_only_turn_streams_text_in_pieces() -> None:
    with OpenAIServer([Turn("Loop detection prunes repeated calls.")]) as server:
        deltas = collect(OpenAICompatibleModel(server.base_url, "gpt-test"))
    texts = [d for d in deltas if isinstance(d, TextDelta)]
    assert len(texts) > 1
    turn = assemble(deltas)
    assert turn.text == "Loop detection prunes repeated calls."
    assert turn.tool_calls == ()


def test_fragmented_tool_calls_assemble_into_names_ids_and_argument_text() -> None:
    calls = [
        Call("search", {"query": "loop detection", "limit": 10}, id="call_a"),
        Call("fetch", '{"url": "x"}'),
    ]
    with OpenAIServer([Turn("Let me look.", calls)]) as server:
        deltas = collect(OpenAICompatibleModel(server.base_url, "gpt-test"))
    fragments = [d for d in deltas if isinstance(d, ToolCallDelta)]
    assert len(fragments) > 6  # arguments really arrived in several pieces
    assert all(f.index is not None for f in fragments)
    assert [(f.index, f.id, f.name) for f in fragments if f.name] == [
        (0, "call_a", "search"),
        (1, "call_1_1", "fetch"),
    ]
    turn = assemble(deltas)
    assert turn.text == "Let me look."
    assert turn.tool_calls == (
        ToolCall("search", '{"query":"loop detection","limit":10}', "call_a"),
        ToolCall("fetch", '{"url": "x"}', "call_1_1"),
    )


@pytest.mark.parametrize("server_wide", [False, True])
def test_whole_calls_with_no_index_assemble_as_separate_calls(server_wide: bool) -> None:
    calls = [Call("search", {"query": "a"}, id="c1"), Call("search", {"query": "b"}, id="c2"), Call("fetch")]
    turn_script = Turn(tool_calls=calls, whole_calls=not server_wide)
    with OpenAIServer([turn_script], whole_calls=server_wide) as server:
        deltas = collect(OpenAICompatibleModel(server.base_url, "llama3.1"))
    fragments = [d for d in deltas if isinstance(d, ToolCallDelta)]
    assert [f.index for f in fragments] == [None, None, None]
    assert assemble(deltas).tool_calls == (
        ToolCall("search", '{"query":"a"}', "c1"),
        ToolCall("search", '{"query":"b"}', "c2"),
        ToolCall("fetch", "{}", "call_1_2"),
    )


def test_usage_is_reported_from_the_chunk_with_no_choices() -> None:
    with OpenAIServer([Turn("hi", usage=(123, 45))]) as server:
        deltas = collect(OpenAICompatibleModel(server.base_url, "gpt-test"))
    assert deltas[-1] == UsageDelta(Usage(123, 45))
    assert [d for d in deltas if isinstance(d, UsageDelta)] == [UsageDelta(Usage(123, 45))]


def test_the_request_carries_function_tools_stream_true_and_the_messages_verbatim() -> None:
    with OpenAIServer([Turn("ok")]) as server:
        model = OpenAICompatibleModel(server.base_url, "gpt-test", temperature=0.2, extra_body={"top_k": 20})
        collect(model)
    (body,) = server.bodies
    assert body["model"] == "gpt-test"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == USER
    assert body["tools"] == [SEARCH.to_openai(), FETCH.to_openai()]
    assert body["tools"][0] == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
    assert body["temperature"] == 0.2
    assert body["top_k"] == 20


def test_no_tools_and_no_temperature_leave_those_fields_out_and_a_missing_key_sends_a_placeholder() -> None:
    with OpenAIServer([Turn("ok")]) as server:
        collect(OpenAICompatibleModel(server.base_url, "gpt-test"), request(tools=()))
    (recorded,) = server.requests
    assert "tools" not in recorded.body
    assert "temperature" not in recorded.body
    assert recorded.headers["authorization"] == "Bearer not-needed"


def test_a_given_api_key_is_sent_as_a_bearer_token() -> None:
    with OpenAIServer([Turn("ok")]) as server:
        collect(OpenAICompatibleModel(server.base_url, "gpt-test", "sk-test-123"))
    assert server.requests[0].headers["authorization"] == "Bearer sk-test-123"


def test_a_429_then_success_is_retried_and_the_server_saw_two_requests() -> None:
    script = [
        ErrorReply(429, "Rate limit reached for requests", type="requests", retry_after_ms=5),
        Turn("ok"),
    ]
    with OpenAIServer(script) as server:
        turn = turn_of(OpenAICompatibleModel(server.base_url, "gpt-test"))
    assert turn.text == "ok"
    assert [r.status for r in server.requests] == [429, 200]


def test_a_persistent_500_gives_a_retryable_model_error_after_max_retries() -> None:
    script = [ErrorReply(500, "The server had an error", type="server_error", retry_after_ms=1)] * 3
    with OpenAIServer(script) as server:
        error = failure(OpenAICompatibleModel(server.base_url, "gpt-test", max_retries=2))
        base_url = server.base_url
    assert len(server.requests) == 3
    assert error.status == 500
    assert error.retryable is True
    assert "HTTP 500" in str(error) and "The server had an error" in str(error)
    assert "gave up after 2 retries" in str(error)
    assert base_url in str(error) and "gpt-test" in str(error)
    assert isinstance(error.__cause__, openai.InternalServerError)


def test_a_401_names_the_status_and_the_server_message_and_is_not_retried() -> None:
    message = "Incorrect API key provided: sk-bad. You can find your API key at the dashboard."
    with OpenAIServer([ErrorReply(401, message, code="invalid_api_key")]) as server:
        error = failure(OpenAICompatibleModel(server.base_url, "gpt-test", "sk-bad"))
    assert len(server.requests) == 1
    assert error.status == 401
    assert error.retryable is False
    assert "HTTP 401" in str(error) and message in str(error)
    assert "retries" not in str(error)
    assert isinstance(error.__cause__, openai.AuthenticationError)


def test_a_response_slower_than_the_timeout_gives_a_model_error_naming_the_timeout() -> None:
    with OpenAIServer([slow(5.0)]) as server:
        error = failure(OpenAICompatibleModel(server.base_url, "gpt-test", timeout=0.5, max_retries=0))
    assert "timed out after 0.5s" in str(error)
    assert error.status is None and error.retryable is True
    assert isinstance(error.__cause__, openai.APITimeoutError)


def test_a_stream_that_stalls_mid_turn_beyond_the_timeout_gives_a_model_error() -> None:
    with OpenAIServer([Turn("abcdefgh", chunk_delay=5.0)]) as server:
        error = failure(OpenAICompatibleModel(server.base_url, "gpt-test", timeout=0.5, max_retries=0))
    assert "timed out after 0.5s" in str(error)
    assert isinstance(error.__cause__, openai.APITimeoutError)


def test_an_unanswered_tool_call_is_rejected_by_the_server_and_surfaces_as_a_400() -> None:
    history = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": "{}"}},
                {"id": "call_2", "type": "function", "function": {"name": "fetch", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "results"},
        {"role": "user", "content": "go on"},
    ]
    with OpenAIServer([Turn("never sent")]) as server:
        error = failure(OpenAICompatibleModel(server.base_url, "gpt-test"), request(history))
    assert error.status == 400 and error.retryable is False
    assert "An assistant message with 'tool_calls' must be followed by tool messages" in str(error)
    assert "call_2" in str(error)
    assert [r.status for r in server.requests] == [400]
    assert server.remaining == 1  # a rejected request takes nothing from the script


def test_the_server_accepts_answered_calls_and_rejects_stray_or_duplicate_tool_messages() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    assistant = {"role": "assistant", "content": None, "tool_calls": [call]}
    answer = {"role": "tool", "tool_call_id": "c1", "content": "r"}
    user = {"role": "user", "content": "q"}
    assert history_problem([user, assistant, answer, user]) is None
    assert history_problem([user, answer]) is not None  # answers no call
    assert history_problem([user, assistant, answer, answer]) is not None  # answered twice
    assert history_problem([user, assistant]) is not None  # never answered


def test_a_server_that_rejects_stream_options_is_asked_again_without_it_and_that_is_remembered() -> None:
    with OpenAIServer([Turn("one"), Turn("two")], reject_stream_options=True) as server:
        model = OpenAICompatibleModel(server.base_url, "old-server")
        first = turn_of(model)
        second = turn_of(model)
    assert (first.text, second.text) == ("one", "two")
    assert first.usage is None  # without stream_options the server reports none
    assert [r.status for r in server.requests] == [400, 200, 200]
    assert ["stream_options" in body for body in server.bodies] == [True, False, False]


def test_an_error_event_inside_the_stream_becomes_a_model_error_after_the_text_so_far() -> None:
    got: list[ModelDelta] = []

    async def run(model: OpenAICompatibleModel) -> None:
        async for delta in model.stream(request()):
            got.append(delta)

    with OpenAIServer([StreamErrorReply("The model overloaded mid-answer", text="partial")]) as server:
        model = OpenAICompatibleModel(server.base_url, "gpt-test")
        with pytest.raises(ModelError, match="The model overloaded mid-answer") as caught:
            asyncio.run(run(model))
    assert assemble(got).text == "partial"
    assert caught.value.status is None
    assert isinstance(caught.value.__cause__, openai.APIError)


def test_a_refused_connection_gives_a_retryable_model_error() -> None:
    with OpenAIServer() as server:
        base_url = server.base_url
    error = failure(OpenAICompatibleModel(base_url, "gpt-test", max_retries=0))
    assert "connection failed" in str(error) and base_url in str(error)
    assert error.retryable is True and error.status is None
    assert isinstance(error.__cause__, openai.APIConnectionError)


def test_a_stream_closed_early_releases_its_connection() -> None:
    async def first_delta(model: OpenAICompatibleModel) -> ModelDelta:
        stream = model.stream(request())
        try:
            return await anext(stream)
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    with OpenAIServer([Turn("a long answer that is never read to the end")]) as server:
        model = OpenAICompatibleModel(server.base_url, "gpt-test")
        assert asyncio.run(first_delta(model)) == TextDelta("a lo")


def test_a_subprocess_can_use_the_in_process_server(tmp_path: Path) -> None:
    script = tmp_path / "client.py"
    script.write_text(
        textwrap.dedent(
            """
            import asyncio, json, sys
            from treellm.models.base import ModelRequest, assemble
            from treellm.models.openai import OpenAICompatibleModel

            async def main() -> None:
                model = OpenAICompatibleModel(sys.argv[1], "gpt-test")
                req = ModelRequest([{"role": "user", "content": "hi"}], (), "n1", 0)
                turn = assemble([d async for d in model.stream(req)])
                print(json.dumps({"text": turn.text, "calls": [c.name for c in turn.tool_calls]}))

            asyncio.run(main())
            """
        )
    )
    with OpenAIServer([Turn("from afar", [Call("search", {"query": "x"})])]) as server:
        result = subprocess.run(
            [sys.executable, str(script), server.base_url],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"text": "from afar", "calls": ["search"]}
    assert len(server.requests) == 1
