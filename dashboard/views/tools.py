"""Tools: prune rate per tool, calls without arguments or results, repeat outcomes, actions taken,
near repeats with examples."""

from __future__ import annotations

import streamlit as st

from dashboard import charts, data

st.title("Tools")
with data.show_problems():
    filters = data.sidebar_filters()
    rates = data.query("prune_rate_by_tool", filters)
    if rates.empty:
        st.info("No tool calls in this selection.")
        st.stop()
    st.vega_lite_chart(spec=charts.vega_spec(charts.prune_rate_chart(rates)), width="stretch")
    st.dataframe(rates, hide_index=True, width="stretch",
                 column_config={"prune_rate": st.column_config.NumberColumn(format="percent")})  # fmt: skip
    lacking = data.query("content_by_tool", filters)
    if not lacking.empty:
        st.subheader("Calls without arguments or results")
        st.warning("These tools' spans hold no arguments (such calls are never counted as repeats) or no "
                   "result (a repeat of them has an unknown outcome). The switch names the framework's "
                   "setting that records them.")  # fmt: skip
        st.dataframe(lacking, hide_index=True, width="stretch")
    outcomes = data.query("repeat_outcome_by_tool", filters)
    st.vega_lite_chart(spec=charts.vega_spec(charts.repeat_outcomes_chart(outcomes)), width="stretch")
    left, right = st.columns(2)
    with left:
        st.subheader("Repeats per ordinal")
        st.dataframe(outcomes, hide_index=True, width="stretch")
    with right:
        st.subheader("Actions taken")
        actions = data.query("actions", filters)
        if actions.empty:
            st.info("No repeated call was caught in this selection.")
        else:
            st.dataframe(actions, hide_index=True, width="stretch")
    st.subheader("Near repeats")
    st.caption("Close but not identical calls of one tool in one run. Paging (a position moving forward with "
               "new results) is progress and counted apart.")  # fmt: skip
    near, pairs = data.query("near_repeats_and_pairs", filters, data.TABLE_ROWS)  # one judgement of the calls
    if near.empty:
        st.info("No near repeats (or no captured arguments) in this selection.")
    else:
        near = near.assign(examples=near["examples"].map("\n".join))
        st.dataframe(near, hide_index=True, width="stretch")
    st.subheader("Identical calls beside counted ones")
    st.caption("Identical repeats: every call identical to an earlier call on its path, whatever ran between. "
               "Counted: those the limit's state-change rule counts.")  # fmt: skip
    identical, calls = data.query("identical_repeats_and_rows", filters, data.TABLE_ROWS)
    st.dataframe(identical, hide_index=True, width="stretch")
    st.subheader("Every identical call, judged")
    st.caption("One row per identical repeat: whether the limit counts it, its outcome (productive, wasted, "
               "unknown) judged by the evidence, and why. The link opens the call in the run explorer.")  # fmt: skip
    if calls.empty:
        st.info("No identical repeat in this selection.")
    else:
        total = int(identical["identical_repeats"].sum())
        if total > len(calls):
            st.caption(f"The first {len(calls):,} of {total:,}, by run: narrow the filters to see others.")
        st.dataframe(data.with_links(calls), hide_index=True, width="stretch",
                     column_config=data.LINK_COLUMNS)  # fmt: skip
    st.subheader("Near repeats and paging, pair by pair")
    if not pairs.empty and not near.empty and int(near["near_repeats"].sum() + near["paging"].sum()) > len(pairs):
        total = int(near["near_repeats"].sum() + near["paging"].sum())
        st.caption(
            f"The first {len(pairs):,} of {total:,}, wasted near repeats first: narrow the filters to see others."
        )
    if pairs.empty:
        st.info("No close pairs in this selection.")
    else:
        st.dataframe(data.with_links(pairs), hide_index=True, width="stretch",
                     column_config=data.LINK_COLUMNS)  # fmt: skip
    st.subheader("Cost of wasted repeats")
    st.dataframe(data.query("cost_by_tool", filters), hide_index=True, width="stretch")
