"""The flusher: moves closed journal segments into the store, one short transaction each.

Contract (runs on its own thread; never raises):

- Every ``interval_s`` after the previous flush ended, it closes the open segment
  (:meth:`Journal.cut`) and ingests the closed segments oldest first with
  :func:`~treellm.store.ingest_file` (``otlp-jsonl``: one transaction per segment, the
  DuckDB write lock held only for it), deleting each segment after its commit. Ingest is
  idempotent by (trace_id, span_id), so a crash between the commit and the delete, or a
  client's retry of a request, stores nothing twice.
- When the store is busy (a reader such as the dashboard or a report holds the file, or
  another writer such as ``treellm ingest`` holds the lock), it gives up after
  ``busy_retries`` short waits and tries again with exponential backoff (0.1 s doubling
  up to 2 s), oldest segment first; meanwhile the journal keeps taking requests (it
  answers 503 only above its bound). While it waits, no new segment is cut, so the open
  segment grows (up to ``max_segment_bytes``) and the flush after the wait is one larger
  transaction rather than many small ones.
- A segment the store refuses as malformed (which the receiver's validation should make
  impossible) is ingested again with ``skip_bad=True`` and moved to ``rejected/`` in the
  journal folder, logged, never retried forever. Any other failure (disk, a corrupt store)
  is logged, counted and retried with backoff: the journal keeps the data.
- :meth:`Flusher.drain` (the owner's thread, after :meth:`Flusher.stop`) ingests what is
  left until nothing is, the deadline passes or ``abort`` is set; True when nothing is left.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from treellm.collector.journal import Journal, Segment
from treellm.errors import IngestError, StoreBusyError, StoreError
from treellm.store import FileReport, ingest_file

__all__ = ["Flusher", "FlusherStats"]

logger = logging.getLogger(__name__)

Outcome = Literal["done", "busy", "failed"]
IngestFn = Callable[..., FileReport]

_BACKOFF_FIRST_S = 0.1
_BACKOFF_MAX_S = 2.0


@dataclass(frozen=True, slots=True)
class FlusherStats:
    flushes: int
    spans_stored: int
    duplicates: int
    busy: int
    failures: int
    rejected_segments: int
    last_flush_monotonic: float | None


class Flusher:
    """Moves closed segments of ``journal`` into the store at ``db`` (see the module docstring)."""

    def __init__(
        self,
        db: str | os.PathLike[str],
        journal: Journal,
        *,
        interval_s: float,
        busy_retries: int = 2,
        ingest: IngestFn = ingest_file,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db = Path(db)
        self.journal = journal
        self.interval_s = interval_s
        self.busy_retries = busy_retries
        self._ingest = ingest
        self._clock = clock
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._flush_lock = threading.Lock()
        self._flushes = 0
        self._spans = 0
        self._duplicates = 0
        self._busy = 0
        self._failures = 0
        self._rejected = 0
        self._last_flush: float | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="treellm-flusher", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Flush now instead of at the end of the current pause."""
        self._wake.set()

    def stop(self) -> None:
        """Stop the thread (after the flush under way, if any)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        backoff = 0.0
        while not self._stop.is_set():
            outcome = self.flush()
            if outcome == "done":
                backoff, pause = 0.0, self.interval_s
            else:
                backoff = min(max(backoff * 2, _BACKOFF_FIRST_S), _BACKOFF_MAX_S)
                pause = backoff
            self._wake.wait(pause)
            self._wake.clear()

    def flush(self) -> Outcome:
        """The backlog first; when it is all in, cut the open segment and flush it too."""
        with self._flush_lock:
            outcome = self._flush_closed()
            if outcome == "done" and self.journal.cut() is not None:
                outcome = self._flush_closed()
            return outcome

    def drain(self, deadline: float, abort: threading.Event | None = None) -> bool:
        """Flush until the journal is empty (True), ``deadline`` (a ``clock`` time) passes or ``abort`` is set."""
        backoff = _BACKOFF_FIRST_S / 2
        while True:
            if self.flush() == "done" and not self.journal.closed_segments():
                return True
            left = deadline - self._clock()
            if left <= 0 or (abort is not None and abort.is_set()):
                return False
            waiter = abort if abort is not None else threading.Event()
            waiter.wait(min(backoff, left))
            backoff = min(backoff * 2, _BACKOFF_MAX_S)

    def _flush_closed(self) -> Outcome:
        for segment in self.journal.closed_segments():
            outcome = self._flush_segment(segment)
            if outcome != "done":
                return outcome
        return "done"

    def _flush_segment(self, segment: Segment) -> Outcome:
        started = self._clock()
        try:
            report = self._ingest(self.db, segment.path, "otlp-jsonl", retries=self.busy_retries)
        except StoreBusyError:
            self._busy += 1
            logger.debug("the store %s is busy; %s waits in the journal", self.db, segment.path.name)
            return "busy"
        except IngestError as exc:
            return self._reject(segment, exc)
        except (StoreError, OSError) as exc:
            self._failures += 1
            logger.error("could not flush %s into %s (kept, retried): %s", segment.path, self.db, exc)
            return "failed"
        self.journal.remove(segment)
        self._flushes += 1
        self._spans += report.spans
        self._duplicates += report.duplicates
        self._last_flush = self._clock()
        logger.debug(
            "flushed %s: %d span(s), %d duplicate(s) in %.3f s",
            segment.path.name, report.spans, report.duplicates, self._last_flush - started,
        )  # fmt: skip
        return "done"

    def _reject(self, segment: Segment, exc: IngestError) -> Outcome:
        logger.error("the store refuses %s: %s; keeping its good lines, moving it to rejected/", segment.path, exc)
        try:
            report = self._ingest(self.db, segment.path, "otlp-jsonl", retries=self.busy_retries, skip_bad=True)
        except StoreBusyError:
            self._busy += 1
            return "busy"
        except (StoreError, OSError) as again:
            logger.error("%s cannot be ingested even line by line: %s", segment.path, again)
        else:
            self._spans += report.spans
        self._rejected += 1
        target = self.journal.quarantine(segment)
        logger.error("moved %s to %s", segment.path.name, target)
        return "done"

    def stats(self) -> FlusherStats:
        return FlusherStats(
            flushes=self._flushes,
            spans_stored=self._spans,
            duplicates=self._duplicates,
            busy=self._busy,
            failures=self._failures,
            rejected_segments=self._rejected,
            last_flush_monotonic=self._last_flush,
        )
