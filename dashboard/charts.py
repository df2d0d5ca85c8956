"""Pure ``DataFrame -> chart`` builders: no Streamlit, no store, unit-tested.

Every chart is Vega-Lite (Altair); the pages hand Streamlit its spec (:func:`vega_spec`). Plotly
drew the trees, the timeline, the shapes and the what-if chart until 2026-12-06: its 4.7 MB of
JavaScript was loaded and run on every page that drew one, about a second of each load on two
cores, Vega's a tenth of that (BENCHMARKS.md, "Dashboard").

Vega draws text as text (no markup, no entities), so trace strings reach a chart through
:func:`chart_text` (one line without control characters, cut), as data values: a chart's spec
holds trace text only in its data and, for the what-if chart, its title. Trees are laid out by
igraph's Reingold-Tilford layout, or drawn as an icicle (:func:`_partition`) when large.
"""

from __future__ import annotations

import json
from typing import Any, Final

import altair as alt
import igraph
import pandas as pd

from dashboard.text import plain

__all__ = [
    "KIND_COLORS",
    "chart_text",
    "vega_spec",
    "TREE_ICICLE_AT",
    "prune_rate_chart",
    "repeat_outcomes_chart",
    "runs_over_time_chart",
    "shape_chart",
    "timeline_chart",
    "timeline_order",
    "tree_chart",
    "tree_icicle",
    "what_if_chart",
]

KIND_COLORS = {"think": "#4C78A8", "tool": "#54A24B", "collapse": "#B279A2", "skill": "#F58518"}
STATUS_LINE = {"completed": "#333333", "failed": "#E45756", "running": "#EECA3B", "pending": "#BBBBBB"}
PRUNED_COLOR = "rgba(228, 87, 86, 0.35)"
TREE_ICICLE_AT = 400
"""From this many nodes, the run explorer draws an icicle instead of a node-link tree."""
TIMELINE_SPANS = 600
"""The waterfall draws at most this many spans (the first in tree order) and says so."""
OTHER_SPAN_COLOR = "#BAB0AC"
FAILED_COLOR = "#E45756"


BARS_WITHIN_DAYS = 31
"""Over at most this many days the overview draws a bar per day; over longer spans a day's bar
would be a hairline on the date axis, so counts are drawn as lines with markers."""


