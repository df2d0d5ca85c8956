"""The set-based placement of flat traces (``treellm/derive/trees_sql.py``) stores exactly what the
Python placement (``treellm/derive/trees.py``) stores, on traces of every shape: flat ones of every
kind (ties in time, repeats past the kept earlier ids, unknown arguments, internal and failed calls,
spans nested below the calls) and the shapes it leaves to Python (sub-agents, missing parents, two
roots, calls that change state, bare arguments, no invocation), in one file and split across two ingests."""

from __future__ import annotations

import importlib
import json
import random
from pathlib import Path
from typing import Any

import duckdb
import pytest

from treellm.derive import foreign
from treellm.store.ingest import ingest

_TOOLS = ("read_file", "grep", "web_search")


def _attr(key: str, value: object) -> dict[str, Any]:
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": str(value)}}


class _Trace:
    def __init__(self, rng: random.Random, number: int) -> None:
        self.rng = rng
        self.trace = f"{number + 1:032x}"
        self.spans: list[dict[str, Any]] = []
        self.clock = 1_796_000_000_000_000_000 + number * 10_000_000_000

    def span_id(self) -> str:
        return f"{self.rng.getrandbits(64) | 1:016x}"

    def add(self, parent: str | None, name: str, attrs: list[dict[str, Any]], *, tie: bool = False,
            status: int = 0) -> str:  # fmt: skip
        sid = self.span_id()
        if not tie:
            self.clock += self.rng.choice((1, 1_000, 3_000_000))
        span: dict[str, Any] = {
            "traceId": self.trace, "spanId": sid, "name": name, "kind": 1,
            "startTimeUnixNano": str(self.clock), "endTimeUnixNano": str(self.clock + self.rng.randrange(1, 9) * 1000),
            "attributes": attrs, "status": {"code": status},
        }  # fmt: skip
        if parent is not None:
            span["parentSpanId"] = parent
        self.spans.append(span)
        return sid

    def agent(self, parent: str | None, name: str | None = "support-bot") -> str:
        attrs = [_attr("gen_ai.operation.name", "invoke_agent")]
        if name is not None:
            attrs.append(_attr("gen_ai.agent.name", name))
        return self.add(parent, f"invoke_agent {name or ''}".strip(), attrs)

    def workflow(self, parent: str | None, name: str = "graph") -> str:
        return self.add(parent, name, [_attr("gen_ai.operation.name", "invoke_workflow")])

    def llm(self, parent: str, *, tie: bool = False) -> str:
        attrs = [_attr("gen_ai.operation.name", "chat"), _attr("gen_ai.request.model", "gpt-4o-mini")]
        return self.add(parent, "chat gpt-4o-mini", attrs, tie=tie)

    def tool(self, parent: str | None, tool: str, arguments: str | None, *, tie: bool = False, status: int = 0,
             result: str = "ok") -> str:  # fmt: skip
        attrs = [_attr("gen_ai.operation.name", "execute_tool"), _attr("gen_ai.tool.name", tool),
                 _attr("gen_ai.tool.call.result", result)]  # fmt: skip
        if arguments is not None:
            attrs.append(_attr("gen_ai.tool.call.arguments", arguments))
        return self.add(parent, f"execute_tool {tool}", attrs, tie=tie, status=status)

    def other(self, parent: str) -> str:
        return self.add(parent, "http GET", [_attr("http.method", "GET")])


def _calls(trace: _Trace, parent: str, rng: random.Random, turns: int) -> None:
    """Think nodes and their calls under ``parent``: ties, repeats, unknown and internal calls."""
    for _ in range(turns):
        think = trace.llm(parent, tie=rng.random() < 0.2)
        for _ in range(rng.randrange(0, 4)):
            tool = rng.choice(_TOOLS)
            arguments: str | None = json.dumps({"path": f"src/m{rng.randrange(3)}.py"})
            if rng.random() < 0.1:
                arguments = None
            call = trace.tool(rng.choice((parent, think)), tool, arguments, tie=rng.random() < 0.2,
                              status=2 if rng.random() < 0.1 else 0)  # fmt: skip
            if rng.random() < 0.1:
                trace.other(call)
        if rng.random() < 0.2:
            trace.other(parent)


def _flat(trace: _Trace, rng: random.Random) -> None:
    root = trace.agent(None)
    _calls(trace, root, rng, rng.randrange(0, 6))
    if rng.random() < 0.2:  # a framework-internal tool: a node without a count
        trace.tool(root, "transfer_to_agent", json.dumps({"agent_name": "x"}))


