"""Where each instrumentation family keeps a span's role and a tool call's facts.

The one place (with :mod:`treellm.telemetry.semconv`, treellm's own names) where the
attribute names of other instrumentations are spelled. Families, in order of trust:

- **GenAI semantic conventions** (``gen_ai.*``, current and older names:
  ``gen_ai.tool.call.arguments`` / ``.result``, ``gen_ai.tool.args``,
  ``gen_ai.tool.output``, ``gen_ai.output``), which pydantic-ai, any-agent and others
  write; pydantic-ai's older logfire names (``tool_arguments``, ``tool_response``).
- **OpenInference** (``openinference.span.kind`` TOOL/LLM/AGENT/CHAIN, ``tool.name``,
  ``input.value`` / ``output.value``; ``tool.parameters`` holds the tool's JSON *schema*,
  never the call's values).
- **OpenLLMetry / Traceloop** (``traceloop.span.kind`` tool/agent/workflow/task,
  ``traceloop.entity.name``, ``traceloop.entity.input`` / ``.output`` in their
  ``{"inputs": ...}`` / ``{"outputs": ...}`` envelopes).
- **GenAI span events**: frameworks that keep a tool call's content out of the span's
  attributes record it in events on the tool span (Strands Agents: the arguments in
  ``gen_ai.tool.message`` ``content``, the result in ``gen_ai.choice`` ``message``; with the
  latest experimental conventions both in ``gen_ai.client.inference.operation.details``,
  as ``gen_ai.input.messages`` / ``gen_ai.output.messages`` parts ``tool_call`` /
  ``tool_call_response``). Each such source is a key of :data:`EVENT_SOURCES` that
  :func:`event_attributes` adds to the attributes; they come after every attribute in
  :data:`ARGUMENT_KEYS` and :data:`RESULT_KEYS`. Content blocks (``[{"text": ...}]``) are
  their text.
- **Result envelopes**: Google ADK's function response ``{"result": ...}`` is what it wraps.
- **LangChain message wrappers**: a tool result recorded as a serialised ``ToolMessage``
  (``{"lc": 1, ..., "kwargs": {"content": ..., "tool_call_id": ...}}``, its ``to_json``
  dict, or its Python repr ``content='...' name='...' tool_call_id='...'``) is the
  ``content`` inside, never the envelope with its unique ids.

Roles: ``tool`` (a tool call), ``llm`` (a model call), ``agent`` (an agent's invocation),
``workflow`` (the invocation of a chain, graph or workflow: GenAI ``invoke_workflow``,
OpenInference ``CHAIN``, Traceloop ``workflow``) and ``other``. An agent or a workflow is
an *invocation*: the outermost invocation of a trace that holds a model or tool call starts
a run (:mod:`treellm.derive.trees`), whatever the framework names its nodes.

A tool span that records no arguments (a framework's content capture off) is a call with
its **arguments unknown**: :attr:`ForeignSpan.arguments` is ``None``, never ``{}``, and the
store never takes it for a repeat of another call (:data:`CONTENT_SWITCHES` names each
framework's switch that records them). A **summary span** (:data:`SUMMARY_TOOLS`: Google
ADK's ``execute_tool (merged)`` over the calls of one turn) has role ``other``: the calls
it sums up have spans of their own.

Contract: pure functions of a span's name, its attributes as text (the store's
``MAP(VARCHAR, VARCHAR)``: scalars as text, arrays and maps as their JSON) and its
status code. They never raise on odd input: a value that cannot be read is skipped and
the next candidate is tried. Arguments are the call's *values*: a JSON schema
(``type: object`` with ``properties``, or ``$schema``) is never taken for them.
"""

from __future__ import annotations

import ast
import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson

from treellm.telemetry import semconv as sc

