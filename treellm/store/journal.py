"""The store's journal: append-only, fsync'd segment files with group commit.

Used by the collector (``<db>.collector/``) and by :class:`~treellm.store.DuckDBSpanExporter`
(``<db>.journal/``); :mod:`treellm.store.flusher` moves its segments into the store.

Contract:

- The journal is a folder of segment files named by a rising sequence number
  (``0000000000000042.jsonl``), each a run of OTLP/JSON lines (``TracesData``, or metric
  points). One process owns the folder: :meth:`Journal.open` takes an exclusive ``flock``
  on ``.lock`` (released by the kernel even after ``kill -9``) and raises
  :class:`JournalInUseError` (with the owner's ``pid``) when another process holds it, or
  :class:`JournalError` when the folder cannot be opened.
- :meth:`Journal.submit` (any thread, never blocks) queues bytes and returns a
  ``concurrent.futures.Future`` that completes only once those bytes are written *and*
  ``fdatasync``'d: a request is acknowledged after its future completes, so every
  acknowledged span survives a crash. One writer thread owns the open segment: it takes
  everything queued since its last sync, writes it with one ``write`` and one
  ``fdatasync`` (group commit: concurrent requests share one sync), then completes all
  those futures together. A failed write fails those futures with
  :class:`JournalError` and closes the segment.
- Bounds: more than ``max_pending_bytes`` waiting for the sync refuses new bytes with
  :class:`Overloaded` status 429; more than
  ``max_journal_bytes`` journaled but not yet in the store refuses them with status 503.
  One submission is always taken when nothing waits (a large request is never starved).
  :meth:`Journal.listen` names a callback told whenever bytes leave a bound (a sync completed, a
  segment removed or quarantined), from the thread that freed them: a submitter refused for want
  of room can wait for it instead of polling (the collector holds a request that way).
- :meth:`Journal.cut` closes the open segment (the flusher calls it before each flush);
  a segment also closes when it reaches ``max_segment_bytes``. Closed segments are
  immutable; :meth:`Journal.remove` deletes one after its spans are committed to the store;
  :meth:`Journal.split` halves one the store refuses (its lines, or the one line's spans
  when the caller says how: to find a bad span, or to make a transaction smaller);
  :meth:`Journal.quarantine` sets a refused line aside in ``rejected/`` with the reason.
  Splitting and quarantine are crash-safe: the new files are fsync'd before the old one
  goes, and a crash in between replays both, which the store's idempotent ingest makes
  harmless; a quarantine file is named by its line's hash, so a replay rewrites it.
- Recovery: segments left by an earlier process are closed segments of this one. A torn
  last line (a write cut by a crash, never acknowledged) is truncated away first.
  :meth:`Journal.adopt` takes in a journal file of another layout the same way.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import orjson

from treellm.errors import StoreError
from treellm.exporters.jsonl import end_of_last_line

__all__ = ["Journal", "JournalError", "JournalInUseError", "JournalStats", "Overloaded", "Segment"]

logger = logging.getLogger(__name__)

LOCK_NAME = ".lock"
REJECTED_FOLDER = "rejected"
_SUFFIX = ".jsonl"
_DATA_SYNC: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync


class JournalError(StoreError):
    """The journal cannot be opened or written (the disk refused it), or is closed (shutting down)."""


class JournalInUseError(JournalError):
    """Another process owns the journal folder (``pid``: its process id, as it wrote it)."""

    def __init__(self, message: str, *, path: str, pid: str) -> None:
        super().__init__(message, path=path)
        self.pid = pid


class Overloaded(StoreError):
    """The journal cannot take more now: ``status`` is 429 (too much waits for the fsync) or 503
    (too much is journaled and not yet in the store), the HTTP status a receiver answers with."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Segment:
    """A closed journal segment."""

    path: Path
    size: int
    sequence: int


@dataclass(frozen=True, slots=True)
class JournalStats:
    pending_bytes: int
    unflushed_bytes: int
    closed_segments: int
    submissions: int
    syncs: int
    write_failures: int


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, data: bytes, *, exclusive: bool = True) -> None:
    """Write ``data`` as the file ``path`` (a new one when ``exclusive``) and fsync it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = os.open(path, flags, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _parsed(line: bytes) -> object:
    """A journal line as JSON, or as text when it is not JSON (what the store refused may be either)."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return line.decode("utf-8", "replace")


