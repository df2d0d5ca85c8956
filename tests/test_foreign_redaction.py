"""No secret stored from any source: other frameworks' spans are redacted before they are stored.

The planted-secret corpus (tests/data/secrets_corpus.json) goes into other frameworks' spans,
every text in every content placement (OpenInference ``input.value``/``output.value`` and
message attributes, GenAI tool attributes and message events, an HTTP header attribute, an
exception event's message and stack trace, the status message, link attributes) and each
``foreign_attribute`` entry under its own key (span, event, link and resource attributes).
Then it is stored three ways: ``ingest`` of an OTLP JSON file, the live collector (real HTTP
on loopback) and ``ingest --clickhouse`` over chDB. Stored: 0 secrets by default, only hashes
with ``capture="none"``; and what ingest derives (signatures, ordinals) is the same as with
``capture="full"``, also when a trace arrives over several transactions (a collector's flushes).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from treellm.collector import Collector, CollectorConfig
from treellm.store import open_store
from treellm.store.ingest import ingest
from treellm.telemetry import redaction
from treellm.telemetry.redaction import MASK

CORPUS = json.loads((Path(__file__).parent / "data" / "secrets_corpus.json").read_text(encoding="utf-8"))
ENTRIES: list[dict[str, Any]] = CORPUS["entries"]
ATTRIBUTES = [e for e in ENTRIES if e["kind"] == "foreign_attribute"]
TEXTS = [e for e in ENTRIES if e["kind"] != "foreign_attribute"]  # every own kind and foreign_text
START = 1_767_225_600_000_000_000


@pytest.fixture(autouse=True)
def default_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TREELLM_CAPTURE", raising=False)
    monkeypatch.setattr(redaction, "_default", None)  # no configure() from another test


def expand(text: str) -> str:
    return re.sub(r"<PAD:(.):(\d+)>", lambda m: m.group(1) * int(m.group(2)), text)


def text_of(entry: dict[str, Any]) -> str:
    return json.dumps(entry["arguments"]) if "arguments" in entry else expand(entry["text"])


def marker(entry: dict[str, Any]) -> str:
    return f"MK{entry['id']}note"


def forbidden(entry: dict[str, Any]) -> list[str]:
    return [entry["secret"], *entry.get("fragments", [])]


# -- the spans ---------------------------------------------------------------------------------------------


def kv(key: str, value: str | int, *, array: bool = False) -> dict[str, Any]:
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if array:
        items = json.loads(value) if value.startswith("[") else [value]
        return {"key": key, "value": {"arrayValue": {"values": [{"stringValue": v} for v in items]}}}
    return {"key": key, "value": {"stringValue": value}}


def span(trace: int, index: int, name: str, attributes: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "traceId": f"{trace:032x}",
        "spanId": f"{trace:08x}{index + 1:08x}",
        "name": name,
        "kind": 1,
        "startTimeUnixNano": str(START + trace * 10**9 + index * 10**6),
        "endTimeUnixNano": str(START + trace * 10**9 + index * 10**6 + 500_000),
        "attributes": attributes,
    }
    if index:
        out["parentSpanId"] = f"{trace:08x}{1:08x}"
    return out | fields


def content_spans(trace: int, text: str) -> list[dict[str, Any]]:
    """One trace with ``text`` in every content placement of other frameworks' spans."""
    stack = f'Traceback (most recent call last):\n  File "tool.py", line 3, in run\nRuntimeError: {text}'
    exception = [kv("exception.type", "RuntimeError"), kv("exception.message", text), kv("exception.stacktrace", stack)]
    return [
        span(trace, 0, "agent", [kv("openinference.span.kind", "AGENT"), kv("input.value", text),
                                 kv("output.value", text)]),
        span(trace, 1, "llm", [kv("openinference.span.kind", "LLM"), kv("llm.input_messages.0.message.content", text),
                               kv("output.value", text)],
             events=[{"timeUnixNano": str(START), "name": "gen_ai.user.message", "attributes": [kv("content", text)]},
                     {"timeUnixNano": str(START), "name": "gen_ai.choice",
                      "attributes": [kv("message", json.dumps({"role": "assistant", "content": text}))]}]),
        span(trace, 2, "probe", [kv("openinference.span.kind", "TOOL"), kv("tool.name", "probe"),
                                 kv("input.value", text), kv("output.value", text),
                                 kv("http.request.header.x-request-note", text)],
             events=[{"timeUnixNano": str(START), "name": "exception", "attributes": exception}],
             links=[{"traceId": f"{trace + 10**6:032x}", "spanId": f"{trace:016x}", "attributes": [kv("note", text)]}],
             status={"code": 2, "message": text}),
        span(trace, 3, "execute_tool fetch", [kv("gen_ai.operation.name", "execute_tool"),
                                              kv("gen_ai.tool.name", "fetch"), kv("gen_ai.tool.call.arguments", text),
                                              kv("gen_ai.tool.call.result", text)]),
    ]  # fmt: skip


