"""Runs, trees and ordinals of the commonest traces, set-based: SQL over every trace of a batch at once.

:mod:`treellm.derive.trees` holds the rules (pure Python, a trace at a time). Most traces of other
frameworks have one shape, for which those rules reduce to window functions: **a flat trace**,

- whose one root (the one span without a parent) is an invocation (an agent or a workflow),
- with no sub-agent below it (invocations nested in the root are graph nodes, subgraphs, or an agent
  span of the root's own agent: no agent span below the root has a name, or all have the root's),
- with every other span below that root (its parent chain reaches it: no missing parent, no cycle,
  no span a converter flagged as an orphan),
- with no tool call that records a bare value or no arguments (a call that may be keyed from its
  parent: ``foreign.py``; a call whose arguments stay unknown is such a call),
- with no counted call that changes state (no count restarts).

Such a trace is one run with one path (the root's): no sub-agent, no floating span, and the root the
one outermost invocation. Its think nodes
are its LLM spans in time order, each the child of the one before; its tool nodes hang from the
think node before them; a counted call's ordinal is 1 + the earlier calls of its key; a span that
is no node is anchored at the last think node that started no later than it. Every other trace goes
to :func:`treellm.derive.trees.place_trace`, and a test pins both to the same answer on traces of
every shape (``tests/test_trees_sql.py``).

What is not SQL runs once per distinct value (``foreign.py``): a call's stored key and targets
(canonical argument text, the shell classifier) per distinct tool and argument text.
"""

from __future__ import annotations

from typing import Final

__all__ = ["EARLIER_KEPT", "FLAT_KEYED", "FLAT_PLACED", "FLAT_TRACES", "KEPT_TARGETS", "KEY_INPUTS", "ROLE_OPERATIONS"]

EARLIER_KEPT: Final = 64
"""A counted call of another framework stores its most recent earlier identical calls, at most
this many (``earlier_node_ids``; ``ordinal - 1`` says how many there are): a repeat is judged
against its chain (``repeat_chain``), so what a loop stores grows with its calls, not with
their square."""

ROLE_OPERATIONS: Final = {"tool": "execute_tool", "llm": "chat", "agent": "invoke_agent", "workflow": "invoke_workflow"}
"""The ``operation`` stored for each role of other frameworks' spans; the placement reads a span's
role back from it (any other operation: ``other``)."""
_INVOKES = f"('{ROLE_OPERATIONS['agent']}', '{ROLE_OPERATIONS['workflow']}')"
_ROLE = (
    "CASE operation "
    + " ".join(f"WHEN '{operation}' THEN '{role}'" for role, operation in ROLE_OPERATIONS.items())
    + " ELSE 'other' END"
)
"""A span's role as the placement reads it (``foreign._ROLES``)."""
_AGENT = f"operation = '{ROLE_OPERATIONS['agent']}'"
_NO_SUB_AGENT = (
    f"count(*) FILTER (WHERE parent_span_id IS NOT NULL AND {_AGENT} AND coalesce(agent_name, '') <> '') = 0 "
    f"OR (count(*) FILTER (WHERE parent_span_id IS NULL AND {_AGENT}) = 1 "
    f"    AND count(*) FILTER (WHERE {_AGENT} AND coalesce(agent_name, '') = '') = 0 "
    f"    AND count(DISTINCT agent_name) FILTER (WHERE {_AGENT}) = 1)"
)
"""No span below the root starts a path of its own (a sub-agent: an agent span with a name other than
its enclosing agent's, ``trees._scope_of``): no agent span below the root has a name, or every agent
span, the root among them, has the root's name."""
_TOOL = f"operation = '{ROLE_OPERATIONS['tool']}'"
_BARE = f"{_TOOL} AND parent_span_id IS NOT NULL AND NOT starts_with(coalesce(arguments, ''), '{{')"
"""A tool call that may take its key from its parent (``foreign._keyed_from_parents``; a superset)."""

FLAT_TRACES: Final = f"""
CREATE OR REPLACE TEMP TABLE flat_traces AS
WITH RECURSIVE shaped AS (
    SELECT trace_id, count(*) AS n FROM place_rows GROUP BY trace_id
    HAVING count(*) FILTER (WHERE parent_span_id IS NULL) = 1
       AND count(*) FILTER (WHERE parent_span_id IS NULL AND operation IN {_INVOKES}) = 1
       AND ({_NO_SUB_AGENT})
       AND NOT bool_or(flagged) AND NOT bool_or({_BARE})
),
reached(trace_id, span_id) AS (
    SELECT trace_id, span_id FROM place_rows SEMI JOIN shaped USING (trace_id) WHERE parent_span_id IS NULL
    UNION ALL
    SELECT c.trace_id, c.span_id FROM reached r
    JOIN place_rows c ON c.trace_id = r.trace_id AND c.parent_span_id = r.span_id
)
SELECT s.trace_id FROM shaped s JOIN (SELECT trace_id, count(*) AS n FROM reached GROUP BY trace_id) r
    ON r.trace_id = s.trace_id AND r.n = s.n
"""
"""The traces of the flat shape (see the module docstring), but for the state changes (:data:`FLAT_KEYED`)."""

