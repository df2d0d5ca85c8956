"""Decoding off the event loop: worker processes, one per core (the GIL would hold threads to one).

Contract:

- :class:`DecodePool` runs :func:`~treellm.collector.decode.decompress` and a decoder
  (``decode_request`` or ``decode_metrics_request``, both pure, named by module and name so that
  a worker imports it) on a body in a worker process and returns the
  :class:`~treellm.collector.decode.Decoded`, or raises the
  :class:`~treellm.collector.errors.BadRequest` / :class:`~treellm.collector.errors.PayloadTooLarge`
  the decoder raised, as if it had run in the caller. A worker's errors cross the process
  boundary as values (:class:`_Failure`), never as pickled exceptions.
- Each worker is a ``spawn``'d process (the collector has threads, so no ``fork``) joined to the
  pool by a socket pair. The event loop writes a request (a fixed header, the decoder's name, the
  body as sent) straight into the worker's socket and reads its answer (a length, then the pickled
  result) from it: no feeder or result thread, no lock, no pickled body. A worker decodes one
  request at a time; a request waits for an idle worker in arrival order.
- ``workers`` processes at most, each started when first needed (on a thread: the event loop
  never waits for a process to start); :meth:`DecodePool.warm` starts them all now,
  :meth:`DecodePool.warm_soon` on a thread. ``workers=0`` decodes on the caller's thread pool
  instead (same answers, one core).
- :meth:`DecodePool.decode` is awaited on the event loop and never blocks it. A worker that dies
  (killed, out of memory) costs no request: that request is decoded again on a thread, the worker
  is replaced on the next request, and the death is logged and counted (``restarts``); the other
  workers go on. When no worker ever started here (a ``spawn``'d process imports the program's
  main module: one read from stdin cannot be, and a script must guard its own start with
  ``if __name__ == "__main__":``, as :mod:`multiprocessing` requires), the pool decodes on threads
  from then on and says so once. Bodies below ``inline_bytes`` (sent without a content coding) are
  decoded on the event loop: a round trip to a process costs more. A request cancelled while a
  worker holds it ends that worker (its socket is mid-message); it is not counted as a death.
- :meth:`DecodePool.close` (the owner, after the event loop stopped) ends the workers: each sees
  its socket close and exits (so does a worker whose collector was killed).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import multiprocessing
import os
import pickle
import signal
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Final, Literal

from starlette.concurrency import run_in_threadpool

from treellm.collector.decode import Decoded, Encoding, decompress
from treellm.collector.errors import BadRequest, PayloadTooLarge

__all__ = ["DecodePool", "Decoder", "cores"]

logger = logging.getLogger(__name__)

Decoder = Callable[[bytes, Encoding], Decoded]
ContentCoding = Literal["identity", "gzip", "deflate"]

_CODINGS: Final[tuple[ContentCoding, ...]] = ("identity", "gzip", "deflate")
_ENCODINGS: Final[tuple[Encoding, ...]] = ("protobuf", "json")
_REQUEST: Final = struct.Struct("!QQBBH")  # body bytes, limit, coding, encoding, decoder name bytes
_ANSWER: Final = struct.Struct("!Q")  # pickled result bytes
_READY: Final = b"R"
_BUFFER_BYTES: Final = 1 << 20  # socket buffers: a request or an answer in few system calls
_START_TIMEOUT_S: Final = 60.0
_JOIN_S: Final = 5.0


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


def _name(decoder: Decoder) -> bytes:
    """How a worker finds ``decoder``: ``module:qualified name`` (a module-level function)."""
    return f"{decoder.__module__}:{decoder.__qualname__}".encode()


def _resolve(name: bytes) -> Decoder:
    module, _, qualname = name.decode().partition(":")
    found: object = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    if not callable(found):
        raise TypeError(f"{name!r} is not a decoder")
    return found


# -- the worker process --------------------------------------------------------------------------------


def _receive_exactly(sock: socket.socket, size: int) -> bytes | None:
    """``size`` bytes from a blocking socket; None when it closes first."""
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        count = sock.recv_into(view[got:])
        if not count:
            return None
        got += count
    return bytes(buffer)


def _serve(sock: socket.socket) -> None:
    """A worker's life: say it is ready, then answer requests until the pool closes its end."""
    decoders: dict[bytes, Decoder] = {}
    sock.setblocking(True)
    sock.sendall(_READY)
    while True:
        header = _receive_exactly(sock, _REQUEST.size)
        if header is None:
            return
        size, limit, coding, encoding, name_size = _REQUEST.unpack(header)
        name = _receive_exactly(sock, name_size)
        body = _receive_exactly(sock, size) if size else b""
        if name is None or body is None:
            return
        decoder = decoders.get(name)
        if decoder is None:
            decoder = decoders[name] = _resolve(name)
        result = _decode(body, _CODINGS[coding], _ENCODINGS[encoding], limit, decoder)
        answer = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
        sock.sendall(_ANSWER.pack(len(answer)) + answer)