__all__ = [
    "AGENT_OPERATIONS",
    "INVOCATION_ROLES",
    "ARGUMENT_KEYS",
    "CALL_ID_KEYS",
    "CONTENT_SWITCHES",
    "DEFAULT_INTERNAL_TOOLS",
    "EVENT_SOURCES",
    "JSON_LITERALS",
    "JSON_SPACE",
    "JSON_STARTS",
    "LANGCHAIN_CALL_ID",
    "SUMMARY_TOOLS",
    "LLM_OPERATIONS",
    "MARKER_KEYS",
    "MODEL_KEYS",
    "NAME_PREFIXES",
    "PYTHON_LITERAL_STARTS",
    "RESULT_KEYS",
    "ROLE_KEYS",
    "TOOL_NAME_KEYS",
    "WORKFLOW_OPERATIONS",
    "ForeignSpan",
    "Role",
    "arguments_of",
    "content_switch",
    "event_attributes",
    "family",
    "parent_call",
    "read_span",
    "result_of",
    "role_of",
    "tool_name_of",
    "unwrap_result",
]

Role = Literal["agent", "workflow", "llm", "tool", "other"]
INVOCATION_ROLES: Final[frozenset[Role]] = frozenset({"agent", "workflow"})
"""The roles of a span that invokes an agent, a graph or a workflow (where a run may start)."""

# -- span kind ------------------------------------------------------------------------------
OPERATION: Final = sc.GEN_AI_OPERATION_NAME
OPENINFERENCE_KIND: Final = "openinference.span.kind"
TRACELOOP_KIND: Final = "traceloop.span.kind"
LOGFIRE_MESSAGE: Final = "logfire.msg"
LOGFIRE_SPAN_TYPE: Final = "logfire.span_type"

TOOL_OPERATIONS: Final = frozenset({"execute_tool"})
LLM_OPERATIONS: Final = frozenset({"chat", "text_completion", "generate_content", "call_llm", "completion"})
AGENT_OPERATIONS: Final = frozenset({"invoke_agent"})
WORKFLOW_OPERATIONS: Final = frozenset({"invoke_workflow"})
_OPENINFERENCE_ROLES: Final[Mapping[str, Role]] = {"TOOL": "tool", "LLM": "llm", "AGENT": "agent", "CHAIN": "workflow"}
# A Traceloop ``task`` is a step of a workflow, never the invocation of one.
_TRACELOOP_ROLES: Final[Mapping[str, Role]] = {"tool": "tool", "agent": "agent", "workflow": "workflow"}
_TRACELOOP_LLM_TYPE: Final = "llm.request.type"
_OPENINFERENCE_MODEL_CALL: Final = ("llm.output_messages.", "llm.token_count.")
# Span names that say the role when no attribute does (pydantic-ai before its GenAI names).
_NAME_ROLES: Final[tuple[tuple[str, Role], ...]] = (
    ("execute_tool ", "tool"),
    ("running tool", "tool"),
    ("invoke_agent ", "agent"),
    ("agent run", "agent"),
    ("chat ", "llm"),
)

# -- span events that carry a tool call's content ---------------------------------------------
INFERENCE_DETAILS: Final = "gen_ai.client.inference.operation.details"
_INPUT_MESSAGES: Final = "gen_ai.input.messages"
_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
EVENT_SOURCES: Final[Mapping[str, tuple[str, str]]] = {
    "event gen_ai.tool.message/content": ("gen_ai.tool.message", "content"),
    f"event {INFERENCE_DETAILS}/{_INPUT_MESSAGES}": (INFERENCE_DETAILS, _INPUT_MESSAGES),
    "event gen_ai.choice/message": ("gen_ai.choice", "message"),
    f"event {INFERENCE_DETAILS}/{_OUTPUT_MESSAGES}": (INFERENCE_DETAILS, _OUTPUT_MESSAGES),
}
"""Pseudo attribute keys (never an attribute's own name: they start with ``event ``) for the
attributes of span events that carry a tool call's content: the value of ``attribute`` in the
span's first event named ``event`` that has it. :func:`event_attributes` gives them; the store
reads them from the stored events the same way."""
_ARGUMENT_EVENTS: Final = ("event gen_ai.tool.message/content", f"event {INFERENCE_DETAILS}/{_INPUT_MESSAGES}")
_RESULT_EVENTS: Final = ("event gen_ai.choice/message", f"event {INFERENCE_DETAILS}/{_OUTPUT_MESSAGES}")

