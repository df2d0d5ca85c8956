"""The ``treellm`` command: parse, call one library function, render.

A :class:`~treellm.errors.TreeLLMError` becomes one line on stderr and exit
status 1, never a traceback; so does an :class:`OSError` about a file or folder that
an option names (the line names the option). A value that no file can have (empty,
NUL) or that DuckDB would read as another path is refused at parsing, naming the
option (exit 2). Every message reaches stderr with URLs' passwords masked
(:mod:`treellm.urls`). Every command's help carries an example.

Manners, for people and for pipes: every JSON output is strict JSON (a NaN or an infinity
from the analysis is ``null``); a wrong option prints the usage of the command it was given
to (exit 2); Ctrl-C ends with one line and exit 130, even when a library turned the
interrupt into an error of its own (DuckDB's "Query interrupted"), and a closed stdout
(``| head``) ends quietly with 141, as a process that SIGPIPE ended.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from treellm import settings
from treellm._version import __version__
from treellm.errors import ConfigError, MissingExtraError, TreeLLMError, require_extra
from treellm.signature import RawArguments, canonical_json, parse_arguments, signature
from treellm.urls import display_url, host_problem, mask_urls, shown, url_problem


def _plain(line: str) -> str:
    """A line that may quote a trace (an error, a bad record) with its control characters
    made visible (``treellm.inspector.terminal_text``), for a plain ``print``."""
    from treellm.inspector import terminal_text

    return terminal_text(line).plain


PIPE_WIDTH = 1_000_000
"""The width text is laid out for when its output is no terminal and ``COLUMNS`` says none: a
report's table whole, one line a tool, and each summary line whole, so a file or a ``grep`` gets
rows (Rich would assume 80 columns, fold the report's tools into blocks of wrapped numbers and
break the summary's lines)."""


def _console(stderr: bool = True) -> Any:
    from rich.console import Console

    console = Console(stderr=stderr)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        return Console(stderr=stderr, width=PIPE_WIDTH)
    return console


def _finite(value: Any) -> Any:
    """``value`` (JSON-shaped) with every NaN and infinity made None: strict JSON has neither."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def _print_json(value: Any, *, ensure_ascii: bool = True) -> None:
    """Print ``value`` as one line of strict JSON (``null`` for NaN and infinities)."""
    print(json.dumps(_finite(value), ensure_ascii=ensure_ascii, allow_nan=False))


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors (which quote the value refused) mask URLs' passwords."""

    def error(self, message: str) -> NoReturn:
        super().error(mask_urls(message))


# The values of options that name files and folders are refused at parsing (argparse names the
# option) when no file can have that name; a file or folder that cannot be used is one error line
# naming the option (main). Paths DuckDB opens are refused also when DuckDB would read another:
# a URL (it fetches it) or, on POSIX, a backslash (it reads one as a folder separator).
_URL_LIKE = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.\-]+:/|md:|motherduck:)")


