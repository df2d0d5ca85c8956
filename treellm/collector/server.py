"""The collector: an OTLP/HTTP receiver (Starlette on uvicorn) in front of the journal and the flusher.

Contract:

- :class:`Collector` owns one socket, one journal folder (spans in it, metric points in its
  ``metrics/`` folder, a journal of their own) and four threads: uvicorn's event loop, the
  two journal writers and the flusher. :meth:`Collector.start` returns once
  it listens (``url`` then names the endpoint); :meth:`Collector.stop` stops accepting,
  lets requests under way finish, writes the journal's queue, drains the journal into the
  store and returns True when nothing is left in it. Both are called from one
  controlling thread. ``app`` is the ASGI application.
- ``POST /v1/traces`` answers per :mod:`treellm.collector.protocol`: 200 only once the
  request's spans are fsync'd in the journal; 400 malformed; 401 without the bearer
  token (when one is set); 413 above ``max_body_bytes`` (``Content-Length`` checked
  before reading, the count checked while reading and while decompressing); 415 for
  another content type or coding; 429 / 503 with ``Retry-After`` over the journal's
  bounds or while stopping. ``GET /health`` answers 200 with the counters (no token).
- A request over a journal bound waits up to ``admission_wait_s`` for room before it is answered
  429 / 503, its body still unread (the socket holds it: a waiting request holds no memory). The
  journal tells the event loop whenever a sync or a flush frees bytes (:meth:`Journal.listen`),
  and every waiting request checks again then: a store that falls behind for a moment slows the
  clients down instead of sending each away for ``Retry-After`` seconds. A request let in whose
  decoded spans then find no room (others took it meanwhile) waits the rest of its time too,
  holding them: at most ``max_pending_bytes`` are held so, beyond that it is refused at once.
  ``/health`` counts the
  requests that waited (``admission_waits``) and those still refused after it
  (``admission_wait_refused``); stopping ends every wait with 503.
- ``POST /v1/metrics`` answers by the same rules (an ``ExportMetricsServiceResponse``,
  ``rejected_data_points`` in a partial success): 200 only once the request's data points
  are fsync'd in the metrics journal; the flusher inserts them into ``metric_points``
  (:mod:`treellm.store.metric_points`, which explains the design).
- Bodies are decoded off the event loop by :class:`~treellm.collector.pool.DecodePool`: worker
  processes, one per core (``decode_workers``), started at :meth:`Collector.start`; small bodies
  sent without a content coding are decoded on the event loop. The journal's writer commits the
  requests of every connection together (one ``fdatasync`` for all that arrived meanwhile).
- Hostile or broken clients cannot hold the collector (:mod:`treellm.collector.connections`
  states the rules): a deadline on each request's headers (``header_timeout_s``) and on its
  whole body (``body_timeout_s``: 408 and the connection closed); at start the soft descriptor
  limit is raised to the hard one and the total cap on connections derived from it (less the
  descriptors open and ``descriptor_reserve``; ``max_connections`` when lower); a peer (an IPv4
  address, an IPv6 /64) holds at most ``max_connections_per_peer``, a connection over it closed
  as soon as it is accepted, unread, so one peer's half-sent requests never hold the others'
  exports or ``GET /health``; at the total cap a new connection closes the oldest idle one, or
  is answered 503 with ``Retry-After`` when none is idle, except ``GET /health``, answered all
  the same; a failed accept (out of descriptors) pauses accepting and is logged once per burst.
  ``/health`` counts the timeouts, the connections refused per peer and over the cap, the idle
  ones closed and the failed accepts, beside both caps, the connections and peers open.
- ``/health`` also says where the stored spans went (``accounting``): how many became runs,
  nodes (tool calls among them), other spans of runs and caught calls (``loop_events``), and
  how many were stored but placed nowhere, per reason, summed over the flushes as
  :func:`~treellm.store.ingest_file` reported each (the same figures as ``treellm ingest
  --json``; a span counts where it was placed when it was stored, so spans that waited for their
  run's root in a later batch stay under ``no run root``).
- ``Authorization`` is compared on the header's raw bytes
  (:func:`~treellm.collector.protocol.bearer_matches`): a UTF-8 token works.
- :func:`serve` runs a collector until SIGTERM or SIGINT (a second signal stops waiting
  for a busy store) and returns the exit code: 0 once drained, 75 (EX_TEMPFAIL) when
  spans had to stay in the journal (they go into the store at the next start), 1 when the
  server failed. Call it from the main thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Final

import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from treellm.collector.config import DEFAULTS, CollectorConfig, journal_folder
from treellm.collector.connections import (
    ConnectionRules,
    GuardedH11,
    accept_forever,
    connection_cap,
    descriptor_limit,
    guarded_protocol,
    open_descriptors,
    raise_descriptor_limit,
)
from treellm.collector.decode import Decoded, Encoding, decode_metrics_request, decode_request
from treellm.collector.errors import BadRequest, CollectorError, PayloadTooLarge
from treellm.collector.pool import DecodePool, cores
from treellm.collector.protocol import (
    bearer_matches,
    content_coding,
    media_type,
    metrics_success_body,
    request_encoding,
    status_body,
    success_body,
)
from treellm.errors import ConfigError
from treellm.store import ingest_file
from treellm.store.flusher import Flusher, FlusherStats, IngestFn
from treellm.store.journal import Journal, JournalError, JournalInUseError, JournalStats, Overloaded, Segment
from treellm.urls import display_url, shown

__all__ = [
    "EXIT_DRAINED",
    "EXIT_JOURNAL_KEPT",
    "EXIT_SERVER_FAILED",
    "Collector",
    "CollectorStats",
    "serve",
    "token_from_env",
]

logger = logging.getLogger(__name__)

TRACES_PATH: Final = "/v1/traces"
METRICS_PATH: Final = "/v1/metrics"
METRICS_FOLDER: Final = "metrics"  # the metrics journal, inside the span journal's folder
EXIT_DRAINED: Final = 0
EXIT_SERVER_FAILED: Final = 1
EXIT_JOURNAL_KEPT: Final = 75  # EX_TEMPFAIL: try again later
_START_TIMEOUT_S: Final = 10.0
_GRACEFUL_S: Final = 10
_BACKLOG: Final = 2048


@dataclass(frozen=True, slots=True)
class CollectorStats:
    requests: int
    accepted_spans: int
    rejected_spans: int
    refused: int
    journal: JournalStats
    flusher: FlusherStats
    accepted_points: int = 0
    rejected_points: int = 0
    metrics_journal: JournalStats | None = None
    timed_out: int = 0
    over_capacity: int = 0
    accept_errors: int = 0
    connection_cap: int = 0
    connections: int = 0
    evicted: int = 0
    decode_restarts: int = 0
    connection_cap_per_peer: int = 0
    peers: int = 0
    peer_refused: int = 0
    admission_waits: int = 0
    admission_wait_refused: int = 0

    def to_json(self) -> dict[str, Any]:
        """The counters as ``/health`` shows them; the flusher's accounting lifted to ``accounting``
        (:meth:`~treellm.store.ingest.Accounting.to_json`: counts only, no span named)."""
        data = asdict(self)
        del data["flusher"]["accounting"]
        data["accounting"] = self.flusher.accounting.to_json()
        return data


@dataclass(slots=True)
class _Wait:
    """One request's wait for room in the journal: its deadline, set when it first waits."""

    deadline: float | None = None