def attribute_spans(trace: int, entry: dict[str, Any]) -> list[dict[str, Any]]:
    """One trace with a ``foreign_attribute`` entry under its key: on the span, an event and a link."""
    value = kv(entry["key"], expand(entry["text"]), array=entry.get("array", False))
    return [
        span(trace, 0, "agent", [kv("openinference.span.kind", "AGENT")]),
        span(trace, 1, "GET /v1/items", [kv("openinference.span.kind", "TOOL"), kv("tool.name", "http"), value],
             events=[{"timeUnixNano": str(START), "name": "http.request", "attributes": [value]}],
             links=[{"traceId": f"{trace + 10**6:032x}", "spanId": f"{trace:016x}", "attributes": [value]}]),
    ]  # fmt: skip


def traces_data(trace: int, spans: list[dict[str, Any]], resource: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [kv("service.name", "foreign-agent"), *resource]},
                "scopeSpans": [{"scope": {"name": "openinference.instrumentation.test", "version": "1"},
                                "spans": spans}],
            }
        ]
    }  # fmt: skip


def planted_documents() -> list[dict[str, Any]]:
    """One OTLP/JSON ``TracesData`` per trace: each corpus text, then each attribute entry (also
    as a resource attribute)."""
    docs = [traces_data(i + 1, content_spans(i + 1, text_of(e)), []) for i, e in enumerate(TEXTS)]
    for j, entry in enumerate(ATTRIBUTES, start=len(TEXTS) + 1):
        resource = [kv(entry["key"], expand(entry["text"]), array=entry.get("array", False))]
        docs.append(traces_data(j, attribute_spans(j, entry), resource))
    return docs


def planted_file(folder: Path) -> Path:
    path = folder / "foreign.jsonl"
    with path.open("w", encoding="utf-8") as out:
        for doc in planted_documents():
            out.write(json.dumps(doc) + "\n")
    return path


# -- what was stored ---------------------------------------------------------------------------------------


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from strings(k)
            yield from strings(v)
    elif isinstance(value, list | tuple | np.ndarray):
        for item in value:
            yield from strings(item)


def stored_in_duckdb(db: Path, *, resource: bool = True) -> list[str]:
    """Every text the store holds: every column of spans, events and links, maps included
    (``resource=False``: but the resource attributes)."""
    spans = "SELECT * FROM spans" if resource else "SELECT * EXCLUDE (resource_attributes) FROM spans"
    con = open_store(db, read_only=True)
    try:
        return [text for sql in (spans, "SELECT * FROM span_events", "SELECT * FROM span_links")
                for row in con.execute(sql).fetchall() for text in strings(list(row))]  # fmt: skip
    finally:
        con.close()


