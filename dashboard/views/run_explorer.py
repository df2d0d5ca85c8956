"""Run explorer: find a run in a sortable, searchable list, then see it as the tree it was
(pruned calls as ghost nodes), as a span timeline beside its tree, or a think node as a chat.

The URL's query parameters ``run``, ``view`` (tree, icicle, timeline, chat) and ``node``
select a run, what is shown of it and a node; ``q`` and ``sort`` the list's search and order.
So a link opens a run's timeline or a node's chat directly. Everything from the trace, and
the URL's parameters, are shown as text (``dashboard.text``).
"""

from __future__ import annotations

import streamlit as st

from dashboard import charts, data, text

ANY = "(any)"
CHAT_AVATARS = {"system": ":material/settings:", "user": ":material/person:", "assistant": ":material/smart_toy:",
                "tool": ":material/build:", "caught": ":material/block:"}  # fmt: skip


def pick_run() -> None:
    """The run list's selection callback: the picked row's run goes into the URL."""
    rows = st.session_state["run_table"].selection.rows
    ids = st.session_state.get("run_table_ids", [])
    if rows and rows[0] < len(ids):
        st.query_params["run"] = ids[rows[0]]
        if "node" in st.query_params:
            del st.query_params["node"]


def show_chat(messages: tuple[data.ChatMessage, ...]) -> None:
    if not messages:
        st.info("No messages or tool calls are stored for this node.")
    for message in messages:
        with st.chat_message(message.role, avatar=CHAT_AVATARS[message.role]):
            head = message.role if not message.stored_role or message.stored_role == message.role else (
                f"{message.role} (stored as {message.stored_role})")  # fmt: skip
            if message.tool is not None:
                verb = {"tool": "ran", "caught": "caught"}.get(message.role, "calls")
                head = f"{head} · {verb} {message.tool}" + (f" · {message.status}" if message.status else "")
            st.caption(text.literal(head))
            if message.arguments is not None:
                st.code(message.arguments, language=None, wrap_lines=True)
            if message.text:
                st.code(message.text, language=None, wrap_lines=True)