def _bind(host: str, port: int) -> socket.socket:
    where = display_url(f"{host}:{port}")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except (OSError, UnicodeError) as exc:  # UnicodeError: a name IDNA cannot encode
        raise CollectorError(f"cannot listen on {where}: {getattr(exc, 'strerror', None) or exc}") from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise CollectorError(f"cannot listen on {where}: {exc.strerror or exc}") from exc
    return sock


def _open_journal(journal: Journal) -> list[Segment]:
    """:meth:`Journal.open`, its errors told as the collector's."""
    try:
        return journal.open()
    except JournalInUseError as exc:
        raise CollectorError(
            f"the journal {journal.folder} is in use by another collector (pid {exc.pid}); one collector per store"
        ) from exc
    except JournalError as exc:
        raise CollectorError(str(exc)) from exc


class Collector:
    """An OTLP/HTTP receiver writing into the store at ``db`` (see the module docstring).

    ``ingest`` is how the flusher writes a journal segment into the store
    (:func:`~treellm.store.ingest_file`; a seam: a test refuses spans or holds a flush with it).
    """

    def __init__(
        self, db: str | os.PathLike[str], config: CollectorConfig = DEFAULTS, *, ingest: IngestFn = ingest_file
    ) -> None:
        if "\x00" in os.fspath(db):
            raise ConfigError("db: expected a path without NUL characters", setting="db")
        self.db = Path(db)
        self.config = config
        folder = journal_folder(db, config)
        self._loop: asyncio.AbstractEventLoop | None = None  # the journals wake waiters through it
        self.journal = self._journal(folder)
        self.metrics_journal = self._journal(folder / METRICS_FOLDER)
        self.flusher = Flusher(
            self.db, self.journal, interval_s=config.flush_interval_s, metrics_journal=self.metrics_journal,
            ingest=ingest, nice=config.flusher_nice, batch_bytes=config.max_flush_bytes,
        )  # fmt: skip
        self.app = Starlette(
            routes=[
                Route(TRACES_PATH, self._traces, methods=["POST"]),
                Route(METRICS_PATH, self._metrics, methods=["POST"]),
                Route("/health", self._health, methods=["GET"]),
            ]
        )
        self._retry_after = {"Retry-After": str(config.retry_after_s)}
        self._rules = ConnectionRules(
            max_connections=config.max_connections or 0, per_peer=config.max_connections_per_peer,
            header_timeout_s=config.header_timeout_s, over_capacity_app=self._over_capacity,
        )  # fmt: skip
        self._pool = DecodePool(cores() if config.decode_workers is None else config.decode_workers)
        self._protocol = guarded_protocol(self._rules)
        self._socket: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._started = False
        self._requests = 0
        self._accepted = 0
        self._rejected = 0
        self._accepted_points = 0
        self._rejected_points = 0
        self._refused = 0
        self._room: asyncio.Event | None = None  # set, then replaced, whenever a journal frees room
        self._admission_waits = 0
        self._admission_wait_refused = 0
        self._held_bytes = 0  # decoded requests waiting for room (event loop only)
        self._waiting = 0  # requests waiting for room now (written on the event loop only)
        self.url = ""
        self.metrics_url = ""

    def _journal(self, folder: Path) -> Journal:
        journal = Journal(
            folder,
            max_segment_bytes=self.config.max_segment_bytes,
            max_pending_bytes=self.config.max_pending_bytes,
            max_journal_bytes=self.config.max_journal_bytes,
        )
        journal.listen(self._room_freed)
        return journal

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        """Open the journal (replaying what an earlier run left), start flushing, listen."""
        if self._started or self._stopping:
            raise CollectorError("a collector starts once: make a new one to start again")
        sock = _bind(self.config.host, self.config.port)
        sock.listen(_BACKLOG)
        sock.setblocking(False)
        try:
            recovered = _open_journal(self.journal)
            try:
                recovered += _open_journal(self.metrics_journal)
            except BaseException:
                self.journal.close()
                self.journal.release()
                raise
        except BaseException:
            sock.close()
            raise
        if recovered:
            logger.info("replaying %d journal segment(s) left in %s", len(recovered), self.journal.folder)
        try:
            self._rules.max_connections = self._connection_cap()
        except CollectorError:
            self.journal.close()
            self.metrics_journal.close()
            self.metrics_journal.release()
            self.journal.release()
            sock.close()
            raise
        self.flusher.start()
        self._pool.warm_soon()
        self._socket = sock
        port = sock.getsockname()[1]
        host = self.config.host if ":" not in self.config.host else f"[{self.config.host}]"
        self.url = f"http://{host}:{port}{TRACES_PATH}"
        self.metrics_url = f"http://{host}:{port}{METRICS_PATH}"
        config = uvicorn.Config(
            self.app, host=self.config.host, port=port, log_config=None, access_log=False, lifespan="off",
            ws="none", server_header=False, timeout_graceful_shutdown=_GRACEFUL_S, http=self._protocol,
        )  # fmt: skip
        self._server = uvicorn.Server(config)  # on its own thread: uvicorn leaves the signals alone
        self._thread = threading.Thread(target=self._serve, name="treellm-collector-http", daemon=True)
        self._started = True
        self._thread.start()
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop(drain_timeout_s=0.0)
                raise CollectorError(f"the HTTP server did not start on {self.url}")
            time.sleep(0.01)
        if not self.config.loopback and self.config.token is None:
            logger.warning("listening on %s without a token: anyone who reaches it can write spans", self.url)
        logger.info("listening on %s; journal %s; store %s", self.url, self.journal.folder, self.db)

    def _connection_cap(self) -> int:
        """The cap on open connections within the descriptor budget, the soft limit raised to the
        hard one first (the module docstring)."""
        raised = raise_descriptor_limit()
        if raised is not None:
            logger.info("raised the file descriptor limit from %d to %d (the hard limit)", *raised)
        limit, held, reserve = descriptor_limit(), open_descriptors(), self.config.descriptor_reserve
        cap = connection_cap(self.config.max_connections, limit, held, reserve)
        if cap < 1:
            raise CollectorError(
                f"the file descriptor limit ({limit}) leaves no room for connections: {held} are open and "
                f"{reserve} are kept in reserve; raise it (ulimit -n) or lower descriptor_reserve"
            )
        logger.info("holding at most %d connections, %d per peer: the descriptor limit is %s, %d are open, %d in "
                    "reserve", cap, self.config.max_connections_per_peer, limit, held, reserve)  # fmt: skip
        if self.config.max_connections_per_peer >= cap:
            logger.warning("one peer may hold all %d connections (max_connections_per_peer is %d): it can keep "
                           "the others out", cap, self.config.max_connections_per_peer)  # fmt: skip
        return cap

    def _serve(self) -> None:
        try:
            asyncio.run(self._serve_forever())
        except Exception:
            logger.exception("the HTTP server of the collector failed")

    async def _serve_forever(self) -> None:
        """uvicorn serves the connections that :func:`accept_forever` hands it (it listens on no socket)."""
        server, sock = self._server, self._socket
        assert server is not None and sock is not None
        loop = asyncio.get_running_loop()
        protocol = self._protocol

        def connection() -> GuardedH11:  # as uvicorn makes them (no lifespan: no state)
            return protocol(config=server.config, server_state=server.server_state, app_state={}, _loop=loop)

        self._room = asyncio.Event()
        self._loop = loop
        self._accepting = asyncio.create_task(accept_forever(sock, connection, self._rules))
        try:
            await server.serve(sockets=[])
        finally:
            self._accepting.cancel()

    @property
    def running(self) -> bool:
        """Whether the HTTP server thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self, *, drain_timeout_s: float | None = None, abort: threading.Event | None = None) -> bool:
        """Stop accepting, finish requests under way, drain the journal; True when it is empty."""
        if not self._started:
            return True
        self._started = False
        self._stopping = True
        self._room_freed()  # a request waiting for room is answered 503 at once
        if self._loop is not None and self._accepting is not None:
            self._loop.call_soon_threadsafe(self._accepting.cancel)  # accept no more, at once
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join()
        self._pool.close()
        if self._socket is not None:
            self._socket.close()
        self.journal.close()
        self.metrics_journal.close()
        self.flusher.stop()
        timeout = self.config.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
        drained = self.flusher.drain(time.monotonic() + timeout, abort)
        if not drained:
            left = self.journal.stats().unflushed_bytes + self.metrics_journal.stats().unflushed_bytes
            logger.warning(
                "%d byte(s) of spans and metric points stay in the journal %s (the store %s is busy); they go "
                "into the store when the collector starts again", left, self.journal.folder, self.db,
            )  # fmt: skip
        self.metrics_journal.release()  # first: the span journal's folder holds it
        self.journal.release()
        return drained

    def __enter__(self) -> Collector:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    def stats(self) -> CollectorStats:
        return CollectorStats(
            requests=self._requests,
            accepted_spans=self._accepted,
            rejected_spans=self._rejected,
            refused=self._refused,
            journal=self.journal.stats(),
            flusher=self.flusher.stats(),
            accepted_points=self._accepted_points,
            rejected_points=self._rejected_points,
            metrics_journal=self.metrics_journal.stats(),
            timed_out=self._rules.timed_out,
            over_capacity=self._rules.over_capacity.total,
            accept_errors=self._rules.accept_errors.total,
            connection_cap=self._rules.max_connections,
            connections=self._rules.open(self._server.server_state.connections) if self._server is not None else 0,
            evicted=self._rules.evicted.total,
            decode_restarts=self._pool.restarts,
            connection_cap_per_peer=self._rules.per_peer,
            peers=len(self._rules.peers),
            peer_refused=self._rules.peer_refused,
            admission_waits=self._admission_waits,
            admission_wait_refused=self._admission_wait_refused,
        )

    # -- waiting for room in the journal -----------------------------------------------------------------

    def _room_freed(self) -> None:
        """From any thread: a journal freed bytes (or the collector is stopping); wake the waiters,
        when a request waits (a sync frees bytes hundreds of times a second: the event loop is not
        woken for each)."""
        loop = self._loop
        if loop is not None and self._waiting:
            with contextlib.suppress(RuntimeError):  # the event loop has closed: nobody waits
                loop.call_soon_threadsafe(self._wake_waiters)

    def _wake_waiters(self) -> None:
        room, self._room = self._room, asyncio.Event()
        if room is not None:
            room.set()

    async def _wait_for_room(self, wait: _Wait, full: Callable[[], bool]) -> bool:
        """Wait until a journal frees room (or the request's deadline, set by its first wait):
        False when the deadline passed, the collector stops or waiting is off. ``full`` is asked
        again once the request counts as waiting: room freed before then woke nobody."""
        if self.config.admission_wait_s <= 0 or self._stopping or self._room is None:
            return False
        loop = asyncio.get_running_loop()
        if wait.deadline is None:
            wait.deadline = loop.time() + self.config.admission_wait_s
            self._admission_waits += 1
        remaining = wait.deadline - loop.time()
        if remaining <= 0:
            return False
        self._waiting += 1
        try:
            if not full():
                return True
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._room.wait()  # set in this thread only: no wake is lost in between
        finally:
            self._waiting -= 1
        return not self._stopping

    async def _admit(self, journal: Journal, wait: _Wait) -> Overloaded | None:
        """Why ``journal`` cannot take a request now, after waiting for room (the module docstring)."""
        refusal = journal.admission()
        while refusal is not None and await self._wait_for_room(wait, lambda: journal.admission() is not None):
            refusal = journal.admission()
        return refusal

    async def _submit(self, journal: Journal, data: bytes, wait: _Wait) -> Future[None]:
        """``journal.submit(data)``, waiting for room while the request's deadline allows; the
        bytes held meanwhile stay within ``max_pending_bytes`` (beyond it, refused at once)."""
        while True:
            try:
                return journal.submit(data)
            except Overloaded:
                if self._held_bytes + len(data) > self.config.max_pending_bytes:
                    raise
                self._held_bytes += len(data)
                try:
                    room = await self._wait_for_room(wait, lambda: journal.admission(len(data)) is not None)
                finally:
                    self._held_bytes -= len(data)
                if not room:
                    raise

    def _over_bound(self, encoding: Encoding | None, refusal: Overloaded | None, wait: _Wait) -> Response:
        """The answer to a request the journal has no room for (after its wait, ended by stopping or
        by its deadline), or that arrived while stopping."""
        if self._stopping or refusal is None:
            return self._error(encoding, 503, "the collector is shutting down", headers=self._retry_after)
        if wait.deadline is not None:
            self._admission_wait_refused += 1
        return self._error(encoding, refusal.status, str(refusal), headers=self._retry_after)

    # -- HTTP ------------------------------------------------------------------------------------------

    def _error(
        self,
        encoding: Encoding | None,
        status: int,
        message: str,
        *,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        self._refused += 1
        logger.debug("refused a request with %d: %s", status, message)
        return Response(
            status_body(encoding, status, message, field=field),
            status_code=status,
            media_type=media_type(encoding or "json"),
            headers=headers,
        )

    async def _over_capacity(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The application of a connection opened above the cap with no idle one to close:
        ``GET /health`` is answered, anything else 503; then the connection is closed."""
        request = Request(scope)
        if scope["method"] == "GET" and scope["path"] == "/health":
            response = await self._health(request)
            response.headers["Connection"] = "close"
        else:
            encoding = request_encoding(request.headers.get("content-type"))
            message = f"more than {self._rules.max_connections} connections are open: retry later"
            response = self._error(encoding, 503, message, headers={**self._retry_after, "Connection": "close"})
        await response(scope, receive, send)

    async def _health(self, request: Request) -> Response:
        return JSONResponse({"status": "stopping" if self._stopping else "ok", **self.stats().to_json()})

    async def _traces(self, request: Request) -> Response:
        return await self._receive(request, self.journal, decode_request, success_body, self._count_spans)

    async def _metrics(self, request: Request) -> Response:
        return await self._receive(request, self.metrics_journal, decode_metrics_request, metrics_success_body,
                                   self._count_points)  # fmt: skip

    def _count_spans(self, decoded: Decoded) -> None:
        self._accepted += decoded.accepted
        self._rejected += decoded.rejected

    def _count_points(self, decoded: Decoded) -> None:
        self._accepted_points += decoded.accepted
        self._rejected_points += decoded.rejected

    async def _receive(
        self,
        request: Request,
        journal: Journal,
        decode: Callable[[bytes, Encoding], Decoded],
        success: Callable[[Encoding, Decoded | None], bytes],
        count: Callable[[Decoded], None],
    ) -> Response:
        """One export request of either signal: ``decode`` the body into ``journal`` lines and
        answer with ``success`` once they are fsync'd; ``count`` is told what was accepted."""
        self._requests += 1
        headers = request.headers
        encoding = request_encoding(headers.get("content-type"))
        token = self.config.token
        if token is not None and not bearer_matches(_raw_header(request, b"authorization"), token):
            return self._error(encoding, 401, "missing or wrong bearer token",
                               headers={"WWW-Authenticate": 'Bearer realm="treellm"'})  # fmt: skip
        if encoding is None:
            return self._error(None, 415, f"unsupported Content-Type {headers.get('content-type')!r}: "
                               "send application/x-protobuf or application/json")  # fmt: skip
        coding = content_coding(headers.get("content-encoding"))
        if coding is None:
            return self._error(encoding, 415, f"unsupported Content-Encoding {headers.get('content-encoding')!r}: "
                               "send gzip, deflate or none")  # fmt: skip
        wait = _Wait()
        refusal = await self._admit(journal, wait)
        if refusal is not None or self._stopping:
            return self._over_bound(encoding, refusal, wait)
        limit = self.config.max_body_bytes
        try:
            async with asyncio.timeout(self.config.body_timeout_s):  # the whole body, however it trickles in
                body = await self._read_body(request, limit)
            decoded = await self._pool.decode(body, coding, encoding, limit, decode)
        except ClientDisconnect:  # the client gave up while sending: nobody to answer
            self._refused += 1
            return Response(status_code=400)
        except TimeoutError:
            self._rules.timed_out += 1
            return self._error(encoding, 408, f"the body did not arrive within {self.config.body_timeout_s} s",
                               headers={"Connection": "close"})  # fmt: skip
        except PayloadTooLarge as exc:
            return self._error(encoding, 413, str(exc))
        except BadRequest as exc:
            return self._error(encoding, 400, exc.reason, field=exc.field)
        if decoded.lines:
            try:
                future = await self._submit(journal, b"".join(decoded.lines), wait)
            except Overloaded as exc:
                return self._over_bound(encoding, exc, wait)
            except JournalError as exc:
                return self._error(encoding, 503, str(exc), headers=self._retry_after)
            try:
                await asyncio.wrap_future(future)
            except JournalError as exc:
                return self._error(encoding, 503, str(exc), headers=self._retry_after)
        count(decoded)
        return Response(success(encoding, decoded), status_code=200, media_type=media_type(encoding))

    @staticmethod
    async def _read_body(request: Request, limit: int) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None:
            if not declared.strip().isdigit():
                raise BadRequest(f"Content-Length is not a number: {declared!r}")
            if int(declared) > limit:
                raise PayloadTooLarge(f"the body ({declared} bytes) is above the {limit}-byte limit", limit=limit)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"the body is above the {limit}-byte limit", limit=limit)
            chunks.append(chunk)
        return b"".join(chunks)


