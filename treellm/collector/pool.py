"""Decoding off the event loop: a pool of worker processes, one per core (the GIL would hold threads to one).

Contract:

- :class:`DecodePool` runs :func:`~treellm.collector.decode.decompress` and a decoder
  (``decode_request`` or ``decode_metrics_request``, both pure) on a body in a worker process and
  returns the :class:`~treellm.collector.decode.Decoded`, or raises the
  :class:`~treellm.collector.errors.BadRequest` / :class:`~treellm.collector.errors.PayloadTooLarge`
  the decoder raised, as if it had run in the caller. A worker's errors cross the process
  boundary as values (:class:`_Failure`), never as pickled exceptions.
- ``workers`` processes at most, started on first use (``spawn``: the collector has threads, so
  no ``fork``); :meth:`DecodePool.warm` starts them all now, :meth:`DecodePool.warm_soon` on a
  thread. ``workers=0`` decodes on the caller's thread pool instead (same answers, one core).
- :meth:`DecodePool.decode` is awaited on the event loop and never blocks it. A worker that
  dies (killed, out of memory) breaks the pool: that request and those in flight are decoded
  again on a thread, the broken pool is shut down and a new one started on the next request,
  and the break is logged and counted (``restarts``). When the pool breaks before any worker
  ever answered, workers cannot start here (a ``spawn``'d process imports the program's main
  module: one read from stdin cannot be, and a script must guard its own start with
  ``if __name__ == "__main__":``, as :mod:`multiprocessing` requires): the pool decodes on threads
  from then on and says so once. Bodies below ``inline_bytes`` (sent without
  a content coding) are decoded on the event loop: a round trip to a process costs more.
- :meth:`DecodePool.close` (the owner, after the event loop stopped) ends the workers.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError, Executor, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Literal

from starlette.concurrency import run_in_threadpool

from treellm.collector.decode import Decoded, Encoding, decompress
from treellm.collector.errors import BadRequest, PayloadTooLarge

__all__ = ["DecodePool", "Decoder", "cores"]

logger = logging.getLogger(__name__)

Decoder = Callable[[bytes, Encoding], Decoded]
ContentCoding = Literal["identity", "gzip", "deflate"]


def cores() -> int:
    """The cores this process may run on (its CPU affinity where the system tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(frozen=True, slots=True)
class _Failure:
    """A decoder's refusal, as a value that crosses the process boundary."""

    status: Literal[400, 413]
    reason: str
    field: str | None = None
    limit: int = 0

    def error(self) -> BadRequest | PayloadTooLarge:
        if self.status == 413:
            return PayloadTooLarge(self.reason, limit=self.limit)
        return BadRequest(self.reason, field=self.field)


def _decode(body: bytes, coding: ContentCoding, encoding: Encoding, limit: int, decoder: Decoder) -> Decoded | _Failure:
    """The work of one request (in a worker process, or on a thread): inflate, decode."""
    try:
        return decoder(decompress(body, coding, limit), encoding)
    except PayloadTooLarge as exc:
        return _Failure(413, str(exc), limit=exc.limit)
    except BadRequest as exc:
        return _Failure(400, exc.reason, field=exc.field)


def _ready() -> int:
    return os.getpid()


class DecodePool:
    """Worker processes that decode request bodies (see the module docstring)."""

    def __init__(self, workers: int, *, inline_bytes: int = 16 * 1024) -> None:
        self.workers = workers
        self.inline_bytes = inline_bytes
        self.restarts = 0
        self._executor: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self._answered = False  # a worker has answered once: they can start here

    def _pool(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))
            return self._executor

    def warm(self) -> None:
        """Start every worker now (blocks until each has imported the decoders)."""
        if self.workers:
            pool = self._pool()
            try:
                for future in [pool.submit(_ready) for _ in range(self.workers * 2)]:
                    future.result()
            except BrokenProcessPool:
                self._broken(pool)
                return
            self._answered = True

    def warm_soon(self) -> None:
        """:meth:`warm` on a thread of its own (the owner does not wait; a request arriving first
        waits for its worker as it would have)."""
        threading.Thread(target=self._warm_quietly, name="treellm-decode-warm", daemon=True).start()

    def _warm_quietly(self) -> None:
        try:
            self.warm()
        except (CancelledError, RuntimeError) as exc:  # closed meanwhile
            logger.debug("the decoding processes were not all started: %r", exc)

    async def decode(self, body: bytes, coding: ContentCoding, encoding: Encoding, limit: int,
                     decoder: Decoder) -> Decoded:  # fmt: skip
        """``decoder(decompress(body))``: inline, on a worker process, or on a thread (the module docstring)."""
        if coding == "identity" and len(body) < self.inline_bytes:
            result = _decode(body, coding, encoding, limit, decoder)
        elif not self.workers:
            result = await run_in_threadpool(_decode, body, coding, encoding, limit, decoder)
        else:
            pool = self._pool()
            try:
                result = await asyncio.wrap_future(pool.submit(_decode, body, coding, encoding, limit, decoder))
            except BrokenProcessPool:
                self._broken(pool)
                result = await run_in_threadpool(_decode, body, coding, encoding, limit, decoder)
            else:
                self._answered = True
        if isinstance(result, _Failure):
            raise result.error()
        return result

    def _broken(self, pool: Executor) -> None:
        with self._lock:
            if self._executor is not pool:
                return  # another request saw it first
            self._executor = None
            if self._answered:
                self.restarts += 1
                logger.error("a decoding process of the collector died; its requests are decoded on a thread and a "
                             "new pool is started")  # fmt: skip
            else:
                self.workers = 0
                logger.warning(
                    "the collector's decoding processes cannot start (a spawned process imports the main module of "
                    "the program: guard its start with if __name__ == '__main__', or set decode_workers=0); "
                    "decoding on threads, one core"
                )
        pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """End the workers (after the requests using them are answered)."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