st.title("Run explorer")
with data.show_problems():
    filters = data.sidebar_filters()
    params = st.query_params
    top = st.columns([3, 1, 1])
    search = top[0].text_input("Search runs", value=params.get("q", ""), key="run_search",
                               placeholder="text in a call's arguments or result, a run or trace id, a file name",
                               help="Case-insensitive, as written (no wildcards): a tool call's captured arguments "
                                    "or result, a caught call's arguments, the run's id or trace id, or the file "
                                    "the run was ingested from.")  # fmt: skip
    outcome = top[1].selectbox("Outcome", [ANY, *data.outcome_choices()], key="run_outcome")
    sorts = list(data.SORTS)
    wanted_sort = params.get("sort")
    sort = top[2].selectbox("Sort by", sorts, index=sorts.index(wanted_sort) if wanted_sort in sorts else 0,
                            key="run_sort")  # fmt: skip
    for name, value, default in (("q", search, ""), ("sort", sort, sorts[0])):
        if value != default:
            st.query_params[name] = value
        elif name in st.query_params:
            del st.query_params[name]
    table = data.run_table(filters, text=search, outcome=None if outcome == ANY else outcome, sort=sort)
    matching = int(table["matching"].iloc[0]) if not table.empty else 0
    shown = f"the first {len(table)}" if matching > len(table) else "all"
    st.caption(f"{matching:,} runs match, {shown} listed ({sort} first). Pick a row to open its run; the "
               "timeline and chat columns are links to each.")  # fmt: skip
    st.session_state["run_table_ids"] = list(table["run_id"])
    st.dataframe(data.run_rows(table), hide_index=True, width="stretch", column_config=data.RUN_ROW_COLUMNS,
                 on_select=pick_run, selection_mode="single-row", key="run_table",
                 height=min(320, 40 + 35 * max(len(table), 1)))  # fmt: skip
    wanted = params.get("run")
    run_id: str | None = None
    if wanted:
        if data.run_detail(wanted)["run"].empty:
            st.warning("The linked run is not in the store; showing the first listed run instead. The link asked for:")
            st.code(wanted, language=None, wrap_lines=True)
        else:
            run_id = wanted
    if run_id is None:
        if table.empty:
            st.info("No runs in this selection." if not search else "No run's calls hold this text.")
            st.stop()
        run_id = str(table["run_id"].iloc[0])  # not put in the URL: it follows the list until a row is picked
    detail = data.run_detail(run_id)
    nodes, loops, run = detail["nodes"], detail["loops"], detail["run"]
    st.subheader("Run")
    st.code(run_id, language=None)
    cols = st.columns([2, 1, 1, 1, 1])
    cols[0].metric("Outcome", text.literal(run["outcome"].iloc[0]) if not run.empty else "?")
    cols[1].metric("Nodes", len(nodes))
    cols[2].metric("Max depth", int(nodes["depth"].max()) if nodes["depth"].notna().any() else 0)
    cols[3].metric("Caught calls", len(loops))
    cols[4].metric("Duration (s)", f"{float(run['duration_ns'].iloc[0]) / 1e9:.2f}" if not run.empty else "?")
    large = len(nodes) >= charts.TREE_ICICLE_AT
    linked_view = params.get("view")
    default_view = linked_view if linked_view in data.VIEWS else ("icicle" if large else "tree")
    view = st.segmented_control("View", list(data.VIEWS), default=default_view, key="view") or default_view
    st.query_params["view"] = view
    node_ids = list(nodes["node_id"])
    wanted_node = params.get("node")
    selected = wanted_node if wanted_node in node_ids else None
    if view == "chat":
        selected = data.chat_node(nodes, selected)
    kinds = dict(zip(nodes["node_id"], nodes["kind"], strict=True))
    node = None
    if node_ids:
        node = st.selectbox("Node", node_ids, index=node_ids.index(selected) if selected in node_ids else 0,
                            key="node_pick", format_func=lambda n: f"{n} · {kinds[n]}")  # fmt: skip
        st.query_params["node"] = node
    tree = charts.tree_icicle(nodes, loops) if view == "icicle" or (large and view != "tree") else (
        charts.tree_chart(nodes, loops, node))  # fmt: skip
    if view in ("tree", "icicle"):
        st.vega_lite_chart(spec=charts.vega_spec(tree), width="stretch", key="tree")
    else:
        left, right = st.columns([2, 3])
        with left:
            st.vega_lite_chart(spec=charts.vega_spec(tree), width="stretch", key="tree")
        with right:
            if view == "timeline":
                st.vega_lite_chart(spec=charts.vega_spec(charts.timeline_chart(detail["spans"], loops)),
                                   width="stretch", key="timeline")  # fmt: skip
            else:
                think = data.chat_node(nodes, node)
                st.subheader("Chat")
                if think is None:
                    st.info("This run has no think node.")
                else:
                    st.caption(text.literal(f"Think node {think}: its messages and tool calls, as stored."))
                    show_chat(data.think_chat(run_id, think))
    if loops.empty:
        st.success("No repeated call was caught in this run.")
    else:
        st.subheader("Caught calls")
        st.dataframe(loops[["node_id", "tool", "count", "limit", "limit_source", "action", "shadow", "arguments",
                            "earlier_node_ids"]], hide_index=True, width="stretch")  # fmt: skip
    st.subheader("Node details")
    if node is None:
        st.info("This run has no nodes.")
        st.stop()
    row = nodes[nodes["node_id"] == node].iloc[0]
    left, right = st.columns(2)
    left.json(data.node_facts(row))
    with right:
        for column, caption in (("arguments", "Arguments (as captured)"), ("result", "Result (as captured)"),
                                ("text", "Model text")):  # fmt: skip
            if isinstance(row[column], str):
                st.caption(caption)
                st.code(row[column], language=None, wrap_lines=True)
        caught_here = loops[loops["node_id"] == node]
        if not caught_here.empty:
            st.caption("Calls this node asked for that were caught")
            st.dataframe(caught_here, hide_index=True, width="stretch")
