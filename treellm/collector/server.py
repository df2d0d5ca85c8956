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
- ``POST /v1/metrics`` answers by the same rules (an ``ExportMetricsServiceResponse``,
  ``rejected_data_points`` in a partial success): 200 only once the request's data points
  are fsync'd in the metrics journal; the flusher inserts them into ``metric_points``
  (:mod:`treellm.store.metrics`, which explains the design).
- Bodies are decoded off the event loop by :class:`~treellm.collector.pool.DecodePool`: worker
  processes, one per core (``decode_workers``), started at :meth:`Collector.start`; small bodies
  sent without a content coding are decoded on the event loop. The journal's writer commits the
  requests of every connection together (one ``fdatasync`` for all that arrived meanwhile).
- Hostile or broken clients cannot hold the collector (uvicorn's h11 protocol, extended
  by :class:`_GuardedH11`): a connection that has not sent a request's headers
  ``header_timeout_s`` after it opened (or after its previous response) is answered 408
  (when it sent part of them) and closed; a body not whole ``body_timeout_s`` after its
  headers is answered 408 and its connection closed (a deadline on the whole body, not per
  chunk). File descriptors are budgeted: at start the connection cap is ``max_connections``
  lowered to the descriptor limit (``RLIMIT_NOFILE``) minus the descriptors already open
  minus ``descriptor_reserve`` (:func:`connection_cap`), so connections never take the
  descriptors the journal, the store and new peers need. A connection opened at the cap
  closes the oldest idle one (waiting for a request's headers, no request under way; oldest
  by when it started waiting) and is served; when none is idle it is answered 503 with
  ``Retry-After`` and closed, except ``GET /health``, which is answered all the same. A flood
  of half-open connections thus cycles through the budget instead of exhausting it, and
  ``/health`` and a client that sends its request are served. The collector accepts connections itself
  (:meth:`Collector._accept`, not asyncio's server, which on Python 3.11 retries a failed
  accept up to its backlog of 2048 times per event-loop turn, logging a traceback each
  time): a failed accept (EMFILE, ENFILE: out of file descriptors; ENOBUFS, ENOMEM) pauses
  accepting, 50 ms doubling to 1 s while it keeps failing, and is logged once per burst
  (the first failure, then how many there were once an accept works again,
  :class:`_Bursts`). The timeouts, refused connections, closed idle connections and failed
  accepts are counted in ``/health``, beside the cap and the connections open.
- ``Authorization`` is compared on the header's raw bytes
  (:func:`~treellm.collector.protocol.bearer_matches`): a UTF-8 token works.
- :func:`serve` runs a collector until SIGTERM or SIGINT (a second signal stops waiting
  for a busy store) and returns the exit code: 0 once drained, 75 (EX_TEMPFAIL) when
  spans had to stay in the journal (they go into the store at the next start), 1 when the
  server failed. Call it from the main thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, ClassVar, Final

import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from treellm.collector.config import DEFAULTS, CollectorConfig, journal_folder
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
_ACCEPT_PAUSE_FIRST_S: Final = 0.05
_ACCEPT_PAUSE_MAX_S: Final = 1.0
_HEADER_TIMEOUT_BODY: Final = b"the request headers did not arrive in time"
_HEADER_TIMEOUT_RESPONSE: Final = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n"
    b"connection: close\r\n\r\n%s" % (len(_HEADER_TIMEOUT_BODY), _HEADER_TIMEOUT_BODY)
)


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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


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


def connection_cap(max_connections: int, descriptor_limit: int | None, open_descriptors: int, reserve: int) -> int:
    """The most connections to hold open: ``max_connections``, lowered so that the descriptors
    open now, the connections and ``reserve`` fit within ``descriptor_limit`` (None: no limit).
    Below 1 when the limit leaves no room (pure)."""
    if descriptor_limit is None:
        return max_connections
    return min(max_connections, descriptor_limit - open_descriptors - reserve)


def _descriptor_limit() -> int | None:
    """The soft ``RLIMIT_NOFILE`` of this process; None when unlimited or unknown."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return None
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else int(soft)


def _open_descriptors() -> int:
    """How many file descriptors this process holds (0 when the system does not list them)."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return max(0, len(os.listdir(folder)) - 1)  # less the listing's own descriptor
        except OSError:
            continue
    return 0


