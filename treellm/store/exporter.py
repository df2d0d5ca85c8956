"""``DuckDBSpanExporter``: an OpenTelemetry span exporter that writes into the store.

Contract (called by the SDK's batch processor worker thread; never raises):

- Each exported batch is first appended, as one OTLP/JSON line, to a journal file
  beside the store (``<store>.journal.jsonl``), flushed and fsync'd: once ``export``
  returns SUCCESS the spans survive a crash.
- Then the journal is ingested into the store in one short transaction (the write lock
  is held only for that) and truncated. When another process holds the lock, the
  batch simply stays journaled and goes in with the next export, ``force_flush`` or
  ``shutdown``: a busy store delays nothing and loses nothing. Ingest is idempotent, so
  a crash between the commit and the truncation duplicates nothing.
- A journal left by a crashed process is replayed when the exporter starts.
- Failures are logged and counted (``failures``), and reported as FAILURE only when
  even the journal cannot be written.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from treellm.errors import StoreBusyError, TreeLLMError
from treellm.otlp import traces_data_line
from treellm.store.ingest import ingest_file

__all__ = ["DuckDBSpanExporter"]

logger = logging.getLogger(__name__)


class DuckDBSpanExporter(SpanExporter):
    """Exports spans into a treellm DuckDB store through an fsync'd journal."""

    def __init__(self, path: str | os.PathLike[str], *, busy_retries: int = 2) -> None:
        self.path = Path(path)
        self.journal = self.path.with_name(self.path.name + ".journal.jsonl")
        self.busy_retries = busy_retries
        self.failures = 0
        self.exported_spans = 0
        self.deferred = 0
        self._lock = threading.Lock()
        self._closed = False
        if self.journal.exists() and self.journal.stat().st_size > 0:
            with self._lock:
                self._drain()

    def _append(self, line: bytes) -> None:
        self.journal.parent.mkdir(parents=True, exist_ok=True)
        with self.journal.open("ab") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())

    def _drain(self) -> bool:
        """Ingest the journal and truncate it; False when the store is busy or failed."""
        try:
            report = ingest_file(self.path, self.journal, "otlp-jsonl", retries=self.busy_retries)
        except StoreBusyError:
            self.deferred += 1
            return False
        except (TreeLLMError, OSError):
            self.failures += 1
            logger.exception("could not write the journal %s into %s; it is kept", self.journal, self.path)
            return False
        self.exported_spans += report.spans
        self.journal.write_bytes(b"")
        return True

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        with self._lock:
            if self._closed:
                self.failures += 1
                return SpanExportResult.FAILURE
            try:
                self._append(traces_data_line(spans))
            except (OSError, ValueError, TypeError):
                self.failures += 1
                logger.exception("could not journal %d span(s) for %s", len(spans), self.path)
                return SpanExportResult.FAILURE
            self._drain()
            return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        with self._lock:
            if self.journal.exists() and self.journal.stat().st_size > 0:
                return self._drain()
            return True

    def shutdown(self) -> None:
        with self._lock:
            if self.journal.exists() and self.journal.stat().st_size > 0:
                self._drain()
            self._closed = True
