"""Every client served (issue 22, point 6), and ``/health`` says where the stored spans went (point 4).

One peer holding its cap in half-sent requests keeps no other peer out: connections over a peer's
cap are closed as soon as they are accepted, and the total cap comes from the descriptor limit,
raised to the hard one at start. The peers are told apart by binding the test's sockets to
different loopback addresses (127.0.0.2, 127.0.0.3: all of 127/8 is loopback on Linux).

No assertion here is on how long something took, and nothing waits on a clock: the tests wait on
the collector's counters (connections open, refused per peer, requests under way, spans stored).
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, closing
from dataclasses import fields
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_collector import PROTOBUF, ROOT, count_spans, pb_request, wait_until
from test_collector_hardening import HEALTH_REQUEST, post_head, read_response, read_until_closed

from treellm.collector import Collector, CollectorConfig
from treellm.collector.command import add_arguments
from treellm.collector.connections import NO_LIMIT_CAP, connection_cap, peer_key
from treellm.errors import ConfigError
from treellm.store import ingest

PEER_A = "127.0.0.2"
PEER_B = "127.0.0.3"
JSON = {"Content-Type": "application/json"}
SAMPLE = ROOT / "sample_traces" / "branch_local_loop.jsonl"


def connect_from(url: str, peer: str) -> socket.socket:
    """A connection to ``url`` from the loopback address ``peer``."""
    address = httpx.URL(url)
    return socket.create_connection((address.host, address.port), timeout=20, source_address=(peer, 0))


def client_from(peer: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=peer), timeout=20)  # a bound, not a measure


def health_url(collector: Collector) -> str:
    return collector.url.replace("/v1/traces", "/health")


@pytest.fixture
def patient(tmp_path: Path) -> Iterator[Collector]:
    """A collector whose deadlines never fire during a test: only the caps decide."""
    config = CollectorConfig(port=0, flush_interval_s=0.2, header_timeout_s=600, body_timeout_s=600)
    with Collector(tmp_path / "s.duckdb", config) as running:
        yield running


# -- one peer cannot keep the others out -----------------------------------------------------------------


def test_300_half_sent_requests_from_one_peer_keep_no_other_peer_out(
    patient: Collector, caplog: pytest.LogCaptureFixture
) -> None:
    """Peer A opens 300 connections and sends each a request's headers and half its body, then
    holds them. Peer B's 1,000 spans are acknowledged and stored meanwhile, and /health answers it."""
    caplog.set_level(logging.INFO, logger="treellm.collector")
    stats = patient.stats()
    per_peer = stats.connection_cap_per_peer
    assert per_peer == 64 and stats.connection_cap > 300, stats  # the total cap from the descriptor limit
    body = pb_request(999, spans=4).SerializeToString()
    half = post_head(patient.url, length=len(body)) + body[: len(body) // 2]
    with ExitStack() as held:
        flood = [held.enter_context(closing(connect_from(patient.url, PEER_A))) for _ in range(300)]

        def accepted() -> bool:
            now = patient.stats()
            return now.peer_refused == 300 - per_peer and now.connections == per_peer

        wait_until(accepted, what="A's connections over its cap closed at accept, the others taken")
        for sock in flood:
            try:
                sock.sendall(half)
            except OSError:  # closed by the collector at accept
                continue
        wait_until(lambda: patient.stats().requests == per_peer, what="A's requests under way, mid-body")

        with client_from(PEER_B) as b:
            answers = [
                b.post(patient.url, content=pb_request(n, spans=100).SerializeToString(), headers=PROTOBUF)
                for n in range(10)
            ]
            assert [a.status_code for a in answers] == [200] * 10
            health = b.get(health_url(patient))
            assert health.status_code == 200
            seen = health.json()
            assert seen["accepted_spans"] == 1000 and seen["peers"] == 2, seen
            assert seen["peer_refused"] == 300 - per_peer and seen["over_capacity"] == 0, seen
            wait_until(lambda: count_spans(patient.db) == 1000, what="B's 1,000 spans in the store")

        open_ones = 0
        for sock in flood:  # A's held requests are still under way: neither answered nor closed
            sock.setblocking(False)
            try:
                sock.recv(1)
            except BlockingIOError:
                open_ones += 1
            except OSError:
                pass
        assert open_ones == per_peer
        assert patient.stats().requests == per_peer + 10  # and B's ten exports (/health is no export request)
    refusals = [r.getMessage() for r in caplog.records if "above its cap" in r.getMessage()]
    assert refusals[:1] == [f"closing connections from {PEER_A} above its cap of {per_peer} at once "
                            "(logged once until it holds fewer)"]  # fmt: skip
    assert len([m for m in refusals if m.startswith("closing")]) == 1, refusals  # once per burst, not per connection


def test_a_peer_at_its_cap_is_refused_its_own_health_but_another_peer_is_not(tmp_path: Path) -> None:
    config = CollectorConfig(port=0, max_connections_per_peer=2, header_timeout_s=600, body_timeout_s=600)
    with Collector(tmp_path / "s.duckdb", config) as capped, ExitStack() as stack:
        for _ in range(2):
            sock = stack.enter_context(closing(connect_from(capped.url, PEER_A)))
            sock.sendall(post_head(capped.url, length=10))  # mid-request
        wait_until(lambda: capped.stats().requests == 2, what="A's two requests under way")
        with closing(connect_from(capped.url, PEER_A)) as third:
            assert read_until_closed(third) == b"", "closed at accept, before a byte was read"
        assert capped.stats().peer_refused == 1
        with closing(connect_from(capped.url, PEER_B)) as other:
            other.sendall(HEALTH_REQUEST)
            assert read_response(other).startswith(b"HTTP/1.1 200 ")
        stack.close()  # A lets go: it is taken again
        wait_until(lambda: capped.stats().peers == 0, what="A's connections gone")
        with client_from(PEER_A) as a:
            assert a.get(health_url(capped)).json()["peers"] == 1


# -- the caps ---------------------------------------------------------------------------------------------


def test_a_peer_is_an_ipv4_address_or_an_ipv6_slash_64() -> None:
    assert peer_key(("127.0.0.2", 40000)) == "127.0.0.2"
    assert peer_key(("::ffff:10.0.0.7", 40000, 0, 0)) == "10.0.0.7"  # dual-stack: the IPv4 peer
    assert peer_key(("2001:db8:1:2:aaaa::1", 1, 0, 0)) == peer_key(("2001:db8:1:2:ffff::9", 2, 0, 0))
    assert peer_key(("2001:db8:1:2::1", 1, 0, 0)) == "2001:db8:1:2::/64"
    assert peer_key(("2001:db8:1:3::1", 1, 0, 0)) != peer_key(("2001:db8:1:2::1", 1, 0, 0))
    assert peer_key(("fe80::1%eth0", 1, 0, 2)) == "fe80::/64"
    assert peer_key("/run/collector.sock") == "/run/collector.sock"
    assert peer_key(None) == ""


def test_the_total_cap_is_what_the_descriptors_allow_unless_max_connections_is_lower() -> None:
    assert connection_cap(None, 20_000, 40, 32) == 20_000 - 40 - 32
    assert connection_cap(500, 20_000, 40, 32) == 500
    assert connection_cap(None, None, 40, 32) == NO_LIMIT_CAP
    assert connection_cap(None, 60, 40, 32) < 1


def test_the_per_peer_cap_is_a_validated_setting_with_a_flag() -> None:
    with pytest.raises(ConfigError, match="max_connections_per_peer: expected a positive integer"):
        CollectorConfig(max_connections_per_peer=0)
    assert CollectorConfig().max_connections is None  # derived from the descriptor limit
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--max-connections-per-peer", "8"])
    assert args.max_connections_per_peer == 8 and args.max_connections is None


def test_every_collector_setting_is_documented() -> None:
    doc = CollectorConfig.__doc__ or ""
    assert [f.name for f in fields(CollectorConfig) if f"``{f.name}``" not in doc] == []


_LIMITED_COLLECTOR = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2])))
from treellm.collector.__main__ import main
sys.exit(main(sys.argv[3:]))
"""


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one_at_start(tmp_path: Path) -> None:
    """``ulimit -Sn 256`` under a hard limit of 2048: the collector raises the soft one and caps
    connections by 2048, not 256."""
    log = tmp_path / "collector.log"
    command = [sys.executable, "-c", _LIMITED_COLLECTOR, "256", "2048", "--db", str(tmp_path / "s.duckdb"),
               "--port", "0", "-v"]  # fmt: skip
    with log.open("w") as stderr, subprocess.Popen(command, stderr=stderr, cwd=ROOT) as process:
        try:
            wait_until(lambda: "listening on" in log.read_text() or process.poll() is not None, 30, "the collector")
            url = log.read_text().split("listening on ", 1)[1].split(";")[0]
            seen = httpx.get(url.replace("/v1/traces", "/health"), timeout=20).json()
        finally:
            process.terminate()
            process.wait(timeout=60)
    assert 256 < seen["connection_cap"] <= 2048 - 32, seen
    text = log.read_text()
    assert "raised the file descriptor limit from 256 to 2048" in text, text
    assert f"holding at most {seen['connection_cap']} connections, 64 per peer" in text


# -- /health: where the stored spans went ------------------------------------------------------------------


def _rootless_copy(line: str) -> str:
    """The sample's trace under another trace and run id, without its run's root span."""
    document = json.loads(line.replace("40272e80d51e72edb4e10ea6a4129711", "ab" * 16)
                          .replace("sample-branch_local_loop", "rootless-run"))  # fmt: skip
    for resource_spans in document["resourceSpans"]:
        for scope_spans in resource_spans["scopeSpans"]:
            scope_spans["spans"] = [s for s in scope_spans["spans"] if s["name"] != "invoke_agent demo-coder"]
    return json.dumps(document)


_HTTP_ONLY: dict[str, Any] = {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{
    "scope": {"name": "http"},
    "spans": [
        {"traceId": "cd" * 16, "spanId": "cd" * 8, "name": "GET /health", "kind": 2,
         "startTimeUnixNano": "1795942800000000000", "endTimeUnixNano": "1795942800100000000"},
        {"traceId": "cd" * 16, "spanId": "ef" * 8, "parentSpanId": "cd" * 8, "name": "SELECT users", "kind": 3,
         "startTimeUnixNano": "1795942800000000001", "endTimeUnixNano": "1795942800000000002"},
    ],
}]}]}  # fmt: skip


def test_health_says_where_the_stored_spans_went_as_ingest_does(tmp_path: Path) -> None:
    """A whole treellm run, a run whose root never came, and HTTP spans no convention reads: /health's
    accounting sums each flush's, and equals ingest's over the same spans."""
    sample = SAMPLE.read_text(encoding="utf-8").strip()
    requests = [sample, _rootless_copy(sample), json.dumps(_HTTP_ONLY)]
    config = CollectorConfig(port=0, flush_interval_s=0.2)
    with Collector(tmp_path / "s.duckdb", config) as target, httpx.Client(timeout=20) as client:
        assert client.get(health_url(target)).json()["accounting"] == {
            "runs": 0, "nodes": 0, "tool_calls": 0, "in_run": 0, "loop_events": 0, "unknown_tool_catches": 0,
            "placed_nowhere": {},
        }  # fmt: skip
        for request in requests:
            assert client.post(target.url, content=request, headers=JSON).status_code == 200
        wait_until(lambda: target.stats().flusher.spans_stored == 35 + 34 + 2, what="every span stored")
        accounting = client.get(health_url(target)).json()["accounting"]
    assert accounting == {  # the caught calls of both runs count: they are events on stored spans
        "runs": 1, "nodes": 32, "tool_calls": 14, "in_run": 2, "loop_events": 6, "unknown_tool_catches": 0,
        "placed_nowhere": {"no run root": 34, "unknown convention": 2},
    }  # fmt: skip
    files = []
    for number, request in enumerate(requests):
        files.append(tmp_path / f"{number}.jsonl")
        files[-1].write_text(request + "\n", encoding="utf-8")
    assert ingest(tmp_path / "i.duckdb", files).accounting.to_json() == accounting
    assert "first" not in json.dumps(accounting), "no span is named on /health, which takes no token"