def leaks(texts: list[str], needles: dict[str, list[str]]) -> list[str]:
    everything = "\n".join(texts)
    return sorted(entry_id for entry_id, pieces in needles.items() if any(piece in everything for piece in pieces))


SECRETS = {e["id"]: forbidden(e) for e in ENTRIES}
MARKED = [e for e in ENTRIES if marker(e) in text_of(e)]  # a value masked whole under a secret key has none


def assert_redacted(texts: list[str]) -> None:
    assert leaks(texts, SECRETS) == []
    everything = "\n".join(texts)
    assert [e["id"] for e in MARKED if marker(e) not in everything] == []  # masked, not dropped
    assert MASK in everything


# -- ingest, the collector, ingest --clickhouse --------------------------------------------------------------


def test_the_corpus_plants_every_foreign_placement() -> None:
    keys = {e["key"] for e in ATTRIBUTES}
    assert {"http.request.header.authorization", "http.request.header.x-api-key", "http.request.header.cookie"} <= keys
    assert len(ATTRIBUTES) >= 10 and sum(e["kind"] == "foreign_text" for e in ENTRIES) >= 8
    placements = json.dumps(content_spans(1, "x"))
    for place in (
        "input.value",
        "output.value",
        "gen_ai.user.message",
        "gen_ai.choice",
        "exception.message",
        "exception.stacktrace",
        "http.request.header",
        "gen_ai.tool.call.arguments",
        "links",
        "status",
    ):
        assert place in placements, place  # fmt: skip


def test_no_planted_secret_is_stored_by_ingest(tmp_path: Path) -> None:
    db = tmp_path / "store.duckdb"
    report = ingest(db, [planted_file(tmp_path)])
    assert report.spans == 4 * len(TEXTS) + 2 * len(ATTRIBUTES)
    assert_redacted(stored_in_duckdb(db))
    on_disk = b"".join(path.read_bytes() for path in tmp_path.glob("store.duckdb*"))
    assert [e["id"] for e in ENTRIES if e["secret"].encode() in on_disk] == []  # not in a free block either


def test_capture_full_keeps_what_was_received(tmp_path: Path) -> None:
    db = tmp_path / "store.duckdb"
    ingest(db, [planted_file(tmp_path)], capture="full")
    assert leaks(stored_in_duckdb(db), SECRETS) == sorted(SECRETS)  # the test plants what it claims


def test_capture_none_stores_only_hashes(tmp_path: Path) -> None:
    db = tmp_path / "store.duckdb"
    ingest(db, [planted_file(tmp_path)], capture="none")
    assert leaks(stored_in_duckdb(db), SECRETS) == []
    texts = stored_in_duckdb(db, resource=False)  # resource attributes say what ran: redacted, not hashed
    assert leaks(texts, {e["id"]: [marker(e)] for e in ENTRIES}) == []
    assert sum(text.startswith("[hash ") for text in texts) > len(TEXTS)
    con = open_store(db, read_only=True)
    try:
        calls = con.execute("SELECT count(*), count(signature), count(result_hash) FROM tool_calls").fetchone()
        statuses = {
            s for (s,) in con.execute("SELECT DISTINCT status_message FROM spans WHERE status_code = 2").fetchall()
        }
        services = con.execute("SELECT DISTINCT resource_attributes['service.name'] FROM spans").fetchall()
    finally:
        con.close()
    # loop analytics still work: a signature for every call with arguments (the attribute entries'
    # `http` spans hold none: their arguments are unknown, so no signature), and a result hash for
    # every call with a result
    assert calls is not None and calls[1] == calls[0] - len(ATTRIBUTES) > 0
    assert calls[2] == calls[0] - len(ATTRIBUTES)
    assert statuses <= {"error", "RuntimeError"} | {None}  # an exception type, never the message
    assert services == [("foreign-agent",)]  # a resource attribute is redacted, never hashed


