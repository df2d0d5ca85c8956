"""The collector against hostile or broken clients, bodies built to cost and spans the store refuses.

No assertion here is on how long something took: the timeouts are set tiny, and the tests assert
what the server did (a 408, a closed socket, a 503, a count of bytes inflated, rows stored).
"""

from __future__ import annotations

import argparse
import gzip
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from google.rpc import status_pb2
from test_collector import PROTOBUF, ROOT, count_spans, ids, pb_request, query, span_keys, wait_until

from treellm.collector import Collector, CollectorConfig
from treellm.collector.command import add_arguments
from treellm.collector.connections import connection_cap
from treellm.collector.decode import decode_protobuf, decompress
from treellm.collector.errors import PayloadTooLarge
from treellm.collector.flusher import Flusher, halve_traces_line
from treellm.collector.journal import Journal
from treellm.collector.protocol import bearer_matches
from treellm.errors import ConfigError, IngestError
from treellm.store import FileReport, ingest_file

# -- raw sockets -----------------------------------------------------------------------------------------


def connect(url: str, peer: str | None = None) -> socket.socket:
    """A connection to ``url`` (from the loopback address ``peer`` when given)."""
    address = httpx.URL(url)
    source = None if peer is None else (peer, 0)
    return socket.create_connection((address.host, address.port), timeout=20, source_address=source)  # a bound


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def read_response(sock: socket.socket) -> bytes:
    """One response of a keep-alive connection (headers and a ``content-length`` body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed mid-response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-len"))
    while len(body) < length:
        body += sock.recv(65536)
    return data


def post_head(url: str, *, length: int, extra: bytes = b"") -> bytes:
    path = httpx.URL(url).raw_path
    return (
        b"POST %s HTTP/1.1\r\nHost: collector\r\nContent-Type: application/x-protobuf\r\nContent-Length: %d\r\n%s\r\n"
        % (path, length, extra)
    )


HEALTH_REQUEST = b"GET /health HTTP/1.1\r\nHost: collector\r\n\r\n"


@pytest.fixture
def quick(tmp_path: Path) -> Iterator[Collector]:
    """A collector whose clients get a fraction of a second for their headers and bodies."""
    config = CollectorConfig(port=0, flush_interval_s=0.2, header_timeout_s=1.0, body_timeout_s=1.0)
    with Collector(tmp_path / "s.duckdb", config) as running:
        yield running


# -- slow clients ----------------------------------------------------------------------------------------


def test_a_client_that_sends_half_its_headers_gets_408_and_is_cut_off(quick: Collector) -> None:
    with closing(connect(quick.url)) as slow, closing(connect(quick.url)) as idle:
        slow.sendall(post_head(quick.url, length=100)[:40])  # half the headers, then nothing
        answer = read_until_closed(slow)
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert read_until_closed(idle) == b"", "an idle connection is closed without a word"
    body = pb_request(1).SerializeToString()
    assert httpx.post(quick.url, content=body, headers=PROTOBUF).status_code == 200  # others are still served
    assert quick.stats().timed_out >= 2


def test_a_client_that_sends_half_its_body_gets_408_and_is_cut_off(quick: Collector) -> None:
    body = pb_request(2).SerializeToString()
    with closing(connect(quick.url)) as slow:
        slow.sendall(post_head(quick.url, length=len(body)) + body[: len(body) // 2])
        answer = read_until_closed(slow)
    head, _, status = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ") and b"connection: close" in head.lower()
    assert "did not arrive" in status_pb2.Status.FromString(status).message
    assert httpx.post(quick.url, content=body, headers=PROTOBUF).status_code == 200
    wait_until(lambda: count_spans(quick.db) == 5, what="the whole request, stored once")


def test_the_body_deadline_is_on_the_whole_body_not_on_each_chunk(quick: Collector) -> None:
    """A byte every few milliseconds never leaves a gap as long as the deadline; it is cut off all the same."""
    total = 100_000
    sent = 0
    with closing(connect(quick.url)) as trickle:
        trickle.sendall(post_head(quick.url, length=total))
        trickle.settimeout(0.02)  # the pace of the trickle, well under the 1 s deadline
        answer = b""
        while sent < total:
            try:
                trickle.sendall(b"\0")
                sent += 1
                answer = trickle.recv(65536)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            if answer:
                break
        trickle.settimeout(20)
        answer += read_until_closed(trickle)
    assert sent < total, "the whole body went through: the deadline was never hit"
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]


def test_connections_above_the_cap_get_503_with_retry_after(tmp_path: Path) -> None:
    config = CollectorConfig(port=0, max_connections=4, retry_after_s=7, header_timeout_s=60, body_timeout_s=60)
    with Collector(tmp_path / "s.duckdb", config) as capped, ExitStack() as stack:
        held = []
        for _ in range(4):  # each answered once (so taken by the server), then held mid-request
            sock = stack.enter_context(closing(connect(capped.url)))
            sock.sendall(HEALTH_REQUEST)
            assert read_response(sock).startswith(b"HTTP/1.1 200 ")
            sock.sendall(post_head(capped.url, length=10))
            held.append(sock)
        with closing(connect(capped.url)) as extra:
            extra.sendall(post_head(capped.url, length=0))
            answer = read_until_closed(extra)
        head, _, status = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 ") and b"retry-after: 7" in head.lower(), head
        assert "connections are open" in status_pb2.Status.FromString(status).message
        assert capped.stats().over_capacity == 1
        with closing(connect(capped.url)) as watcher:  # /health is answered all the same, then closed
            watcher.sendall(HEALTH_REQUEST)
            answer = read_until_closed(watcher)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ") and b"connection: close" in head.lower(), head
        assert orjson.loads(body)["over_capacity"] == 2
        held.pop().close()  # one leaves: a new client is taken again

        def served() -> bool:
            return httpx.post(capped.url, content=b"", headers=PROTOBUF).status_code == 200

        wait_until(served, what="a connection below the cap to be served")


def test_the_limits_are_validated_settings_with_flags() -> None:
    for setting in ("header_timeout_s", "body_timeout_s", "max_connections"):
        with pytest.raises(ConfigError, match=f"{setting}: expected a positive"):
            CollectorConfig(**{setting: 0})
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--header-timeout", "2.5", "--body-timeout", "9", "--max-connections", "12"])
    assert (args.header_timeout, args.body_timeout, args.max_connections) == (2.5, 9.0, 12)


def test_at_the_cap_a_new_connection_closes_the_oldest_idle_one(tmp_path: Path) -> None:
    """Idle connections (no request under way) make room for new ones, oldest first; one mid-request stays."""
    config = CollectorConfig(port=0, max_connections=3, header_timeout_s=600, body_timeout_s=600)
    with Collector(tmp_path / "s.duckdb", config) as capped, ExitStack() as stack:
        body = pb_request(7).SerializeToString()
        busy = stack.enter_context(closing(connect(capped.url)))
        busy.sendall(post_head(capped.url, length=len(body)))  # mid-request: never closed to make room
        wait_until(lambda: capped.stats().connections == 1, what="the busy connection")
        oldest = stack.enter_context(closing(connect(capped.url)))
        wait_until(lambda: capped.stats().connections == 2, what="the oldest idle connection")
        newer = stack.enter_context(closing(connect(capped.url)))
        wait_until(lambda: capped.stats().connections == 3, what="the newer idle connection")
        first = stack.enter_context(closing(connect(capped.url)))  # at the cap: the oldest idle one goes
        first.sendall(HEALTH_REQUEST)
        assert read_response(first).startswith(b"HTTP/1.1 200 ")  # and it waits again, kept alive
        assert read_until_closed(oldest) == b""
        assert capped.stats().evicted == 1
        with closing(connect(capped.url)) as second:  # then the next oldest: newer, not first
            second.sendall(HEALTH_REQUEST)
            assert read_response(second).startswith(b"HTTP/1.1 200 ")
            assert read_until_closed(newer) == b""
        first.sendall(HEALTH_REQUEST)
        assert read_response(first).startswith(b"HTTP/1.1 200 ")
        busy.sendall(body)  # the busy one was kept: its request completes
        assert read_response(busy).startswith(b"HTTP/1.1 200 ")
        assert capped.stats().evicted == 2 and capped.stats().over_capacity == 0


def test_the_cap_is_lowered_to_the_descriptor_budget() -> None:
    assert connection_cap(256, None, 40, 32) == 256
    assert connection_cap(None, 1024, 40, 32) == 1024 - 40 - 32
    assert connection_cap(256, 1024, 40, 32) == 256
    assert connection_cap(1000, 256, 40, 32) == 184
    assert connection_cap(1000, 48, 40, 32) < 1  # no room: the collector refuses to start


# -- descriptors running out -----------------------------------------------------------------------------

_LOW_FD_COLLECTOR = """
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[1])))  # soft and hard
from treellm.collector.__main__ import main
sys.exit(main(sys.argv[2:]))
"""


def low_fd_collector(tmp_path: Path, limit: int, *options: str) -> tuple[list[str], Path]:
    log = tmp_path / "collector.log"
    command = [sys.executable, "-c", _LOW_FD_COLLECTOR, str(limit), "--db", str(tmp_path / "s.duckdb"), "--port", "0",
               "-v", *options]  # fmt: skip
    return command, log


def test_health_answers_with_more_half_open_connections_than_the_descriptor_limit_allows(tmp_path: Path) -> None:
    """``ulimit -n 256`` (soft and hard) and 300 connections from 10 peers that never send a byte:
    they cycle through the budget (oldest closed first), and /health and a client that sends its
    request are served."""
    command, log = low_fd_collector(tmp_path, 256, "--header-timeout", "600", "--max-connections", "1000")
    with log.open("w") as stderr, subprocess.Popen(command, stderr=stderr, cwd=ROOT) as process:
        try:
            wait_until(lambda: "listening on" in log.read_text() or process.poll() is not None, 30, "the collector")
            url = log.read_text().split("listening on ", 1)[1].split(";")[0]
            health = url.replace("/v1/traces", "/health")
            before = httpx.get(health, timeout=20).json()
            cap = before["connection_cap"]
            assert 0 < cap < 256 - 32, before  # lowered to the budget: the limit less the open ones and the reserve
            with ExitStack() as flood:
                sockets = [flood.enter_context(closing(connect(url, f"127.0.0.{10 + n % 10}"))) for n in range(300)]
                answer = httpx.get(health, timeout=20)  # a generous bound, not a measure
                assert answer.status_code == 200
                after = answer.json()
                assert after["accept_errors"] == 0 and after["connections"] <= cap, after
                assert after["evicted"] >= 300 - cap and after["peer_refused"] == 0, after
                assert read_until_closed(sockets[0]) == b"", "the oldest idle connection was closed first"
                body = pb_request(5).SerializeToString()
                assert httpx.post(url, content=body, headers=PROTOBUF, timeout=20).status_code == 200
        finally:
            process.terminate()
            process.wait(timeout=60)
    text = log.read_text()
    assert f"holding at most {cap} connections" in text
    assert text.count("closing the oldest idle one") == 1, text  # once per burst, not per connection
    assert "Traceback" not in text


def test_a_descriptor_limit_that_leaves_no_room_for_connections_is_one_clear_error(tmp_path: Path) -> None:
    command, _ = low_fd_collector(tmp_path, 30)
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)
    assert done.returncode == 1
    assert "leaves no room for connections" in done.stderr and "ulimit -n" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


_SHRINKING_COLLECTOR = """
import os, resource, sys, threading
from pathlib import Path
from treellm.collector import Collector, CollectorConfig
config = CollectorConfig(port=0, header_timeout_s=120, max_connections=1000)
with Collector(Path(sys.argv[1]), config) as collector:
    held = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (held + 16, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    print("listening on", collector.url, file=sys.stderr, flush=True)
    threading.Event().wait()
"""


def test_accepts_refused_for_want_of_descriptors_back_off_and_log_once(tmp_path: Path) -> None:
    """The limit lowered under a running collector (its cap was set at start): accepts fail and back off."""
    log = tmp_path / "collector.log"
    command = [sys.executable, "-c", _SHRINKING_COLLECTOR, str(tmp_path / "s.duckdb")]
    with log.open("w") as stderr, subprocess.Popen(command, stderr=stderr, cwd=ROOT) as process:
        try:
            wait_until(lambda: "listening on" in log.read_text() or process.poll() is not None, 30, "the collector")
            url = log.read_text().split("listening on ", 1)[1].split()[0]
            health = url.replace("/v1/traces", "/health")
            with httpx.Client(timeout=20) as watcher, ExitStack() as flood:
                assert watcher.get(health).json()["accept_errors"] == 0  # a connection taken before the flood
                for _ in range(80):  # more than the descriptors left
                    flood.enter_context(closing(connect(url)))

                def refused(count: int) -> bool:
                    return watcher.get(health).json()["accept_errors"] >= count

                wait_until(lambda: refused(4), 60, "the accepts to fail and be retried")
                during = log.read_text()
                failed = watcher.get(health).json()["accept_errors"]
            # the flood has left: accepting works again
            wait_until(lambda: httpx.get(health, timeout=20).status_code == 200, 60, "accepting again")
        finally:
            process.terminate()
            process.wait(timeout=60)
    assert during.count("cannot accept connections: Too many open files") == 1, during  # once for 4 failures and more
    assert failed < 100, f"{failed} failed accepts: retried without pausing"
    text = log.read_text()
    assert "accepting connections again after" in text and text.count("cannot accept") <= 3, text
    assert "Traceback" not in text


# -- UTF-8 tokens ----------------------------------------------------------------------------------------


def test_a_bearer_token_is_compared_on_its_utf8_bytes() -> None:
    token = "s3crèt-ключ-🔑"
    assert bearer_matches(b"Bearer " + token.encode("utf-8"), token)
    assert bearer_matches(b"bearer  " + token.encode("utf-8") + b" ", token)
    assert not bearer_matches(b"Bearer " + token.encode("latin-1", "replace"), token)
    assert not bearer_matches(b"Bearer " + token.encode("utf-8")[:-1], token)
    assert not bearer_matches(b"Basic " + token.encode("utf-8"), token)
    assert not bearer_matches(None, token)


def test_a_non_ascii_token_is_accepted_over_http(tmp_path: Path) -> None:
    token = "sécret-令牌"
    config = CollectorConfig(port=0, token=token, flush_interval_s=0.2)
    with Collector(tmp_path / "s.duckdb", config) as guarded, httpx.Client(timeout=20) as client:
        body = pb_request(3).SerializeToString()
        right = {**PROTOBUF, "Authorization": b"Bearer " + token.encode("utf-8")}
        wrong = {**PROTOBUF, "Authorization": b"Bearer " + "sécret-令".encode()}
        assert client.post(guarded.url, content=body, headers=wrong).status_code == 401  # type: ignore[arg-type]
        assert client.post(guarded.url, content=body, headers=right).status_code == 200  # type: ignore[arg-type]


# -- gzip members ----------------------------------------------------------------------------------------


class CountingInflater:
    """A ``decompress(inflater=...)`` that counts the bytes each decompressor is handed."""

    def __init__(self) -> None:
        self.fed = 0
        self.made = 0

    def __call__(self, wbits: int) -> Any:
        self.made += 1
        return _Fed(zlib.decompressobj(wbits), self)


class _Fed:
    def __init__(self, inner: Any, counter: CountingInflater) -> None:
        self._inner = inner
        self._counter = counter

    def decompress(self, data: Any, max_length: int = 0) -> bytes:
        self._counter.fed += len(data)
        out: bytes = self._inner.decompress(data, max_length)
        return out

    def flush(self, *args: int) -> bytes:
        out: bytes = self._inner.flush(*args)
        return out

    def __getattr__(self, name: str) -> Any:  # eof, unused_data, unconsumed_tail
        return getattr(self._inner, name)


EMPTY_MEMBER = gzip.compress(b"")


def test_many_empty_gzip_members_and_one_real_one_decode_to_the_real_one(tmp_path: Path) -> None:
    real = pb_request(4).SerializeToString()
    body = EMPTY_MEMBER * 50_000 + gzip.compress(real) + EMPTY_MEMBER * 10
    assert decompress(body, "gzip", 1_000_000) == real
    config = CollectorConfig(port=0, flush_interval_s=0.2)
    with Collector(tmp_path / "s.duckdb", config) as target:
        response = httpx.post(target.url, content=body, headers={**PROTOBUF, "Content-Encoding": "gzip"}, timeout=60)
        assert response.status_code == 200
        wait_until(lambda: count_spans(target.db) == 5)


def test_inflating_gzip_members_is_linear_in_the_body() -> None:
    """The bytes handed to zlib (what it scans and copies) per byte of body stay flat as the number
    of members doubles; handing it the rest of the body each member made them grow with it."""
    per_byte = []
    for members in (20_000, 40_000, 80_000):
        body = EMPTY_MEMBER * members + gzip.compress(b"payload" * 100)
        counter = CountingInflater()
        assert decompress(body, "gzip", 1_000_000, inflater=counter) == b"payload" * 100
        assert counter.made == members + 1
        per_byte.append(counter.fed / len(body))
    assert max(per_byte) < 16, per_byte
    assert per_byte[-1] < per_byte[0] * 1.1, f"the work per byte grows with the body: {per_byte}"


def test_decompression_limits_hold_with_many_members() -> None:
    big = gzip.compress(b"\0" * 200_000)
    with pytest.raises(PayloadTooLarge):
        decompress(EMPTY_MEMBER * 1000 + big * 10, "gzip", 1_000_000)
    assert decompress(EMPTY_MEMBER * 3 + big * 5, "gzip", 1_000_000) == b"\0" * 1_000_000


# -- spans the store refuses -----------------------------------------------------------------------------

MARKER_SPAN = b"\xba\xd0" * 4


def refusing_marked_spans(db: Any, path: Any, input_format: str, **options: Any) -> FileReport:
    """The store's ingest, refusing any file that holds a span with the marker span id."""
    if MARKER_SPAN.hex().encode() in Path(path).read_bytes():
        raise IngestError(f"span {MARKER_SPAN.hex()} is refused by this test", path=str(path))
    return ingest_file(db, path, input_format, **options)


def quarantined(folder: Path) -> list[dict[str, Any]]:
    rejected = folder / "rejected"
    return [orjson.loads(path.read_bytes()) for path in sorted(rejected.glob("*.json"))] if rejected.exists() else []


def quarantined_span_ids(folder: Path) -> list[str]:
    return [span["spanId"] for record in quarantined(folder) for line in record["lines"]
            for rs in line["resourceSpans"] for ss in rs["scopeSpans"] for span in ss["spans"]]  # fmt: skip


def test_only_the_spans_the_store_refuses_are_quarantined_and_every_other_is_stored_once(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    config = CollectorConfig(port=0, flush_interval_s=0.2)
    with Collector(db, config, ingest=refusing_marked_spans) as target, httpx.Client(timeout=20) as client:
        sent = {n: pb_request(n, spans=40) for n in range(6)}
        sent[2].resource_spans[0].scope_spans[0].spans[17].span_id = MARKER_SPAN
        sent[4].resource_spans[0].scope_spans[0].spans[3].span_id = MARKER_SPAN[:7] + b"\x01"  # not the marker
        for request in sent.values():
            assert client.post(target.url, content=request.SerializeToString(), headers=PROTOBUF).status_code == 200
        acknowledged = {(s.trace_id.hex(), s.span_id.hex()) for r in sent.values()
                        for s in r.resource_spans[0].scope_spans[0].spans}  # fmt: skip
        wait_until(lambda: count_spans(db) == len(acknowledged) - 1, what="every good span")
        folder = target.journal.folder
        wait_until(lambda: len(quarantined(folder)) == 1, what="the refused span set aside")
        assert target.stats().flusher.rejected_segments == 1
    stored = span_keys(db)
    assert len(stored) == len(set(stored)), "a span is stored twice"
    assert set(stored) == acknowledged - {(ids(2, 0)[0].hex(), MARKER_SPAN.hex())}
    (record,) = quarantined(folder)
    assert "refused by this test" in record["reason"]
    assert quarantined_span_ids(folder) == [MARKER_SPAN.hex()]
    (line,) = record["lines"]
    assert line["resourceSpans"][0]["resource"]["attributes"][0]["key"] == "service.name"


class Crash(Exception):
    """The process dies here (raised through the flusher, which catches only store and disk errors)."""


def test_a_crash_mid_split_neither_loses_nor_duplicates_a_span(tmp_path: Path) -> None:
    folder, db = tmp_path / "j", tmp_path / "s.duckdb"
    lines = [decode_protobuf(pb_request(n, spans=16).SerializeToString()).lines[0] for n in range(4)]
    marked = orjson.loads(lines[1])
    marked["resourceSpans"][0]["scopeSpans"][0]["spans"][5]["spanId"] = MARKER_SPAN.hex()
    marked["resourceSpans"][0]["scopeSpans"][0]["spans"][11]["spanId"] = MARKER_SPAN.hex()[:-2] + "01"
    lines[1] = orjson.dumps(marked, option=orjson.OPT_APPEND_NEWLINE)
    journal = Journal(folder, max_segment_bytes=2**20, max_pending_bytes=2**20, max_journal_bytes=2**24)
    journal.open()
    journal.submit(b"".join(lines)).result(timeout=10)
    (original,) = [journal.cut()]
    assert original is not None
    saved = original.path.read_bytes()
    calls = 0

    def crashing(db: Any, path: Any, input_format: str, **options: Any) -> FileReport:
        nonlocal calls
        calls += 1
        if calls == 6:  # a few halves in: some stored, some split, the original already gone
            raise Crash
        return refusing_marked_spans(db, path, input_format, **options)

    with pytest.raises(Crash):
        Flusher(db, journal, interval_s=0.01, batch_bytes=2**24, ingest=crashing).flush()
    journal.close()
    journal.release()
    assert not original.path.exists()
    original.path.write_bytes(saved)  # and worse: as if the crash came before the original was deleted
    again = Journal(folder, max_segment_bytes=2**20, max_pending_bytes=2**20, max_journal_bytes=2**24)
    again.open()
    flusher = Flusher(db, again, interval_s=0.01, batch_bytes=2**24, ingest=refusing_marked_spans)
    again.close()
    assert flusher.drain(time.monotonic() + 60)
    again.release()
    stored = span_keys(db)
    assert len(stored) == len(set(stored)) == 4 * 16 - 1
    assert quarantined_span_ids(folder) == [MARKER_SPAN.hex()]  # once, though refused twice
    assert not list(folder.glob("*.jsonl")), "a segment was left behind"


def test_halving_a_traces_line_keeps_every_span_once_under_its_resource_and_scope() -> None:
    doc = {"resourceSpans": [
        {"resource": {"attributes": [{"key": "r", "value": {"stringValue": str(r)}}]}, "schemaUrl": f"u{r}",
         "scopeSpans": [{"scope": {"name": f"s{r}{s}"}, "spans": [{"spanId": f"{r}{s}{i}"} for i in range(3)]}
                        for s in range(2)]}
        for r in range(2)
    ]}  # fmt: skip
    first, second = halve_traces_line(orjson.dumps(doc) + b"\n") or (b"", b"")
    assert first.endswith(b"\n") and second.endswith(b"\n")

    def placed(line: bytes) -> list[tuple[str, str, str, str]]:
        return [(rs["resource"]["attributes"][0]["value"]["stringValue"], rs["schemaUrl"], ss["scope"]["name"],
                 span["spanId"]) for rs in orjson.loads(line)["resourceSpans"] for ss in rs["scopeSpans"]
                for span in ss["spans"]]  # fmt: skip

    assert len(placed(first)) == len(placed(second)) == 6
    assert placed(first) + placed(second) == placed(orjson.dumps(doc))
    one = {"resourceSpans": [{"scopeSpans": [{"spans": [{"spanId": "1"}]}]}]}
    assert halve_traces_line(orjson.dumps(one)) is None
    assert halve_traces_line(b"not json") is None


def test_a_line_that_cannot_be_halved_is_set_aside_whole_with_the_reason(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j", max_segment_bytes=2**20, max_pending_bytes=2**20, max_journal_bytes=2**24)
    journal.open()
    journal.submit(b'{"a": 1}\n').result(timeout=10)
    segment = journal.cut()
    assert segment is not None and journal.split(segment) is None  # one line, no way to halve it
    target = journal.quarantine(segment, "the reason")
    assert orjson.loads(target.read_bytes()) == {"reason": "the reason", "segment": segment.path.name,
                                                  "lines": [{"a": 1}]}  # fmt: skip
    journal.close()
    journal.release()


def test_requests_keep_being_answered_while_a_flush_is_held(tmp_path: Path) -> None:
    """A flush held by the test (no clock): requests are acknowledged meanwhile, and stored once it goes on."""
    entered, release = threading.Event(), threading.Event()

    def held(db: Any, path: Any, input_format: str, **options: Any) -> FileReport:
        entered.set()
        assert release.wait(60)
        return ingest_file(db, path, input_format, **options)

    db = tmp_path / "s.duckdb"
    config = CollectorConfig(port=0, flush_interval_s=0.2)
    with Collector(db, config, ingest=held) as target, httpx.Client(timeout=20) as client:

        def send(number: int) -> int:
            return client.post(target.url, content=pb_request(number).SerializeToString(), headers=PROTOBUF).status_code

        assert send(0) == 200
        assert entered.wait(30)  # the flusher is inside its ingest, held
        assert [send(n) for n in range(1, 6)] == [200] * 5
        assert target.stats().flusher.spans_stored == 0
        release.set()
        wait_until(lambda: target.stats().flusher.spans_stored == 30, what="the held flush and the next ones")
    assert int(query(db, "SELECT count(DISTINCT (trace_id, span_id)) FROM spans")[0][0]) == 30


# -- waiting for room in a full journal ---------------------------------------------------------------------


def test_the_journal_tells_its_listener_when_a_sync_or_a_flush_frees_room(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j", max_segment_bytes=2**20, max_pending_bytes=2**20, max_journal_bytes=2**24)
    told: list[str] = []
    journal.listen(lambda: told.append(threading.current_thread().name))
    journal.open()
    journal.submit(b'{"a": 1}\n').result(timeout=10)
    wait_until(lambda: len(told) == 1, 10, "the writer to tell of its sync")
    assert told == ["treellm-journal-writer"]
    segment = journal.cut()
    assert segment is not None
    journal.remove(segment)
    assert len(told) == 2
    journal.listen(None)
    journal.submit(b'{"a": 2}\n').result(timeout=10)
    journal.close()
    assert len(told) == 2
    journal.release()


def _held_ingest() -> tuple[threading.Event, threading.Event, Any]:
    entered, release = threading.Event(), threading.Event()

    def held(db: Any, path: Any, input_format: str, **options: Any) -> FileReport:
        entered.set()
        assert release.wait(60)
        return ingest_file(db, path, input_format, **options)

    return entered, release, held


def test_a_request_over_the_journals_bound_waits_for_room_and_is_acknowledged(tmp_path: Path) -> None:
    """The store is held (no clock): a request that finds the journal full is not answered 503 but
    waits, with its body unread, and is acknowledged once the flush frees room."""
    entered, release, held = _held_ingest()
    db = tmp_path / "s.duckdb"
    config = CollectorConfig(port=0, flush_interval_s=0.1, max_journal_bytes=12_000, admission_wait_s=120)
    statuses: list[int] = []
    with Collector(db, config, ingest=held) as target, httpx.Client(timeout=150) as client:

        def send_all() -> None:
            for n in range(12):
                body = pb_request(n).SerializeToString()
                statuses.append(client.post(target.url, content=body, headers=PROTOBUF).status_code)

        sender = threading.Thread(target=send_all)
        sender.start()
        assert entered.wait(30)
        wait_until(lambda: target.stats().admission_waits >= 1, 60, "a request to wait for room")
        assert sender.is_alive() and 503 not in statuses and len(statuses) < 12
        release.set()
        sender.join(120)
        assert statuses == [200] * 12
        stats = target.stats()
        assert stats.admission_wait_refused == 0 and stats.refused == 0
        wait_until(lambda: target.stats().flusher.spans_stored == 60, what="every span stored")
    assert sorted(span_keys(db)) == sorted(
        (ids(n, i)[0].hex(), ids(n, i)[1].hex()) for n in range(12) for i in range(5)
    )


def test_stopping_answers_a_waiting_request_503_at_once(tmp_path: Path) -> None:
    entered, release, held = _held_ingest()
    db = tmp_path / "s.duckdb"
    config = CollectorConfig(port=0, flush_interval_s=0.1, max_journal_bytes=6_000, admission_wait_s=120)
    answers: list[httpx.Response] = []
    target = Collector(db, config, ingest=held)
    target.start()
    with httpx.Client(timeout=150) as client:

        def send_all() -> None:
            for n in range(12):
                body = pb_request(n).SerializeToString()
                answers.append(client.post(target.url, content=body, headers=PROTOBUF))
                if answers[-1].status_code != 200:
                    return

        sender = threading.Thread(target=send_all)
        sender.start()
        assert entered.wait(30)
        wait_until(lambda: target.stats().admission_waits >= 1, 60, "a request to wait for room")
        stopper = threading.Thread(target=target.stop)
        stopper.start()
        sender.join(60)  # answered while the store is still held: stopping ended the wait
        assert not sender.is_alive()
        last = answers[-1]
        assert last.status_code == 503 and "shutting down" in status_pb2.Status.FromString(last.content).message
        release.set()
        stopper.join(120)
    acknowledged = sum(a.status_code == 200 for a in answers)
    assert acknowledged >= 1 and count_spans(db) == acknowledged * 5