class _Bursts:
    """Counts a recurring trouble and logs it once per burst: the first occurrence, then nothing
    until :meth:`end` (the trouble is over), which logs how many there were. Event loop thread only."""

    def __init__(self, first: str, over: str) -> None:
        self.total = 0
        self._burst = 0
        self._first = first
        self._over = over

    def note(self, *args: object) -> None:
        self.total += 1
        self._burst += 1
        if self._burst == 1:
            logger.warning(self._first, *args)

    def end(self) -> None:
        if self._burst:
            logger.warning(self._over, self._burst)
            self._burst = 0


class _ConnectionRules:
    """What every connection of one collector obeys (:class:`_GuardedH11`), its counters, and
    the connections waiting for a request's headers, oldest first (the ones closed to make
    room at the cap). Event loop thread only, but :attr:`max_connections`, set once at start."""

    def __init__(self, config: CollectorConfig, over_capacity: ASGIApp) -> None:
        self.max_connections = config.max_connections
        self.header_timeout_s = config.header_timeout_s
        self.over_capacity_app = over_capacity
        self.timed_out = 0
        self.waiting: dict[_GuardedH11, None] = {}  # insertion order: oldest first
        self.closing: set[_GuardedH11] = set()  # closed to make room, not yet gone
        self.over_capacity = _Bursts(
            "refusing connections above %d open ones with 503, no idle one left to close (logged once until one "
            "is taken)",
            "taking connections again after refusing %d above the limit",
        )
        self.evicted = _Bursts(
            "at the cap of %d connections: closing the oldest idle one for each new one (logged once until the "
            "connections fall below the cap)",
            "below the connection cap again after closing %d idle connection(s)",
        )
        self.accept_errors = _Bursts(
            "cannot accept connections: %s; pausing and retrying (logged once until accepting works again)",
            "accepting connections again after %d failed accept(s)",
        )

    def open(self, connections: set[Any]) -> int:
        """Connections open, less those closed to make room and not yet gone."""
        return len(connections) - len(self.closing)

    def make_room(self, newcomer: _GuardedH11) -> bool:
        """Close the oldest idle connection other than ``newcomer``; whether there was one."""
        for connection in self.waiting:
            if connection is not newcomer and connection.idle:
                del self.waiting[connection]
                self.closing.add(connection)
                connection.transport.close()
                self.evicted.note(self.max_connections)
                return True
        return False


def _guarded_protocol(rules: _ConnectionRules) -> type[_GuardedH11]:
    """uvicorn's HTTP protocol class bound to one collector's ``rules``."""

    class Guarded(_GuardedH11):
        _rules = rules

    return Guarded