def _loop(trace: _Trace, rng: random.Random) -> None:
    """More identical calls than a call keeps the ids of (``EARLIER_KEPT``)."""
    root = trace.agent(None)
    think = trace.llm(root)
    for _ in range(foreign.EARLIER_KEPT + 6):
        trace.tool(think, "grep", json.dumps({"q": "x", "n": 1}))
        if rng.random() < 0.3:
            think = trace.llm(root)


def _graph(trace: _Trace, rng: random.Random) -> None:
    """A graph: nodes (workflows, unnamed agents) nested in the root, calls inside them."""
    root = trace.workflow(None) if rng.random() < 0.5 else trace.agent(None, rng.choice(("support-bot", None)))
    _calls(trace, root, rng, 1)
    for _ in range(rng.randrange(1, 4)):
        node = trace.workflow(root, "node") if rng.random() < 0.5 else trace.agent(root, None)
        _calls(trace, rng.choice((node, trace.workflow(node, "subgraph"))), rng, rng.randrange(0, 3))


def _own_agent(trace: _Trace, rng: random.Random) -> None:
    """An agent span of the root's own agent nested in it (an instrumentor marks a node so)."""
    root = trace.agent(None)
    _calls(trace, trace.agent(trace.workflow(root, "node"), "support-bot"), rng, 2)
    _calls(trace, root, rng, 1)


def _named_under_unnamed(trace: _Trace, rng: random.Random) -> None:
    """The root's name again, below an unnamed agent: a sub-agent by the rule (Python's)."""
    root = trace.agent(None)
    _calls(trace, trace.agent(trace.agent(root, None), "support-bot"), rng, 2)


def _sub_agent(trace: _Trace, rng: random.Random) -> None:
    root = trace.agent(None)
    _calls(trace, root, rng, 2)
    child = trace.agent(root, "researcher")
    _calls(trace, child, rng, 2)


def _missing_parent(trace: _Trace, rng: random.Random) -> None:
    root = trace.agent(None)
    _calls(trace, root, rng, 2)
    _calls(trace, trace.span_id(), rng, 2)


def _two_roots(trace: _Trace, rng: random.Random) -> None:
    for _ in range(2):
        _calls(trace, trace.agent(None), rng, 2)


def _state_change(trace: _Trace, rng: random.Random) -> None:
    root = trace.agent(None)
    think = trace.llm(root)
    for command in ("cat a.txt", "echo 1 > a.txt", "cat a.txt", "cat a.txt"):
        trace.tool(think, "bash", json.dumps({"command": command}))


def _bare(trace: _Trace, rng: random.Random) -> None:
    root = trace.agent(None)
    think = trace.llm(root)
    trace.tool(think, "web_search", "weather in Paris")


def _no_invocation(trace: _Trace, rng: random.Random) -> None:
    root = trace.llm(trace.add(None, "POST /chat", [_attr("http.method", "POST")]))
    trace.tool(root, "grep", json.dumps({"q": "y"}))


_SHAPES = (_flat, _flat, _flat, _loop, _graph, _graph, _own_agent, _sub_agent, _named_under_unnamed,
           _missing_parent, _two_roots, _state_change, _bare, _no_invocation)  # fmt: skip
_ONE_PATH = (_flat, _loop, _graph, _own_agent)
"""The shapes the set-based placement takes (but for a trace with a call of unknown arguments)."""


def _traces(seed: int, count: int) -> list[_Trace]:
    rng = random.Random(seed)
    out = []
    for number in range(count):
        trace = _Trace(rng, number)
        _SHAPES[number % len(_SHAPES)](trace, rng)
        out.append(trace)
    return out


def _write(path: Path, spans: list[dict[str, Any]]) -> Path:
    with path.open("w", encoding="utf-8") as out:
        for start in range(0, len(spans), 40):
            scope = {"scope": {"name": "openinference.instrumentation"}, "spans": spans[start : start + 40]}
            resource = {"attributes": [_attr("service.name", "bot")]}
            out.write(json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [scope]}]}) + "\n")
    return path


def _stores_equal(left: Path, right: Path) -> int:
    """The rows both stores hold are the same (EXCEPT ALL both ways); returns the spans compared."""
    con = duckdb.connect()
    con.execute(f"ATTACH '{left}' AS a (READ_ONLY); ATTACH '{right}' AS b (READ_ONLY)")
    for table in ("spans", "span_events", "span_links"):
        for one, other in (("a", "b"), ("b", "a")):
            differ = con.execute(
                f"SELECT * FROM (SELECT * FROM {one}.{table} EXCEPT ALL SELECT * FROM {other}.{table}) LIMIT 3"
            ).fetchall()
            assert differ == [], (table, one, differ)
    return int(con.execute("SELECT count(*) FROM a.spans").fetchone()[0])  # type: ignore[index]


