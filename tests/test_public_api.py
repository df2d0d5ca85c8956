"""The public surface is exactly what we mean it to be (no accidental exports)."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import treellm

PUBLIC = {
    "treellm.collector": {"Collector", "CollectorConfig", "CollectorStats", "serve", "token_from_env"},
    "treellm.analysis": {
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
    },
    "treellm.simulate": {
        "PERSONAS",
        "PLANTED",
        "Persona",
        "PlantedTool",
        "SimulationReport",
        "Verdict",
        "iter_runs",
        "sample_traces_dir",
        "simulate",
    },
    "treellm.store": {
        "BadRecord",
        "DuckDBSpanExporter",
        "FileReport",
        "GcReport",
        "IngestReport",
        "default_db_path",
        "export_parquet",
        "gc",
        "ingest",
        "ingest_file",
        "open_parquet",
        "open_store",
    },
    "treellm.telemetry": {
        "Capture",
        "CaptureMode",
        "TelemetryObserver",
        "redact_text",
        "redact_value",
        "semconv",
    },
    "treellm": {
        "ArgumentPattern",
        "BranchAnswer",
        "ChatModel",
        "Chunk",
        "ChunkType",
        "CollapseNode",
        "Event",
        "EventType",
        "ModelRequest",
        "ModelTurn",
        "NodeKind",
        "NodeStatus",
        "PrunedCall",
        "RunResult",
        "RunStats",
        "ScriptedModel",
        "Skill",
        "ThinkNode",
        "Tool",
        "ToolCall",
        "ToolLimits",
        "ToolNode",
        "ToolRule",
        "TreeConfig",
        "TreeExecutor",
        "Usage",
        "GuardDecision",
        "IngestError",
        "StoreBusyError",
        "StoreError",
        "OTLPJsonlSpanExporter",
        "configure",
        "OpenAICompatibleModel",
        "LoopGuard",
        "MissingExtraError",
        "CallKey",
        "ConfigError",
        "LoopDecision",
        "LoopDetector",
        "ModelError",
        "PathSignatures",
        "RawArguments",
        "ScriptExhaustedError",
        "ToolDefinitionError",
        "TreeLLMError",
        "__version__",
        "canonical_json",
        "parse_arguments",
        "signature",
        "stable_hash",
    },
}


@pytest.mark.parametrize("module_name", sorted(PUBLIC))
def test_all_is_exactly_the_intended_public_names(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert set(module.__all__) == PUBLIC[module_name]


@pytest.mark.parametrize("module_name", sorted(PUBLIC))
def test_all_is_sorted_and_every_name_resolves(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert list(module.__all__) == sorted(module.__all__)
    for name in module.__all__:
        assert hasattr(module, name), name


def test_no_public_attribute_escapes_all() -> None:
    public_attrs = {
        name
        for name, value in vars(treellm).items()
        if not name.startswith("_") and not getattr(value, "__name__", "").startswith("treellm.")
    }
    assert public_attrs <= set(treellm.__all__)


def test_every_error_derives_from_treellm_error() -> None:
    for name in treellm.__all__:
        value = getattr(treellm, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, treellm.TreeLLMError), name


def test_a_command_imports_none_of_the_executor_and_each_public_name_comes_on_first_use() -> None:
    """``import treellm`` and the CLI import none of the executor, the engine, the models or the
    OpenTelemetry setup (a command's start-up, BENCHMARKS.md "Batched ingest"); each such name
    is imported when first read, is the object its module defines, and ``dir`` lists it."""
    script = textwrap.dedent(
        """
        import json, sys
        import treellm, treellm.cli, treellm.telemetry
        heavy = ("treellm.agent", "treellm.engine", "treellm.models", "treellm.setup", "treellm.telemetry.observer")
        before = sorted(m for m in sys.modules if m.startswith(heavy))
        observer_listed = "TelemetryObserver" in dir(treellm.telemetry)
        from treellm import LoopGuard, TreeExecutor
        from treellm.agent import TreeExecutor as defined
        from treellm.telemetry import TelemetryObserver
        from treellm.telemetry.observer import TelemetryObserver as observer
        print(json.dumps({
            "before": before,
            "observer_listed": observer_listed,
            "same": TreeExecutor is defined and TelemetryObserver is observer,
            "guard": LoopGuard.__module__,
            "listed": sorted(set(treellm.__all__) - set(dir(treellm))),
            "signature": callable(treellm.signature),
        }))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    found = json.loads(done.stdout)
    assert found == {
        "before": [],
        "observer_listed": True,
        "same": True,
        "guard": "treellm.guard",
        "listed": [],
        "signature": True,
    }
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        treellm.NoSuchName  # noqa: B018


@pytest.mark.parametrize("module_name", ["treellm", "treellm.telemetry"])
def test_the_lazy_table_and_the_type_checkers_imports_name_the_same_modules(module_name: str) -> None:
    """Each name imported on first use is imported, from the same module, under ``TYPE_CHECKING``
    (what mypy and a user's type checker read), and nothing else is: the two lists cannot drift."""
    module = importlib.import_module(module_name)
    tree = ast.parse(Path(module.__file__ or "").read_text(encoding="utf-8"))
    checked = {
        alias.asname or alias.name: node.module
        for block in tree.body
        if isinstance(block, ast.If) and ast.unparse(block.test) == "_typing.TYPE_CHECKING"
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert checked == module._LAZY
    assert set(checked) <= set(module.__all__)