def _raw_header(request: Request, name: bytes) -> bytes | None:
    """A header's value as sent (Starlette decodes them as Latin-1)."""
    for key, value in request.headers.raw:
        if key.lower() == name:
            return value
    return None


_VARIABLE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,254}$")


def token_from_env(variable: str) -> str:
    """The bearer token held by the environment variable ``variable`` (``--token-env``)."""
    if _VARIABLE.match(variable) is None:
        raise ConfigError(f"--token-env: expected the name of an environment variable such as TREELLM_TOKEN, got "
                          f"{shown(variable)}", setting="token")  # fmt: skip
    value = os.environ.get(variable, "").strip()
    if not value:
        raise ConfigError(f"--token-env: ${variable} is not set or empty; it must hold the bearer token",
                          setting="token")  # fmt: skip
    return value


def serve(
    db: str | os.PathLike[str],
    *,
    host: str | None = None,
    port: int | None = None,
    token: str | None = None,
    max_body_bytes: int | None = None,
    config: CollectorConfig | None = None,
    on_ready: Callable[[str], None] | None = None,
) -> int:
    """Run a collector on ``db`` until SIGTERM / SIGINT; returns the exit code (module docstring).

    ``host``, ``port``, ``token`` and ``max_body_bytes`` override ``config`` (whose
    defaults are :class:`CollectorConfig`'s); ``on_ready(url)`` is called once listening.
    """
    settings = (config or DEFAULTS).replace(host=host, port=port, token=token, max_body_bytes=max_body_bytes)
    collector = Collector(db, settings)
    stop, abort = threading.Event(), threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            abort.set()
            logger.warning("second signal: not waiting for the store any longer")
        else:
            stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        collector.start()
        if on_ready is not None:
            on_ready(collector.url)
        failed = False
        while not stop.wait(0.2):
            if not collector.running:
                failed = True
                break
        logger.info("stopping: draining the journal into %s", collector.db)
        drained = collector.stop(abort=abort)
    finally:
        collector.stop(drain_timeout_s=0.0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failed:
        return EXIT_SERVER_FAILED
    return EXIT_DRAINED if drained else EXIT_JOURNAL_KEPT