class _GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with the collector's connection rules (the module docstring): a
    deadline on the headers of each request and a cap on open connections. Event loop thread only."""

    _rules: ClassVar[_ConnectionRules]
    _header_timer: asyncio.TimerHandle | None = None
    _heard = False  # bytes received since the header deadline was set

    @property
    def idle(self) -> bool:
        """Waiting for a request's headers, none under way (a connection that may be closed to make room)."""
        return not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        rules = self._rules
        if rules.open(self.connections) <= rules.max_connections:
            rules.over_capacity.end()
            rules.evicted.end()
        elif not rules.make_room(self):
            rules.over_capacity.note(rules.max_connections)
            self.app = rules.over_capacity_app
        rules.waiting[self] = None
        self._set_header_deadline()

    def data_received(self, data: bytes) -> None:
        self._heard = True
        super().data_received(data)
        if not self.idle:  # a request is under way: not to be closed to make room
            self._rules.waiting.pop(self, None)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._set_header_deadline()
            if self.idle:  # waiting again (a pipelined request may be under way already)
                self._rules.waiting.pop(self, None)
                self._rules.waiting[self] = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        self._rules.waiting.pop(self, None)
        self._rules.closing.discard(self)
        super().connection_lost(exc)

    def _set_header_deadline(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
        self._heard = False
        self._header_timer = self.loop.call_later(self._rules.header_timeout_s, self._header_deadline)

    def _header_deadline(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request is under way: its body has a deadline of its own (Collector._receive)
        self._rules.timed_out += 1
        if self._heard:  # part of a request: say why; an idle keep-alive connection is just closed
            self.transport.write(_HEADER_TIMEOUT_RESPONSE)
        self.transport.close()


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
        self.journal = self._journal(folder)
        self.metrics_journal = self._journal(folder / METRICS_FOLDER)
        self.flusher = Flusher(
            self.db, self.journal, interval_s=config.flush_interval_s, metrics_journal=self.metrics_journal,
            ingest=ingest,
        )  # fmt: skip
        self.app = Starlette(
            routes=[
                Route(TRACES_PATH, self._traces, methods=["POST"]),
                Route(METRICS_PATH, self._metrics, methods=["POST"]),
                Route("/health", self._health, methods=["GET"]),
            ]
        )
        self._retry_after = {"Retry-After": str(config.retry_after_s)}
        self._rules = _ConnectionRules(config, self._over_capacity)
        self._pool = DecodePool(cores() if config.decode_workers is None else config.decode_workers)
        self._protocol = _guarded_protocol(self._rules)
        self._socket: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
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
        self.url = ""
        self.metrics_url = ""

    def _journal(self, folder: Path) -> Journal:
        return Journal(
            folder,
            max_segment_bytes=self.config.max_segment_bytes,
            max_pending_bytes=self.config.max_pending_bytes,
            max_journal_bytes=self.config.max_journal_bytes,
        )

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
        """The cap on open connections within the descriptor budget (the module docstring)."""
        limit, held, reserve = _descriptor_limit(), _open_descriptors(), self.config.descriptor_reserve
        cap = connection_cap(self.config.max_connections, limit, held, reserve)
        if cap < 1:
            raise CollectorError(
                f"the file descriptor limit ({limit}) leaves no room for connections: {held} are open and "
                f"{reserve} are kept in reserve; raise it (ulimit -n) or lower descriptor_reserve"
            )
        if cap < self.config.max_connections:
            logger.info("holding at most %d connections: the descriptor limit is %d, %d are open, %d in reserve",
                        cap, limit, held, reserve)  # fmt: skip
        return cap

    def _serve(self) -> None:
        try:
            asyncio.run(self._serve_forever())
        except Exception:
            logger.exception("the HTTP server of the collector failed")

    async def _serve_forever(self) -> None:
        """uvicorn serves the connections that :meth:`_accept` hands it (it listens on no socket)."""
        server, sock = self._server, self._socket
        assert server is not None and sock is not None
        loop = asyncio.get_running_loop()
        protocol = self._protocol

        def connection() -> asyncio.Protocol:  # as uvicorn makes them (no lifespan: no state)
            return protocol(config=server.config, server_state=server.server_state, app_state={}, _loop=loop)

        self._loop = loop
        self._accepting = asyncio.create_task(self._accept(sock, connection))
        try:
            await server.serve(sockets=[])
        finally:
            self._accepting.cancel()

    async def _accept(self, sock: socket.socket, connection: Callable[[], asyncio.Protocol]) -> None:
        """Accept connections until cancelled; a failed accept pauses (the module docstring)."""
        loop = asyncio.get_running_loop()
        pause = _ACCEPT_PAUSE_FIRST_S
        while True:
            try:
                conn, _ = await loop.sock_accept(sock)
            except ConnectionAbortedError:  # the client left while waiting in the backlog
                continue
            except OSError as exc:  # EMFILE, ENFILE, ENOBUFS, ENOMEM... accepting again at once would spin
                self._rules.accept_errors.note(exc.strerror or exc)
                await asyncio.sleep(pause)
                pause = min(pause * 2, _ACCEPT_PAUSE_MAX_S)
                continue
            pause = _ACCEPT_PAUSE_FIRST_S
            self._rules.accept_errors.end()
            try:
                await loop.connect_accepted_socket(connection, conn)
            except OSError as exc:
                conn.close()
                logger.debug("dropped an accepted connection: %s", exc)

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
        )

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
        if self._stopping:
            return self._error(encoding, 503, "the collector is shutting down", headers=self._retry_after)
        refusal = journal.admission()
        if refusal is not None:
            return self._error(encoding, refusal.status, str(refusal), headers=self._retry_after)
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
                future = journal.submit(b"".join(decoded.lines))
            except Overloaded as exc:
                return self._error(encoding, exc.status, str(exc), headers=self._retry_after)
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
