"""The treellm collector: an OTLP/HTTP receiver that feeds the DuckDB store.

``treellm collect`` (and ``python -m treellm.collector``) listens on ``/v1/traces``
and ``/v1/metrics`` (OTLP/HTTP, port 4318, loopback by default) for protobuf and JSON
requests, gzip or not, from any OpenTelemetry SDK or Collector, and writes the spans
and the metric data points (table ``metric_points``) into the store. Metrics follow the
same path as spans through a journal of their own (``<db>.collector/metrics/``) and the
same flusher; :mod:`treellm.store.metric_points` explains that design.

How it fits the store's one-writer-or-many-readers rule (``docs/architecture.md``)::

    clients ──POST──> receiver ──submit──> journal writer ──write + fdatasync──> <db>.collector/NNNN.jsonl
       ^                 │                  (group commit: one fsync for all      │ segments, cut every
       └──── 200 ────────┘ once fsync'd      requests queued meanwhile)           v ~1 s by the flusher
                                                                     flusher ──ingest_file──> store.duckdb
                                                                     (one short transaction per segment,
                                                                      then the segment is deleted)

- Durability: a request is answered 200 only once its spans are fsync'd in the journal
  (:mod:`treellm.store.journal`), an append-only folder of segment files beside the
  store. A crash (even ``kill -9``) loses nothing acknowledged: the segments left behind
  are replayed into the store when the collector starts again (a torn last line, never
  acknowledged, is dropped).
- Group commit: the journal writer thread takes every request queued since its last
  fsync and writes them with one ``write`` and one ``fdatasync``; the more concurrent
  requests, the more share one sync, so throughput does not collapse under fsync.
- Batched writes into the store (:mod:`treellm.store.flusher`): about every second
  the flusher takes the oldest closed segment (or closes the open one) and ingests it
  with :func:`~treellm.store.ingest_file` in one transaction, holding DuckDB's write
  lock only while it writes; then it deletes it. Ingest is idempotent by
  (trace_id, span_id), so a replayed segment or a client's retried request stores
  nothing twice. A segment the store refuses is split in halves until the bad line is
  alone, which is set aside in ``rejected/``; the good ones go in.
- Live dashboard: DuckDB lets one process write or several read, never both. Readers
  (the dashboard, ``treellm report``) open a read-only connection per query and retry
  while the flusher writes; the flusher leaves the file free between flushes (at least
  half a flush interval every cycle) and, in turn, treats a reader holding the file (or
  another writer, such as ``treellm ingest``) as "busy": it backs off (0.1 s doubling to
  2 s) and retries, while the receiver keeps journaling and answering 200. Requests
  never wait for the store, so a reader never slows the collector; data reaches readers
  about one flush interval (1 s) plus one flush later (measured: 2-3 s at 20,000 spans/s
  on 2 cores, see ``benchmarks/bench_collector.py``).
- Backpressure: above ``max_pending_bytes`` waiting for the fsync the receiver answers
  429, above ``max_journal_bytes`` not yet in the store 503, both with ``Retry-After``.
- Shutdown: on SIGTERM or Ctrl-C it stops accepting, finishes requests under way,
  drains the journal into the store and exits 0 (75 if the store stayed busy past the
  drain timeout: the spans wait in the journal for the next start).

The HTTP behaviour follows the OTLP specification (see :mod:`treellm.collector.protocol`).
Past one machine: run one collector per store and route spans by trace id with the
OpenTelemetry Collector's ``loadbalancing`` exporter (``otelcol-loadbalancing.yaml``
beside this file), export each store to Parquet and report over all the folders.
"""

from typing import TYPE_CHECKING, Any

from treellm.errors import require_extra

require_extra("treellm.collector", "collector", "starlette", "uvicorn", "duckdb")

from treellm.collector.config import CollectorConfig

if TYPE_CHECKING:
    from treellm.collector.server import Collector, CollectorStats, serve, token_from_env

__all__ = ["Collector", "CollectorConfig", "CollectorStats", "serve", "token_from_env"]

_SERVER_NAMES = frozenset({"Collector", "CollectorStats", "serve", "token_from_env"})


def __getattr__(name: str) -> Any:
    """The server's names load on first use: Starlette, uvicorn and DuckDB stay out of
    ``treellm --help`` and the other commands, which build the ``collect`` parser."""
    if name in _SERVER_NAMES:
        from treellm.collector import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