def _ingest_both(tmp_path: Path, files: list[Path], monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, int]:
    """Each file ingested in turn into two stores: every trace placed in Python (the SQL placement
    replaced by an empty ``flat_traces``), then as ingest places them. Returns both stores and how
    many traces the SQL placement took."""
    flat = [0]
    placed = foreign._place_flat

    def in_python(con: duckdb.DuckDBPyConnection) -> None:
        con.execute("CREATE OR REPLACE TEMP TABLE flat_traces (trace_id VARCHAR)")

    def counted(con: duckdb.DuckDBPyConnection) -> None:
        placed(con)
        flat[0] += int(con.execute("SELECT count(*) FROM flat_traces").fetchone()[0])  # type: ignore[index]

    stores = {"python": tmp_path / "store-python.duckdb", "sql": tmp_path / "store-sql.duckdb"}
    for way, place in (("python", in_python), ("sql", counted)):
        monkeypatch.setattr(foreign, "_place_flat", place)
        for file in files:
            ingest(stores[way], [file])
    return stores["python"], stores["sql"], flat[0]


def test_recorded_framework_traces_are_placed_the_same_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real instrumentors' spans (LangGraph graphs, subgraphs and supervisors, Agents SDK
    handoffs, smolagents managed agents, CrewAI, LlamaIndex, ADK, AutoGen, Strands, any-agent,
    tau-bench), each file ingested in turn: the same rows both ways, and some traces in SQL."""
    data = Path(__file__).parent / "data"
    files = sorted((data / "frameworks").rglob("*.pb")) + sorted((data / "external").glob("*.json"))
    assert len(files) > 15
    python, sql, flat = _ingest_both(tmp_path, files, monkeypatch)
    assert _stores_equal(python, sql) > 1000
    assert flat > 10


def test_flat_traces_placed_in_sql_store_what_python_stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    traces = _traces(seed=7, count=280)
    spans = [span for trace in traces for span in trace.spans]
    python, sql, flat = _ingest_both(tmp_path, [_write(tmp_path / "all.jsonl", spans)], monkeypatch)
    assert _stores_equal(python, sql) == len(spans)
    # most flat and loop traces took SQL (not those with a call of unknown arguments), no other shape did
    flat_shaped = sum(1 for n in range(len(traces)) if _SHAPES[n % len(_SHAPES)] in _ONE_PATH)
    assert flat_shaped * 0.6 <= flat <= flat_shaped
    con = duckdb.connect(str(sql), read_only=True)
    assert con.execute("SELECT max(ordinal) FROM spans").fetchone() == (foreign.EARLIER_KEPT + 6,)
    assert con.execute("SELECT count(*) FROM spans WHERE node_kind = 'think' AND node_depth > 0").fetchone()[0] > 0  # type: ignore[index]


def test_a_trace_split_across_ingests_is_placed_again_the_same_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Children first, then the rest with the roots: the second ingest places stored rows (their
    keys kept) beside new ones, and moves the first ingest's spans to their runs."""
    traces = _traces(seed=11, count=140)
    first, second = [], []
    for trace in traces:
        cut = len(trace.spans) // 2
        first += trace.spans[cut:]  # no root: the root is each trace's first span
        second += trace.spans[:cut]
    files = [_write(tmp_path / "late.jsonl", first), _write(tmp_path / "roots.jsonl", second)]
    python, sql, flat = _ingest_both(tmp_path, files, monkeypatch)
    assert _stores_equal(python, sql) == len(first) + len(second)
    assert flat > 0


def test_traces_cut_across_the_chunks_of_one_file_are_placed_the_same_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One file in many chunks of one transaction, each trace's spans spread over several of them
    (the spans shuffled): each chunk places the rows of its traces stored by the chunks before."""
    ingest_module = importlib.import_module("treellm.store.ingest")
    monkeypatch.setattr(ingest_module, "CHUNK_BYTES", 48 * 1024)
    monkeypatch.setattr(ingest_module, "MIN_PIECE_BYTES", 4 * 1024)
    monkeypatch.setattr(ingest_module, "PIECES_IN_FLIGHT_BYTES", 16 * 1024)
    traces = _traces(seed=13, count=70)
    spans = [span for trace in traces for span in trace.spans]
    random.Random(13).shuffle(spans)
    file = _write(tmp_path / "shuffled.jsonl", spans)
    assert file.stat().st_size > 4 * 48 * 1024  # several chunks
    python, sql, flat = _ingest_both(tmp_path, [file], monkeypatch)
    assert _stores_equal(python, sql) == len(spans)
    assert flat > 0