# -- tool call facts, each in order of trust -------------------------------------------------
TOOL_NAME_KEYS: Final = (sc.GEN_AI_TOOL_NAME, "tool.name", "tool_call.function.name")
TRACELOOP_NAME: Final = "traceloop.entity.name"
CALL_ID_KEYS: Final = (sc.GEN_AI_TOOL_CALL_ID, "tool_call.id", "tool.id", "tool_call_id")
ARGUMENT_KEYS: Final = (
    sc.GEN_AI_TOOL_CALL_ARGUMENTS,
    "gen_ai.tool.args",
    "tool_arguments",
    "tool_call.function.arguments",
    "input.value",
    "traceloop.entity.input",
    "tool.parameters",
    *_ARGUMENT_EVENTS,
)
RESULT_KEYS: Final = (
    sc.GEN_AI_TOOL_CALL_RESULT,
    "gen_ai.tool.output",
    "gen_ai.output",
    "tool_response",
    "output.value",
    "traceloop.entity.output",
    *_RESULT_EVENTS,
)
MODEL_KEYS: Final = (sc.GEN_AI_REQUEST_MODEL, "gen_ai.response.model", "llm.model_name")
AGENT_NAME_KEYS: Final = (sc.GEN_AI_AGENT_NAME, "agent.name", "agent_name", "graph.node.name")
INPUT_TOKEN_KEYS: Final = (sc.GEN_AI_USAGE_INPUT_TOKENS, "gen_ai.usage.prompt_tokens", "llm.token_count.prompt")
OUTPUT_TOKEN_KEYS: Final = (
    sc.GEN_AI_USAGE_OUTPUT_TOKENS,
    "gen_ai.usage.completion_tokens",
    "llm.token_count.completion",
)
EXCEPTION_EVENT: Final = "exception"

READ_KEYS: Final = frozenset(
    {OPERATION, OPENINFERENCE_KIND, TRACELOOP_KIND, TRACELOOP_NAME, _TRACELOOP_LLM_TYPE, LOGFIRE_MESSAGE,
     LOGFIRE_SPAN_TYPE, *TOOL_NAME_KEYS, *CALL_ID_KEYS, *ARGUMENT_KEYS, *RESULT_KEYS, *MODEL_KEYS, *AGENT_NAME_KEYS}
)  # fmt: skip
"""Every attribute :func:`read_span` looks up by name (its value or its presence)."""
PRESENCE_PREFIXES: Final = ("gen_ai.", *_OPENINFERENCE_MODEL_CALL)
"""The key prefixes whose presence :func:`read_span` asks about (any key starting with one).

:func:`read_span`'s answer is a function of the span's name, status code, whether
``exception`` is among its event names, the items of :data:`READ_KEYS` and, for each
prefix here, whether some key starts with it: nothing else of the attributes. So a reader
may hand it only those items plus one key per prefix present (the prefix itself, which is
never looked up by name), and equal such inputs have equal answers (the store memoises them)."""

ROLE_KEYS: Final = (OPERATION, OPENINFERENCE_KIND, TRACELOOP_KIND, _TRACELOOP_LLM_TYPE)
"""The attributes whose values :func:`role_of` reads."""
MARKER_KEYS: Final = (OPENINFERENCE_KIND, TRACELOOP_KIND, TRACELOOP_NAME, LOGFIRE_MESSAGE, LOGFIRE_SPAN_TYPE)
"""The attributes whose presence :func:`role_of` asks about (with :data:`PRESENCE_PREFIXES`)."""
NAME_PREFIXES: Final = tuple(prefix for prefix, _ in _NAME_ROLES)
"""The span-name prefixes that say a role, in order: :func:`role_of` reads nothing else of the name,
so a reader may hand it the first of them that the name starts with (or ``""``) instead."""