def test_own_spans_keep_what_their_capture_recorded(tmp_path: Path) -> None:
    """treellm's own spans were captured (redacted or not) by the capture that made them: ingest
    leaves them alone, so a ``capture="full"`` run stays full."""
    own = span(1, 0, "execute_tool probe", [
        kv("gen_ai.operation.name", "execute_tool"), kv("gen_ai.tool.name", "probe"), kv("treellm.run.id", "r1"),
        kv("treellm.node.id", "n1"), kv("treellm.node.kind", "tool"),
        kv("gen_ai.tool.call.result", "password=own-full-1"),
    ])  # fmt: skip
    doc = {"resourceSpans": [{"resource": {"attributes": [kv("service.name", "me")]},
                              "scopeSpans": [{"scope": {"name": "treellm"}, "spans": [own]}]}]}  # fmt: skip
    path = tmp_path / "own.jsonl"
    path.write_text(json.dumps(doc) + "\n", encoding="utf-8")
    ingest(tmp_path / "store.duckdb", [path])
    assert any("own-full-1" in text for text in stored_in_duckdb(tmp_path / "store.duckdb"))


def test_no_planted_secret_is_stored_by_the_live_collector(tmp_path: Path) -> None:
    db = tmp_path / "store.duckdb"
    documents = planted_documents()
    with Collector(db, CollectorConfig(port=0, flush_interval_s=0.2)) as collector, httpx.Client(timeout=60) as client:
        for doc in documents:
            response = client.post(collector.url, content=json.dumps(doc), headers={"Content-Type": "application/json"})
            assert response.status_code == 200, response.text
    # leaving the block drained the journal into the store and removed it
    assert not any(path.is_file() for path in tmp_path.glob("store.duckdb.collector/**/*"))
    texts = stored_in_duckdb(db)
    assert len([t for t in texts if t == "openinference.instrumentation.test"]) == 4 * len(TEXTS) + 2 * len(ATTRIBUTES)
    assert_redacted(texts)


def test_no_planted_secret_is_stored_by_ingest_clickhouse(tmp_path: Path) -> None:
    pytest.importorskip("chdb")
    from treellm.store.clickhouse import open_clickhouse
    from treellm.store.clickhouse_ingest import ingest_clickhouse

    ch = open_clickhouse(f"chdb:{tmp_path / 'chdb'}", table="planted.otel_traces", database="treellm_planted",
                         create_table=True)  # fmt: skip
    try:
        report = ingest_clickhouse(ch, [planted_file(tmp_path)])
        lines = ch.df(f"SELECT formatRow('JSONEachRow', *) AS line FROM {ch.table}")["line"]  # every column
    finally:
        ch.close()
    assert report.spans == len(lines) == 4 * len(TEXTS) + 2 * len(ATTRIBUTES)
    assert_redacted([text for line in lines for text in strings(json.loads(line))])


# -- what ingest derives does not change --------------------------------------------------------------------

LOGIN = {"user": "bob", "password": "Rd-pw-0001!x"}
REPEATED = [
    ("login", json.dumps(LOGIN)),
    ("login", json.dumps(LOGIN)),
    ("login", json.dumps({"user": "bob", "password": "Rd-pw-0002!x"})),  # differs only in the secret
    ("login", json.dumps(LOGIN)),
    ("fetch", json.dumps({"headers": [["token", "Rd-tok-0003"]]})),
    ("fetch", json.dumps({"headers": [["token", "Rd-tok-0003"]]})),
    ("decode", json.dumps({"blob": "YWRtaW46UmQtcHctMDAwNA=="})),  # admin:Rd-pw-0004
    ("decode", json.dumps({"blob": "YWRtaW46UmQtcHctMDAwNA=="})),
    ("bash", json.dumps({"command": "mysql -uroot -pRd-pw-0005 -e 'select 1'"})),
    ("bash", json.dumps({"command": "mysql -uroot -pRd-pw-0005 -e 'select 1'"})),
]
DERIVED = ("span_id, tool_name, signature, ordinal, earlier_node_ids, result_hash, run_id, node_kind, "
           "node_parent_id, node_depth, internal, node_status")  # fmt: skip


