"""Analysis of stored runs: ``(connection, filters) -> DataFrame`` functions named
``<metric>_by_<grain>``.

Shapes, prune rates, repeat outcomes (productive or wasted), what-if replay of limits,
tuning verdicts and near repeats, over a store connection (``treellm.store.open_store``
or ``open_parquet``). Never imports the engine or streamlit.
"""

from treellm.errors import require_extra

require_extra("treellm.analysis", "store", "duckdb", "pandas", "tomli_w")

from treellm.analysis.filters import Filters
from treellm.analysis.measures import (
    content_by_tool,
    cost_by_tool,
    internal_calls_by_tool,
    prune_rate_by_model,
    prune_rate_by_tool,
    repeat_outcome_by_tool,
    repeat_samples,
    runs_by_day,
    shape_by_run,
    shape_distribution,
    shape_groups,
    shape_values,
    totals,
)
from treellm.analysis.near import (
    classify_commands,
    classify_pair,
    near_repeat_pairs,
    near_repeats,
    near_repeats_and_pairs,
    near_repeats_by_tool,
)
from treellm.analysis.outcomes import repeats_by_run_outcome
from treellm.analysis.repeats import identical_repeats_and_rows, identical_repeats_by_tool, repeats
from treellm.analysis.report import report, tune
from treellm.analysis.rules import rules_by_tool
from treellm.analysis.tuning import limits_toml, tuning_by_tool, what_if_by_tool_limit, wilson_interval

__all__ = [
    "Filters",
    "classify_commands",
    "classify_pair",
    "content_by_tool",
    "cost_by_tool",
    "identical_repeats_and_rows",
    "identical_repeats_by_tool",
    "internal_calls_by_tool",
    "limits_toml",
    "near_repeat_pairs",
    "near_repeats",
    "near_repeats_and_pairs",
    "near_repeats_by_tool",
    "prune_rate_by_model",
    "prune_rate_by_tool",
    "repeat_outcome_by_tool",
    "repeat_samples",
    "repeats",
    "repeats_by_run_outcome",
    "report",
    "rules_by_tool",
    "runs_by_day",
    "shape_by_run",
    "shape_distribution",
    "shape_groups",
    "shape_values",
    "totals",
    "tune",
    "tuning_by_tool",
    "what_if_by_tool_limit",
    "wilson_interval",
]