DEFAULT_INTERNAL_TOOLS: Final = ("final_answer", "final_result")
"""Framework-internal tools (smolagents' ``final_answer``, pydantic-ai's output tool
``final_result``): marked ``internal`` at ingest and left out of counts and tuning."""

SUMMARY_TOOLS: Final = frozenset({"(merged tools)"})
"""Tool names of summary spans, which are not calls: Google ADK's ``execute_tool (merged)``
records the calls of one turn once more, after each ran in a span of its own."""

_SEMANTIC_KERNEL: Final = "SEMANTICKERNEL_EXPERIMENTAL_GENAI_ENABLE_OTEL_DIAGNOSTICS_SENSITIVE=true"
CONTENT_SWITCHES: Final[tuple[tuple[str, str, str], ...]] = (
    ("strands", "Strands Agents", "OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental"),
    ("gcp.vertex.agent", "Google ADK", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY"),
    ("autogen", "AutoGen", "no switch of its own; trace it with openinference-instrumentation-autogen-agentchat"),
    (
        "openinference.instrumentation",
        "OpenInference",
        "OPENINFERENCE_HIDE_INPUTS=false, OPENINFERENCE_HIDE_OUTPUTS=false",
    ),
    ("opentelemetry.instrumentation", "OpenLLMetry", "TRACELOOP_TRACE_CONTENT=true"),
    ("pydantic-ai", "Pydantic AI", "InstrumentationSettings(include_content=True)"),
    ("semantic_kernel", "Semantic Kernel", _SEMANTIC_KERNEL),
    ("microsoft.semantickernel", "Semantic Kernel", _SEMANTIC_KERNEL),
    ("openai.agents", "OpenAI Agents SDK", "RunConfig(trace_include_sensitive_data=True)"),
)
"""(instrumentation scope name prefix, framework, the switch that records tool-call content),
matched case-insensitively in order: what the report names for calls whose arguments or
results are unknown (:func:`content_switch`)."""
_GENERIC_SWITCH: Final = ("GenAI instrumentation", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true")


def content_switch(scope_name: str | None) -> tuple[str, str]:
    """(framework, switch) that records tool-call content for spans of the instrumentation
    scope ``scope_name``; the OpenTelemetry GenAI instrumentations' switch when it is unknown."""
    scope = (scope_name or "").lower()
    for prefix, framework, switch in CONTENT_SWITCHES:
        if scope.startswith(prefix):
            return framework, switch
    return _GENERIC_SWITCH


def event_attributes(events: Sequence[tuple[str, Mapping[str, str]]]) -> dict[str, str]:
    """The pseudo attributes of :data:`EVENT_SOURCES` that a span's ``(name, attributes)``
    events hold: for each source, its attribute in the first event of its name that has it."""
    out: dict[str, str] = {}
    for key, (event, attribute) in EVENT_SOURCES.items():
        found = next((attrs[attribute] for name, attrs in events if name == event and attribute in attrs), None)
        if found is not None:
            out[key] = found
    return out


_LANGCHAIN_REPR = re.compile(r"""^content=(?P<q>['"])(?P<content>.*?)(?P=q)(?: [a-z_]+=|$)""", re.DOTALL)


@dataclass(frozen=True, slots=True)
class ForeignSpan:
    """What a span from another framework says, read through its family's conventions."""

    role: Role
    family: str | None
    tool_name: str | None = None
    call_id: str | None = None
    arguments: str | None = None
    result: str | None = None
    model: str | None = None
    agent_name: str | None = None
    failed: bool = False


def family(attributes: Mapping[str, str]) -> str | None:
    """The instrumentation family of a span: ``openinference``, ``traceloop``, ``logfire``,
    ``genai`` or ``None`` when the span carries none of their markers."""
    if OPENINFERENCE_KIND in attributes:
        return "openinference"
    if TRACELOOP_KIND in attributes or TRACELOOP_NAME in attributes:
        return "traceloop"
    if LOGFIRE_MESSAGE in attributes or LOGFIRE_SPAN_TYPE in attributes:
        return "logfire"
    if any(key.startswith("gen_ai.") for key in attributes):
        return "genai"
    return None


def _role(name: str, attributes: Mapping[str, str]) -> Role:
    operation = attributes.get(OPERATION)
    if operation in TOOL_OPERATIONS:
        return "tool"
    if operation in LLM_OPERATIONS:
        return "llm"
    if operation in AGENT_OPERATIONS:
        return "agent"
    if operation in WORKFLOW_OPERATIONS:
        return "workflow"
    role = _OPENINFERENCE_ROLES.get(str(attributes.get(OPENINFERENCE_KIND, "")).upper())
    if role == "llm" and not any(key.startswith(_OPENINFERENCE_MODEL_CALL) for key in attributes):
        return "other"  # an LLM-kind step that asked no model (LlamaIndex's _prepare_chat_with_tools)
    if role is not None:
        return role
    kind = attributes.get(TRACELOOP_KIND)
    if kind is not None:
        return _TRACELOOP_ROLES.get(kind, "other")
    if attributes.get(_TRACELOOP_LLM_TYPE) in {"chat", "completion"}:
        return "llm"
    for prefix, named in _NAME_ROLES:
        if name.startswith(prefix):
            return named
    return "other"


def _first(attributes: Mapping[str, str], keys: Sequence[str]) -> str | None:
    for key in keys:
        value = attributes.get(key)
        if value not in (None, ""):
            return value
    return None


JSON_SPACE: Final = " \t\n\r"
"""The whitespace JSON allows before a text's value."""
JSON_STARTS: Final = frozenset('{["-0123456789')
"""The characters a JSON text can start with after its leading whitespace (:data:`JSON_SPACE`),
but for the literals ``true``, ``false`` and ``null`` (:data:`JSON_LITERALS`): any other text is
not JSON, and is told so without the parser's error (most results are plain text, each distinct)."""
JSON_LITERALS: Final = ("true", "false", "null")
PYTHON_LITERAL_STARTS: Final = "{[("
"""The first characters of a text that is tried as a Python literal when it is no JSON (LangChain
records dicts by ``str()``)."""
LANGCHAIN_CALL_ID: Final = " tool_call_id="
"""What a LangChain message's ``repr`` holds when it gives a call id (:func:`unwrap_result`)."""


def _may_be_json(text: str) -> bool:
    head = text.lstrip(JSON_SPACE)
    return head[:1] in JSON_STARTS or head.startswith(JSON_LITERALS)


def _loads(text: str) -> Any:
    """JSON, else a Python literal (LangChain records dicts by ``str()``), else the text."""
    if _may_be_json(text):
        try:
            return orjson.loads(text)
        except (orjson.JSONDecodeError, RecursionError):
            pass
    if len(text) < 1_000_000 and text[:1] in PYTHON_LITERAL_STARTS:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            pass
    return text


def _is_schema(value: Any, *, loose: bool = False) -> bool:
    """A JSON schema (``type: object`` with ``properties``, or ``$schema``); ``loose`` also
    takes a map of parameter specs (``{"query": {"type": "string", ...}}``, smolagents)."""
    if not isinstance(value, Mapping):
        return False
    if "$schema" in value:
        return True
    properties = value.get("properties")
    if value.get("type") == "object" and isinstance(properties, Mapping):
        return True
    return loose and bool(value) and all(isinstance(v, Mapping) and "type" in v for v in value.values())


_CALL_ENVELOPE_KEYS: Final = frozenset({"args", "kwargs", "sanitize_inputs_outputs"})


def _dump(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


_TRACELOOP_INPUT_KEYS: Final = frozenset({"inputs", "input_str", "tags", "metadata", "kwargs"})
_TRACELOOP_OUTPUT_KEYS: Final = frozenset({"output", "outputs", "kwargs", "metadata", "tags"})


def _envelope_call_id(value: Mapping[str, Any]) -> str | None:
    kwargs = value.get("kwargs")
    call_id = kwargs.get("tool_call_id") if isinstance(kwargs, Mapping) else None
    return call_id if isinstance(call_id, str) else None


def _argument_value(key: str, text: str) -> tuple[Any | None, str | None]:
    """(the call's values, a call id found in the envelope) from one candidate attribute;
    the values are ``None`` when it holds none."""
    value = _loads(text)
    call_id = None
    if key == _ARGUMENT_EVENTS[1]:
        part = _message_part(value, "tool_call")
        if part is None:
            return None, None
        found = part.get("id")
        call_id = found if isinstance(found, str) else None
        value = part.get("arguments")
        if value is None:
            return None, None
        if isinstance(value, str):
            value = _loads(value)
    if isinstance(value, Mapping) and "inputs" in value and len(value) > 1 and set(value) <= _TRACELOOP_INPUT_KEYS:
        call_id = _envelope_call_id(value)  # Traceloop's {"inputs": ..., "input_str": ..., "kwargs": ...}
        value = value["inputs"]
    if isinstance(value, Mapping) and set(value) == {"input"} and isinstance(value["input"], str):
        inner = _loads(value["input"])  # LangChain's {"input": "<the args>"}
        if isinstance(inner, Mapping):
            value = inner
    if isinstance(value, Mapping) and "kwargs" in value and set(value) <= _CALL_ENVELOPE_KEYS:
        # smolagents' {"args": [...], "sanitize_inputs_outputs": ..., "kwargs": {...}}
        args, kwargs = value.get("args") or [], value.get("kwargs") or {}
        value = kwargs if kwargs or not args else (args[0] if len(args) == 1 else args)
    if _is_schema(value, loose=key == "tool.parameters"):
        return None, None
    if isinstance(value, Mapping):
        value = {k: v for k, v in value.items() if k not in {"callbacks", "run_manager", "config"}}
    return value, call_id


_MEMO_CHARS: Final = 4096
"""Texts up to this long are read once per distinct text (memoised: a span's facts are a pure
function of its texts, and an agent's repeated calls and results repeat them); longer ones
are read afresh, so the memos stay small (at most 8,192 entries each)."""


def _arguments_of(candidates: tuple[str | None, ...]) -> tuple[str | None, str | None]:
    for key, text in zip(ARGUMENT_KEYS, candidates, strict=True):
        if text is None or text == "":
            continue
        value, call_id = _argument_value(key, text)
        if value is not None:
            return _dump(value), call_id
    return None, None


_arguments_memo = functools.lru_cache(maxsize=8192)(_arguments_of)


def _arguments(attributes: Mapping[str, str]) -> tuple[str | None, str | None]:
    candidates = tuple(attributes.get(key) for key in ARGUMENT_KEYS)
    if sum(len(text) for text in candidates if text is not None) <= _MEMO_CHARS:
        return _arguments_memo(candidates)
    return _arguments_of(candidates)


def _langchain_message(value: Any) -> tuple[Any, str | None] | None:
    """(content, tool_call_id) of a serialised LangChain message, else ``None``."""
    if not isinstance(value, Mapping):
        return None
    if value.get("lc") == 1 and isinstance(value.get("kwargs"), Mapping):
        kwargs = value["kwargs"]
        return kwargs.get("content"), kwargs.get("tool_call_id")
    if value.get("type") == "tool" and isinstance(value.get("data"), Mapping):  # message_to_dict
        data = value["data"]
        return data.get("content"), data.get("tool_call_id")
    if value.get("type") == "tool" and "content" in value and "tool_call_id" in value:
        return value.get("content"), value.get("tool_call_id")
    return None


def _message_part(value: Any, kind: str) -> Mapping[str, Any] | None:
    """The first part of type ``kind`` in GenAI messages (``[{"role", "parts": [{"type", ...}]}]``)."""
    if not isinstance(value, list):
        return None
    for message in value:
        parts = message.get("parts") if isinstance(message, Mapping) else None
        for part in parts if isinstance(parts, list) else ():
            if isinstance(part, Mapping) and part.get("type") == kind:
                return part
    return None


def _content_text(value: Any) -> str | None:
    """The text of content blocks (``[{"text": ...}, ...]``, each at most a ``type`` besides), else None."""
    if not isinstance(value, list) or not value:
        return None
    texts = []
    for block in value:
        if not (isinstance(block, Mapping) and isinstance(block.get("text"), str) and set(block) <= {"text", "type"}):
            return None
        texts.append(block["text"])
    return "\n".join(texts)


def parent_call(parent_attributes: Mapping[str, str], tool_name: str | None) -> tuple[str, str | None] | None:
    """(arguments, call id) of the one call a parent span ran, when the parent records it
    (LangGraph's ``tools`` node: ``input.value`` = ``[{"name", "args", "id", "type": "tool_call"}]``);
    used when the tool span itself records a bare value instead of its keyed arguments."""
    text = parent_attributes.get("input.value")
    if not text or not text.startswith("["):
        return None
    value = _loads(text)
    if not (isinstance(value, list) and len(value) == 1 and isinstance(value[0], Mapping)):
        return None
    call = value[0]
    if call.get("type") != "tool_call" or not isinstance(call.get("args"), Mapping):
        return None
    if tool_name is not None and call.get("name") != tool_name:
        return None
    call_id = call.get("id")
    return _dump(dict(call["args"])), call_id if isinstance(call_id, str) else None


def unwrap_result(text: str) -> tuple[str, str | None]:
    """(the result's content, a call id found in its envelope) of a recorded tool result."""
    value = _loads(text)
    if isinstance(value, str):  # plain text, as most results are: no envelope below reads a text
        return _text_result(value)
    if isinstance(value, Mapping) and "kwargs" in value and set(value) <= _TRACELOOP_OUTPUT_KEYS:
        for inner in ("outputs", "output"):  # Traceloop's envelope
            if inner in value:
                value = value[inner]
                break
    if isinstance(value, Mapping) and "raw_output" in value and "tool_name" in value:  # LlamaIndex ToolOutput
        value = value["raw_output"]
    if isinstance(value, Mapping) and set(value) == {"result"}:  # Google ADK's function response
        value = value["result"]
    response = _message_part(value, "tool_call_response")  # GenAI output messages
    if response is not None:
        found = response.get("id")
        value, envelope = response.get("response"), found if isinstance(found, str) else None
        if isinstance(value, str):
            value = _loads(value)
        blocks = _content_text(value)
        return (blocks if blocks is not None else _dump(value)), envelope
    blocks = _content_text(value)
    if blocks is not None:
        return blocks, None
    found = _langchain_message(value)
    if found is not None:
        content, call_id = found
        return _dump(content), call_id
    if isinstance(value, str):
        return _text_result(value)
    return _dump(value), None


def _text_result(value: str) -> tuple[str, str | None]:
    """A result that is text: a LangChain message's ``repr`` gives its content and call id."""
    match = _LANGCHAIN_REPR.match(value)
    if match and LANGCHAIN_CALL_ID in value:
        call = re.search(r" tool_call_id=(['\"])(.*?)\1", value)
        return match.group("content"), call.group(2) if call else None
    return value, None


_unwrap_memo = functools.lru_cache(maxsize=8192)(unwrap_result)


def _result(attributes: Mapping[str, str]) -> tuple[str | None, str | None]:
    text = next((attributes[key] for key in RESULT_KEYS if attributes.get(key) is not None), None)
    if text is None:
        return None, None
    return _unwrap_memo(text) if len(text) <= _MEMO_CHARS else unwrap_result(text)


def _tool_name(name: str, attributes: Mapping[str, str]) -> str | None:
    found = _first(attributes, TOOL_NAME_KEYS)
    if found is not None:
        return found
    if TRACELOOP_NAME in attributes:
        return attributes[TRACELOOP_NAME]
    for prefix in ("execute_tool ", "running tool: "):
        if name.startswith(prefix):
            return name[len(prefix) :].strip() or None
    return None


def role_of(name: str, attributes: Mapping[str, str]) -> tuple[Role, str | None]:
    """(role, family) of a span, as :func:`read_span` says them: a function of the name's first
    :data:`NAME_PREFIXES` match, the values of :data:`ROLE_KEYS`, the presence of
    :data:`MARKER_KEYS` and of a key starting with each of :data:`PRESENCE_PREFIXES`."""
    return _role(name, attributes), family(attributes)


def tool_name_of(name: str, attributes: Mapping[str, str]) -> str | None:
    """The tool name :func:`read_span` gives a tool span: a function of the values of
    :data:`TOOL_NAME_KEYS`, of :data:`TRACELOOP_NAME` (and its presence) and of the name."""
    return _tool_name(name, attributes)


def arguments_of(candidates: tuple[str | None, ...]) -> tuple[str | None, str | None]:
    """(arguments, a call id found in their envelope) that :func:`read_span` gives a tool span
    whose values of :data:`ARGUMENT_KEYS`, in that order, are ``candidates``."""
    if sum(len(text) for text in candidates if text is not None) <= _MEMO_CHARS:
        return _arguments_memo(candidates)
    return _arguments_of(candidates)


def result_of(text: str | None) -> tuple[str | None, str | None]:
    """(result, a call id found in its envelope) that :func:`read_span` gives a tool span whose
    first value of :data:`RESULT_KEYS` present (an empty one is an empty result) is ``text`` (None: none)."""
    if text is None:
        return None, None
    return _unwrap_memo(text) if len(text) <= _MEMO_CHARS else unwrap_result(text)


def read_span(
    name: str,
    attributes: Mapping[str, str],
    *,
    status_code: int = 0,
    event_names: Sequence[str] = (),
    is_failure: Callable[[str], bool] | None = None,
) -> ForeignSpan:
    """The role and, for a tool span, the call's facts (see the module docstring)."""
    role = _role(name, attributes)
    fam = family(attributes)
    failed = status_code == 2 or EXCEPTION_EVENT in event_names
    if role == "tool" and _tool_name(name, attributes) in SUMMARY_TOOLS:
        return ForeignSpan(role="other", family=fam, failed=failed)
    if role == "tool":
        result, envelope_id = _result(attributes)
        if result is not None and is_failure is not None and is_failure(result):
            failed = True
        arguments, argument_id = _arguments(attributes)
        return ForeignSpan(
            role="tool",
            family=fam,
            tool_name=_tool_name(name, attributes),
            call_id=_first(attributes, CALL_ID_KEYS) or envelope_id or argument_id,
            arguments=arguments,
            result=result,
            failed=failed,
        )
    if role == "llm":
        return ForeignSpan(role="llm", family=fam, model=_first(attributes, MODEL_KEYS), failed=failed)
    if role == "agent":
        return ForeignSpan(role="agent", family=fam, agent_name=_first(attributes, AGENT_NAME_KEYS), failed=failed)
    return ForeignSpan(role=role, family=fam, failed=failed)
