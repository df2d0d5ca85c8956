"""The flusher: moves closed journal segments into the store, one short transaction each.

Used by the collector (on its own thread, :meth:`Flusher.start`) and by
:class:`~treellm.store.DuckDBSpanExporter` (from the SDK's export thread, :meth:`Flusher.drain`).

Contract (runs on its own thread; never raises):

- One flush is one transaction: the oldest closed segment, or, when none waits, the
  open segment closed for it (:meth:`Journal.cut`), ingested with
  :func:`~treellm.store.ingest_file` (``otlp-jsonl``; the DuckDB write lock is held only
  for it) and deleted after its commit. Ingest is idempotent by (trace_id, span_id), so a
  crash between the commit and the delete, or a client's retry of a request, stores
  nothing twice. A backlog (several closed segments) goes in oldest first up to
  ``batch_bytes`` at a time, in one transaction (:func:`~treellm.store.ingest.ingest_segments`:
  one read of them all, one commit, one pause per batch); a batch the store refuses for its
  data goes in segment by segment, as below, and nothing of it was stored before.
- Flushes start every ``interval_s`` while they are short; after a long one (a busy
  collector, or a backlog) the flusher still pauses ``interval_s / 2`` before the next, so
  the lock is free for readers (the dashboard opens a read-only connection per query) at
  least that long in every cycle. Segments are cut at the start of a flush, so the pause
  and the flush itself set the batch size: the busier the collector, the larger (and the
  cheaper per span) each transaction, and data reaches readers about one cycle after it
  was acknowledged.
- When the store is busy (a reader such as the dashboard or a report holds the file, or
  another writer such as ``treellm ingest`` holds the lock, or a read-only connection of
  this same process holds it), it gives up after
  ``busy_retries`` short waits and tries again with exponential backoff (0.1 s doubling
  up to 2 s), oldest segment first; meanwhile the journal keeps taking requests (it
  answers 503 only above its bound). While it waits, no new segment is cut, so the open
  segment grows (up to ``max_segment_bytes``) and the flush after the wait is one larger
  transaction rather than many small ones.
- A segment the store refuses for its data (:class:`~treellm.errors.IngestError`, or a
  DuckDB conversion, range, constraint or out-of-memory error: a span it cannot hold,
  which the receiver's validation should make impossible, or a batch too large for the
  ingester's memory limit) is split in two halves (:meth:`Journal.split`) that are flushed
  on their own right away, and so on: by lines, then a line of spans by its spans
  (:func:`halve_traces_line`, each span keeping its resource and scope). A good batch goes
  in in smaller transactions, and a bad span ends alone in a one-span segment, which is
  set aside in ``rejected/`` in the journal folder with the store's error message
  (:meth:`Journal.quarantine`) and logged: every good span of a refused line is stored,
  and only the spans the store refuses are quarantined. Exactly once even across a
  crash mid-split: the halves are fsync'd before the segment they replace goes, ingest is
  idempotent by (trace_id, span_id), and the quarantine file is named by its content.
  Any other failure (disk, a corrupt store) is logged, counted and retried with backoff:
  the journal keeps the data.
- Metric points (optional ``metrics_journal``, see :mod:`treellm.store.metric_points`): each
  flush, after its span segment, inserts the oldest metrics segment (or the open one, cut)
  with :func:`~treellm.store.metric_points.insert_point_lines`, in its own short transaction right
  after the span one, so both kinds share one flush and the readers' pause. The same rules
  apply: deleted after the commit (``point_id`` makes a replay harmless), busy and failures
  retried, a refused segment split down to a quarantined point. A busy store skips the
  metrics until the next flush.
- :meth:`Flusher.stats` sums what each span flush's :class:`~treellm.store.ingest.FileReport`
  says of where its new spans went (``accounting``: runs, nodes, tool calls, loop events, placed
  nowhere per reason), once the flush committed; a span counts where it was placed when stored.
- :meth:`Flusher.drain` (shutdown; the owner's thread, after :meth:`Flusher.stop`) flushes
  segment after segment without pausing; True once nothing is left, False when the
  deadline passes or ``abort`` is set first. :meth:`Flusher.flush_pending` is a drain that
  never waits (the exporter's flush, without a thread: stop at the first busy store).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import duckdb
import orjson

from treellm.errors import IngestError, StoreBusyError, StoreError
from treellm.store.ingest import Accounting, FileReport, combine, ingest_file, ingest_segments
from treellm.store.journal import Journal, Segment
from treellm.store.metric_points import insert_point_lines

__all__ = ["Flusher", "FlusherStats", "halve_traces_line"]

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
    points_stored: int = 0
    point_duplicates: int = 0
    accounting: Accounting = field(default_factory=Accounting)
    """Where the stored spans went, summed over the flushes as ingest reported each."""


HalveLine = Callable[[bytes], tuple[bytes, bytes] | None]


class _Lane:
    """One journal and how its segments go into the store: ``load(path) -> (stored, duplicates)``;
    ``halve_line`` splits a refused line in two (None: a line is the smallest unit)."""

    def __init__(
        self,
        journal: Journal,
        load: Callable[[Path], tuple[int, int]],
        noun: str,
        halve_line: HalveLine | None,
        load_many: Callable[[list[Path]], tuple[int, int]] | None = None,
    ) -> None:
        self.journal = journal
        self.load = load
        self.load_many = load_many
        self.noun = noun
        self.halve_line = halve_line
        self.stored = 0
        self.duplicates = 0


# DuckDB errors that depend on the data of a batch (a value out of range, a line it cannot read,
# a batch too large for the memory limit): smaller batches isolate them. Anything else (I/O, a
# corrupt file, a full disk) is the environment's and is retried as it is.
_DATA_ERRORS = (
    duckdb.ConversionException,
    duckdb.InvalidInputException,
    duckdb.OutOfRangeException,
    duckdb.ConstraintException,
    duckdb.OutOfMemoryException,
)


def halve_traces_line(line: bytes) -> tuple[bytes, bytes] | None:
    """An OTLP/JSON ``TracesData`` line of two spans or more as two lines: its first and its
    second half of the spans, each span under a copy of its resource and scope (their other
    fields kept). None for a single span, or a line that is not a ``TracesData`` document.
    Pure; the halves hold every span of the line once, in order."""
    try:
        doc = orjson.loads(line)
        placed = [(r, s, span) for r, rs in enumerate(doc["resourceSpans"])
                  for s, ss in enumerate(rs["scopeSpans"]) for span in ss["spans"]]  # fmt: skip
    except (orjson.JSONDecodeError, TypeError, KeyError):
        return None
    if len(placed) < 2:
        return None
    middle = len(placed) // 2
    return _traces_line(doc, placed[:middle]), _traces_line(doc, placed[middle:])


def _traces_line(doc: dict[str, Any], placed: list[tuple[int, int, Any]]) -> bytes:
    """A ``TracesData`` line of the spans ``placed`` (resource index, scope index, span) of ``doc``."""
    resources: list[dict[str, Any]] = []
    last: tuple[int, int] | None = None
    for r, s, span in placed:
        if last is None or last[0] != r:
            resources.append({**doc["resourceSpans"][r], "scopeSpans": []})
        if last != (r, s):
            resources[-1]["scopeSpans"].append({**doc["resourceSpans"][r]["scopeSpans"][s], "spans": []})
        resources[-1]["scopeSpans"][-1]["spans"].append(span)
        last = (r, s)
    return orjson.dumps({**doc, "resourceSpans": resources}, option=orjson.OPT_APPEND_NEWLINE)


def _batch(closed: list[Segment], limit: int) -> list[Segment]:
    """The oldest closed segments, up to ``limit`` bytes together (the first one always)."""
    batch, size = [closed[0]], closed[0].size
    for segment in closed[1:]:
        if size + segment.size > limit:
            break
        batch.append(segment)
        size += segment.size
    return batch


def _refused_data(exc: StoreError) -> bool:
    return isinstance(exc, IngestError) or isinstance(exc.__cause__, _DATA_ERRORS)


def _same_process_reader(exc: StoreError) -> bool:
    """DuckDB's answer when a connection of this very process (e.g. a reader embedded beside the
    collector, or a test) holds the file with another configuration: busy, not broken."""
    return "different configuration" in str(exc)


def _lower_priority(increment: int) -> None:
    """Raise the calling thread's nice value by ``increment`` (Linux, where a thread id names the
    thread alone; the threads it starts inherit it). Elsewhere, or when refused, nothing."""
    if increment <= 0 or not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + increment))
    except OSError as exc:
        logger.info("could not lower the flusher's priority: %s", exc)


class Flusher:
    """Moves closed segments of ``journal`` into the store at ``db`` (see the module docstring)."""

    def __init__(
        self,
        db: str | os.PathLike[str],
        journal: Journal,
        *,
        interval_s: float,
        batch_bytes: int,
        busy_retries: int = 2,
        ingest: IngestFn = ingest_file,
        ingest_many: IngestFn | None = None,
        clock: Callable[[], float] = time.monotonic,
        metrics_journal: Journal | None = None,
        nice: int = 0,
    ) -> None:
        self.db = Path(db)
        self.journal = journal
        self.metrics_journal = metrics_journal
        self.interval_s = interval_s
        self.busy_retries = busy_retries
        self._ingest = ingest
        if ingest_many is None and ingest is ingest_file:
            ingest_many = ingest_segments
        self._ingest_many = ingest_many
        self.batch_bytes = batch_bytes
        self._clock = clock
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._flush_lock = threading.Lock()
        self._flushes = 0
        many = None if ingest_many is None else self._load_span_segments
        self._spans = _Lane(journal, self._load_spans, "span(s)", halve_traces_line, many)
        self._points = None if metrics_journal is None else _Lane(metrics_journal, self._load_points, "point(s)", None)
        self._busy = 0
        self._failures = 0
        self._rejected = 0
        self._last_flush: float | None = None
        self._accounting = Accounting()  # replaced whole (immutable): read from any thread
        self.nice = nice
        self.running = threading.Event()
        """Set once the thread of :meth:`start` runs (its priority lowered by ``nice``)."""

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
        _lower_priority(self.nice)
        self.running.set()
        backoff = 0.0
        while not self._stop.is_set():
            started = self._clock()
            outcome = self.flush()
            if outcome == "done":
                took = self._clock() - started
                backoff, pause = 0.0, max(self.interval_s - took, self.interval_s / 2)
            else:
                backoff = min(max(backoff * 2, _BACKOFF_FIRST_S), _BACKOFF_MAX_S)
                pause = backoff
            self._wake.wait(pause)
            self._wake.clear()

    def _lanes(self) -> list[_Lane]:
        return [self._spans] if self._points is None else [self._spans, self._points]

    def flush(self) -> Outcome:
        """One transaction per journal: its oldest closed segment, else its open one, cut now
        ("done" when none; "busy" or "failed" when a journal's segment could not go in)."""
        with self._flush_lock:
            outcome: Outcome = "done"
            for lane in self._lanes():
                closed = lane.journal.closed_segments()
                if len(closed) > 1 and lane.load_many is not None:
                    result = self._flush_segments(lane, _batch(closed, self.batch_bytes))
                else:
                    segment = closed[0] if closed else lane.journal.cut()
                    if segment is None:
                        continue
                    result = self._flush_segments(lane, [segment])
                if result == "busy":
                    return "busy"  # the store is held: the next journal would wait for nothing
                if result == "failed":
                    outcome = "failed"
            return outcome

    def drain(self, deadline: float, abort: threading.Event | None = None) -> bool:
        """Flush until the journal is empty (True), ``deadline`` (a ``clock`` time) passes or ``abort`` is set."""
        backoff = _BACKOFF_FIRST_S / 2
        while True:
            outcome = self.flush()
            if outcome == "done":
                if all(not lane.journal.closed_segments() and lane.journal.cut() is None for lane in self._lanes()):
                    return True
                continue
            left = deadline - self._clock()
            if left <= 0 or (abort is not None and abort.is_set()):
                return False
            waiter = abort if abort is not None else threading.Event()
            waiter.wait(min(backoff, left))
            backoff = min(backoff * 2, _BACKOFF_MAX_S)

    def flush_pending(self) -> bool:
        """Flush segment after segment, never waiting: True once the journal is empty, False as
        soon as a flush finds the store busy or fails (what is left waits for the next call)."""
        return self.drain(-math.inf)

    def _load_spans(self, path: Path) -> tuple[int, int]:
        report = self._ingest(self.db, path, "otlp-jsonl", retries=self.busy_retries)
        self._accounting = combine([self._accounting, report.accounting])  # committed: counted
        return report.spans, report.duplicates

    def _load_span_segments(self, paths: list[Path]) -> tuple[int, int]:
        assert self._ingest_many is not None
        report = self._ingest_many(self.db, paths, retries=self.busy_retries)
        self._accounting = combine([self._accounting, report.accounting])  # committed: counted
        return report.spans, report.duplicates

    def _load_points(self, path: Path) -> tuple[int, int]:
        report = insert_point_lines(self.db, path, retries=self.busy_retries)
        return report.points, report.duplicates

    def _flush_segments(self, lane: _Lane, segments: list[Segment]) -> Outcome:
        """One transaction: one segment, or several (a backlog: one read, one commit, one pause).
        Refused for its data, a single segment is split (:meth:`_reject`); several go in one by
        one (nothing of them was stored)."""
        started = self._clock()
        load_many = lane.load_many if len(segments) > 1 else None
        if load_many is None:
            segments = segments[:1]  # a lane without load_many takes one at a time (flush never asks it)
        what = str(segments[0].path) if len(segments) == 1 else f"{len(segments)} segments"
        try:
            if load_many is None:
                stored, duplicates = lane.load(segments[0].path)
            else:
                stored, duplicates = load_many([segment.path for segment in segments])
        except StoreBusyError:
            self._busy += 1
            logger.debug("the store %s is busy; %s waits in the journal", self.db, what)
            return "busy"
        except StoreError as exc:
            if _same_process_reader(exc):
                self._busy += 1
                return "busy"
            if _refused_data(exc):
                if len(segments) == 1:
                    return self._reject(lane, segments[0], exc)
                logger.debug("the store refused %s (%s); flushing them one by one", what, exc)
                for segment in segments:
                    outcome = self._flush_segments(lane, [segment])
                    if outcome != "done":
                        return outcome
                return "done"
            self._failures += 1
            logger.error("could not flush %s into %s (kept, retried): %s", what, self.db, exc)
            return "failed"
        except OSError as exc:
            self._failures += 1
            logger.error("could not flush %s into %s (kept, retried): %s", what, self.db, exc)
            return "failed"
        for segment in segments:
            lane.journal.remove(segment)
        self._flushes += 1
        lane.stored += stored
        lane.duplicates += duplicates
        self._last_flush = self._clock()
        logger.debug(
            "flushed %s: %d %s, %d duplicate(s) in %.3f s",
            what, stored, lane.noun, duplicates, self._last_flush - started,
        )  # fmt: skip
        return "done"

    def _reject(self, lane: _Lane, segment: Segment, exc: StoreError) -> Outcome:
        """Split a refused segment and flush its halves now (so on down to the refused spans), or
        quarantine it with the store's reason once it holds a single span (or an unsplittable line)."""
        try:
            halves = lane.journal.split(segment, lane.halve_line)
            if halves is None:
                target = lane.journal.quarantine(segment, str(exc))
        except OSError as error:
            self._failures += 1
            logger.error("could not set aside %s after the store refused it (%s): %s", segment.path, exc, error)
            return "failed"
        if halves is None:
            self._rejected += 1
            logger.error("the store refuses %s of the journal (%s); set them aside in %s", lane.noun, exc, target)
            return "done"
        logger.debug("the store refused %s (%s); flushing its halves apart", segment.path.name, exc)
        for half in halves:
            outcome = self._flush_segments(lane, [half])
            if outcome != "done":
                return outcome  # what is left waits at the head of the journal for the next flush
        return "done"

    def stats(self) -> FlusherStats:
        return FlusherStats(
            flushes=self._flushes,
            spans_stored=self._spans.stored,
            duplicates=self._spans.duplicates,
            busy=self._busy,
            failures=self._failures,
            rejected_segments=self._rejected,
            last_flush_monotonic=self._last_flush,
            points_stored=self._points.stored if self._points is not None else 0,
            point_duplicates=self._points.duplicates if self._points is not None else 0,
            accounting=self._accounting,
        )
