"""The ``treellm collect`` command's options and its call into :func:`~treellm.collector.serve`.

Shared by ``treellm collect`` (``treellm/cli.py``) and ``python -m treellm.collector``: the
options default to ``None`` so the only defaults are :class:`CollectorConfig`'s. Importing this
module is cheap (the server and the store load in :func:`run`), so the CLI can build its parser
without them.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from treellm.collector.config import DEFAULTS, parse_size

__all__ = ["DESCRIPTION", "EPILOG", "add_arguments", "run"]

DESCRIPTION = (
    "Receive OTLP/HTTP traces and metrics (protobuf or JSON, gzip or not) on /v1/traces and /v1/metrics and "
    "write them into the store (spans, metric_points) through an fsync'd journal beside it (<db>.collector/); "
    "a request is answered 200 once its data is durable. SIGTERM or Ctrl-C drains the journal into the store "
    "and exits 0 (75 when the store stayed busy: the data waits in the journal for the next start)."
)
EPILOG = "example:\n  TREELLM_TOKEN=s3cret treellm collect --db runs.duckdb --port 4318 --token-env TREELLM_TOKEN"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--db", help="the store (default $TREELLM_DB or ./treellm.duckdb)")
    add("--host", help=f"address to listen on (default {DEFAULTS.host}: loopback only)")
    add("--port", type=int, help=f"port (default {DEFAULTS.port}; 0 picks a free one)")
    add("--token-env", metavar="VAR", help="require `Authorization: Bearer <token>`, the token read from $VAR")
    add(
        "--max-body", metavar="SIZE", help=f"largest body, as sent and decompressed (default {DEFAULTS.max_body_bytes})"
    )
    add(
        "--flush-interval",
        type=float,
        metavar="S",
        help=f"seconds between flushes (default {DEFAULTS.flush_interval_s})",
    )
    add(
        "--drain-timeout",
        type=float,
        metavar="S",
        help=f"wait for a busy store on exit (default {DEFAULTS.drain_timeout_s})",
    )
    add("--journal-dir", metavar="DIR", help="the journal folder (default <db>.collector)")
    add(
        "--header-timeout",
        type=float,
        metavar="S",
        help=f"a request's headers must arrive within S seconds, else 408 (default {DEFAULTS.header_timeout_s})",
    )
    add(
        "--body-timeout",
        type=float,
        metavar="S",
        help=f"a request's whole body must arrive within S seconds, else 408 (default {DEFAULTS.body_timeout_s})",
    )
    add(
        "--max-connections",
        type=int,
        metavar="N",
        help="hold at most N connections open (default: as many as the file descriptor limit allows, less a "
        "reserve); above it the oldest idle one is closed, or the new one answered 503",
    )
    add(
        "--max-connections-per-peer",
        type=int,
        metavar="N",
        help="hold at most N connections from one peer (an IPv4 address, an IPv6 /64); more are closed at once "
        f"(default {DEFAULTS.max_connections_per_peer})",
    )
    add(
        "--max-flush",
        metavar="SIZE",
        help="when the store has fallen behind, flush at most SIZE of journal segments in one transaction: larger "
        f"is cheaper a span, and a reader waits longer for it (default {DEFAULTS.max_flush_bytes // 2**20}MiB)",
    )
    add(
        "--admission-wait",
        type=float,
        metavar="S",
        help="a request arriving while the journal is full waits up to S seconds for the store to catch up "
        f"before it is answered 503 (0: at once; default {DEFAULTS.admission_wait_s:g})",
    )
    add(
        "--flusher-nice",
        type=int,
        metavar="N",
        help="lower the flusher's CPU priority by N (0-19; Linux) so that acknowledging comes first under load "
        f"(default {DEFAULTS.flusher_nice})",
    )
    add("-v", "--verbose", action="store_true", help="log starts, stops and replays")


def _announce(db: Path) -> Callable[[str], None]:
    def announce(url: str) -> None:
        print(f"treellm collect: listening on {url} (store {db})", file=sys.stderr, flush=True)

    return announce


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM / SIGINT; the exit code. Bad options raise :class:`~treellm.errors.ConfigError`."""
    from treellm.collector.server import serve, token_from_env
    from treellm.store import default_db_path

    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="treellm collect: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    db = Path(args.db) if args.db else default_db_path()
    config = DEFAULTS.replace(
        flush_interval_s=args.flush_interval,
        drain_timeout_s=args.drain_timeout,
        journal_dir=Path(args.journal_dir) if args.journal_dir else None,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        max_connections=args.max_connections,
        max_connections_per_peer=args.max_connections_per_peer,
        flusher_nice=args.flusher_nice,
        admission_wait_s=args.admission_wait,
        max_flush_bytes=parse_size(args.max_flush, setting="--max-flush") if args.max_flush else None,
    )
    return serve(
        db,
        host=args.host,
        port=args.port,
        token=token_from_env(args.token_env) if args.token_env else None,
        max_body_bytes=parse_size(args.max_body, setting="--max-body") if args.max_body else None,
        config=config,
        on_ready=_announce(db),
    )
