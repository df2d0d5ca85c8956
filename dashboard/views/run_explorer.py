"""Run explorer: a run drawn as the tree it was, pruned calls as ghost nodes, node details.

The URL's query parameters ``run`` and ``node`` select a run and a node, so a link can be
shared. Everything from the trace, and the URL's parameters, are shown as text (``dashboard.text``).
"""

from __future__ import annotations

import streamlit as st

from dashboard import charts, data, text

st.title("Run explorer")
with data.show_problems():
    filters = data.sidebar_filters()
    runs = data.query("runs", filters)
    if runs.empty:
        st.info("No runs in this selection.")
        st.stop()
    wanted = st.query_params.get("run")
    ids = list(runs["run_id"])
    if wanted and wanted not in ids:
        linked = data.run_detail(wanted)["run"]
        if linked.empty:
            st.warning("The linked run is not in the store; showing the latest run instead. The link asked for:")
            st.code(wanted, language=None, wrap_lines=True)
        else:
            runs = data.prepend(linked, runs)
            ids = list(runs["run_id"])
    st.caption(f"The latest {len(ids)} runs of the selection; a link with ?run=ID opens any run.")
    labels = {
        r.run_id: f"{r.agent} · {r.outcome} · {r.nodes} nodes · {r.pruned_calls} pruned · {r.run_id}"
        for r in runs.itertuples(index=False)
    }
    run_id = st.selectbox(
        "Run", ids, index=ids.index(wanted) if wanted in ids else 0, format_func=lambda r: labels[r], key="run_pick"
    )
    st.query_params["run"] = run_id
    detail = data.run_detail(run_id)
    nodes, loops, run = detail["nodes"], detail["loops"], detail["run"]
    cols = st.columns([2, 1, 1, 1, 1])
    cols[0].metric("Outcome", text.literal(run["outcome"].iloc[0]) if not run.empty else "?")
    cols[1].metric("Nodes", len(nodes))
    cols[2].metric("Max depth", int(nodes["depth"].max()) if nodes["depth"].notna().any() else 0)
    cols[3].metric("Caught calls", len(loops))
    cols[4].metric("Duration (s)", f"{float(run['duration_ns'].iloc[0]) / 1e9:.2f}" if not run.empty else "?")
    large = len(nodes) >= charts.TREE_ICICLE_AT
    view = st.segmented_control("View", ["tree", "icicle"], default="icicle" if large else "tree", key="view")
    node_ids = list(nodes["node_id"])
    wanted_node = st.query_params.get("node")
    selected = wanted_node if wanted_node in node_ids else None
    figure = charts.tree_icicle(nodes, loops) if view == "icicle" else charts.tree_figure(nodes, loops, selected)
    st.plotly_chart(figure, width="stretch", key="tree")
    if loops.empty:
        st.success("No repeated call was caught in this run.")
    else:
        st.subheader("Caught calls")
        st.dataframe(loops[["node_id", "tool", "count", "limit", "limit_source", "action", "shadow", "arguments",
                            "earlier_node_ids"]], hide_index=True, width="stretch")  # fmt: skip
    st.subheader("Node details")
    node = st.selectbox("Node", node_ids, index=node_ids.index(selected) if selected else 0, key="node_pick",
                        format_func=lambda n: f"{n} · {nodes.loc[nodes['node_id'] == n, 'kind'].iloc[0]}")  # fmt: skip
    st.query_params["node"] = node
    row = nodes[nodes["node_id"] == node].iloc[0]
    left, right = st.columns(2)
    left.json(data.node_facts(row))
    with right:
        if isinstance(row["arguments"], str):
            st.caption("Arguments (as captured)")
            st.code(row["arguments"], language=None, wrap_lines=True)
        if isinstance(row["result"], str):
            st.caption("Result (as captured)")
            st.code(row["result"], language=None, wrap_lines=True)
        if isinstance(row["text"], str):
            st.caption("Model text")
            st.code(row["text"], language=None, wrap_lines=True)
        caught_here = loops[loops["node_id"] == node]
        if not caught_here.empty:
            st.caption("Calls this node asked for that were caught")
            st.dataframe(caught_here, hide_index=True, width="stretch")
