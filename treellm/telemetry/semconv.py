"""Every span, event, attribute and metric name treellm emits, in one place.

The ``gen_ai.*`` names follow the OpenTelemetry GenAI semantic conventions at
:data:`GENAI_SEMCONV_VERSION` (the conventions moved to their own repository,
open-telemetry/semantic-conventions-genai, in 2026, and are still at
Development status). They are kept as our own string constants rather than
imported from ``opentelemetry-semantic-conventions``, whose GenAI names are
deprecated and move between releases. The ``treellm.*`` names are ours; they
are what the store and the analysis read, so renaming one is a schema change.
"""

from __future__ import annotations

from typing import Final

GENAI_SEMCONV_VERSION: Final = "semantic-conventions-genai v0.1.0 (after semantic-conventions v1.41.0)"
SCHEMA_URL: Final = "https://opentelemetry.io/schemas/1.45.0"
INSTRUMENTATION_NAME: Final = "treellm"

# -- span names and operations ---------------------------------------------------------
OP_INVOKE_AGENT: Final = "invoke_agent"
OP_CHAT: Final = "chat"
OP_EXECUTE_TOOL: Final = "execute_tool"
OP_COLLAPSE: Final = "collapse"
SPAN_COLLAPSE: Final = "collapse"

# -- GenAI attributes ---------------------------------------------------------------------
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
GEN_AI_TOOL_TYPE: Final = "gen_ai.tool.type"
GEN_AI_TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"
ERROR_TYPE: Final = "error.type"

# -- treellm: run ---------------------------------------------------------------------------
RUN_ID: Final = "treellm.run.id"
RUN_TASK: Final = "treellm.run.task"
RUN_OUTCOME: Final = "treellm.run.outcome"
RUN_ANSWER: Final = "treellm.run.answer"
RUN_GUARD: Final = "treellm.run.guard"
RUN_NODES: Final = "treellm.run.nodes"
RUN_MAX_DEPTH: Final = "treellm.run.max_depth"
RUN_PRUNED: Final = "treellm.run.pruned"
RUN_LOOPS: Final = "treellm.run.loops_detected"
RUN_RETRIES: Final = "treellm.run.retries"
CONFIG_MAX_REPEATS: Final = "treellm.config.max_repeats_per_signature"
CONFIG_NODE_BUDGET: Final = "treellm.config.node_budget"
CONFIG_DEPTH_LIMIT: Final = "treellm.config.depth_limit"
CONFIG_BRANCHING: Final = "treellm.config.branching"
CONFIG_SHADOW: Final = "treellm.config.shadow"
CONFIG_COLLAPSE_THRESHOLD: Final = "treellm.config.collapse_threshold"
SKILL_NAME: Final = "treellm.skill.name"

# -- treellm: every node span ---------------------------------------------------------------
NODE_ID: Final = "treellm.node.id"
NODE_KIND: Final = "treellm.node.kind"
NODE_DEPTH: Final = "treellm.node.depth"
NODE_PARENT_ID: Final = "treellm.node.parent_id"
NODE_SKILL_STACK: Final = "treellm.node.skill_stack"
NODE_STATUS: Final = "treellm.node.status"

# -- treellm: think nodes -------------------------------------------------------------------
THINK_TEXT: Final = "treellm.think.text"
THINK_REQUESTED_CALLS: Final = "treellm.think.requested_calls"
THINK_ACCEPTED_CALLS: Final = "treellm.think.accepted_calls"
THINK_ENDED_BY: Final = "treellm.think.ended_by"

# -- treellm: tool nodes ---------------------------------------------------------------------
TOOL_SIGNATURE: Final = "treellm.tool.signature"
TOOL_ORDINAL: Final = "treellm.tool.ordinal"
TOOL_LIMIT: Final = "treellm.tool.limit"
TOOL_LIMIT_SOURCE: Final = "treellm.tool.limit_source"
TOOL_RESULT_HASH: Final = "treellm.tool.result_hash"
TOOL_ATTEMPTS: Final = "treellm.tool.attempts"
TOOL_SHADOW_CAUGHT: Final = "treellm.tool.shadow_caught"
TOOL_ARGS_VALID: Final = "treellm.tool.arguments_valid"
TOOL_EARLIER_NODE_IDS: Final = "treellm.tool.earlier_node_ids"
INGEST_ORPHAN_PARENT: Final = "treellm.ingest.orphan_parent"

# -- treellm: collapse nodes -----------------------------------------------------------------
COLLAPSE_COMPRESSED: Final = "treellm.collapse.compressed"
COLLAPSE_SIZE_BEFORE: Final = "treellm.collapse.size_before"
COLLAPSE_SIZE_AFTER: Final = "treellm.collapse.size_after"
COLLAPSE_MERGED: Final = "treellm.collapse.merged"
LINK_RELATION: Final = "treellm.link.relation"

# -- span events ------------------------------------------------------------------------------
EVENT_LOOP_DETECTED: Final = "loop:detected"
EVENT_TOOL_RETRY: Final = "tool:retry"
EVENT_BUDGET_EXHAUSTED: Final = "budget:exhausted"
EVENT_TASK_COMPLETE: Final = "task:complete"

LOOP_TOOL: Final = "treellm.loop.tool"
LOOP_SIGNATURE: Final = "treellm.loop.signature"
LOOP_CALL_ID: Final = "treellm.loop.call_id"
LOOP_COUNT: Final = "treellm.loop.count"
LOOP_LIMIT: Final = "treellm.loop.limit"
LOOP_LIMIT_SOURCE: Final = "treellm.loop.limit_source"
LOOP_ACTION: Final = "treellm.loop.action"
LOOP_SHADOW: Final = "treellm.loop.shadow"
LOOP_ARGUMENTS: Final = "treellm.loop.arguments"
LOOP_EARLIER_NODE_IDS: Final = "treellm.loop.earlier_node_ids"
LOOP_EARLIER_SPAN_IDS: Final = "treellm.loop.earlier_span_ids"

RETRY_ATTEMPT: Final = "treellm.retry.attempt"
RETRY_ERROR: Final = "treellm.retry.error"
RETRY_DELAY_S: Final = "treellm.retry.delay_s"

BUDGET_KIND: Final = "treellm.budget.kind"
BUDGET_LIMIT: Final = "treellm.budget.limit"
BUDGET_USED: Final = "treellm.budget.used"

# -- metrics -------------------------------------------------------------------------------------
METRIC_TOOL_CALLS: Final = "treellm.tool.calls"
METRIC_LOOP_DETECTIONS: Final = "treellm.loop.detections"
METRIC_TOOL_DURATION: Final = "treellm.tool.duration"
METRIC_ATTR_STATUS: Final = "treellm.tool.status"
