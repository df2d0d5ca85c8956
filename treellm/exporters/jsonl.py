"""Append OTLP/JSON ``TracesData`` lines to a file: the OTLP JSONL span exporter.

Contract of :class:`OTLPJsonlSpanExporter`:

- **Who calls it.** The SDK's span processor: the ``BatchSpanProcessor`` worker thread
  (or the ending thread under ``SimpleSpanProcessor``). Every method is thread-safe; file
  access is serialised by one lock. It blocks only on the file write (and ``fsync``).
- **What it writes.** One export call with at least one span appends exactly one line:
  one ``TracesData`` object, encoded by :func:`treellm.otlp.traces_data_line` (the file
  format of the OpenTelemetry Collector's file exporter), with a single ``write`` of the
  whole line followed by a flush (and ``os.fsync`` when ``fsync=True``). An empty batch
  writes nothing and succeeds.
- **Never raises.** An I/O or encoding failure (``OSError``, ``ValueError``,
  ``TypeError``) is logged and counted in ``failures`` and the call returns
  ``SpanExportResult.FAILURE``; so does an export after ``shutdown()``. ``exported_spans``
  counts the spans written. After a failed write the file is closed and reopened (and
  repaired) on the next export.
- **Crash safety.** The file is opened lazily in append mode, parent folders created.
  A crash mid-write leaves at most one torn last line. When an existing file does not
  end in ``"\\n"``, its torn tail is truncated back to the last ``"\\n"`` when the file is
  opened (logged as a warning with the byte count), so a new line is never glued onto it.
  The repair happens only at open: give each writing process its own file.
- It creates no spans of its own.
"""

from __future__ import annotations

import io
import logging
import os
import threading
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import IO

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from treellm.otlp import traces_data_line

__all__ = ["OTLPJsonlSpanExporter"]

logger = logging.getLogger(__name__)

_SCAN_CHUNK = 64 * 1024


def end_of_last_line(file: IO[bytes], size: int) -> int:
    """Offset just past the last ``"\\n"`` among the first ``size`` bytes (0 when none).

    The one tail scan of the append-only JSONL files (this exporter, the ingest of a
    crashed writer's file, the collector's journal): 64 KiB steps backwards from ``size``.
    """
    end = size
    while end > 0:
        start = max(0, end - _SCAN_CHUNK)
        file.seek(start)
        chunk = file.read(end - start)
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0


def _drop_torn_tail(file: io.BufferedRandom) -> int:
    """Truncate a last line that lacks its ``"\\n"``; return the number of bytes dropped."""
    size = file.seek(0, os.SEEK_END)
    if size == 0:
        return 0
    file.seek(size - 1)
    if file.read(1) == b"\n":
        return 0
    keep = end_of_last_line(file, size - 1)
    file.truncate(keep)
    file.seek(0, os.SEEK_END)
    return size - keep


def _open_for_append(path: Path) -> io.BufferedRandom:
    """Open ``path`` for appending whole lines, creating folders and repairing a torn tail."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        file = stack.enter_context(open(path, "a+b"))
        dropped = _drop_torn_tail(file)
        stack.pop_all()
    if dropped:
        logger.warning("%s ended in a torn line: dropped its last %d bytes", path, dropped)
    return file


class OTLPJsonlSpanExporter(SpanExporter):
    """Append one OTLP/JSON ``TracesData`` line per export to ``path`` (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self.path = Path(os.fspath(path))
        self.fsync = fsync
        self.exported_spans = 0
        self.failures = 0
        self._lock = threading.Lock()
        self._file: io.BufferedRandom | None = None
        self._shut_down = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        try:
            line = traces_data_line(spans)
        except (ValueError, TypeError):
            logger.exception("could not encode %d spans for %s", len(spans), self.path)
            return self._failed()
        with self._lock:
            if self._shut_down:
                logger.warning("export to %s after shutdown: %d spans dropped", self.path, len(spans))
                self.failures += 1
                return SpanExportResult.FAILURE
            try:
                self._write(line)
            except (OSError, ValueError) as exc:
                self.failures += 1
                logger.warning(
                    "could not write %d spans to %s (failure %d): %s",
                    len(spans),
                    self.path,
                    self.failures,
                    exc,
                    exc_info=self.failures == 1,
                )
                self._discard_file()
                return SpanExportResult.FAILURE
            self.exported_spans += len(spans)
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        with self._lock:
            if self._file is None:
                return True
            try:
                self._file.flush()
            except (OSError, ValueError) as exc:
                logger.warning("could not flush %s: %s", self.path, exc)
                return False
        return True

    def shutdown(self) -> None:
        with self._lock:
            self._shut_down = True
            self._discard_file()

    def _failed(self) -> SpanExportResult:
        with self._lock:
            self.failures += 1
        return SpanExportResult.FAILURE

    def _write(self, line: bytes) -> None:
        """Append ``line`` with one write, then flush (and fsync). Caller holds the lock."""
        if self._file is None:
            self._file = _open_for_append(self.path)
        self._file.write(line)
        self._file.flush()
        if self.fsync:
            os.fsync(self._file.fileno())

    def _discard_file(self) -> None:
        """Close the file, if open; the next write reopens (and repairs) it. Caller holds the lock."""
        file, self._file = self._file, None
        if file is None:
            return
        try:
            file.close()
        except OSError as exc:
            logger.warning("could not close %s: %s", self.path, exc)
