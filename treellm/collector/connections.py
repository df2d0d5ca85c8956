"""The collector's connections: who is let in, how many each peer and all peers may hold, and the
deadlines every connection obeys (uvicorn's h11 protocol, extended by :class:`GuardedH11`).

Contract (everything here runs on the collector's event loop thread, but :func:`raise_descriptor_limit`
and :func:`connection_cap`, called once at start from the controlling thread):

- **Descriptors.** At start the soft ``RLIMIT_NOFILE`` is raised to the hard one
  (:func:`raise_descriptor_limit`; as far as the system lets), and the total cap on open
  connections is derived from it (:func:`connection_cap`): the limit less the descriptors
  already open less ``descriptor_reserve`` (the journal, the store, DuckDB's files, new peers),
  lowered to ``max_connections`` when that is set. A limit that leaves no room is an error.
- **Peers.** A peer is an IPv4 address, or an IPv6 address's /64 (one host usually holds a whole
  /64), an IPv4-mapped IPv6 address counting as its IPv4 address (:func:`peer_key`). A peer
  holds at most ``max_connections_per_peer`` connections: one over it is closed as soon as it
  is accepted, before anything is read from it (:func:`accept_forever`), counted
  (``peer_refused``) and logged once per burst per peer. So while one peer holds its cap in
  half-sent requests, every other peer's exports and ``GET /health`` are answered at once.
  Behind a proxy or an OpenTelemetry Collector every client is the proxy's one peer: raise the
  cap there.
- **The total cap.** A connection opened at the total cap (many peers) closes the oldest idle one
  (waiting for a request's headers, none under way; oldest by when it started waiting) and is
  served; when none is idle it is answered 503 with ``Retry-After`` and closed, except ``GET
  /health``, which is answered all the same (``over_capacity_app``).
- **Deadlines.** A connection that has not sent a request's headers ``header_timeout_s`` after it
  opened (or after its previous response) is answered 408 (when it sent part of them) and
  closed; the body's deadline is the server's (``Collector._receive``).
- **Accepting.** The collector accepts connections itself (:func:`accept_forever`, not asyncio's
  server, which on Python 3.11 retries a failed accept up to its backlog of 2048 times per
  event-loop turn, logging a traceback each time): a failed accept (EMFILE, ENFILE: out of file
  descriptors; ENOBUFS, ENOMEM) pauses accepting, 50 ms doubling to 1 s while it keeps failing,
  and is logged once per burst (:class:`Bursts`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
from collections.abc import Callable
from typing import Any, ClassVar, Final

from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = [
    "Bursts",
    "ConnectionRules",
    "GuardedH11",
    "accept_forever",
    "connection_cap",
    "descriptor_limit",
    "guarded_protocol",
    "open_descriptors",
    "peer_key",
    "raise_descriptor_limit",
]

logger = logging.getLogger(__name__)

NO_LIMIT_CAP: Final = 65_536
"""The total cap when neither ``max_connections`` nor a descriptor limit bounds it."""
_ACCEPT_PAUSE_FIRST_S: Final = 0.05
_ACCEPT_PAUSE_MAX_S: Final = 1.0
_UNLIMITED_TARGETS: Final = (1 << 20, 10_240)  # an unlimited hard limit: Linux's nr_open default, macOS's OPEN_MAX
_HEADER_TIMEOUT_BODY: Final = b"the request headers did not arrive in time"
_HEADER_TIMEOUT_RESPONSE: Final = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n"
    b"connection: close\r\n\r\n%s" % (len(_HEADER_TIMEOUT_BODY), _HEADER_TIMEOUT_BODY)
)


# -- pure ------------------------------------------------------------------------------------------------


def connection_cap(
    max_connections: int | None, descriptor_limit: int | None, open_descriptors: int, reserve: int
) -> int:
    """The most connections to hold open: what the descriptors allow once those open now and
    ``reserve`` are set aside (``descriptor_limit`` None: no limit), lowered to ``max_connections``
    when given; :data:`NO_LIMIT_CAP` when neither bounds it. Below 1 when the limit leaves no room."""
    if descriptor_limit is None:
        return NO_LIMIT_CAP if max_connections is None else max_connections
    room = descriptor_limit - open_descriptors - reserve
    return room if max_connections is None else min(max_connections, room)


def peer_key(address: object) -> str:
    """The peer a connection counts against, from ``getpeername()``'s address: the IPv4 address;
    an IPv6 address's /64 network (an IPv4-mapped one: its IPv4 address); anything else (a Unix
    socket's path, an unknown address) as text."""
    host = address[0] if isinstance(address, tuple) and address else address
    if not isinstance(host, str):
        return "" if host is None else repr(host)
    try:
        ip = ipaddress.ip_address(host.partition("%")[0])  # an IPv6 zone ("fe80::1%eth0") is no part of it
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