def chart_text(value: Any, limit: int = 160) -> str:
    """``value`` as a Vega-Lite chart shows it: one line without control characters
    (:func:`dashboard.text.plain`), cut to ``limit`` characters. Vega draws text as text (no
    markup, no entities), so nothing is escaped. Missing values are ``""``."""
    text = plain(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def vega_spec(chart: alt.Chart | alt.LayerChart) -> dict[str, Any]:
    """The Vega-Lite spec of ``chart`` as the pages hand it to ``st.vega_lite_chart``: its data
    inline and not validated again (``st.altair_chart`` validated each chart against Vega-Lite's
    schema on every run, 0.06 s a chart; the builders here are validated by the tests), without
    Altair's default view size (Streamlit sizes the chart), sized by :data:`AUTOSIZE`."""
    spec: dict[str, Any] = chart.to_dict(validate=False)
    spec.get("config", {}).pop("view", None)
    if not spec.get("config"):
        spec.pop("config", None)
    spec["autosize"] = dict(AUTOSIZE)
    return spec


AUTOSIZE: Final = {"type": "fit-x", "contains": "padding"}
"""Every chart fits the page's width; its height is its plot's, and its legend, axes and title add to
it. Streamlit's default (``fit``: all of it within the plot's height) let a long legend take the plot's
room: 49 agents' legend left the shapes' scatter no height at all."""


def _empty_vega(title: str, message: str) -> alt.Chart:
    chart: alt.Chart = (
        alt.Chart(pd.DataFrame({"message": [message]}))
        .mark_text(size=14, color="#666666")
        .encode(text="message:N")
        .properties(title=title, height=200)
    )
    return chart


COUNT_SERIES = (("runs", "runs"), ("tool_calls", "tool calls"), ("pruned", "pruned"), ("wasted", "wasted"))
OVER_TIME_COLORS = {"runs": "#4C78A8", "tool calls": "#9ECAE9", "pruned": "#E45756", "wasted": "#FF9DA6",
                    "prune rate": "#54A24B"}  # fmt: skip


DAY_TICKS = {"interval": "day", "step": 1}
"""The bars' date axis ticks whole days only: within one day, Vega's ticks fell on hours, each
labelled with the same date (a file of trajectories, all on their synthetic day, showed "Jan 01"
twice)."""


def runs_over_time_chart(by_day: pd.DataFrame) -> alt.LayerChart | alt.Chart:
    """Runs, tool calls, pruned calls and wasted repeats per day, with the prune rate on its own
    axis (right): days on a UTC date axis (gaps show as gaps: a line is broken where days without
    runs fall between two days with runs, never drawn across them), counts and the rate never drawn
    below zero."""
    if by_day.empty:
        return _empty_vega("Over time", "no runs")
    ordered = by_day.assign(day=pd.to_datetime(by_day["day"])).sort_values("day", ignore_index=True)
    days = ordered["day"]
    span_days = (days.max() - days.min()).days
    frame = pd.DataFrame({"day": days.dt.strftime("%Y-%m-%d"), "prune_rate": ordered["prune_rate"].astype(float),
                          "segment": (days.diff().dt.days > 1).cumsum().astype("int64"),
                          **{name: ordered[column].astype("int64") for column, name in COUNT_SERIES}})  # fmt: skip
    names = [name for _, name in COUNT_SERIES]
    counts = frame.melt(id_vars=["day", "segment"], value_vars=names, var_name="series", value_name="count")
    palette = alt.Scale(domain=list(OVER_TIME_COLORS), range=list(OVER_TIME_COLORS.values()))
    color = alt.Color("series:N", title=None, legend=alt.Legend(orient="bottom"), scale=palette)
    tooltip = [alt.Tooltip("day:T", timeUnit="utcyearmonthdate", title="day"), "series:N", "count:Q"]
    count_axis = alt.Y("count:Q", title="count", scale=alt.Scale(domainMin=0))
    bars = span_days <= BARS_WITHIN_DAYS
    if bars:
        drawn = alt.Chart(counts).mark_bar().encode(
            x=alt.X("day:T", timeUnit="utcyearmonthdate", title=None,
                    axis=alt.Axis(format="%b %d", tickCount=DAY_TICKS)),
            xOffset=alt.XOffset("series:N", sort=names), y=count_axis, color=color, tooltip=tooltip,
        )  # fmt: skip
    else:
        drawn = (
            alt.Chart(counts)
            .mark_line(point=True)
            .encode(
                x=alt.X("day:T", timeUnit="utcyearmonthdate", title=None),
                y=count_axis,
                color=color,
                tooltip=tooltip,
                detail=alt.Detail("segment:N"),  # one line per run of consecutive days
            )
        )
    top = max(float(frame["prune_rate"].max()), 0.01)
    rate = alt.Chart(frame).mark_line(point=True, strokeDash=[4, 3]).encode(
        # beside bars, each day's rate sits mid-day, over its bars, not at the day's first instant
        x=alt.X("day:T", timeUnit="utcyearmonthdate", title=None, bandPosition=0.5 if bars else 0),
        y=alt.Y("prune_rate:Q", title="prune rate", scale=alt.Scale(domain=[0, min(1.0, top) * 1.1]),
                axis=alt.Axis(format=".1~%", orient="right")),
        color=alt.datum("prune rate"), detail=alt.Detail("segment:N"),
        tooltip=[alt.Tooltip("day:T", timeUnit="utcyearmonthdate", title="day"),
                 alt.Tooltip("prune_rate:Q", format=".1%", title="prune rate")],
    )  # fmt: skip
    layered: alt.LayerChart = alt.layer(drawn, rate).resolve_scale(y="independent")
    return layered.properties(title="Over time", height=300)


PRUNE_KINDS = (("calls", "executed", "#9ECAE9"), ("pruned_prune", "pruned", "#E45756"),
               ("pruned_nudge", "nudged", "#F58518"), ("pruned_cache", "cached", "#72B7B2"))  # fmt: skip


def prune_rate_chart(rates: pd.DataFrame, top: int = 15) -> alt.Chart:
    """Calls per tool, stacked: executed, then those caught by action (pruned, nudged, cached);
    the ``top`` tools by caught calls, then calls, the most first."""
    if rates.empty:
        return _empty_vega("Calls per tool: executed and caught", "no tool calls")
    data = rates.sort_values(["pruned", "calls"], ascending=False).head(top)
    tools = [chart_text(t) for t in data["tool"]]
    long = pd.DataFrame(
        [{"tool": tool, "kind": name, "order": order, "calls": int(count)}
         for order, (column, name, _) in enumerate(PRUNE_KINDS)
         for tool, count in zip(tools, data[column], strict=True)]
    )  # fmt: skip
    kinds = [name for _, name, _ in PRUNE_KINDS]
    chart: alt.Chart = (
        alt.Chart(long)
        .mark_bar()
        .encode(
            y=alt.Y("tool:N", sort=tools, title=None, axis=alt.Axis(labelLimit=0)),
            x=alt.X("sum(calls):Q", title="calls", stack="zero"),
            color=alt.Color("kind:N", title=None, legend=alt.Legend(orient="bottom"),
                            scale=alt.Scale(domain=kinds, range=[c for _, _, c in PRUNE_KINDS])),
            order=alt.Order("order:Q"),
            tooltip=["tool:N", "kind:N", "calls:Q"],
        )
        .properties(title="Calls per tool: executed and caught", height=alt.Step(24))
    )  # fmt: skip
    return chart


def repeat_outcomes_chart(outcomes: pd.DataFrame) -> alt.Chart:
    """Executed repeats per tool, stacked: productive and wasted; the most wasted first."""
    if outcomes.empty:
        return _empty_vega("Executed repeats: productive or wasted", "no executed repeats (ordinal >= 2)")
    per_tool = outcomes.groupby("tool")[["productive", "wasted"]].sum().reset_index()
    per_tool = per_tool.sort_values(["wasted", "tool"], ascending=[False, True])
    tools = [chart_text(t) for t in per_tool["tool"]]
    long = pd.DataFrame(
        [{"tool": tool, "outcome": outcome, "order": order, "repeats": int(count)}
         for order, outcome in enumerate(("productive", "wasted"))
         for tool, count in zip(tools, per_tool[outcome], strict=True)]
    )  # fmt: skip
    chart: alt.Chart = (
        alt.Chart(long)
        .mark_bar()
        .encode(
            x=alt.X("tool:N", sort=tools, title=None, axis=alt.Axis(labelLimit=0, labelAngle=-30)),
            y=alt.Y("sum(repeats):Q", title="executed repeats", stack="zero"),
            color=alt.Color("outcome:N", title=None, legend=alt.Legend(orient="bottom"),
                            scale=alt.Scale(domain=["productive", "wasted"], range=["#54A24B", "#E45756"])),
            order=alt.Order("order:Q"),
            tooltip=["tool:N", "outcome:N", "repeats:Q"],
        )
        .properties(title="Executed repeats: productive or wasted", height=300)
    )  # fmt: skip
    return chart


def what_if_chart(table: pd.DataFrame, tool: str) -> alt.LayerChart | alt.Chart:
    """For one tool, at each limit: the repeats it would save (wasted), lose (productive) and leave
    unknown (pruned in the data, so never seen to run), side by side, the branches it would end as a
    line, and the current limit as a dashed rule (or a note that the data never ran under one)."""
    data = table[table["tool"] == tool]
    title = f"What if: limits for {chart_text(tool)}"
    if data.empty:
        return _empty_vega(title, "no calls of this tool")
    drawn = [{"part": "bar", "limit": int(limit), "series": name, "order": order, "calls": int(count)}
             for order, (column, name, _) in enumerate(WHAT_IF_SERIES)
             for limit, count in zip(data["limit"], data[column], strict=True)]  # fmt: skip
    drawn += [{"part": "line", "limit": int(limit), "series": "branches that would end", "calls": int(ended)}
              for limit, ended in zip(data["limit"], data["branches_ended"], strict=True)]  # fmt: skip
    current = data["current_limit"].iloc[0]
    if pd.notna(current):
        drawn.append({"part": "current", "limit": int(current), "series": f"current limit {int(current)}"})
    frame = pd.DataFrame(drawn)
    names = [name for _, name, _ in WHAT_IF_SERIES] + ["branches that would end"]
    color = alt.Color("series:N", title=None, legend=alt.Legend(orient="bottom", columns=2, labelLimit=0),
                      scale=alt.Scale(domain=names, range=[c for _, _, c in WHAT_IF_SERIES] + ["#4C78A8"]))  # fmt: skip
    x = alt.X("limit:O", title="max_repeats", axis=alt.Axis(labelAngle=0))
    base = alt.Chart(frame).encode(x=x)
    bars = base.mark_bar().encode(
        xOffset=alt.XOffset("series:N", sort=names), y=alt.Y("calls:Q", title="calls"), color=color,
        tooltip=["limit:O", "series:N", "calls:Q"],
    ).transform_filter("datum.part == 'bar'")  # fmt: skip
    line = base.mark_line(point=True).encode(y="calls:Q", color=color, tooltip=["limit:O", "series:N", "calls:Q"])
    layers: list[alt.Chart] = [bars, line.transform_filter("datum.part == 'line'")]
    if pd.notna(current):
        rule = base.mark_rule(strokeDash=[4, 4], color="#333333").encode(tooltip=alt.value(None))
        note = base.mark_text(align="left", dx=4, dy=-6, color="#333333").encode(y=alt.value(0), text="series:N")
        layers += [rule.transform_filter("datum.part == 'current'"), note.transform_filter("datum.part == 'current'")]
    subtitle = [] if pd.notna(current) else ["no limit observed in the data"]
    chart = alt.LayerChart(layer=layers, title=alt.Title(title, subtitle=subtitle), height=340)
    return chart


WHAT_IF_SERIES = (("saved", "saved (wasted repeats pruned)", "#54A24B"),
                  ("lost", "lost (productive repeats pruned)", "#E45756"),
                  ("unknown", "unknown (pruned in the data, would run)", "#BAB0AC"))  # fmt: skip
"""The what-if chart's bars: (column, name, colour)."""


BUBBLE_PADDING = 22
"""Pixels the shapes' scales reach past their data: the radius of the largest bubble (area 1300)."""


def shape_chart(groups: pd.DataFrame, color: str = "agent") -> alt.Chart:
    """Runs by max depth against max breadth: one bubble per (depth, breadth, ``color``), its area
    by how many runs share it (so a million runs draw as a few hundred bubbles)."""
    if groups.empty:
        return _empty_vega("Tree shapes", "no runs")
    frame = pd.DataFrame({
        "max_depth": groups["max_depth"].astype(int), "max_breadth": groups["max_breadth"].astype(int),
        "runs": groups["runs"].astype(int), "nodes": groups["nodes"].astype(float).round(1),
        color: [chart_text(v) for v in groups[color]], "example": [chart_text(e) for e in groups["example"]],
    })  # fmt: skip
    chart: alt.Chart = (
        alt.Chart(frame)
        .mark_circle(opacity=0.6)
        .encode(
            # whole numbers on the axes; the scales padded so that a bubble on an edge is drawn whole
            x=alt.X("max_depth:Q", title="max depth", axis=alt.Axis(tickMinStep=1, format="d"),
                    scale=alt.Scale(padding=BUBBLE_PADDING, nice=False)),
            y=alt.Y("max_breadth:Q", title="max breadth", axis=alt.Axis(tickMinStep=1, format="d"),
                    scale=alt.Scale(padding=BUBBLE_PADDING, nice=False)),
            size=alt.Size("runs:Q", scale=alt.Scale(type="sqrt", range=[36, 1300]), legend=None),  # the title says
            color=alt.Color(f"{color}:N", legend=alt.Legend(orient="bottom", columns=3, labelLimit=0)),  # text cuts
            tooltip=[alt.Tooltip("runs:Q", title="runs"), alt.Tooltip("max_depth:Q", title="depth"),
                     alt.Tooltip("max_breadth:Q", title="breadth"), alt.Tooltip("nodes:Q", title="nodes on average"),
                     alt.Tooltip(f"{color}:N"), alt.Tooltip("example:N", title="e.g.")],
        )
        .properties(title="Depth against breadth (bubble size: runs)", height=360)
        .interactive()
    )  # fmt: skip
    return chart


# -- trees -------------------------------------------------------------------------------------------


def _kind(value: Any, other: str) -> str:
    """A node kind as the charts colour it: one of :data:`KIND_COLORS`, else ``other``."""
    return str(value) if isinstance(value, str) and value in KIND_COLORS else other


def _node_label(row: Any) -> str:
    """A node's label: its tool and ordinal, or its kind."""
    t = chart_text  # every value below comes from the trace
    if row.kind == "tool":
        tool = t(row.tool, 40)
        return f"{tool} #{t(row.ordinal)}" if pd.notna(row.ordinal) else tool
    return t(row.kind)


def tree_chart(nodes: pd.DataFrame, loops: pd.DataFrame, selected: str | None = None) -> alt.LayerChart | alt.Chart:
    """A run's tree (Reingold-Tilford layout), each pruned call drawn as a ghost node under
    the ThinkNode that asked for it, tied by a dotted line to the earlier call it repeated; the
    ``selected`` node drawn larger. Vega-Lite, panned and zoomed by drag and wheel: one dataset
    whose ``part`` says what each row draws (``edge``, ``repeat``, ``node``)."""
    if nodes.empty:
        return _empty_vega("Run tree", "no nodes")
    ids = list(nodes["node_id"])
    index = {node_id: i for i, node_id in enumerate(ids)}
    ghosts = [row for row in loops.itertuples(index=False) if row.node_id in index]
    edges = [(index[p], index[c]) for c, p in zip(nodes["node_id"], nodes["parent_id"], strict=True) if p in index]
    edges += [(index[row.node_id], len(ids) + i) for i, row in enumerate(ghosts)]
    graph = igraph.Graph(n=len(ids) + len(ghosts), edges=edges, directed=True)
    roots = [index[c] for c, p in zip(nodes["node_id"], nodes["parent_id"], strict=True) if p not in index]
    layout = graph.layout_reingold_tilford(mode="out", root=roots or [0])
    xs = [pos[0] for pos in layout.coords]
    ys = [-pos[1] for pos in layout.coords]
    drawn: list[dict[str, Any]] = [{"part": "edge", "x": xs[a], "y": ys[a], "x2": xs[b], "y2": ys[b]} for a, b in edges]
    for i, row in enumerate(nodes.itertuples(index=False)):
        kind = _kind(row.kind, "other")
        drawn.append({
            "part": "node", "x": xs[i], "y": ys[i], "kind": kind, "label": _node_label(row),
            "line": STATUS_LINE.get(str(row.status), "#333333"), "size": 260 if row.node_id == selected else 130,
            **_tip(row),
        })  # fmt: skip
    for i, row in enumerate(ghosts):
        at = len(ids) + i
        ghost = {"part": "node", "x": xs[at], "y": ys[at], "kind": "pruned call", "label": chart_text(row.tool, 30)}
        drawn.append({**ghost, "line": FAILED_COLOR, "size": 130, **_pruned_tip(row)})
        drawn += [{"part": "repeat", "x": xs[at], "y": ys[at], "x2": xs[index[earlier]], "y2": ys[index[earlier]]}
                  for earlier in _ids(row.earlier_node_ids) if earlier in index]  # fmt: skip
    data = pd.DataFrame(drawn)
    x = alt.X("x:Q", axis=None, scale=alt.Scale(zero=False, nice=False, padding=30))
    y = alt.Y("y:Q", axis=None, scale=alt.Scale(zero=False, nice=False, padding=30))
    base = alt.Chart(data).encode(x=x, y=y)
    kinds = [*KIND_COLORS, "other", "pruned call"]
    colors = [*KIND_COLORS.values(), "#999999", PRUNED_COLOR]
    silent = alt.value(None)  # no tooltip: an edge or a label says nothing of its own
    lines = base.mark_rule(color="#BBBBBB", strokeWidth=1).encode(
        x2="x2:Q", y2="y2:Q", tooltip=silent).transform_filter("datum.part == 'edge'")  # fmt: skip
    repeats = base.mark_rule(color=FAILED_COLOR, strokeWidth=1, strokeDash=[2, 3]).encode(
        x2="x2:Q", y2="y2:Q", tooltip=silent).transform_filter("datum.part == 'repeat'")  # fmt: skip
    points = (
        base.mark_point(filled=True, strokeWidth=2, opacity=1)
        .encode(
            color=alt.Color("kind:N", title=None, scale=alt.Scale(domain=kinds, range=colors),
                            legend=alt.Legend(orient="bottom")),
            shape=alt.Shape("kind:N", scale=alt.Scale(domain=kinds, range=["circle"] * (len(kinds) - 1) + ["cross"]),
                            legend=None),
            stroke=alt.Stroke("line:N", scale=None), size=alt.Size("size:Q", scale=None),
            tooltip=[alt.Tooltip(f"{field}:N", title=title) for field, title in TREE_TIPS],
        )
        .transform_filter("datum.part == 'node'")
    )  # fmt: skip
    ghostly = alt.condition("datum.kind == 'pruned call'", alt.value(FAILED_COLOR), alt.value("#333333"))
    labels = base.mark_text(dy=14, fontSize=9).encode(text="label:N", color=ghostly, tooltip=silent).transform_filter(
        "datum.part == 'node'")  # fmt: skip
    levels = len(set(ys))
    chart = alt.LayerChart(
        layer=[lines, repeats, points, labels], title=f"Run tree: {len(ids)} nodes, {len(ghosts)} caught call(s)",
        height=min(1400, 160 + 70 * levels),
    ).interactive()  # fmt: skip
    return chart


TREE_TIPS = (("node", "node"), ("what", "kind · status · depth"), ("call", "call"), ("limit", "ordinal / limit"),
             ("skill", "skill"))  # fmt: skip
"""The tree's tooltip: each node's fields (trace text as :func:`chart_text` gives it), by title."""


def _tip(row: Any) -> dict[str, str]:
    t = chart_text  # every value below comes from the trace
    tip = {"node": t(row.node_id), "what": f"{t(row.kind)} · {t(row.status)} · depth {t(row.depth)}",
           "call": "", "limit": "", "skill": ""}  # fmt: skip
    if row.kind == "tool":
        tip["call"] = f"{t(row.tool, 60)} {t(row.arguments, 120)}"
        tip["limit"] = f"{t(row.ordinal)} / {t(row.limit)} ({t(row.limit_source)})"
    if isinstance(row.skill_stack, str) and row.skill_stack not in ("", "[]"):
        tip["skill"] = t(row.skill_stack)
    return tip


def _pruned_tip(row: Any) -> dict[str, str]:
    t = chart_text  # every value below comes from the trace
    shadow = " · shadow" if row.shadow else ""
    return {"node": f"caught under {t(row.node_id)}", "what": f"pruned call · {t(row.action)}{shadow}",
            "call": f"{t(row.tool, 60)} {t(row.arguments, 100)}",
            "limit": f"count {t(row.count)} ≥ limit {t(row.limit)} ({t(row.limit_source)})", "skill": ""}  # fmt: skip


def _ids(raw: Any) -> list[str]:
    """Node ids from a JSON list, or from an OTLP ``arrayValue`` text (``{"values": [...]}``)."""
    if not isinstance(raw, str):
        return []
    try:
        value = json.loads(raw)
    except ValueError:
        return []
    if isinstance(value, dict):
        value = [v.get("stringValue") for v in value.get("values", []) if isinstance(v, dict)]
    return [str(v) for v in value if v is not None] if isinstance(value, list) else []


def tree_icicle(nodes: pd.DataFrame, loops: pd.DataFrame) -> alt.LayerChart | alt.Chart:
    """A large run as an icicle: every node a box under its parent, as wide as the leaves under it,
    a row per depth, pruned calls as red boxes under the ThinkNode that asked. Readable at thousands
    of nodes: zoomed and panned by wheel and drag; a box's label shows once it is wide enough."""
    if nodes.empty:
        return _empty_vega("Run tree", "no nodes")
    rows = list(nodes.itertuples(index=False))
    index = {r.node_id: i for i, r in enumerate(rows)}
    ghosts = [row for row in loops.itertuples(index=False) if row.node_id in index]
    boxes = _partition(
        [index.get(r.parent_id) for r in rows] + [index[g.node_id] for g in ghosts], first_ghost=len(rows)
    )  # fmt: skip
    total = sum(width for _, depth, _, width in boxes if depth == 0)
    drawn: list[dict[str, Any]] = []
    for item, depth, x0, width in boxes:
        if item < len(rows):
            row = rows[item]
            kind = _kind(row.kind, "other")
            facts = {"kind": kind, "label": _node_label(row), **_tip(row)}
        else:
            ghost = ghosts[item - len(rows)]
            facts = {"kind": "pruned call", "label": f"✂ {chart_text(ghost.tool, 30)}", **_pruned_tip(ghost)}
        shown = facts["label"] if width / total >= ICICLE_LABEL_SHARE else ""
        drawn.append({**facts, "label": shown, "x": x0, "x2": x0 + width, "y": depth, "y2": depth + 1})
    levels = 1 + max(depth for _, depth, _, _ in boxes)
    frame = pd.DataFrame(drawn)
    kinds = [*KIND_COLORS, "other", "pruned call"]
    colors = [*KIND_COLORS.values(), "#999999", FAILED_COLOR]
    across = alt.Scale(domain=[0, total], nice=False, zero=False)
    down = alt.Scale(domain=[0, levels], reverse=True, nice=False, zero=False)
    base = alt.Chart(frame).encode(x=alt.X("x:Q", axis=None, scale=across), y=alt.Y("y:Q", axis=None, scale=down))
    boxes_drawn = base.mark_rect(stroke="white", strokeWidth=1).encode(
        x2="x2:Q", y2="y2:Q",
        color=alt.Color("kind:N", title=None, scale=alt.Scale(domain=kinds, range=colors),
                        legend=alt.Legend(orient="bottom")),
        tooltip=[alt.Tooltip(f"{field}:N", title=title) for field, title in TREE_TIPS],
    )  # fmt: skip
    labels = (
        alt.Chart(frame)
        .transform_calculate(cx="(datum.x + datum.x2) / 2", cy="datum.y + 0.5")
        .mark_text(fontSize=10, color="white", limit=160)
        .encode(x=alt.X("cx:Q", scale=across, axis=None), y=alt.Y("cy:Q", scale=down, axis=None), text="label:N",
                tooltip=alt.value(None))
    )  # fmt: skip
    chart = alt.LayerChart(
        layer=[boxes_drawn, labels], title=f"Run tree (icicle): {len(nodes)} nodes, {len(ghosts)} caught call(s)",
        height=min(2400, max(300, 36 * levels)),
    ).interactive()  # fmt: skip
    return chart


ICICLE_LABEL_SHARE = 0.03
"""A box of the icicle is labelled when it is at least this share of the run's width (zoomed out)."""


def _partition(parents: list[int | None], first_ghost: int) -> list[tuple[int, int, float, float]]:
    """The icicle's layout (pure): (item, depth, x, width) for each item, depth first from the roots
    (an item whose parent is None, unknown or itself; then any left in a cycle), each leaf one wide,
    a parent as wide as its children. ``parents[i]``: the position of item ``i``'s parent; the items
    from ``first_ghost`` on are the pruned calls, placed after their node's own children."""
    children: dict[int | None, list[int]] = {}
    for item, parent in enumerate(parents):
        children.setdefault(None if parent is None or parent == item else parent, []).append(item)
    for members in children.values():
        members.sort(key=lambda i: (i >= first_ghost, i))
    order: list[tuple[int, int, int]] = []  # (item, depth, position of the parent in order or -1)
    seen: set[int] = set()
    for start in [*children.get(None, []), *range(len(parents))]:
        stack = [(start, 0, -1)]
        while stack:
            item, depth, parent_at = stack.pop()
            if item in seen:
                continue
            seen.add(item)
            order.append((item, depth, parent_at))
            at = len(order) - 1
            stack += [(child, depth + 1, at) for child in reversed(children.get(item, []))]
    width = [0.0] * len(order)
    for at in range(len(order) - 1, -1, -1):
        width[at] = width[at] or 1.0
        if order[at][2] >= 0:
            width[order[at][2]] += width[at]
    x = [0.0] * len(order)
    cursor = [0.0] * len(order)
    roots = 0.0
    for at, (_, _, parent_at) in enumerate(order):
        if parent_at < 0:
            x[at], roots = roots, roots + width[at]
        else:
            x[at] = x[parent_at] + cursor[parent_at]
            cursor[parent_at] += width[at]
    return [(item, depth, x[at], width[at]) for at, (item, depth, _) in enumerate(order)]


# -- the span timeline (waterfall) ----------------------------------------------------------------------


def timeline_order(spans: pd.DataFrame) -> list[int]:
    """The row positions of ``spans`` in tree order (pure): each span, then its children by
    start time, depth first; spans whose parent is not in the run are roots, by start."""
    if spans.empty:
        return []
    ids = list(spans["span_id"])
    known = set(ids)
    children: dict[Any, list[int]] = {}
    for i, parent in enumerate(spans["parent_span_id"]):
        children.setdefault(parent if parent in known else None, []).append(i)
    starts = list(spans["start_ns"])
    for members in children.values():
        members.sort(key=lambda i: (starts[i], str(ids[i])))
    order: list[int] = []
    seen: set[int] = set()
    stack = list(reversed(children.get(None, [])))
    while stack:
        i = stack.pop()
        if i in seen:  # a cycle in the parents: each span once
            continue
        seen.add(i)
        order.append(i)
        stack += reversed(children.get(ids[i], []))
    order += [i for i in sorted(range(len(ids)), key=lambda i: starts[i]) if i not in seen]
    return order


def timeline_chart(spans: pd.DataFrame, loops: pd.DataFrame | None = None) -> alt.LayerChart | alt.Chart:
    """A run's spans as a waterfall: one bar per span in tree order (:func:`timeline_order`),
    from its start to its end in ms since the run's first span, coloured by node kind (failed
    spans outlined red), and each caught call a red cross at its time on the row of the node
    that asked for it. Rows are numbered, so spans of the same name never merge. Vega-Lite: one
    dataset whose ``part`` says what each row draws (``span``, ``caught``)."""
    if spans.empty:
        return _empty_vega("Span timeline", "no spans")
    order = timeline_order(spans)
    shown = order[:TIMELINE_SPANS]
    data = spans.iloc[shown].reset_index(drop=True)
    origin = int(spans["start_ns"].min())
    rows: list[Any] = list(data.itertuples(index=False))
    t = chart_text  # every value below comes from the trace
    drawn: list[dict[str, Any]] = []
    for i, r in enumerate(rows):
        start, end = (int(r.start_ns) - origin) / 1e6, (max(int(r.end_ns), int(r.start_ns)) - origin) / 1e6
        kind = _kind(r.kind, "other span")
        drawn.append({
            "part": "span", "row": i, "label": f"{i + 1} · {t(r.name, 48)}", "start": start, "end": end, "kind": kind,
            "failed": r.status == "failed", "span": t(r.name), "call": t(r.tool) if isinstance(r.tool, str) else "",
            "node": t(r.node_id) if isinstance(r.node_id, str) else "",
            "when": f"starts at {start:,.1f} ms · lasts {end - start:,.1f} ms · {t(r.status)}",
        })  # fmt: skip
    row_of_node = {r.node_id: i for i, r in enumerate(rows) if isinstance(r.node_id, str)}
    caught: list[Any] = []
    if loops is not None and not loops.empty:
        caught = [r for r in loops.itertuples(index=False) if r.node_id in row_of_node]
    for r in caught:
        i = row_of_node[str(r.node_id)]
        tip = _pruned_tip(r)
        drawn.append({"part": "caught", "row": i, "label": drawn[i]["label"], "start": (int(r.time_ns) - origin) / 1e6,
                      "kind": "caught call", "span": tip["what"], "call": tip["call"], "node": tip["node"],
                      "when": tip["limit"]})  # fmt: skip
    frame = pd.DataFrame(drawn)
    kinds = [*KIND_COLORS, "other span", "caught call"]
    colors = [*KIND_COLORS.values(), OTHER_SPAN_COLOR, FAILED_COLOR]
    base = alt.Chart(frame).encode(
        y=alt.Y("label:N", title=None, sort=alt.EncodingSortField(field="row", op="min"),
                axis=alt.Axis(labelLimit=320)),
        color=alt.Color("kind:N", title=None, scale=alt.Scale(domain=kinds, range=colors),
                        legend=alt.Legend(orient="bottom", columns=4)),
        tooltip=[alt.Tooltip(f"{field}:N", title=title) for field, title in TIMELINE_TIPS],
    )  # fmt: skip
    bars = base.mark_bar(height={"band": 0.8}).encode(
        x=alt.X("start:Q", title="ms since the run started", scale=alt.Scale(domainMin=0)), x2="end:Q",
        stroke=alt.condition("datum.failed", alt.value(FAILED_COLOR), alt.value("transparent")),
        strokeWidth=alt.condition("datum.failed", alt.value(2), alt.value(0)),
    ).transform_filter("datum.part == 'span'")  # fmt: skip
    crosses = base.mark_point(shape="cross", filled=True, size=120).encode(x="start:Q").transform_filter(
        "datum.part == 'caught'")  # fmt: skip
    more = f" (the first {len(shown)} of {len(order)})" if len(order) > len(shown) else ""
    chart = alt.LayerChart(
        layer=[bars, crosses],
        title=f"Span timeline (ms since the run started): {len(order)} spans{more}, {len(caught)} caught call(s)",
        height=alt.Step(max(4, min(22, 2400 // len(rows)))),  # 22 px a row, 2400 px at most
    )  # fmt: skip
    return chart


TIMELINE_TIPS = (("span", "span"), ("call", "call"), ("node", "node"), ("when", "when"))
"""The timeline's tooltip: each bar's (or caught call's) fields, by title."""