def repeated_calls(trace: int, calls: list[tuple[str, str]], first: int = 0) -> list[dict[str, Any]]:
    """Tool calls of other frameworks (OpenInference and GenAI, in turn), each after an LLM span."""
    spans = []
    for n, (tool, arguments) in enumerate(calls, start=first):
        spans.append(span(trace, 2 * n + 1, "llm", [kv("openinference.span.kind", "LLM")]))
        if n % 2:
            attributes = [
                kv("gen_ai.operation.name", "execute_tool"),
                kv("gen_ai.tool.name", tool),
                kv("gen_ai.tool.call.arguments", arguments),
                kv("gen_ai.tool.call.result", f"ok {n % 3}"),
            ]
        else:
            attributes = [
                kv("openinference.span.kind", "TOOL"),
                kv("tool.name", tool),
                kv("input.value", arguments),
                kv("output.value", f"ok {n % 3}"),
            ]
        spans.append(span(trace, 2 * n + 2, f"execute_tool {tool}" if n % 2 else tool, attributes))
    return spans  # fmt: skip


def derived(db: Path) -> list[tuple[Any, ...]]:
    con = open_store(db, read_only=True)
    try:
        return con.execute(f"SELECT {DERIVED} FROM spans ORDER BY span_id").fetchall()
    finally:
        con.close()


def ingest_calls(folder: Path, capture: str, *parts: list[dict[str, Any]], trace: int = 7) -> Path:
    """Each part in its own transaction (a collector's flushes)."""
    db = folder / f"{capture}.duckdb"
    for index, spans in enumerate(parts):
        path = folder / f"{capture}-{index}.jsonl"
        path.write_text(json.dumps(traces_data(trace, spans, [])) + "\n", encoding="utf-8")
        ingest(db, [path], capture=capture)  # type: ignore[arg-type]
    return db


def test_signatures_and_ordinals_are_the_same_with_redaction_as_with_full_capture(tmp_path: Path) -> None:
    spans = [span(7, 0, "agent", [kv("openinference.span.kind", "AGENT")]), *repeated_calls(7, REPEATED)]
    full, redacted, none = (derived(ingest_calls(tmp_path, mode, spans)) for mode in ("full", "redacted", "none"))
    assert redacted == full and none == full
    ordinals = [row[3] for row in full if row[1] == "login"]
    assert ordinals == [1, 2, 1, 3]  # derived from the raw arguments: the other password is another call
    assert max(row[3] or 0 for row in full) >= 3 and all(row[2] for row in full if row[1])
    stored = stored_in_duckdb(tmp_path / "redacted.duckdb")
    assert not [s for s in ("Rd-pw-0001", "Rd-pw-0002", "Rd-tok-0003", "YWRtaW46UmQt", "Rd-pw-0005")
                if any(s in text for text in stored)]  # fmt: skip


def test_ordinals_are_the_same_when_a_trace_arrives_in_two_transactions(tmp_path: Path) -> None:
    root = span(7, 0, "agent", [kv("openinference.span.kind", "AGENT")])
    first, second = [root, *repeated_calls(7, REPEATED[:2])], repeated_calls(7, REPEATED[2:4], first=2)
    assert derived(ingest_calls(tmp_path, "redacted", first, second)) == derived(
        ingest_calls(tmp_path, "full", first, second)
    )


SHELL = [
    ("bash", json.dumps({"command": "cat /srv/app/settings.ini"})),
    ("bash", json.dumps({"command": "cat /srv/app/settings.ini"})),
    ("bash", json.dumps({"command": "echo x > /srv/other.txt"})),  # writes another path: the count goes on
    ("bash", json.dumps({"command": "cat /srv/app/settings.ini"})),
    ("bash", json.dumps({"command": "sed -i s/a/b/ /srv/app/settings.ini"})),  # writes what it reads
    ("bash", json.dumps({"command": "cat /srv/app/settings.ini"})),
]


