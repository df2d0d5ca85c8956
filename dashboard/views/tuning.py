"""Tuning: candidates per tool with evidence, a what-if control per tool, the TOML limits file."""

from __future__ import annotations

import streamlit as st

from dashboard import charts, data

st.title("Tuning")
st.caption("The recommended limit is the smallest max_repeats whose loss of productive repeats stays within "
           "the tolerance.")  # fmt: skip
with data.show_problems():
    filters = data.sidebar_filters()
    tolerance = st.slider("Tolerance (share of productive repeats a limit may prune)", 0.0, 0.5, 0.05, 0.01,
                          key="tolerance")  # fmt: skip
    tuning = data.query("tuning", filters, tolerance)
    if tuning.empty:
        st.info("No tool calls in this selection.")
        st.stop()
    st.dataframe(
        data.limits_shown(tuning)[["tool", "verdict", "current_max_repeats", "recommended_max_repeats", "samples",
                                   "productive_rate", "productive_rate_low", "productive_rate_high", "calls_saved",
                                   "tokens_saved_est", "reason"]],
        hide_index=True, width="stretch",
        column_config={c: st.column_config.NumberColumn(format="percent")
                       for c in ("productive_rate", "productive_rate_low", "productive_rate_high")},
    )  # fmt: skip
    st.subheader("What if")
    tools = list(tuning["tool"])
    tool = st.selectbox("Tool", tools, key="what_if_tool")
    table = data.query("what_if", filters, tool)
    st.vega_lite_chart(spec=charts.vega_spec(charts.what_if_chart(table, tool)), width="stretch")
    st.dataframe(table[table["tool"] == tool], hide_index=True, width="stretch")
    st.subheader("Rules that would let the limit see wasted repeats")
    st.caption("Programs whose effect is unknown restart every count. Each row is a read_only pattern for such "
               "programs: the wasted repeats they hid, those the limit would then see, and the productive ones it "
               "would prune. Advised rules go into limits.toml.")  # fmt: skip
    rules = data.query("rules_by_tool", filters)
    if rules.empty:
        st.info("No wasted repeat is hidden by an unknown program in this selection.")
    else:
        st.dataframe(rules.assign(examples=rules["examples"].map("\n".join)), hide_index=True, width="stretch")
    st.download_button("Download limits.toml", data.query("limits_toml", filters, tolerance), file_name="limits.toml",
                       mime="application/toml")  # fmt: skip