def _worker_main(sock: socket.socket) -> None:  # the target of a spawned process
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the process group: the collector decides
    try:
        _serve(sock)
    except ConnectionError:
        pass  # the collector went away: nobody to answer
    finally:
        sock.close()


# -- the pool ------------------------------------------------------------------------------------------


class _WorkerDied(Exception):
    """A worker's socket closed or broke mid-request: the process is gone."""


@dataclass(eq=False, slots=True)
class _Worker:
    """One worker process and the pool's end of its socket (non-blocking).

    Requests are pipelined: each writes its request after the previous one was written, and reads
    its answer after the previous one was read (``sent`` and ``read``: the last request's turn,
    True once it passed, False when the stream broke); ``queued`` counts the requests holding it.
    """

    process: BaseProcess
    sock: socket.socket
    queued: int = 0
    broken: bool = False
    sent: asyncio.Future[bool] | None = None
    read: asyncio.Future[bool] | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def end(self) -> None:
        """Close the pool's end and reap the process (killed when it does not exit)."""
        try:
            self.sock.close()
        finally:
            self.reap()

    def reap(self) -> None:
        """Wait for the process to exit (it does once its socket is shut), killed when it does not."""
        self.process.join(_JOIN_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(_JOIN_S)


def _start_worker() -> _Worker:
    """Spawn one worker and wait until it has imported the decoders (blocking: call it on a thread)."""
    ours, theirs = socket.socketpair()
    for end in (ours, theirs):
        end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BUFFER_BYTES)
        end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _BUFFER_BYTES)
    context = multiprocessing.get_context("spawn")
    process = context.Process(target=_worker_main, args=(theirs,), name="treellm-decode", daemon=True)
    try:
        process.start()
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    ours.settimeout(_START_TIMEOUT_S)
    try:
        ready = ours.recv(len(_READY))
    except OSError:
        ready = b""
    if ready != _READY:
        _Worker(process, ours).end()
        raise _WorkerDied("the decoding process did not start")
    ours.setblocking(False)
    return _Worker(process, ours)


async def _turn(previous: asyncio.Future[bool] | None) -> None:
    """Wait for the previous request's turn on a worker; :class:`_WorkerDied` when its stream broke."""
    if previous is None:
        return
    passed = previous.result() if previous.done() else await asyncio.shield(previous)
    if not passed:
        raise _WorkerDied("an earlier request on the decoding process failed")


def _settle(turn: asyncio.Future[bool], passed: bool) -> None:
    if not turn.done():
        turn.set_result(passed)