# -- descriptors -----------------------------------------------------------------------------------------


def raise_descriptor_limit() -> tuple[int, int] | None:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard one (an unlimited hard one: as high as the
    system takes); (before, after) when it was raised, None when it was not (already there, not a
    POSIX system, or the system refused). Process-wide: call it at start, from one thread."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    targets = (hard,) if hard != resource.RLIM_INFINITY else _UNLIMITED_TARGETS
    for target in targets:
        if target <= soft:
            continue
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            logger.debug("could not raise the descriptor limit from %d to %d: %s", soft, target, exc)
            continue
        return soft, target
    return None


def descriptor_limit() -> int | None:
    """The soft ``RLIMIT_NOFILE`` of this process; None when unlimited or unknown."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return None
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else int(soft)


def open_descriptors() -> int:
    """How many file descriptors this process holds (0 when the system does not list them)."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return max(0, len(os.listdir(folder)) - 1)  # less the listing's own descriptor
        except OSError:
            continue
    return 0


# -- the rules -------------------------------------------------------------------------------------------


class Bursts:
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

    def end(self, *args: object) -> None:
        if self._burst:
            logger.warning(self._over, *args, self._burst)
            self._burst = 0


class ConnectionRules:
    """What every connection of one collector obeys (the module docstring), its counters, the
    connections open per peer, and the connections waiting for a request's headers, oldest first
    (the ones closed to make room at the total cap). Event loop thread only, but the caps, set
    once at start."""

    def __init__(
        self, *, max_connections: int, per_peer: int, header_timeout_s: float, over_capacity_app: ASGIApp
    ) -> None:
        self.max_connections = max_connections
        self.per_peer = per_peer
        self.header_timeout_s = header_timeout_s
        self.over_capacity_app = over_capacity_app
        self.timed_out = 0
        self.peer_refused = 0
        self.peers: dict[str, int] = {}  # connections open per peer (none listed at 0)
        self._refusing: dict[str, Bursts] = {}  # peers refused since their last connection taken
        self.waiting: dict[GuardedH11, None] = {}  # insertion order: oldest first
        self.closing: set[GuardedH11] = set()  # closed to make room, not yet gone
        self.over_capacity = Bursts(
            "refusing connections above %d open ones with 503, no idle one left to close (logged once until one "
            "is taken)",
            "taking connections again after refusing %d above the limit",
        )
        self.evicted = Bursts(
            "at the cap of %d connections: closing the oldest idle one for each new one (logged once until the "
            "connections fall below the cap)",
            "below the connection cap again after closing %d idle connection(s)",
        )
        self.accept_errors = Bursts(
            "cannot accept connections: %s; pausing and retrying (logged once until accepting works again)",
            "accepting connections again after %d failed accept(s)",
        )

    def open(self, connections: set[Any]) -> int:
        """Connections open, less those closed to make room and not yet gone."""
        return len(connections) - len(self.closing)

    def admit(self, peer: str) -> bool:
        """Whether a connection just accepted from ``peer`` may stay (under the peer's cap)."""
        if self.peers.get(peer, 0) < self.per_peer:
            return True
        self.peer_refused += 1
        bursts = self._refusing.get(peer)
        if bursts is None:
            bursts = self._refusing[peer] = Bursts(
                "closing connections from %s above its cap of %d at once (logged once until it holds fewer)",
                "taking connections from %s again after closing %d above its cap",
            )
        bursts.note(peer, self.per_peer)
        return False

    def joined(self, peer: str) -> None:
        self.peers[peer] = self.peers.get(peer, 0) + 1
        bursts = self._refusing.pop(peer, None)
        if bursts is not None:
            bursts.end(peer)

    def left(self, peer: str) -> None:
        held = self.peers.get(peer, 0) - 1
        if held > 0:
            self.peers[peer] = held
            return
        self.peers.pop(peer, None)
        bursts = self._refusing.pop(peer, None)  # gone: its burst is over too (the table stays bounded)
        if bursts is not None:
            bursts.end(peer)

    def make_room(self, newcomer: GuardedH11) -> bool:
        """Close the oldest idle connection other than ``newcomer``; whether there was one."""
        for connection in self.waiting:
            if connection is not newcomer and connection.idle:
                del self.waiting[connection]
                self.closing.add(connection)
                connection.transport.close()
                self.evicted.note(self.max_connections)
                return True
        return False