_COUNTED = f"{_TOOL} AND tool_name IS NOT NULL AND NOT internal"
_KEPT = "call_digest IS NOT NULL AND call_targets IS NOT NULL"
_FLAT_ROWS = "FROM place_rows SEMI JOIN flat_traces USING (trace_id)"
KEY_INPUTS: Final = f"SELECT DISTINCT tool_name, arguments {_FLAT_ROWS} WHERE {_COUNTED} AND NOT ({_KEPT})"
"""Each distinct (tool, argument text) of the flat traces' counted calls without a stored key:
Python derives its key and targets once (``flat_keys``: k_tool, k_args, k_digest, k_targets, k_changes)."""
KEPT_TARGETS: Final = f"SELECT DISTINCT call_targets {_FLAT_ROWS} WHERE {_COUNTED} AND {_KEPT}"
"""Each distinct stored targets text (``flat_kept``: t_targets, t_changes)."""

FLAT_KEYED: Final = f"""
CREATE OR REPLACE TEMP TABLE flat_rows AS
WITH keyed AS (
    SELECT r.*, {_ROLE} AS role, {_COUNTED} AS counted,
           CASE WHEN {_KEPT} THEN call_digest ELSE k_digest END AS digest,
           CASE WHEN {_KEPT} THEN call_targets ELSE k_targets END AS targets,
           CASE WHEN {_KEPT} THEN t_changes ELSE k_changes END AS changes
    FROM place_rows r SEMI JOIN flat_traces USING (trace_id)
    LEFT JOIN flat_keys ON {_COUNTED} AND NOT ({_KEPT}) AND k_tool = tool_name AND k_args = arguments
    LEFT JOIN flat_kept ON {_COUNTED} AND {_KEPT} AND t_targets = call_targets
)
SELECT trace_id, span_id, parent_span_id, start_ns, end_ns, tool_name, role, counted, digest, targets, stored,
       stage_row
FROM keyed WHERE trace_id NOT IN (SELECT trace_id FROM keyed WHERE counted AND NOT failed AND changes);
DELETE FROM flat_traces WHERE trace_id NOT IN (SELECT trace_id FROM flat_rows)
"""
"""The rows of the flat traces with their role and, for a counted call, its key (its stored one, else
the one derived from its arguments), only the columns :data:`FLAT_PLACED` reads (they are held until
the ingest's transaction ends); a trace holding a counted call that
changes state leaves, ``flat_traces`` too (its counts restart: :class:`treellm.loop.PathSignatures`)."""

_ORDER = "start_ns, end_ns DESC, span_id"
"""A trace's spans in time order (``trees._order``)."""
_THINK = "CASE WHEN role = 'llm' THEN span_id END"
_UP_TO_HERE = "ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW"
FLAT_PLACED: Final = f"""
INSERT INTO foreign_placed BY NAME
WITH ordered AS (
    SELECT *, role IN ('llm', 'tool') AS member,
           arg_min(span_id, parent_span_id IS NOT NULL) OVER (PARTITION BY trace_id) AS root_id,
           sum(CASE WHEN role = 'llm' THEN 1 ELSE 0 END) OVER (trace_order {_UP_TO_HERE}) AS thinks,
           last_value({_THINK} IGNORE NULLS) OVER (trace_order {_UP_TO_HERE}) AS think_now,
           last_value({_THINK} IGNORE NULLS) OVER (trace_order ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
               AS think_before
    FROM flat_rows
    WINDOW trace_order AS (PARTITION BY trace_id ORDER BY start_ns, NOT (role IN ('llm', 'tool')), end_ns DESC, span_id)
),
counted AS (
    SELECT *,
           CASE WHEN counted THEN row_number() OVER chain END AS nth,
           CASE WHEN counted THEN first_value(span_id) OVER chain END AS first_id,
           CASE WHEN counted
                THEN list(span_id) OVER (chain ROWS BETWEEN {EARLIER_KEPT} PRECEDING AND 1 PRECEDING) END AS earlier
    FROM ordered
    WINDOW chain AS (PARTITION BY trace_id, counted, tool_name, digest ORDER BY {_ORDER})
)
SELECT trace_id, span_id, trace_id || ':' || root_id AS run_id,
       CASE role WHEN 'llm' THEN 'think' WHEN 'tool' THEN 'tool' END AS node_kind,
       CASE role WHEN 'llm' THEN think_before WHEN 'tool' THEN think_now END AS node_parent_id,
       CASE role WHEN 'llm' THEN thinks - 1 WHEN 'tool' THEN greatest(thinks - 1, 0) END AS node_depth,
       CASE WHEN counted THEN nth END AS ordinal,
       CASE WHEN len(earlier) > 0
            THEN '[' || array_to_string(list_transform(earlier, lambda x: CAST(to_json(x) AS VARCHAR)), ', ') || ']'
       END AS earlier_node_ids,
       CASE WHEN counted THEN first_id END AS repeat_chain,
       false AS orphan,
       CASE WHEN NOT member THEN think_now END AS anchor_node_id,
       CASE WHEN counted THEN digest END AS call_digest,
       CASE WHEN counted THEN targets END AS call_targets,
       stored, stage_row
FROM counted
"""
"""The placement of every span of the flat traces (see the module docstring), as
:func:`treellm.derive.trees.place_trace` answers it, a counted call keeping its last
:data:`EARLIER_KEPT` earlier ids."""