def truncate_torn_tail(path: Path) -> int:
    """Cut ``path`` after its last newline; returns the bytes dropped."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        end = end_of_last_line(handle, size)
    if end < size:
        with path.open("r+b") as handle:
            handle.truncate(end)
            handle.flush()
            os.fsync(handle.fileno())
    return size - end


class Journal:
    """Segment files with group commit (see the module docstring).

    Threads: :meth:`submit` from any thread; the writer thread started by :meth:`open`;
    :meth:`cut`, :meth:`closed_segments`, :meth:`remove` and :meth:`quarantine` from the
    flusher; :meth:`open`, :meth:`close` and :meth:`release` from the owner.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        *,
        max_segment_bytes: int,
        max_pending_bytes: int,
        max_journal_bytes: int,
        sync: Callable[[int], None] = _DATA_SYNC,
    ) -> None:
        self.folder = Path(folder)
        self.max_segment_bytes = max_segment_bytes
        self.max_pending_bytes = max_pending_bytes
        self.max_journal_bytes = max_journal_bytes
        self._sync = sync
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._file_lock = threading.Lock()  # taken before _lock, never after
        self._pending: list[tuple[bytes, Future[None]]] = []
        self._pending_bytes = 0
        self._inflight_bytes = 0
        self._open_bytes = 0
        self._closed: list[Segment] = []
        self._closed_bytes = 0
        self._closing = False
        self._fd: int | None = None
        self._path: Path | None = None
        self._next_sequence = 1
        self._lock_fd: int | None = None
        self._writer: threading.Thread | None = None
        self._submissions = 0
        self._syncs = 0
        self._write_failures = 0
        self._on_room: Callable[[], None] | None = None

    # -- owner -----------------------------------------------------------------------------------------

    def open(self) -> list[Segment]:
        """Lock the folder, recover the segments left in it and start the writer; returns them."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._lock_fd = self._take_lock()
            recovered = self._recover()
        except OSError as exc:
            self.release()
            message = f"cannot open the journal {self.folder}: {exc.strerror or exc}"
            raise JournalError(message, path=str(self.folder)) from exc
        except BaseException:
            self.release()
            raise
        self._writer = threading.Thread(target=self._run, name="treellm-journal-writer", daemon=True)
        self._writer.start()
        return recovered

    def _take_lock(self) -> int:
        path = self.folder / LOCK_NAME
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
                os.close(fd)
                raise JournalInUseError(
                    f"the journal {self.folder} is in use by another process (pid {owner})",
                    path=str(self.folder),
                    pid=owner,
                ) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino  # not unlinked by an owner that just left
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(os.getpid()).encode("ascii"), 0)
                return fd
            os.close(fd)

    def _recover(self) -> list[Segment]:
        segments = []
        for path in sorted(self.folder.glob("*" + _SUFFIX)):
            if not path.stem.isdigit():
                continue
            dropped = truncate_torn_tail(path)
            if dropped:
                logger.warning("dropped a torn last line of %d byte(s) from %s (never acknowledged)", dropped, path)
            size = path.stat().st_size
            if size == 0:
                path.unlink()
                continue
            segments.append(Segment(path, size, int(path.stem)))
        with self._lock:
            self._closed = segments
            self._closed_bytes = sum(s.size for s in segments)
            self._next_sequence = max((s.sequence for s in segments), default=0) + 1
        return list(segments)

    def adopt(self, path: Path) -> Segment | None:
        """Move the file ``path`` (whole OTLP/JSON lines; a torn last line is cut away) into the
        open journal as its oldest closed segment; None when it is missing or empty. The file is
        renamed, so it must be on the journal's file system; a replay after a crash finds it
        either where it was or as a segment."""
        try:
            truncate_torn_tail(path)
            size = path.stat().st_size
            if size == 0:
                path.unlink()
                return None
            with self._lock:
                sequence = self._next_sequence
                self._next_sequence += 1
            target = self.folder / f"{sequence:016d}{_SUFFIX}"
            path.replace(target)
        except FileNotFoundError:
            return None  # taken by another owner first
        _fsync_folder(self.folder)
        segment = Segment(target, size, sequence)
        with self._lock:
            self._closed.insert(0, segment)
            self._closed_bytes += size
        return segment

    def close(self) -> None:
        """Refuse new submissions, write and sync everything queued, close the open segment."""
        with self._lock:
            self._closing = True
            self._wake.notify_all()
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        self.cut()

    def release(self) -> None:
        """Give the folder up; it is removed when nothing is left in it."""
        if self._lock_fd is None:
            return
        try:
            leftovers = [p for p in self.folder.iterdir() if p.name != LOCK_NAME]
            if not leftovers:
                (self.folder / LOCK_NAME).unlink(missing_ok=True)
                self.folder.rmdir()
        except OSError as exc:
            logger.warning("could not tidy the journal folder %s: %s", self.folder, exc)
        finally:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- submitters ------------------------------------------------------------------------------------

    def listen(self, on_room: Callable[[], None] | None) -> None:
        """Call ``on_room`` (no arguments, quick, from the thread that freed them) whenever bytes
        leave a bound; None stops it."""
        self._on_room = on_room

    def _room(self) -> None:
        on_room = self._on_room
        if on_room is not None:
            on_room()

    def admission(self, size: int = 0) -> Overloaded | None:
        """Why ``size`` more bytes would be refused now, or None (a cheap early check)."""
        with self._lock:
            return self._refusal(size)

    def _refusal(self, size: int) -> Overloaded | None:
        if self._pending and self._pending_bytes + size > self.max_pending_bytes:
            return Overloaded(
                f"{self._pending_bytes} bytes are waiting for the journal's fsync (limit {self.max_pending_bytes})",
                status=429,
            )
        unflushed = self._unflushed()
        if unflushed and unflushed + size > self.max_journal_bytes:
            return Overloaded(
                f"the journal holds {unflushed} bytes not yet in the store (limit {self.max_journal_bytes}): "
                "the store is not keeping up",
                status=503,
            )
        return None

    def _unflushed(self) -> int:
        return self._closed_bytes + self._open_bytes + self._inflight_bytes + self._pending_bytes

    def submit(self, data: bytes) -> Future[None]:
        """Queue ``data`` (whole lines); the future completes once it is fsync'd.

        Raises :class:`Overloaded` over a bound and :class:`JournalError` once closed.
        """
        future: Future[None] = Future()
        with self._lock:
            if self._closing or self._writer is None:
                raise JournalError("the journal is closed: its owner is shutting down")
            refusal = self._refusal(len(data))
            if refusal is not None:
                raise refusal
            self._pending.append((data, future))
            self._pending_bytes += len(data)
            self._submissions += 1
            self._wake.notify()
        return future

    # -- the writer thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closing:
                    self._wake.wait()
                if not self._pending:
                    return
                batch, self._pending = self._pending, []
                self._inflight_bytes, self._pending_bytes = self._pending_bytes, 0
            live = [future for _, future in batch if future.set_running_or_notify_cancel()]
            error = self._write(b"".join(data for data, _ in batch))
            with self._lock:
                self._inflight_bytes = 0
            for future in live:
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)
            self._room()

    def _write(self, data: bytes) -> JournalError | None:
        with self._file_lock:
            try:
                fd = self._fd if self._fd is not None else self._open_segment()
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                self._sync(fd)
            except OSError as exc:
                self._write_failures += 1
                logger.error("could not write %d byte(s) to the journal %s: %s", len(data), self._path, exc)
                self._abandon_segment()
                return JournalError(f"the journal could not be written: {exc.strerror or exc}")
            with self._lock:
                self._open_bytes += len(data)
                self._syncs += 1
                full = self._open_bytes >= self.max_segment_bytes
            if full:
                self._cut_locked()
        return None

    def _open_segment(self) -> int:
        with self._lock:
            sequence = self._next_sequence
            self._next_sequence += 1
        path = self.folder / f"{sequence:016d}{_SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o644)
        try:
            _fsync_folder(self.folder)  # the new name itself must survive a crash
        except OSError:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        self._fd, self._path = fd, path
        return fd

    def _abandon_segment(self) -> None:
        """After a failed write: cut the segment back to its last synced size and close it."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, self._open_bytes)
        except OSError as exc:  # a torn tail stays; the ingester skips it
            logger.error("could not truncate %s after a failed write: %s", self._path, exc)
        self._cut_locked()

    # -- the flusher -----------------------------------------------------------------------------------

    def cut(self) -> Segment | None:
        """Close the open segment (when it holds anything); returns it."""
        with self._file_lock:
            return self._cut_locked()

    def _cut_locked(self) -> Segment | None:
        if self._fd is None or self._path is None:
            return None
        os.close(self._fd)
        path, self._fd, self._path = self._path, None, None
        with self._lock:
            size, self._open_bytes = self._open_bytes, 0
            if size == 0:
                segment = None
            else:
                segment = Segment(path, size, int(path.stem))
                self._closed.append(segment)
                self._closed_bytes += size
        if segment is None:
            path.unlink(missing_ok=True)
        return segment

    def closed_segments(self) -> list[Segment]:
        """The closed segments, oldest first."""
        with self._lock:
            return list(self._closed)

    def remove(self, segment: Segment) -> None:
        """Delete a segment whose spans are in the store."""
        segment.path.unlink(missing_ok=True)
        self._forget(segment)

    def split(
        self, segment: Segment, halve_line: Callable[[bytes], tuple[bytes, bytes] | None] | None = None
    ) -> tuple[Segment, Segment] | None:
        """Replace a closed segment by two segments holding its halves, in its place at the head of
        the queue: its first and second half of the lines, or, for a single line, the two lines
        ``halve_line`` makes of it (None when there is no ``halve_line`` or it returns None: the
        line cannot be split). Crash-safe: the halves are fsync'd before the original goes; a
        crash in between replays both, which ingest deduplicates."""
        lines = segment.path.read_bytes().splitlines(keepends=True)
        parts: tuple[bytes, bytes] | None = None
        if len(lines) >= 2:
            middle = len(lines) // 2
            parts = b"".join(lines[:middle]), b"".join(lines[middle:])
        elif len(lines) == 1 and halve_line is not None:
            parts = halve_line(lines[0])
        if parts is None:
            return None
        halves = []
        for data in parts:
            with self._lock:
                sequence = self._next_sequence
                self._next_sequence += 1
            path = self.folder / f"{sequence:016d}{_SUFFIX}"
            _write_synced(path, data)
            halves.append(Segment(path, len(data), sequence))
        _fsync_folder(self.folder)
        with self._lock:
            index = self._closed.index(segment) if segment in self._closed else 0
            self._closed[index : index + 1] = halves
            self._closed_bytes += sum(h.size for h in halves) - segment.size
        segment.path.unlink(missing_ok=True)
        return halves[0], halves[1]

    def quarantine(self, segment: Segment, reason: str) -> Path:
        """Set a segment the store refuses aside in ``rejected/`` with ``reason``; returns the file.

        The file (``<sha256 of the data, 16 hex digits>.json``) holds one JSON object:
        ``reason``, the ``segment`` it came from and ``lines``, the refused lines (parsed; a
        line that is not JSON as its text). Crash-safe and idempotent: written in full and
        fsync'd before the segment goes, named by its content, so a replay rewrites the same file.
        """
        data = segment.path.read_bytes()
        folder = self.folder / REJECTED_FOLDER
        folder.mkdir(exist_ok=True)
        target = folder / f"{hashlib.sha256(data).hexdigest()[:16]}.json"
        record = {
            "reason": reason,
            "segment": segment.path.name,
            "lines": [_parsed(line) for line in data.splitlines()],
        }
        staging = target.with_suffix(".tmp")
        _write_synced(staging, orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE), exclusive=False)
        staging.replace(target)
        _fsync_folder(folder)
        segment.path.unlink(missing_ok=True)
        self._forget(segment)
        return target

    def _forget(self, segment: Segment) -> None:
        with self._lock:
            if segment in self._closed:
                self._closed.remove(segment)
                self._closed_bytes -= segment.size
        self._room()

    def stats(self) -> JournalStats:
        with self._lock:
            return JournalStats(
                pending_bytes=self._pending_bytes + self._inflight_bytes,
                unflushed_bytes=self._unflushed(),
                closed_segments=len(self._closed),
                submissions=self._submissions,
                syncs=self._syncs,
                write_failures=self._write_failures,
            )