def guarded_protocol(rules: ConnectionRules) -> type[GuardedH11]:
    """uvicorn's HTTP protocol class bound to one collector's ``rules``."""

    class Guarded(GuardedH11):
        _rules = rules

    return Guarded


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with the collector's connection rules (the module docstring): a
    deadline on the headers of each request, the count per peer and the total cap. Event loop thread only."""

    _rules: ClassVar[ConnectionRules]
    _header_timer: asyncio.TimerHandle | None = None
    _heard = False  # bytes received since the header deadline was set
    peer: str | None = None  # set by accept_forever (else read at connection_made); counted until lost
    _counted = False

    @property
    def idle(self) -> bool:
        """Waiting for a request's headers, none under way (a connection that may be closed to make room)."""
        return not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        rules = self._rules
        if self.peer is None:
            self.peer = peer_key(transport.get_extra_info("peername"))
        rules.joined(self.peer)
        self._counted = True
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
        if self._counted and self.peer is not None:
            self._rules.left(self.peer)
            self._counted = False
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


async def accept_forever(sock: socket.socket, connection: Callable[[], GuardedH11], rules: ConnectionRules) -> None:
    """Accept connections on ``sock`` until cancelled, each served by a ``connection()`` protocol:
    one over its peer's cap is closed at once, unread; a failed accept pauses (the module docstring)."""
    loop = asyncio.get_running_loop()
    pause = _ACCEPT_PAUSE_FIRST_S
    while True:
        try:
            conn, address = await loop.sock_accept(sock)
        except ConnectionAbortedError:  # the client left while waiting in the backlog
            continue
        except OSError as exc:  # EMFILE, ENFILE, ENOBUFS, ENOMEM... accepting again at once would spin
            rules.accept_errors.note(exc.strerror or exc)
            await asyncio.sleep(pause)
            pause = min(pause * 2, _ACCEPT_PAUSE_MAX_S)
            continue
        pause = _ACCEPT_PAUSE_FIRST_S
        rules.accept_errors.end()
        peer = peer_key(address)
        if not rules.admit(peer):
            conn.close()  # before reading a byte: the peer holds its cap already
            continue
        protocol = connection()
        protocol.peer = peer
        try:
            # returns once the protocol's connection_made ran: the peer's count is up to date
            await loop.connect_accepted_socket(_given(protocol), conn)
        except OSError as exc:
            conn.close()
            logger.debug("dropped an accepted connection: %s", exc)


def _given(protocol: GuardedH11) -> Callable[[], GuardedH11]:
    """A protocol factory that hands out ``protocol``, made beforehand."""
    return lambda: protocol