class DecodePool:
    """Worker processes that decode request bodies (see the module docstring).

    ``start`` makes one worker (a seam: a test gives one that cannot start).
    """

    def __init__(self, workers: int, *, inline_bytes: int = 16 * 1024,
                 start: Callable[[], _Worker] = _start_worker) -> None:  # fmt: skip
        self.workers = workers
        self.inline_bytes = inline_bytes
        self.restarts = 0
        self._start = start
        self._live: list[_Worker] = []
        self._starting = 0
        self._waiting: list[asyncio.Future[None]] = []  # requests waiting for a worker to start
        self._lock = threading.Lock()  # the workers are touched by the loop and by warm()'s thread
        self._started_once = False  # a worker has started here: they can
        self._closed = False

    def pids(self) -> list[int]:
        """The live worker processes' ids."""
        with self._lock:
            return [w.pid for w in self._live if w.pid is not None]

    # -- starting ----------------------------------------------------------------------------------

    def warm(self) -> None:
        """Start every worker now (blocks until each has imported the decoders)."""
        while True:
            with self._lock:
                if self._closed or len(self._live) + self._starting >= self.workers:
                    return
                self._starting += 1
            if self._add(self._started()) is None:
                return

    def warm_soon(self) -> None:
        """:meth:`warm` on a thread of its own (the owner does not wait; a request arriving first
        waits for its worker as it would have)."""
        threading.Thread(target=self.warm, name="treellm-decode-warm", daemon=True).start()

    def _started(self) -> _Worker | None:
        """A new worker, or None (said, and the pool moved to threads when none ever started)."""
        try:
            return self._start()
        except Exception as exc:  # noqa: BLE001 -- whatever stops a process from starting: decode on a thread
            self._cannot_start(exc)
            return None

    def _add(self, worker: _Worker | None) -> _Worker | None:
        """A start ended: keep ``worker`` (None: it failed); the requests waiting look again."""
        with self._lock:
            self._starting -= 1
            closed = self._closed
            if worker is not None and not closed:
                self._live.append(worker)
                self._started_once = True
            waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits any longer
                waiter.get_loop().call_soon_threadsafe(_wake, waiter)
        if worker is not None and closed:
            worker.end()
            return None
        return worker

    def _cannot_start(self, exc: BaseException) -> None:
        with self._lock:
            if self._started_once:
                logger.error("a decoding process of the collector could not start (%s); decoding on a thread "
                             "meanwhile", exc)  # fmt: skip
                return
            if not self.workers:
                return  # said already
            self.workers = 0
        logger.warning(
            "the collector's decoding processes cannot start (a spawned process imports the main module of "
            "the program: guard its start with if __name__ == '__main__', or set decode_workers=0); "
            "decoding on threads, one core"
        )

    # -- decoding ----------------------------------------------------------------------------------

    async def decode(self, body: bytes, coding: ContentCoding, encoding: Encoding, limit: int,
                     decoder: Decoder) -> Decoded:  # fmt: skip
        """``decoder(decompress(body))``: inline, on a worker process, or on a thread (the module docstring)."""
        if coding == "identity" and len(body) < self.inline_bytes:
            result = _decode(body, coding, encoding, limit, decoder)
        else:
            worker = await self._assign()
            if worker is None:
                result = await run_in_threadpool(_decode, body, coding, encoding, limit, decoder)
            else:
                try:
                    result = await self._exchange(worker, body, coding, encoding, limit, decoder)
                except _WorkerDied:
                    result = await run_in_threadpool(_decode, body, coding, encoding, limit, decoder)
        if isinstance(result, _Failure):
            raise result.error()
        return result

    async def _assign(self) -> _Worker | None:
        """The live worker with the fewest requests queued; None: decode on a thread.

        While every live worker is busy and fewer than ``workers`` run, one more is started on a
        thread; a request waits for it only when no worker is live.
        """
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                least = min(self._live, key=lambda w: w.queued, default=None)  # a retired worker has left it
                if not self.workers or self._closed:
                    return None
                if len(self._live) + self._starting < self.workers and (least is None or least.queued):
                    self._starting += 1
                    threading.Thread(target=self._start_one, name="treellm-decode-start", daemon=True).start()
                if least is not None:
                    least.queued += 1
                    return least
                if not self._starting:
                    return None
                waiter: asyncio.Future[None] = loop.create_future()
                self._waiting.append(waiter)
            await waiter

    def _start_one(self) -> None:
        self._add(self._started())

    async def _exchange(self, worker: _Worker, body: bytes, coding: ContentCoding, encoding: Encoding,  # noqa: PLR0917
                        limit: int, decoder: Decoder) -> Decoded | _Failure:  # fmt: skip
        """Write the request after the previous one, read the answer after the previous one."""
        loop = asyncio.get_running_loop()
        name = _name(decoder)
        header = _REQUEST.pack(len(body), limit, _CODINGS.index(coding), _ENCODINGS.index(encoding), len(name))
        previous_sent, previous_read = worker.sent, worker.read
        sent, read = worker.sent, worker.read = loop.create_future(), loop.create_future()
        passed = False
        try:
            try:
                await _turn(previous_sent)
                await loop.sock_sendall(worker.sock, header + name)
                await loop.sock_sendall(worker.sock, body)
                _settle(sent, True)
                await _turn(previous_read)
                size = _ANSWER.unpack(await _read(loop, worker.sock, _ANSWER.size))[0]
                answer = await _read(loop, worker.sock, size)
            except OSError as exc:  # reset, broken pipe
                raise _WorkerDied(str(exc)) from exc
            passed = True
        except _WorkerDied:
            self._died(worker)
            raise
        except BaseException:  # cancelled mid-message: the worker's stream is out of step
            self._retire(worker)
            raise
        finally:
            _settle(sent, passed)
            _settle(read, passed)
            with self._lock:
                worker.queued -= 1
                last = worker.broken and not worker.queued
            if last:
                worker.sock.close()
        result: Decoded | _Failure = pickle.loads(answer)
        return result

    # -- ending --------------------------------------------------------------------------------------

    def _died(self, worker: _Worker) -> None:
        """The worker is gone (first seen here: counted and said once)."""
        if self._retire(worker):
            with self._lock:
                self.restarts += 1
            logger.error("a decoding process of the collector died (pid %s); its requests are decoded on a thread "
                         "and a new process started for the next", worker.pid)  # fmt: skip

    def _retire(self, worker: _Worker) -> bool:
        """Take ``worker`` out of the pool: its socket shut at once (the requests still on it read
        the end and go to a thread; the last of them closes it, on the loop that waits on it), its
        process reaped on a thread. False when it already was."""
        with self._lock:
            if worker.broken:
                return False
            worker.broken = True
            if worker in self._live:
                self._live.remove(worker)
        with contextlib.suppress(OSError):
            worker.sock.shutdown(socket.SHUT_RDWR)
        threading.Thread(target=worker.reap, name="treellm-decode-end", daemon=True).start()
        return True

    def close(self) -> None:
        """End the workers (after the requests using them are answered)."""
        with self._lock:
            self._closed = True
            workers, self._live = self._live, []
        for worker in workers:
            worker.broken = True
            worker.end()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def _read(loop: asyncio.AbstractEventLoop, sock: socket.socket, size: int) -> bytearray:
    """``size`` bytes from a worker's socket; :class:`_WorkerDied` when it closes first."""
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        count = await loop.sock_recv_into(sock, view[got:])
        if not count:
            raise _WorkerDied("the decoding process closed its socket")
        got += count
    return buffer