def _path(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("expected a path, got an empty one")
    if "\x00" in text:
        raise argparse.ArgumentTypeError("expected a path without NUL characters")
    return text


def _store_path(text: str) -> str:
    text = _path(text)
    if _URL_LIKE.match(text):
        raise argparse.ArgumentTypeError(f"expected a local path, got the URL {shown(text)}")
    if os.sep == "/" and "\\" in text:
        raise argparse.ArgumentTypeError("expected a path without '\\' (DuckDB reads it as a folder separator)")
    return text


def _host(text: str) -> str:
    problem = host_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{problem}, got {shown(text)}")
    return text


def _appendable(path: str) -> None:
    """Create ``path`` (and its folders) for appending, as the trace exporter will: a path that
    cannot be written fails here, on the command line, not in the exporter's thread later."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with Path(path).open("ab"):
        pass


def _option_naming(
    parser: argparse.ArgumentParser, args: argparse.Namespace, filename: object
) -> tuple[str, str] | None:
    """The option (or positional) of the command run whose value is ``filename`` or a folder
    holding it, and that value; None when no option names it."""
    if not isinstance(filename, str | bytes) or not filename:
        return None
    failed = Path(os.fsdecode(filename)).absolute()
    sub: Any = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for action in sub.choices[args.command]._actions:
        given = getattr(args, action.dest, None)
        for value in given if isinstance(given, list) else [given]:
            if isinstance(value, str) and value and "\x00" not in value:
                path = Path(value).absolute()
                if failed == path or path in failed.parents:
                    return (
                        action.option_strings[-1] if action.option_strings else action.metavar or action.dest
                    ), value
    return None


def _cmd_sign(args: argparse.Namespace) -> int:
    value = parse_arguments(args.arguments)
    out = {
        "tool": args.tool,
        "signature": signature(args.tool, value),
        "canonical": canonical_json(value),
        "valid_json": not isinstance(value, RawArguments),
    }
    _print_json(out, ensure_ascii=False)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from treellm.agent import TreeExecutor
    from treellm.builtins import builtin_tools
    from treellm.config import TreeConfig
    from treellm.inspector import LiveLog, render_tree
    from treellm.models.openai import OpenAICompatibleModel

    base_url = args.base_url or settings.get(settings.TREELLM_BASE_URL)
    model_name = args.model or settings.get(settings.TREELLM_MODEL)
    if not base_url or not model_name:
        raise ConfigError(
            f"treellm run needs --base-url and --model "
            f"(or {settings.TREELLM_BASE_URL.name} and {settings.TREELLM_MODEL.name})"
        )
    problem = url_problem(base_url)
    if problem is not None:
        raise ConfigError(f"--base-url (or ${settings.TREELLM_BASE_URL.name}): {problem}, got {shown(base_url)}")
    config = TreeConfig.from_file(args.limits) if args.limits else TreeConfig()
    changes = {
        k: v
        for k, v in {
            "branching": args.branching,
            "node_budget": args.node_budget,
            "shadow": args.shadow or None,
        }.items()
        if v is not None
    }
    config = config.replace(**changes)
    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    model = OpenAICompatibleModel(base_url, model_name, api_key, timeout=args.timeout)
    console = _console()
    provider = None
    if args.trace:
        from treellm.setup import configure

        _appendable(args.trace)
        provider = configure(service_name=args.name, jsonl=args.trace)
    executor = TreeExecutor(
        model,
        builtin_tools(args.root),
        config,
        name=args.name,
        observers=[LiveLog(console)],
        telemetry=provider is not None,
        tracer_provider=provider,
    )
    try:
        result = executor.run(args.task)
    finally:
        if provider is not None:
            provider.shutdown()
    console.print(render_tree(result))
    if result.answer is not None:
        print(result.answer)
    if result.outcome != "completed":
        causes = [n.error for n in result.nodes if getattr(n, "ended_by", None) == "error" and n.error]
        cause = f": {causes[0]}" if causes else ""
        print(_plain(mask_urls(f"treellm: run ended {result.outcome}{cause}")), file=sys.stderr)
        return 1
    return 0


def _cmd_mcp_proxy(args: argparse.Namespace) -> int:
    from treellm.config import TreeConfig
    from treellm.integrations.mcp import run_mcp_proxy

    command = args.server[1:] if args.server[:1] == ["--"] else args.server
    config = TreeConfig.from_file(args.limits) if args.limits else None
    if args.trace:
        _appendable(args.trace)
    run_mcp_proxy(
        command, config, on_repeat=args.on_repeat, max_repeats=args.max_repeats, trace=args.trace, name=args.name
    )
    return 0


def _dashboard_command(args: argparse.Namespace) -> tuple[list[str], dict[str, str], str]:
    import dashboard

    require_extra("treellm dashboard", "dashboard", "streamlit", "altair", "igraph")

    env = dict(os.environ)
    for setting in (settings.TREELLM_DASHBOARD_PARQUET, settings.TREELLM_DASHBOARD_DB):
        env.pop(setting.name, None)  # the arguments decide the source, not an inherited variable
    script_args: list[str] = []
    clickhouse = _dashboard_clickhouse(args)
    if getattr(args, "parquet", None):
        env[settings.TREELLM_DASHBOARD_PARQUET.name] = os.pathsep.join(str(Path(p).resolve()) for p in args.parquet)
    elif clickhouse:
        from treellm.store.clickhouse import open_clickhouse

        table = getattr(args, "clickhouse_table", None) or "otel_traces"
        database = getattr(args, "clickhouse_database", None)
        open_clickhouse(clickhouse, table=table, database=database).close()  # a bad URL or name fails here
        env[settings.TREELLM_CLICKHOUSE.name] = clickhouse
        if database:
            env[settings.TREELLM_CLICKHOUSE_DATABASE.name] = database
        script_args = ["--", "--clickhouse-table", table]
    else:
        env[settings.TREELLM_DASHBOARD_DB.name] = str(Path(_db(args)).resolve())
    env["STREAMLIT_BROWSER_GATHER_USAGE_STATS"] = "false"
    app = Path(dashboard.__file__).resolve().parent / "app.py"
    command = [
        sys.executable, "-m", "dashboard.serve", "run", str(app),
        "--server.address", args.host, "--server.port", str(args.port), "--server.headless", "true",
        "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none", "--global.developmentMode", "false",
        "--theme.base", "light", *script_args,
    ]  # fmt: skip
    return command, env, f"http://{args.host}:{args.port}"


def _dashboard_clickhouse(args: argparse.Namespace) -> str | None:
    """The ClickHouse URL the dashboard reads: ``--clickhouse``, else ``$TREELLM_CLICKHOUSE``
    when neither ``--db`` nor ``--parquet`` is given (as ``report`` and ``tune`` decide)."""
    url: str | None = getattr(args, "clickhouse", None)
    if url or getattr(args, "db", None) or getattr(args, "parquet", None) or not hasattr(args, "clickhouse"):
        return url
    return settings.get(settings.TREELLM_CLICKHOUSE)


def _serve(args: argparse.Namespace) -> int:
    """Replace this process with Streamlit's server (signals then reach it directly)."""
    command, env, url = _dashboard_command(args)
    print(f"treellm dashboard on {url} (Ctrl-C to stop)", flush=True)
    sys.stderr.flush()
    os.execve(sys.executable, command, env)
    return 0  # not reached


def _cmd_collect(args: argparse.Namespace) -> int:
    if getattr(args, "missing_extra", None) is not None:
        raise args.missing_extra
    from treellm.collector.command import run

    return int(run(args))


def _cmd_dashboard(args: argparse.Namespace) -> int:
    return _serve(args)


def _cmd_demo(args: argparse.Namespace) -> int:
    import tempfile

    from treellm.analysis.report import report
    from treellm.simulate import sample_traces_dir, simulate
    from treellm.store.connection import open_store
    from treellm.store.ingest import ingest

    db = _db(args)
    if args.runs:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "simulated.jsonl"
            simulate(args.runs, args.seed, out=out)
            result = ingest(db, [out])
    else:
        result = ingest(db, [sample_traces_dir()])
    console = _console(stderr=False)
    console.print(
        f"ingested into {db}: {result.spans} new span(s), {result.runs} new run(s), {result.duplicates} already there",
        markup=False,
    )
    con = open_store(db, read_only=True)
    try:
        data = report(con)
    finally:
        con.close()
    _print_report(data)
    if args.tree:
        from treellm.inspector import render_tree
        from treellm.simulate.demo import run_demo

        console.print(render_tree(run_demo([], telemetry=False)))
    if args.no_dashboard:
        console.print("next: `treellm dashboard` to explore it, `treellm tune --format toml` for limits", markup=False)
        return 0
    return _serve(args)


def _db(args: argparse.Namespace) -> str:
    from treellm.store.connection import default_db_path

    return str(args.db or default_db_path())


def _cmd_ingest(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    from treellm.store.ingest import IngestProgress, IngestReport, ingest

    db = f"{display_url(args.clickhouse)} ({args.clickhouse_table})" if args.clickhouse else _db(args)

    def run(progress: Any = None) -> IngestReport:
        if not args.clickhouse:
            return ingest(
                db, args.paths, args.input_format, skip_bad=args.skip_bad, progress=progress, bound_process=True
            )
        from treellm.store.clickhouse import open_clickhouse
        from treellm.store.clickhouse_ingest import ingest_clickhouse

        ch = open_clickhouse(
            args.clickhouse, table=args.clickhouse_table, database=args.clickhouse_database, create_table=True
        )
        try:
            return ingest_clickhouse(ch, args.paths, args.input_format, skip_bad=args.skip_bad, progress=progress)
        finally:
            ch.close()

    if args.json:
        report = run()
    else:
        # On a terminal: files, bytes, new spans and spans/s, the step and the file; elsewhere
        # rich draws nothing and the summary below is all that is printed.
        columns = (
            TextColumn("ingest"),
            BarColumn(),
            DownloadColumn(),
            TextColumn("{task.fields[files]}"),
            TextColumn("{task.fields[spans]}"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[step]} {task.fields[file]}"),
        )
        with Progress(*columns, console=_console(), transient=True) as bar:
            task = bar.add_task("ingest", total=None, files="", spans="", step="", file="")

            def progress(at: IngestProgress) -> None:
                elapsed = bar.tasks[task].elapsed or 0.0
                rate = f", {at.spans / elapsed:,.0f} spans/s" if elapsed > 0 and at.spans else ""
                bar.update(
                    task, completed=at.bytes_done, total=at.bytes_total or None,
                    files=f"file {min(at.files_done + 1, at.files)}/{at.files}",
                    spans=f"{at.spans:,} spans{rate}", step=at.step, file=at.path,
                )  # fmt: skip

            report = run(progress)
    if args.json:
        _print_json(report.to_json())
    else:
        console = _console(stderr=False)
        for line in _ingest_summary(report, db):
            console.print(line, markup=False)
    for path in report.skipped_files:
        print(_plain(f"treellm: skipped a file of another type: {path}"), file=sys.stderr)
    for bad in report.bad_records:
        where = f"line {bad.line}" if bad.line is not None else f"record {bad.record}"
        print(_plain(f"treellm: skipped a bad record: {bad.path} {where}: {bad.reason}"), file=sys.stderr)
    for warning in report.warnings:
        print(_plain(f"treellm: warning: {warning}"), file=sys.stderr)
    return 0


def _ingest_summary(report: Any, db: str) -> list[str]:
    """The lines ``ingest`` prints for people: the counts, where the new spans went (they add up
    to the new spans), and the empty files."""
    lines = [
        f"{report.files} file(s) into {db}: {report.spans} new span(s), {report.runs} run(s), "
        f"{report.duplicates} duplicate(s), {report.skipped} torn line(s) skipped"
    ]
    a = report.accounting
    if a.spans:
        nowhere = "".join(f", {u.spans} placed nowhere ({u.reason})" for u in a.unplaced)
        lines.append(
            f"spans: {a.runs} run root(s), {a.nodes} node(s) ({a.tool_calls} tool call(s)), "
            f"{a.in_run} other span(s) in runs{nowhere}; {a.loop_events} caught call(s)"
        )
    lines.extend(f"empty file: {path}" for path in report.empty_files)
    return lines


def _cmd_export(args: argparse.Namespace) -> int:
    from treellm.store.maintenance import export_parquet

    counts = export_parquet(_db(args), args.parquet)
    _print_json({"parquet": args.parquet, **counts})
    return 0


def _cmd_gc(args: argparse.Namespace) -> int:
    from treellm.store.maintenance import gc, parse_age

    report = gc(_db(args), parse_age(args.older_than))
    _print_json({"runs": report.runs, "spans": report.spans, "bytes_before": report.bytes_before,
                 "bytes_after": report.bytes_after, "bytes_freed": report.bytes_freed,
                 "compacted": report.compacted})  # fmt: skip
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    from treellm.simulate import simulate
    from treellm.simulate.scenarios import write_scenario

    if args.scenario:
        spans = write_scenario(args.scenario, args.out, args.seed)
        _print_json({"out": args.out, "scenario": args.scenario, "spans": spans})
        return 0
    report = simulate(args.runs, args.seed, out=args.out, personas=args.persona or None)
    _print_json({"out": args.out, **report.to_json()})
    return 0


def _derive_options(args: argparse.Namespace) -> tuple[float, tuple[str, int] | None]:
    """``derive``'s checked options: (--compact-every in seconds, the /health address or None)."""
    from treellm.store.clickhouse_derive import COMPACT_EVERY_S

    compact_every = COMPACT_EVERY_S if args.compact_every is None else args.compact_every
    if args.wait < 0 or args.interval < 0 or compact_every < 0:
        raise ConfigError(
            "expected --wait, --interval and --compact-every of 0 seconds or more, got "
            f"{args.wait}, {args.interval} and {compact_every}"
        )
    if not args.health:
        return compact_every, None
    host, _, port = args.health.rpartition(":")
    if not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"expected --health as [HOST:]PORT, such as 9464 or 0.0.0.0:9464, got {args.health!r}")
    return compact_every, (host or "127.0.0.1", int(port))


def _cmd_derive(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from treellm.store.clickhouse import open_clickhouse
    from treellm.store.clickhouse_derive import DeriveHealth, DeriveReport, parse_shard, run_derive, serve_health

    shard = parse_shard(args.shard)
    compact_every, address = _derive_options(args)
    health = DeriveHealth(shard)
    ch = open_clickhouse(args.clickhouse, table=args.clickhouse_table, database=args.clickhouse_database)
    # On a terminal a bar of the traces derived against those due, spans/s and the lag, above which
    # each pass prints its line (to stdout: into a pipe when stdout is one); elsewhere only the
    # lines (rich draws nothing).
    bar = Progress(
        TextColumn("derive"), BarColumn(), MofNCompleteColumn(), TextColumn("traces, {task.fields[spans]}"),
        TimeElapsedColumn(), console=_console(), transient=True, disable=args.json,
        redirect_stdout=sys.stdout.isatty(),
    )  # fmt: skip
    task = bar.add_task("derive", total=None, spans="")
    derived = [0, 0]  # traces, spans

    def show(done: DeriveReport) -> None:
        health.record(done)
        derived[0] += done.traces
        derived[1] += done.spans
        elapsed = bar.tasks[task].elapsed or 0.0
        rate = f", {derived[1] / elapsed:,.0f} spans/s" if elapsed > 0 and derived[1] else ""
        bar.update(task, completed=derived[0], total=derived[0] + done.due,
                   spans=f"{derived[1]:,} spans{rate}, lag {done.lag_s:.1f}s")  # fmt: skip
        if args.json:
            payload = {k: getattr(done, k) for k in done.__slots__ if k != "bad_records"}
            _print_json({**payload, "bad_records": len(done.bad_records)})
            sys.stdout.flush()
        elif done.traces or args.once or done.due:
            print(done.line(), flush=True)
        for bad in done.bad_records[:20]:
            print(f"treellm: skipped a bad span: {bad.reason}", file=sys.stderr)

    def merged(tables: tuple[str, ...], problem: str | None) -> None:
        if problem is not None:
            print(f"treellm: could not merge the parts of treellm's tables in {ch.database}: {problem} (reads stay "
                  "right, only slower; grant OPTIMIZE on them, or pass --compact-every 0)",
                  file=sys.stderr, flush=True)  # fmt: skip
        elif tables:
            print(f"treellm: merged the parts of {len(tables)} table(s) in {ch.database}", file=sys.stderr, flush=True)

    server = None
    try:
        if address is not None:
            try:
                server = serve_health(health, *address)
            except OSError as exc:
                raise ConfigError(f"cannot serve /health on {args.health}: {exc.strerror or exc}") from None
            where = f"http://{address[0]}:{server.server_address[1]}/health"
            print(f"treellm: derive health on {where}", file=sys.stderr, flush=True)
        with bar:
            run_derive(ch, shard=shard, wait_s=args.wait, once=args.once, interval_s=args.interval, report=show,
                       compact_every_s=compact_every, compacted=merged)  # fmt: skip
    except KeyboardInterrupt:
        return 130
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        ch.close()
    return 0


def _source(args: argparse.Namespace) -> Any:
    """The source a reading command's options name (``store.sources``: Parquet, else ClickHouse,
    else the DuckDB file)."""
    from treellm.store.sources import choose_source

    return choose_source(
        db=args.db, parquet=args.parquet or (), clickhouse=args.clickhouse, table=args.clickhouse_table,
        database=args.clickhouse_database,
    )  # fmt: skip


def _reader(args: argparse.Namespace) -> Any:
    from treellm.store.sources import open_source

    src = _source(args)
    con = open_source(src)
    if src.kind == "clickhouse":
        from treellm.store.clickhouse import ClickHouseConnection
        from treellm.store.clickhouse_derive import underived

        assert isinstance(con, ClickHouseConnection)
        if behind := underived(con):
            print(
                f"treellm: {behind:,} trace(s) in {con.table} are not derived yet, so this reads without them: run "
                f"`treellm derive --clickhouse URL --clickhouse-table {src.table} --once` "
                "(or keep a derive worker running beside the Collector)",
                file=sys.stderr,
            )
    return con


def _filters(args: argparse.Namespace) -> Any:
    import datetime as dt

    from treellm.analysis.filters import Filters, moment

    now = dt.datetime.now(dt.UTC)

    def bound(flag: str, text: str | None) -> dt.datetime | None:
        if text is None:
            return None
        try:
            return moment(text, now)
        except ValueError as exc:
            raise ConfigError(f"{flag}: {exc}") from None

    since, until = bound("--since", args.since), bound("--until", args.until)
    return Filters(since, until, args.service, args.agent, args.model, args.tool)


def _cmd_report(args: argparse.Namespace) -> int:
    from treellm.analysis.report import report

    con = _reader(args)
    try:
        data = report(con, _filters(args))
    finally:
        con.close()
    if args.format == "json":
        _print_json(data)
        return 0
    _print_report(data)
    return 0


_REPORT_COLUMNS = (
    ("calls", "calls", "calls"),
    ("pruned", "pruned", "pruned"),
    ("prune_rate", "prune rate", "prune rate"),
    ("identical_repeats", "identical repeats", "ident. rep."),
    ("identical_wasted", "identical wasted", "ident. wasted"),
    ("exact_repeats", "exact repeats", "exact rep."),
    ("productive_repeats", "productive", "prod."),
    ("wasted_repeats", "wasted", "wasted"),
    ("unknown_repeats", "unknown", "unkn."),
    ("near_repeats", "near repeats", "near rep."),
)
"""The report's numbers per tool: (key, header, abbreviated header). Productive, wasted and
unknown are among the exact repeats; the identical wasted among the identical repeats."""
_REPORT_LEGEND = "ident.: identical; rep.: repeats; prod./wasted/unkn.: of the exact repeats"


def _report_cell(item: dict[str, Any], key: str) -> str:
    value = item[key]
    return f"{value:.1%}" if key == "prune_rate" else str(value)


def _report_table(data: dict[str, Any], names: list[Any], *, abbreviated: bool) -> tuple[Any, int]:
    """The report as one table, and the least width it needs: tool names never wrapped, headers
    wrapped between words, each column at least as wide as its longest word or value, one
    space between columns (so at that width nothing is cut)."""
    from rich import box
    from rich.table import Table

    from treellm.inspector import terminal_text

    title = f"{data['runs']} runs, {data['tool_calls']} tool calls, {data['pruned']} pruned"
    table = Table(
        title=title, caption=_REPORT_LEGEND if abbreviated else None, box=box.SIMPLE_HEAD,
        show_edge=False, padding=0,
    )  # fmt: skip
    widths = [max([n.cell_len for n in names] + [len("tool")])]
    table.add_column("tool", no_wrap=True, min_width=widths[0])
    for key, header, short in _REPORT_COLUMNS:
        shown = short if abbreviated else header
        widths.append(max([len(w) for w in shown.split()] + [len(_report_cell(item, key)) for item in data["tools"]]))
        table.add_column(shown, justify="right", min_width=widths[-1])
    for name, item in zip(names, data["tools"], strict=True):
        table.add_row(name, *[terminal_text(_report_cell(item, key)) for key, _, _ in _REPORT_COLUMNS])
    return table, sum(widths) + len(widths) - 1


def _report_renderable(data: dict[str, Any], width: int) -> Any:
    """The report for a terminal ``width`` columns wide, never cutting a tool name: a table with
    the full headers (wrapped between words) when it fits, else with abbreviated headers, else
    one block per tool (its name on a line of its own, folded only past the width, then its
    numbers, wrapped between them)."""
    from rich.console import Group
    from rich.padding import Padding
    from rich.text import Text

    from treellm.inspector import terminal_text

    names = [terminal_text(item["tool"]) for item in data["tools"]]
    for abbreviated in (False, True):
        table, needed = _report_table(data, names, abbreviated=abbreviated)
        if needed <= width:
            return table
    blocks: list[Any] = [Text(f"{data['runs']} runs, {data['tool_calls']} tool calls, {data['pruned']} pruned")]
    for name, item in zip(names, data["tools"], strict=True):
        name.overflow = "fold"
        name.stylize("bold")
        numbers = "  ".join(f"{header} {_report_cell(item, key)}" for key, header, _ in _REPORT_COLUMNS)
        blocks.extend([name, Padding(Text(numbers), (0, 0, 0, 2))])
    return Group(*blocks)


def _content_notes(data: dict[str, Any]) -> list[str]:
    """Per tool, the calls whose spans hold no arguments or no result, and per framework the
    switch that records them (empty when every call's content is known)."""
    lines: list[str] = []
    switches: dict[tuple[str, str], list[str]] = {}
    for item in data["tools"]:
        found = item.get("capture_switch")
        if not found:
            continue
        parts = []
        if item["arguments_unknown"]:
            parts.append(f"{item['arguments_unknown']} of {item['calls']} calls without arguments")
        if item["results_unknown"]:
            parts.append(f"{item['results_unknown']} without a result")
        lines.append(f"  {item['tool']}: {', '.join(parts)}")
        switches.setdefault((found["framework"], found["switch"]), []).append(item["tool"])
    if not lines:
        return []
    head = "Calls without arguments are never counted as repeats; a repeat without results has an unknown outcome:"
    tail = [f"  to record them ({framework}): {switch}" for (framework, switch) in switches]
    return [head, *lines, *tail]


def _internal_note(data: dict[str, Any]) -> list[str]:
    """The calls of framework-internal tools, which no count of the report includes (``treellm
    ingest`` counts them among its tool calls): one line naming each tool, empty when none."""
    if not data["internal_tools"]:
        return []
    tools = ", ".join(
        f"{item['tool']} ({item['calls']} call{'s' if item['calls'] != 1 else ''})" for item in data["internal_tools"]
    )
    return [
        f"Framework-internal tools are left out of every count: {tools}; "
        f"{settings.TREELLM_INTERNAL_TOOLS.name}, read when traces are ingested, names them."
    ]


def _print_report(data: dict[str, Any]) -> None:
    from treellm.inspector import terminal_text

    console = _console(stderr=False)
    console.print(_report_renderable(data, console.width))
    for line in [*_content_notes(data), *_internal_note(data)]:
        console.print(terminal_text(line))  # the notes name tools: a trace's text, shown as typed


def _cmd_tune(args: argparse.Namespace) -> int:
    from treellm.analysis.tuning import limits_toml, tuning_by_tool

    output = args.format or ("table" if sys.stdout.isatty() else "json")
    con = _reader(args)
    try:
        if output == "toml":
            frame = tuning_by_tool(
                con,
                _filters(args),
                tolerance=args.tolerance,
                min_samples=args.min_samples,
                min_productive=args.min_productive,
            )
            from treellm.analysis.rules import rules_by_tool

            print(_toml_safe(limits_toml(frame, rules=rules_by_tool(con, _filters(args)))), end="")
            return 0
        from treellm.analysis.report import tune

        data = tune(
            con,
            _filters(args),
            tolerance=args.tolerance,
            min_samples=args.min_samples,
            min_productive=args.min_productive,
        )
    finally:
        con.close()
    if output == "json":
        _print_json(data)
    else:
        _print_tune(data)
    return 0


def _print_tune(data: dict[str, Any]) -> None:
    """The tuning for people: a table of each tool's verdict and numbers, then why, one
    paragraph per tool (the reasons are long: a column of them would squeeze the rest)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from treellm.analysis.tuning import limit_text
    from treellm.inspector import terminal_text

    console = _console(stderr=False)
    table = Table(
        title=f"max_repeats per tool ({len(data['tools'])} tool(s))",
        caption="limit: the one the agent ran under; useful: productive share of repeats; saved: calls",
        box=box.SIMPLE_HEAD,
        collapse_padding=True,
        pad_edge=False,
    )
    table.add_column("tool", overflow="fold", ratio=1)
    table.add_column("verdict", no_wrap=True)
    for column in ("limit", "advised", "samples", "useful", "saved", "rules"):
        table.add_column(column, justify="right", no_wrap=True)
    for item in data["tools"]:
        current = item.get("current_max_repeats")
        rate = item.get("productive_rate")
        table.add_row(
            terminal_text(item["tool"]),
            terminal_text(item["verdict"]),
            terminal_text(limit_text(current if item.get("observed_limit") else None)),
            terminal_text(item.get("recommended_max_repeats")),
            terminal_text(item.get("samples")),
            terminal_text("" if rate is None or not math.isfinite(rate) else f"{rate:.0%}"),
            terminal_text(item.get("calls_saved")),
            terminal_text(sum(1 for rule in item.get("rules", []) if rule.get("advised")) or ""),
        )
    console.print(table)
    for item in data["tools"]:
        line = Text()
        line.append(terminal_text(item["tool"], "bold"))
        line.append(": ")
        line.append(terminal_text(item.get("reason")))
        console.print(line)
    print("JSON: --format json; the limits file: --format toml", file=sys.stderr)


def _toml_safe(document: str) -> str:
    """A TOML document with the characters a terminal acts on that TOML leaves raw (C1
    controls, line separators, bidirectional controls) written as ``\\uXXXX`` escapes: the
    same TOML (tomli_w escapes C0 itself, and puts any such tool name in a quoted string)."""
    return _TOML_RAW.sub(lambda m: f"\\u{ord(m.group()):04X}", document)


_TOML_RAW = re.compile(r"[\x80-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


_CLICKHOUSE_DATABASE_HELP = (
    "the database that holds treellm's views, created if absent (default $TREELLM_CLICKHOUSE_DATABASE or treellm)"
)


def _add_reader_options(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--db", type=_store_path, help="the store (default $TREELLM_DB or ./treellm.duckdb)")
    source.add_argument(
        "--parquet", nargs="+", type=_store_path, metavar="DIR", help="read `treellm export` folders instead"
    )
    source.add_argument(
        "--clickhouse",
        metavar="URL",
        help="read the OpenTelemetry Collector's ClickHouse table instead: http(s)://user:pass@host:8123 or "
        "chdb:PATH (embedded ClickHouse on a folder); default $TREELLM_CLICKHOUSE when --db is not given",
    )
    parser.add_argument(
        "--clickhouse-table", default="otel_traces", metavar="NAME", help="the spans table (default otel_traces)"
    )
    parser.add_argument("--clickhouse-database", metavar="NAME", help=_CLICKHOUSE_DATABASE_HELP)
    parser.add_argument(
        "--since", help="runs that started at or after this ISO date/time (naive: UTC), or this long ago: 7d, 12h"
    )
    parser.add_argument("--until", help="runs that started before this ISO date/time, or this long ago")
    parser.add_argument("--service", help="only this service")
    parser.add_argument("--agent", help="only this agent")
    parser.add_argument("--model", help="only this model")
    parser.add_argument("--tool", help="only this tool")


def _command(sub: Any, name: str, **options: Any) -> argparse.ArgumentParser:
    """A subcommand; its epilog (the example) keeps its line breaks."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name, formatter_class=argparse.RawDescriptionHelpFormatter, **options
    )
    return parser


# The names of treellm.derive.formats.FORMATS in detection order, spelled out because importing
# the store would slow every command's start; tests/test_store_formats.py checks them.
INPUT_FORMATS = (
    "auto", "otlp-jsonl", "sdk-jsonl", "otlp-json", "trajectory", "swe-agent", "sdk-json", "sdk-console", "otlp-proto",
)  # fmt: skip


def _add_data_commands(sub: Any) -> None:
    """ingest, export, gc, simulate, report and tune."""
    ingest = _command(
        sub,
        "ingest",
        help="ingest trace files (OTLP JSON lines or documents, OTLP protobuf, SDK span JSON, agent trajectories)",
        description=(
            "Ingest trace files into the DuckDB store, one transaction per file; re-ingesting adds nothing. "
            "Folders are walked. The store is --db, else $TREELLM_DB, else ./treellm.duckdb. With --clickhouse "
            "the spans go into the OpenTelemetry Collector's ClickHouse table instead, with the runs, trees, "
            "signatures and ordinals ingest derives (spans already in the table are not written again)."
        ),
        epilog=(
            "examples:\n  treellm ingest traces/*.jsonl --db runs.duckdb --json\n"
            "  treellm ingest trajectories/ --clickhouse http://localhost:8123 --clickhouse-table otel.otel_traces"
        ),
    )
    ingest.add_argument("paths", nargs="+", type=_store_path, metavar="PATH", help="files or folders")
    target = ingest.add_mutually_exclusive_group()
    target.add_argument("--db", type=_store_path, help="the store (default $TREELLM_DB or ./treellm.duckdb)")
    target.add_argument(
        "--clickhouse",
        metavar="URL",
        help="write into the Collector's ClickHouse table instead (created with the exporter's schema when "
        "missing): http(s)://user:pass@host:8123 or chdb:PATH",
    )
    ingest.add_argument(
        "--clickhouse-table", default="otel_traces", metavar="NAME", help="the spans table (default otel_traces)"
    )
    ingest.add_argument("--clickhouse-database", metavar="NAME", help=_CLICKHOUSE_DATABASE_HELP)
    ingest.add_argument(
        "--input-format",
        default="auto",
        choices=INPUT_FORMATS,
        help="the files' format (default: detect it)",
    )
    ingest.add_argument(
        "--skip-bad", action="store_true", help="keep the good records of a bad file, report each bad one"
    )
    ingest.add_argument("--json", action="store_true", help="print one JSON object with the counts")
    ingest.set_defaults(func=_cmd_ingest)

    derive = _command(
        sub,
        "derive",
        help="derive the spans the Collector wrote into ClickHouse: runs, trees, signatures, repeats",
        description=(
            "Read the spans that arrived in the OpenTelemetry Collector's ClickHouse table (treellm's own and "
            "other frameworks'), derive each trace once its last span is --wait seconds old, and write treellm's "
            "tables in its ClickHouse database, which report, tune and the dashboard read. A trace that gets a "
            "late span is derived again. Run it once (--once, e.g. from cron) or as a worker; N workers split "
            "the traces with --shard 0/N ... N-1/N. Restarting loses and duplicates nothing."
        ),
        epilog=(
            "examples:\n  treellm derive --clickhouse http://localhost:8123 --clickhouse-table otel.otel_traces\n"
            "  treellm derive --clickhouse chdb:./traces --once --wait 0"
        ),
    )
    derive.add_argument(
        "--clickhouse", metavar="URL", help="http(s)://user:pass@host:8123 or chdb:PATH (default $TREELLM_CLICKHOUSE)"
    )
    derive.add_argument(
        "--clickhouse-table", default="otel_traces", metavar="NAME", help="the spans table (default otel_traces)"
    )
    derive.add_argument("--clickhouse-database", metavar="NAME", help=_CLICKHOUSE_DATABASE_HELP)
    derive.add_argument("--once", action="store_true", help="derive every trace that is due, then exit")
    derive.add_argument("--shard", default="0/1", metavar="I/N", help="derive only shard I of N (default 0/1)")
    derive.add_argument(
        "--wait", type=float, default=10.0, metavar="SECONDS",
        help="the quiet window: derive a trace once its last span ended this long ago (default %(default)s)",
    )  # fmt: skip
    derive.add_argument(
        "--interval", type=float, default=2.0, metavar="SECONDS",
        help="how long a worker sleeps when nothing is due (default %(default)s)",
    )  # fmt: skip
    derive.add_argument(
        "--compact-every", type=float, metavar="SECONDS",
        help="once nothing is due, merge the parts of treellm's tables (so reads need not merge them) at most this "
        "often; --once merges at its end when it derived a tenth or more of every derived span; 0 never "
        "(default every 10 minutes)",
    )  # fmt: skip
    derive.add_argument(
        "--health", metavar="[HOST:]PORT",
        help="serve GET /health (totals, what is due, the lag) on HOST (default 127.0.0.1) and PORT while it runs",
    )  # fmt: skip
    derive.add_argument("--json", action="store_true", help="print one JSON object per pass")
    derive.set_defaults(func=_cmd_derive)

    export = _command(
        sub,
        "export",
        help="export the store's raw tables as hive-partitioned Parquet (by service and day)",
        description=(
            "Write spans, span_events and span_links as Parquet partitioned by service and day, which DuckDB, "
            "Spark, Trino or ClickHouse read; `treellm report --parquet DIR...` reads one or more such folders."
        ),
        epilog="example:\n  treellm export --db runs.duckdb --parquet warehouse/",
    )
    export.add_argument("--db", type=_store_path, help="the store (default $TREELLM_DB or ./treellm.duckdb)")
    export.add_argument("--parquet", required=True, type=_store_path, metavar="DIR", help="the folder to write")
    export.set_defaults(func=_cmd_export)

    gc = _command(
        sub,
        "gc",
        help="delete runs older than an age and reclaim space",
        description="Delete the runs that started longer ago than --older-than (with all their spans).",
        epilog="example:\n  treellm gc --db runs.duckdb --older-than 30d",
    )
    gc.add_argument("--db", type=_store_path, help="the store (default $TREELLM_DB or ./treellm.duckdb)")
    gc.add_argument("--older-than", required=True, help="an age such as 30d, 12h or 2w")
    gc.set_defaults(func=_cmd_gc)

    simulate = _command(
        sub,
        "simulate",
        help="simulate agent runs with planted behaviour and write them as OTLP JSON lines",
        description=(
            "Run simulated agents (a coding, a research and an ops persona) through the real executor and "
            "telemetry pipeline. The same seed gives the same bytes."
        ),
        epilog="example:\n  treellm simulate --runs 300 --seed 7 --out day.jsonl --persona coder --persona operator",
    )
    simulate.add_argument("--runs", type=int, default=100, help="number of runs (default %(default)s)")
    simulate.add_argument("--seed", type=int, default=0, help="the seed (default %(default)s)")
    simulate.add_argument("--out", required=True, type=_path, metavar="FILE.jsonl", help="the OTLP JSONL file to write")
    simulate.add_argument(
        "--persona",
        action="append",
        choices=["coder", "researcher", "operator"],
        help="persona(s) to run (default all)",
    )
    simulate.add_argument(
        "--scenario",
        choices=["branch_local_loop", "nudge_and_cache", "shadow_mode", "retries", "budget_exhausted", "skill_subtree"],
        help="write one small named scenario instead of persona runs",
    )
    simulate.set_defaults(func=_cmd_simulate)

    report = _command(
        sub,
        "report",
        help="per-tool calls, prunes, exact, productive, wasted and near repeats",
        description="Report runs, tool calls and prunes, and per tool: prune rate and repeat outcomes.",
        epilog="example:\n  treellm report --db runs.duckdb --service coding-agent --format json",
    )
    _add_reader_options(report)
    report.add_argument("--format", choices=["table", "json"], default="table", help="output (default %(default)s)")
    report.set_defaults(func=_cmd_report)

    tune = _command(
        sub,
        "tune",
        help="recommend each tool's max_repeats from the data (keep, raise, lower, mutates, insufficient_data)",
        description=(
            "Recommend each tool's limit: the smallest max_repeats whose loss of productive repeats stays "
            "within --tolerance. --format toml prints the limits file that TreeConfig.from_file and "
            "`treellm run --limits` load."
        ),
        epilog="example:\n  treellm tune --db runs.duckdb --format toml > limits.toml",
    )
    _add_reader_options(tune)
    tune.add_argument(
        "--format", choices=["table", "json", "toml"], help="output (default: table on a terminal, else json)"
    )
    tune.add_argument("--tolerance", type=float, default=0.05, help="acceptable loss (default %(default)s)")
    tune.add_argument("--min-samples", type=int, default=10, help="repeats needed for a verdict (default %(default)s)")
    tune.add_argument(
        "--min-productive",
        type=int,
        default=5,
        help="productive repeats needed to advise a raise (default %(default)s: fewer is chance, not a pattern)",
    )
    tune.set_defaults(func=_cmd_tune)


def _add_mcp_proxy_command(sub: Any) -> None:
    """mcp-proxy."""
    proxy = _command(
        sub,
        "mcp-proxy",
        help="serve an MCP server over stdio with its tool calls guarded against loops",
        description=(
            "An MCP server on stdin/stdout in front of the MCP server that the command after -- starts: "
            "everything passes through unchanged, and each tools/call goes through LoopGuard (one path per "
            "proxy run, i.e. per client session). A caught call never reaches the server: prune answers an "
            "error result, nudge and cache the guard's answer. Traces go to --trace, else to the OTEL_* "
            "variables' exporters."
        ),
        epilog=(
            "example:\n  treellm mcp-proxy --limits limits.toml --on-repeat nudge -- "
            "npx -y @modelcontextprotocol/server-filesystem ~/notes"
        ),
    )
    proxy.add_argument("--limits", type=_path, help="a TOML limits file, as `treellm tune` writes it (wins per tool)")
    proxy.add_argument(
        "--on-repeat",
        choices=["prune", "nudge", "cache"],
        default="prune",
        help="what a caught call gets (default %(default)s)",
    )
    proxy.add_argument(
        "--max-repeats", type=int, help="identical calls that may run per session (default: max_repeats_per_signature)"
    )
    proxy.add_argument(
        "--trace", type=_path, metavar="FILE.jsonl", help="append the session's spans to an OTLP JSONL file"
    )
    proxy.add_argument("--name", default="mcp-proxy", help="the agent's name in traces (default %(default)s)")
    proxy.add_argument("server", nargs=argparse.REMAINDER, metavar="-- COMMAND...", help="the MCP server's command")
    proxy.set_defaults(func=_cmd_mcp_proxy)


def _add_dashboard_command(sub: Any) -> None:
    dashboard = _command(
        sub,
        "dashboard",
        help="open the Streamlit dashboard on a store, Parquet folders or ClickHouse",
        description="Serve the dashboard (overview, run explorer, tree shapes, tools, tuning) on loopback.",
        epilog="example:\n  treellm dashboard --db runs.duckdb --port 8501\n"
        "  treellm dashboard --clickhouse chdb:./traces --clickhouse-table otel.otel_traces",
    )
    source = dashboard.add_mutually_exclusive_group()
    source.add_argument("--db", type=_store_path, help="the store (default $TREELLM_DB or ./treellm.duckdb)")
    source.add_argument(
        "--parquet", nargs="+", type=_store_path, metavar="DIR", help="read `treellm export` folders instead"
    )
    source.add_argument(
        "--clickhouse",
        metavar="URL",
        help="read the OpenTelemetry Collector's ClickHouse table instead: http(s)://user:pass@host:8123 or "
        "chdb:PATH (embedded ClickHouse on a folder); default $TREELLM_CLICKHOUSE when neither --db nor "
        "--parquet is given",
    )
    dashboard.add_argument(
        "--clickhouse-table", default="otel_traces", metavar="NAME", help="the spans table (default otel_traces)"
    )
    dashboard.add_argument("--clickhouse-database", metavar="NAME", help=_CLICKHOUSE_DATABASE_HELP)
    dashboard.add_argument(
        "--host", default="127.0.0.1", type=_host, help="address to listen on (default %(default)s: loopback)"
    )
    dashboard.add_argument("--port", type=int, default=8501, help="port (default %(default)s)")
    dashboard.set_defaults(func=_cmd_dashboard)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="treellm",
        description="Path-local loop detection, tracing and analysis for tree-shaped LLM agents.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"treellm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    sign = _command(
        sub,
        "sign",
        help="print the tree-llm signature and canonical JSON of a tool call",
        description="Print the tree-llm compatible signature of one tool call.",
        epilog='example:\n  treellm sign search \'{"query": "loop detection", "limit": 10}\'',
    )
    sign.add_argument("tool", help="tool name")
    sign.add_argument("arguments", help="the call's arguments as the model sent them (JSON text)")
    sign.set_defaults(func=_cmd_sign)

    run = _command(
        sub,
        "run",
        help="run a real agent against an OpenAI-compatible endpoint with safe read-only tools",
        description=(
            "Run TASK with a model behind an OpenAI-compatible Chat Completions endpoint (OpenAI, Gemini, "
            "Ollama, vLLM), with read-only tools under --root: read_file, list_dir, search_text, "
            "current_time. The live log and the tree go to stderr, the answer to stdout."
        ),
        epilog=(
            "example:\n  treellm run --base-url http://localhost:11434/v1 --model qwen2.5 --root . "
            "'What does this project do?'"
        ),
    )
    run.add_argument("task", help="what the agent should do")
    run.add_argument("--base-url", help="the endpoint, e.g. https://api.openai.com/v1 (env TREELLM_BASE_URL)")
    run.add_argument("--model", help="the model name (env TREELLM_MODEL)")
    run.add_argument(
        "--api-key-env",
        default="OPENAI_API_KEY",
        help="environment variable holding the API key (default %(default)s)",
    )
    run.add_argument(
        "--root", default=".", type=_path, help="the folder the tools may read (default: the current folder)"
    )
    run.add_argument("--limits", type=_path, help="a TOML limits file, as `treellm tune` writes it")
    run.add_argument("--branching", choices=["collapse", "fork"], help="how the tree continues after tool calls")
    run.add_argument("--node-budget", type=int, help="most nodes the run may create")
    run.add_argument("--shadow", action="store_true", help="run every call; only report would-be loops")
    run.add_argument("--timeout", type=float, default=60.0, help="seconds per request read (default %(default)s)")
    run.add_argument("--name", default="agent", help="the agent's name in traces (default %(default)s)")
    run.add_argument("--trace", type=_path, metavar="FILE.jsonl", help="append the run's spans to an OTLP JSONL file")
    run.set_defaults(func=_cmd_run)

    _add_mcp_proxy_command(sub)
    _add_data_commands(sub)

    demo = _command(
        sub,
        "demo",
        help="ingest the sample traces (or a fresh simulation), print the report and open the dashboard",
        description=(
            "Ingest sample_traces/ (or --runs N simulated runs) into the store (default ./treellm.duckdb), print the "
            "report and launch the dashboard, printing its URL. Works from any folder once treellm is installed."
        ),
        epilog="example:\n  treellm demo\n  treellm demo --runs 500 --no-dashboard",
    )
    demo.add_argument("--db", type=_store_path, help="the store (default $TREELLM_DB or ./treellm.duckdb)")
    demo.add_argument("--runs", type=int, default=0, help="simulate this many runs instead of the sample traces")
    demo.add_argument("--seed", type=int, default=7, help="seed of the simulation (default %(default)s)")
    demo.add_argument("--no-dashboard", action="store_true", help="print the report only (terminals and CI)")
    demo.add_argument("--tree", action="store_true", help="also draw a scripted run's tree in the terminal")
    demo.add_argument("--host", default="127.0.0.1", type=_host, help="dashboard address (default %(default)s)")
    demo.add_argument("--port", type=int, default=8501, help="dashboard port (default %(default)s)")
    demo.set_defaults(func=_cmd_demo)

    try:
        from treellm.collector.command import DESCRIPTION, EPILOG, add_arguments
    except MissingExtraError as missing:  # the core install: the command says what to install
        DESCRIPTION, EPILOG, error = str(missing), "", missing

        def add_arguments(parser: argparse.ArgumentParser) -> None:
            parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
            parser.set_defaults(missing_extra=error)

    collect = _command(
        sub,
        "collect",
        help="receive OTLP/HTTP traces on /v1/traces into the store (durable journal, live dashboard)",
        description=DESCRIPTION,
        epilog=EPILOG,
    )
    add_arguments(collect)
    collect.set_defaults(func=_cmd_collect)

    _add_dashboard_command(sub)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """The arguments; an option no command knows is refused with the usage of the command it
    was given to (``treellm report --bogus`` prints ``usage: treellm report ...``), exit 2."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        given = list(sys.argv[1:] if argv is None else argv)
        sub: Any = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        command = getattr(args, "command", None)
        after = given[given.index(command) + 1 :] if command in given else []
        if command in sub.choices and all(word in after for word in extra):
            sub.choices[command].error(f"unrecognized arguments: {' '.join(extra)}")
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


@contextmanager
def _interrupts() -> Iterator[threading.Event]:
    """While the command runs: an event set by Ctrl-C (SIGINT), which still raises
    KeyboardInterrupt as Python's own handler does. A library may turn that into an error
    of its own (DuckDB: ``RuntimeError: Query interrupted``); the event tells main it was
    Ctrl-C. Nothing changes off the main thread or where SIGINT is ignored."""
    seen = threading.Event()
    previous = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if previous is None or previous == signal.SIG_IGN:
        yield seen
        return

    def on_interrupt(signum: int, frame: FrameType | None) -> None:
        seen.set()
        if callable(previous):
            previous(signum, frame)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupted() -> int:
    print("treellm: interrupted", file=sys.stderr)
    return 130


def _closed_pipe() -> int:
    """stdout's reader went away (``treellm report --format json | head``): end quietly, with the
    status of a process that SIGPIPE ended (141). The rest of the output goes to /dev/null, so
    the interpreter's last flush at exit finds nothing to complain about."""
    stdout = sys.stdout
    if stdout is sys.__stdout__ and stdout is not None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stdout.fileno())
        os.close(devnull)
    return 141


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = _parse(parser, argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    with _interrupts() as interrupted:
        try:
            code = int(args.func(args))
            sys.stdout.flush()  # a closed pipe fails here, not in the interpreter's exit
            return code
        except KeyboardInterrupt:
            return _interrupted()
        except BrokenPipeError:
            return _closed_pipe()
        except Exception as exc:
            if interrupted.is_set():
                return _interrupted()
            if isinstance(exc, TreeLLMError):
                print(_plain(f"treellm: error: {mask_urls(str(exc))}"), file=sys.stderr)
                return 1
            named = _option_naming(parser, args, exc.filename) if isinstance(exc, OSError) else None
            if named is None:  # anything else than a file or folder an option names: ours, it propagates
                raise
            option, value = named
            strerror = exc.strerror if isinstance(exc, OSError) else None
            print(_plain(f"treellm: error: {option} {shown(value)}: {strerror or exc}"), file=sys.stderr)
            return 1
