"""Text from traces in Streamlit: the one rule every page follows.

Traces are untrusted: any agent (or attacker) writes the names, ids, arguments and results
the dashboard shows. So a string from a trace, from the store's path or from the URL is
always shown as text, never as Markdown or HTML:

- as it is, only through elements that never parse it: ``st.text``, ``st.code``,
  ``st.json``, ``st.dataframe`` cells and ``st.selectbox`` options (plain text);
- through :func:`literal` wherever Streamlit parses Markdown: titles, headers, captions,
  alert bodies (``st.info``, ``st.warning``, ...), metric labels, values and deltas, widget
  labels and help, and the options of ``st.radio``, ``st.pills`` and ``st.segmented_control``;
- never with ``unsafe_allow_html``, ``st.html`` or ``st.markdown``.

Charts are Vega-Lite, which draws text as text: they get it through :func:`plain`
(``dashboard.charts.chart_text``: one line, cut), nothing escaped.
"""

from __future__ import annotations

import math
import re

import pandas as pd

__all__ = ["literal", "plain"]

_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")
"""Every ASCII punctuation character: CommonMark lets a backslash make each one literal."""
_CONTROL_OR_SPACE = re.compile(r"[\x00-\x20\x7f-\x9f\u2028\u2029]+")
_WORD_JOINER = "\u2060"


def literal(value: object) -> str:
    """``value`` as Markdown source that Streamlit renders as exactly that text, on one line.

    Every ASCII punctuation character is backslash-escaped (no link, image, emphasis, code,
    HTML, math, autolink, heading, list or ``:color[...]`` directive can start), runs of
    whitespace and control characters become one space (no block can start), and an
    invisible word joiner follows each colon so that ``:smile:`` or ``:material/home:``
    stays text instead of turning into an emoji or an icon. ``None`` and missing values
    are the empty string.
    """
    return _PUNCTUATION.sub(r"\\\1", plain(value)).replace(":", ":" + _WORD_JOINER)


def plain(value: object) -> str:
    """``value`` as one line of plain text: runs of whitespace and control characters become one
    space, the ends are trimmed; ``None`` and missing values are the empty string."""
    if value is None or value is pd.NA or value is pd.NaT or (isinstance(value, float) and math.isnan(value)):
        return ""
    return _CONTROL_OR_SPACE.sub(" ", str(value)).strip()
