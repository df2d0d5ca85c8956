"""Gzip bodies of many empty members: the collector's decompression before and after the linear fix.

Run: .venv/bin/python benchmarks/bench_gzip_members.py [--mib 1 2 4]

A body of N empty gzip members (20 bytes each) and one real member is decoded, side by side in
one run, by the receiver's ``decompress`` and by the implementation it replaced (kept below as
``inflate_before``: it handed zlib the whole rest of the body for each member, which zlib copies
into ``unused_data`` at the end of every member, so the work grew with the square of the body).
Printed per size: each one's CPU time, the ratio between them, and how each grows when the body
doubles (2.0 is linear, 4.0 quadratic).
"""

from __future__ import annotations

import argparse
import gzip
import time
import zlib

from treellm.collector.decode import decompress

LIMIT = 20 * 1024 * 1024
EMPTY = gzip.compress(b"")
REAL = b"the one real member" * 50


def inflate_before(data: bytes, limit: int = LIMIT) -> bytes:
    """The gzip path of ``decompress`` before the fix (limits and errors left out: never reached here)."""
    out = bytearray()
    pending = data
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    while True:
        out += inflater.decompress(pending, limit + 1 - len(out))
        if inflater.eof:
            pending = inflater.unused_data
            if not pending:
                return bytes(out)
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            continue
        pending = inflater.unconsumed_tail
        if not pending:
            return bytes(out + inflater.flush())


def body_of(mib: float) -> bytes:
    return EMPTY * int(mib * 1024 * 1024 / len(EMPTY)) + gzip.compress(REAL)


def cpu(function: object, body: bytes) -> float:
    started = time.process_time()
    assert function(body) == REAL  # type: ignore[operator]
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    args = parser.parse_args()
    print(f"{'body':>8} {'members':>9} {'before s':>9} {'after s':>8} {'before/after':>13} {'growth b/a':>11}")
    previous: tuple[float, float] | None = None
    for mib in args.mib:
        body = body_of(mib)
        before = cpu(inflate_before, body)
        after = cpu(lambda data: decompress(data, "gzip", LIMIT), body)
        growth = f"{before / previous[0]:.1f}/{after / previous[1]:.1f}" if previous else "-"
        print(f"{mib:>6.2f}Mi {len(body) // len(EMPTY):>9} {before:>9.3f} {after:>8.3f} {before / after:>12.1f}x "
              f"{growth:>11}")  # fmt: skip
        previous = (before, after)


if __name__ == "__main__":
    main()
