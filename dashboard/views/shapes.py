"""Tree shapes across runs, and two agents, models or time windows side by side."""

from __future__ import annotations

import streamlit as st

from dashboard import charts, data, text

st.title("Tree shapes")
with data.show_problems():
    filters = data.sidebar_filters()
    groups = data.shape_groups(filters, "agent")
    if groups.empty:
        st.info("No runs in this selection.")
        st.stop()
    st.vega_lite_chart(spec=charts.vega_spec(charts.shape_chart(groups, "agent")), width="stretch")
    st.dataframe(data.query("shape_distribution", filters), hide_index=True, width="stretch")
    st.subheader("Side by side")
    by = st.radio("Compare", ["agent", "model", "day"], horizontal=True, key="compare_by")
    values = data.shape_values(filters, by)
    if len(values) < 2:
        st.info(f"Only one {by} in this selection: nothing to compare.")
        st.stop()
    pick_left, pick_right = st.columns(2)
    first = pick_left.selectbox("Left", values, index=0, key="left")
    second = pick_right.selectbox("Right", values, index=1, key="right")
    for side, column, value in (("left", pick_left, first), ("right", pick_right, second)):
        chosen = data.shape_side(filters, by, value)
        with column:
            st.metric(f"{by}: {text.literal(value)}", f"{chosen.runs} runs")
            st.dataframe(chosen.summary, width="stretch")
            st.vega_lite_chart(spec=charts.vega_spec(charts.shape_chart(chosen.grouped, "outcome")), width="stretch",
                               key=f"scatter-{side}")  # fmt: skip
