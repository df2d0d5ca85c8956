"""The collector's settings: one frozen, validated dataclass; its field defaults are the only defaults."""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from treellm.errors import ConfigError
from treellm.urls import host_problem, shown

__all__ = ["DEFAULTS", "CollectorConfig", "journal_folder", "parse_size"]

_MiB = 1024 * 1024
# The receiver checks that a body parsed as protobuf is one message (not the Collector file
# exporter's length-prefixed frames) by its size: a frame length read from a message's first
# bytes is always at least 128 MiB.
_MAX_BODY_CEILING = 128 * _MiB


def _expect(setting: str, ok: bool, expected: str, got: object) -> None:
    if not ok:
        raise ConfigError(f"{setting}: expected {expected}, got {shown(got) if isinstance(got, str) else repr(got)}",
                          setting=setting)  # fmt: skip


def _positive_int(setting: str, value: object, *, maximum: int | None = None) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    if ok and maximum is not None:
        ok = value <= maximum  # type: ignore[operator]
    _expect(setting, ok, "a positive integer" + (f" up to {maximum}" if maximum else ""), value)


def _positive_number(setting: str, value: object) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
    _expect(setting, ok, "a positive number", value)


@dataclass(frozen=True, slots=True)
class CollectorConfig:
    """How the collector listens, what it accepts and how it journals and flushes.

    - ``host`` / ``port``: where to listen (loopback unless told otherwise; 4318 is the
      OTLP/HTTP port; 0 picks a free port).
    - ``token``: when set, requests need ``Authorization: Bearer <token>`` (else 401).
    - ``max_body_bytes``: the largest body, as sent and once decompressed (else 413);
      20 MiB, as the OpenTelemetry Collector's HTTP receiver.
    - ``flush_interval_s``: how often the journal is flushed into the store (the start of
      one flush to the next; after a flush longer than half of it, a pause of half of it,
      which readers get to themselves). Readers see data about this much later, plus a flush.
    - ``max_segment_bytes``: a journal segment is closed at this size even between flushes,
      so one flush transaction stays bounded while the store is busy.
    - ``max_flush_bytes``: a backlog of closed segments (the store fell behind) goes in up to
      this many bytes in one transaction: the larger, the cheaper each span (one read, one
      commit, one pause per batch), and the longer a reader waits for the transaction under
      way (BENCHMARKS.md, "Collector"). At least one segment goes in whatever its size.
    - ``max_pending_bytes``: bytes waiting for the journal's fsync; above it, 429.
    - ``max_journal_bytes``: bytes journaled and not yet in the store; above it, 503
      (the store cannot keep up, e.g. another writer holds it).
    - ``admission_wait_s``: how long a request over a journal bound waits for room before it is
      answered 429 / 503: it waits before its body is read (the body stays in the socket, so a
      waiting request holds no memory; one let in whose decoded spans then find no room waits
      holding them, at most ``max_pending_bytes`` in all) and goes on as soon as a sync or a
      flush frees room. A
      store that falls behind for a moment then slows clients down instead of turning them away
      for ``Retry-After`` seconds each; one that stays behind still answers 503 after this long.
      0 answers at once. Keep it well under the clients' timeout (10 s in the OpenTelemetry SDKs).
    - ``retry_after_s``: the ``Retry-After`` sent with 429 and 503.
    - ``drain_timeout_s``: on shutdown, how long to keep trying to move the journal into
      a busy store before leaving it for the next start.
    - ``journal_dir``: the journal folder (default ``<db>.collector`` beside the store).
    - ``header_timeout_s``: a connection must send a request's headers within this many
      seconds of opening (or of the previous response); else it is answered 408 (when it
      sent part of them) and closed. A client holding connections half-open holds no
      file descriptor for longer.
    - ``body_timeout_s``: the deadline on a request's whole body, from its headers to its
      last byte (not per chunk: a client trickling a byte at a time is cut off all the same);
      408 and the connection closed.
    - ``max_connections``: the most connections held open (None: as many as the file
      descriptors allow, see ``descriptor_reserve``; a number: that many at most). At the cap, a
      new connection closes the oldest idle one (waiting for a request's headers, none under
      way) and is served; when none is idle it is answered 503 with ``Retry-After`` (as soon as
      it sends its headers) and closed, except that ``GET /health`` is answered all the same.
    - ``max_connections_per_peer``: the most connections one peer (an IPv4 address, an IPv6
      /64) holds open; one more is closed as soon as it is accepted, before anything is read,
      so a peer holding its cap in half-sent requests never keeps the others or ``/health``
      out. An SDK exports over one or a few connections, an OpenTelemetry Collector over about
      ten; behind a proxy every client is the proxy's one peer.
    - ``descriptor_reserve``: file descriptors kept free for the collector's own files (the
      journal, the store, DuckDB's) and for accepting new peers: at start the soft descriptor
      limit (``RLIMIT_NOFILE``) is raised to the hard one, and the cap becomes that limit minus
      the descriptors already open minus this reserve (``max_connections`` when lower), so a
      flood of half-open connections never leaves ``/health`` or a new client without one.
    - ``decode_workers``: the processes that decode request bodies off the event loop (None: one
      per core the process may run on; 0: decode on threads, one core). Small bodies are
      decoded on the event loop all the same. The processes are spawned: a program that starts a
      collector itself guards its start with ``if __name__ == "__main__":`` (else they cannot
      start, and it decodes on threads, saying so once).
    - ``flusher_nice``: how much lower the flusher's CPU priority is than the receiver's (0-19;
      Linux: the nice value of the flusher's thread, and of the DuckDB threads it starts, raised
      by this much). Under a full load the cores go to acknowledging first; the store catches up
      when the load eases (the journal holds what is acknowledged meanwhile, up to its bound).
    """

    host: str = "127.0.0.1"
    port: int = 4318
    token: str | None = field(default=None, repr=False)
    max_body_bytes: int = 20 * _MiB
    flush_interval_s: float = 1.0
    max_segment_bytes: int = 32 * _MiB
    max_flush_bytes: int = 256 * _MiB
    max_pending_bytes: int = 64 * _MiB
    max_journal_bytes: int = 1024 * _MiB
    admission_wait_s: float = 5.0
    retry_after_s: int = 2
    drain_timeout_s: float = 30.0
    journal_dir: Path | None = None
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int | None = None
    max_connections_per_peer: int = 64
    descriptor_reserve: int = 32
    decode_workers: int | None = None
    flusher_nice: int = 10

    def __post_init__(self) -> None:
        _expect("host", isinstance(self.host, str) and host_problem(self.host) is None,
                "a host name or an IP address such as 127.0.0.1, ::1 or localhost", self.host)  # fmt: skip
        port_ok = isinstance(self.port, int) and not isinstance(self.port, bool) and 0 <= self.port <= 65535
        _expect("port", port_ok, "a port number 0-65535", self.port)
        _expect("token", self.token is None or (isinstance(self.token, str) and bool(self.token.strip())),
                "a non-empty token or none", "<hidden>")  # fmt: skip
        _positive_int("max_body_bytes", self.max_body_bytes, maximum=_MAX_BODY_CEILING)
        _positive_number("flush_interval_s", self.flush_interval_s)
        _positive_int("max_segment_bytes", self.max_segment_bytes)
        _positive_int("max_flush_bytes", self.max_flush_bytes)
        _positive_int("max_pending_bytes", self.max_pending_bytes)
        _positive_int("max_journal_bytes", self.max_journal_bytes)
        _expect("admission_wait_s", isinstance(self.admission_wait_s, int | float) and not
                isinstance(self.admission_wait_s, bool) and 0 <= self.admission_wait_s <= 600,
                "a number of seconds 0-600", self.admission_wait_s)  # fmt: skip
        _positive_int("retry_after_s", self.retry_after_s)
        _positive_number("drain_timeout_s", self.drain_timeout_s)
        _expect("journal_dir", self.journal_dir is None or (isinstance(self.journal_dir, Path) and
                "\x00" not in str(self.journal_dir)), "a folder path without NUL characters",
                self.journal_dir)  # fmt: skip
        _positive_number("header_timeout_s", self.header_timeout_s)
        _positive_number("body_timeout_s", self.body_timeout_s)
        if self.max_connections is not None:
            _positive_int("max_connections", self.max_connections)
        _positive_int("max_connections_per_peer", self.max_connections_per_peer)
        _positive_int("descriptor_reserve", self.descriptor_reserve)
        _expect("decode_workers", self.decode_workers is None or (isinstance(self.decode_workers, int) and
                not isinstance(self.decode_workers, bool) and self.decode_workers >= 0),
                "a number of processes >= 0 or none (one per core)", self.decode_workers)  # fmt: skip
        _expect("flusher_nice", isinstance(self.flusher_nice, int) and not isinstance(self.flusher_nice, bool)
                and 0 <= self.flusher_nice <= 19, "a nice increment 0-19", self.flusher_nice)  # fmt: skip

    def replace(self, **changes: Any) -> CollectorConfig:
        """A copy with ``changes`` applied (``None`` values are ignored: "not given")."""
        given = {k: v for k, v in changes.items() if v is not None}
        unknown = set(given) - {f.name for f in fields(self)}
        if unknown:
            raise ConfigError(f"unknown collector setting(s): {', '.join(sorted(unknown))}")
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(given)
        return CollectorConfig(**values)

    @property
    def loopback(self) -> bool:
        """Whether ``host`` only listens on this machine."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


DEFAULTS = CollectorConfig()


def journal_folder(db: str | os.PathLike[str], config: CollectorConfig) -> Path:
    """The journal folder: ``config.journal_dir``, else ``<db>.collector`` beside the store."""
    if config.journal_dir is not None:
        return config.journal_dir
    path = Path(db)
    return path.with_name(path.name + ".collector")


_SIZE = re.compile(r"^\s*(\d+)\s*(|b|k|kb|kib|m|mb|mib|g|gb|gib)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
          "g": 1000**3, "gb": 1000**3, "gib": 1024**3}  # fmt: skip


def parse_size(text: str, *, setting: str = "size") -> int:
    """``20MiB``, ``4mb``, ``1048576``... as a number of bytes."""
    match = _SIZE.match(text)
    if match is None:
        raise ConfigError(f"{setting}: expected a size such as 20MiB, 512kB or 1048576, got {shown(text)}",
                          setting=setting)  # fmt: skip
    return int(match.group(1)) * _UNITS[match.group(2).lower()]
