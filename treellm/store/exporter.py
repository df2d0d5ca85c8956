"""``DuckDBSpanExporter``: an OpenTelemetry span exporter that writes into the store.

Contract (``export``, ``force_flush`` and ``shutdown`` are called by the SDK's batch
processor worker thread and never raise; the constructor raises
:class:`~treellm.store.journal.JournalError` when it cannot open a journal):

- It writes through the store's journal and flusher, the collector's own
  (:mod:`treellm.store.journal`, :mod:`treellm.store.flusher`). The journal is a folder of
  segment files beside the store: ``<store>.journal/<n>/``, where ``n`` is the first slot
  no other live exporter holds (so several processes can export into one store; a slot
  left by a crashed process is taken, and replayed, by the next exporter that starts).
- Each exported batch is first submitted, as one OTLP/JSON line, to the journal and
  fsync'd: once ``export`` returns SUCCESS the spans survive a crash.
- Then the journal is flushed into the store, one short transaction per segment (the
  write lock is held only for it), each segment deleted after its commit. When another
  process holds the lock, the batch simply stays journaled and goes in with the next
  export, ``force_flush`` or ``shutdown``: a busy store delays nothing and loses nothing.
  Ingest is idempotent, so a crash between the commit and the delete duplicates nothing.
- A span the store refuses (:class:`~treellm.errors.IngestError`, or a value DuckDB
  cannot hold) is split out of its batch and quarantined in ``rejected/`` of the journal
  folder with the store's reason; every other span of the batch is stored, once.
- A journal left by a crashed process is replayed when the exporter starts, including
  the single ``<store>.journal.jsonl`` file of earlier versions.
- Failures are logged and counted (``failures``), and reported as FAILURE only when
  even the journal cannot be written.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from treellm.errors import StoreError
from treellm.otlp import traces_data_line
from treellm.store.flusher import Flusher, IngestFn
from treellm.store.ingest import ingest_file
from treellm.store.journal import Journal, JournalError, JournalInUseError

__all__ = ["DuckDBSpanExporter"]

logger = logging.getLogger(__name__)

_SEGMENT_BYTES = 64 * 2**20
_FLUSH_BYTES = 2 * _SEGMENT_BYTES  # a backlog (the store was busy) goes in two segments a transaction
_MAX_SLOTS = 256


def _open_journal(root: Path) -> Journal:
    """The journal in the first slot of ``root`` no other live exporter holds, opened."""
    for slot in range(_MAX_SLOTS):
        # One batch waits at a time (the SDK exports from one thread), and nothing bounds what a
        # busy store leaves journaled: the exporter keeps every span, as its contract says.
        journal = Journal(
            root / str(slot), max_segment_bytes=_SEGMENT_BYTES, max_pending_bytes=_SEGMENT_BYTES,
            max_journal_bytes=sys.maxsize,
        )  # fmt: skip
        try:
            journal.open()
        except JournalInUseError:
            continue
        return journal
    raise JournalError(f"all {_MAX_SLOTS} journal slots of {root} are in use", path=str(root))


class DuckDBSpanExporter(SpanExporter):
    """Exports spans into a treellm DuckDB store through an fsync'd journal.

    ``ingest`` is how the flusher writes a journal segment into the store
    (:func:`~treellm.store.ingest_file`; a seam for tests).
    """

    def __init__(self, path: str | os.PathLike[str], *, busy_retries: int = 2, ingest: IngestFn = ingest_file) -> None:
        self.path = Path(path)
        self.busy_retries = busy_retries
        self._failures = 0
        self._lock = threading.Lock()
        self._closed = False
        self.journal = _open_journal(self.path.with_name(self.path.name + ".journal"))
        self._flusher = Flusher(
            self.path, self.journal, interval_s=0.0, batch_bytes=_FLUSH_BYTES, busy_retries=busy_retries, ingest=ingest
        )
        try:
            legacy = self.journal.adopt(self.path.with_name(self.path.name + ".journal.jsonl"))
        except OSError as exc:
            logger.error("could not take in the journal of an earlier version beside %s: %s", self.path, exc)
        else:
            if legacy is not None:
                logger.info("replaying the journal of an earlier version (%d bytes) into %s", legacy.size, self.path)
        with self._lock:
            self._flusher.flush_pending()

    @property
    def failures(self) -> int:
        """Batches that could not be journaled, and flushes that failed (and were kept)."""
        return self._failures + self._flusher.stats().failures

    @property
    def exported_spans(self) -> int:
        """Spans committed to the store (a replayed duplicate is not counted)."""
        return self._flusher.stats().spans_stored

    @property
    def deferred(self) -> int:
        """Flushes that found the store busy (their segments waited in the journal)."""
        return self._flusher.stats().busy

    @property
    def quarantined(self) -> int:
        """Refused spans (or lines) set aside in ``rejected/`` of the journal folder."""
        return self._flusher.stats().rejected_segments

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        with self._lock:
            if self._closed:
                self._failures += 1
                return SpanExportResult.FAILURE
            try:
                self.journal.submit(traces_data_line(spans)).result()
            except (StoreError, ValueError, TypeError):
                self._failures += 1
                logger.exception("could not journal %d span(s) for %s", len(spans), self.path)
                return SpanExportResult.FAILURE
            self._flusher.flush_pending()
            return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        with self._lock:
            return self._closed or self._flusher.flush_pending()

    def shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.journal.close()
            if not self._flusher.flush_pending():
                logger.warning(
                    "%d byte(s) stay in the journal %s; they go into %s when an exporter for it starts again",
                    self.journal.stats().unflushed_bytes, self.journal.folder, self.path,
                )  # fmt: skip
            self.journal.release()