def test_ordinals_are_the_same_when_a_trace_arrives_in_several_transactions_with_capture_none(
    tmp_path: Path,
) -> None:
    """Under ``none`` every stored argument is a hash: the calls stored by the earlier flushes
    are keyed, and their targets read, from what the placement stored of their raw values."""
    calls = REPEATED + SHELL
    root = span(7, 0, "agent", [kv("openinference.span.kind", "AGENT")])
    parts = [[root, *repeated_calls(7, calls[:3])]]
    parts += [repeated_calls(7, calls[n : n + 3], first=n) for n in range(3, len(calls), 3)]
    (tmp_path / "one").mkdir()
    full = derived(ingest_calls(tmp_path / "one", "full", [s for part in parts for s in part]))
    assert derived(ingest_calls(tmp_path, "none", *parts)) == full
    assert [row[3] for row in full if row[1] == "login"] == [1, 2, 1, 3]
    ordinals = {row[0]: row[3] for row in full}
    cats = [ordinals[f"{7:08x}{2 * n + 3:08x}"] for n, call in enumerate(calls) if call == SHELL[0]]
    assert cats == [1, 2, 3, 1]  # a write elsewhere leaves the count, a write to what it reads restarts it


def tools_node(trace: int, index: int, call: int, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """LangGraph's ``tools`` node: it records the one call its child tool span runs."""
    recorded = [{"name": tool, "args": arguments, "id": f"call_{call}", "type": "tool_call"}]
    return span(
        trace, index, "tools", [kv("openinference.span.kind", "CHAIN"), kv("input.value", json.dumps(recorded))]
    )


def bare_call(trace: int, index: int, parent: int, tool: str, value: str) -> dict[str, Any]:
    """A single-argument tool's span: it records the bare value, its parent the keyed call."""
    attributes = [kv("openinference.span.kind", "TOOL"), kv("tool.name", tool), kv("input.value", value),
                  kv("output.value", "ok")]  # fmt: skip
    return span(trace, index, tool, attributes, parentSpanId=f"{trace:08x}{parent + 1:08x}")


@pytest.mark.parametrize("capture", ["redacted", "none"])
def test_a_bare_call_is_keyed_by_a_parent_that_arrives_in_a_later_transaction(tmp_path: Path, capture: str) -> None:
    """A stored call's key is kept across flushes, but a parent that records the call and arrives
    later keys it again (children are exported first); a parent stored before never does."""
    passwords = ["Rd-pw-0001!x", "Rd-pw-0001!x", "Rd-pw-0002!x", "Rd-pw-0001!x"]
    nodes = [tools_node(8, 2 * n + 1, n, "unlock", {"password": p}) for n, p in enumerate(passwords)]
    calls = [bare_call(8, 2 * n + 2, 2 * n + 1, "unlock", p) for n, p in enumerate(passwords)]
    root = span(8, 0, "agent", [kv("openinference.span.kind", "AGENT")])
    parts = [[root, *calls[:3]], nodes[:3], [nodes[3], calls[3]]]  # children first, then their parents
    (tmp_path / "one").mkdir()
    full = derived(ingest_calls(tmp_path / "one", "full", [s for part in parts for s in part], trace=8))
    assert derived(ingest_calls(tmp_path, capture, *parts, trace=8)) == full
    assert [row[3] for row in full if row[1] == "unlock"] == [1, 2, 1, 3]
    con = open_store(tmp_path / f"{capture}.duckdb", read_only=True)
    try:
        stored = con.execute("SELECT arguments FROM tool_calls").fetchall()
    finally:
        con.close()
    assert not [a for (a,) in stored if "Rd-pw" in a]
