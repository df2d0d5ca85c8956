"""Overview: runs, tool calls, prunes and waste over time; the tools that loop most; verdicts."""

from __future__ import annotations

import streamlit as st

from dashboard import charts, data

st.title("treellm: overview")
st.caption("Runs, tool calls and repeated calls in the store, and what the data says about each tool's limit.")
with data.show_problems():
    filters = data.sidebar_filters()
    totals = data.query("totals", filters)
    if totals["runs"] == 0:
        st.info("No runs in this selection yet. Ingest traces with `treellm ingest` or run `treellm demo`.")
        st.stop()
    outcomes = data.query("repeat_outcome_by_tool", filters)
    wasted = int(outcomes["wasted"].sum()) if not outcomes.empty else 0
    executed_and_pruned = totals["tool_calls"] + totals["pruned"]
    rate = totals["pruned"] / executed_and_pruned if executed_and_pruned else 0.0
    cols = st.columns(5)
    cols[0].metric("Runs", f"{totals['runs']:,}")
    cols[1].metric("Tool calls (executed)", f"{totals['tool_calls']:,}")
    cols[2].metric("Pruned calls", f"{totals['pruned']:,}")
    cols[3].metric("Prune rate", f"{rate:.1%}")
    cols[4].metric("Wasted repeats", f"{wasted:,}")
    st.vega_lite_chart(
        spec=charts.vega_spec(charts.runs_over_time_chart(data.query("runs_by_day", filters))), width="stretch"
    )
    left, right = st.columns(2)
    with left:
        rates = data.query("prune_rate_by_tool", filters)
        st.vega_lite_chart(spec=charts.vega_spec(charts.prune_rate_chart(rates, top=8)), width="stretch")
    with right:
        st.subheader("Tuning verdicts at a glance")
        tuning = data.query("tuning_glance", filters, 0.05)
        if tuning.empty:
            st.info("No tool calls to judge.")
        else:
            st.dataframe(
                data.limits_shown(tuning)[
                    ["tool", "verdict", "current_max_repeats", "recommended_max_repeats", "samples"]
                ],
                hide_index=True, width="stretch",
            )  # fmt: skip
