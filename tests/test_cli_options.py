"""Every option that takes text, given hostile values: an error or a result, never a traceback or a password.

The walk is built from the parser itself (:func:`treellm.cli.build_parser`): every subcommand,
every option and positional that takes a value not parsed as a number, so an option added later
is walked too. Each command runs for real against a small store made here (a DuckDB
file and a chDB folder holding one ingested trace), with every other option valid, once per
hostile value.

Each command's cases run in one child process that calls :func:`treellm.cli.main` in-process
case after case (``child``): fast, and the global state some commands set (the OpenTelemetry
provider, signal handlers, the current folder, ``os.execve`` replaced so the dashboard is not
started) stays out of the test process. The child's current folder is two levels inside the
scratch folder, so ``../../etc/passwd`` stays in it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from treellm.cli import build_parser

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
DATA = TESTS / "data" / "external" / "any-agent-OPENAI_trace.json"
SECRET = "S3cretPW"
HOSTILE = (
    "\\",
    "x;y",
    "'",
    "%",
    "\x00",
    "",
    "x" * 5000,
    "../../etc/passwd",
    f"http://treellm:{SECRET}@127.0.0.1:1",
    f"http://treellm:{SECRET}#x@127.0.0.1:1",
)
# (command, option) whose value the command's result on stdout repeats as given (sign prints the
# call it signs): a password typed there comes back on stdout, and only there.
ECHOED = {("sign", "tool"), ("sign", "arguments")}
# The filters whose text also goes to chDB as a query parameter (one path for every text
# parameter, so a call filter and a run filter stand for the rest; each case costs a second).
OVER_CHDB = {("report", "--tool"), ("report", "--service"), ("tune", "--tool")}


def text_options() -> dict[str, list[argparse.Action]]:
    """Every subcommand's options and positionals that take text: any that takes a value and is
    not parsed as a number (no type, ``str``, ``Path`` or one of the CLI's checks of a text)."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: dict[str, list[argparse.Action]] = {}
    for name, command in sub.choices.items():
        found[name] = [
            action
            for action in command._actions
            if action.nargs != 0 and action.type not in (int, float) and action.dest != "help"
        ]
    return found


def option_name(action: argparse.Action) -> str:
    return action.option_strings[-1] if action.option_strings else action.dest


# -- the child: one command's cases, in-process ----------------------------------------------------------


@dataclass(frozen=True)
class Context:
    """The scratch folder: a DuckDB store and a chDB folder, each holding one ingested trace."""

    folder: Path

    @property
    def store(self) -> str:
        return str(self.folder / "store.duckdb")

    @property
    def chdb(self) -> str:
        return f"chdb:{self.folder / 'chdb'}"

    def work(self, command: str) -> Path:
        """The child's current folder for ``command`` (two levels down: ``../../etc/passwd`` stays inside)."""
        return self.folder / f"work-{command}" / "a" / "b"


def base_arguments(
    command: str, option: str, ctx: Context, extra: dict[str, str], *, over_chdb: bool
) -> tuple[list[str], dict[str, Any]]:
    """The positionals (in order) and options of a valid ``command`` around the tested ``option``
    (``None``: a flag); ``over_chdb`` reads the chDB folder instead of the DuckDB store."""
    fresh = str(ctx.folder / "fresh.duckdb")
    reader: dict[str, Any] = {"--db": ctx.store, "--format": "json"}
    if over_chdb or option in ("--clickhouse-table", "--clickhouse-database"):
        reader = {"--clickhouse": ctx.chdb, "--format": "json"}
    if option in ("--clickhouse", "--parquet"):  # the tested source replaces the store
        reader = {"--format": "json"}
    bases: dict[str, tuple[list[str], dict[str, Any]]] = {
        "sign": (["search", "{}"], {}),
        "run": (["say done"], {"--base-url": extra.get("base_url", ""), "--model": "m", "--root": str(ctx.folder),
                               "--api-key-env": "TREELLM_TEST_KEY"}),
        "mcp-proxy": ([], {}),
        "ingest": ([str(DATA)], {"--db": fresh, "--json": None}),
        "export": ([], {"--db": ctx.store, "--parquet": str(ctx.folder / "parquet")}),
        "gc": ([], {"--db": str(ctx.folder / "gc.duckdb"), "--older-than": "36500d"}),
        "simulate": ([], {"--runs": "1", "--out": str(ctx.folder / "sim.jsonl")}),
        "report": ([], reader),
        "tune": ([], reader),
        "demo": ([], {"--db": str(ctx.folder / "demo.duckdb")}),
        "collect": ([], {"--db": str(ctx.folder / "collect.duckdb"), "--port": "0"}),
        "derive": ([], {"--clickhouse": ctx.chdb, "--once": None, "--wait": "0"}),
        "dashboard": ([], {k: v for k, v in reader.items() if k != "--format"}),
    }  # fmt: skip
    positionals, options = bases[command]
    options = dict(options)
    if command == "ingest" and option in ("--clickhouse", "--clickhouse-table", "--clickhouse-database"):
        options.pop("--db")
        if option != "--clickhouse":
            options["--clickhouse"] = ctx.chdb
    return positionals, options


def case_argv(command: str, action: argparse.Action, value: str, ctx: Context, extra: dict[str, str],
              *, over_chdb: bool = False) -> list[str]:  # fmt: skip
    name = option_name(action)
    positionals, options = base_arguments(command, name, ctx, extra, over_chdb=over_chdb)
    if action.option_strings:
        options[name] = [value] if action.nargs == "+" else value
    else:
        index = [a.dest for a in text_options()[command] if not a.option_strings].index(name)
        positionals = list(positionals)
        if index < len(positionals):
            positionals[index] = value
        else:
            positionals.append(value)
    argv = [command]
    for key, given in options.items():
        if given is None:
            argv.append(key)
        elif isinstance(given, list):
            argv += [key, *given]
        else:
            argv += [key, given]
    if command == "mcp-proxy":  # the server's command: the value, or one that exits at once
        return [*argv, "--", value if not action.option_strings else "true"]
    return [*argv, "--", *positionals] if positionals else argv


def cases(command: str, ctx: Context, extra: dict[str, str]) -> Iterator[tuple[str, str, list[str]]]:
    for action in text_options()[command]:
        name = option_name(action)
        for over_chdb in (False, True) if (command, name) in OVER_CHDB else (False,):
            for value in HOSTILE:
                label = f"{name}{' over chDB' if over_chdb else ''}"
                yield label, value, case_argv(command, action, value, ctx, extra, over_chdb=over_chdb)


def _run_case(argv: list[str], out: Path) -> dict[str, Any]:
    from treellm.cli import main

    stdout_path, stderr_path = out / "stdout", out / "stderr"
    saved = sys.stdout, sys.stderr, sys.stdin
    escaped = None
    with stdout_path.open("w") as stdout, stderr_path.open("w") as stderr, open(os.devnull) as stdin:
        sys.stdout, sys.stderr, sys.stdin = stdout, stderr, stdin
        try:
            code: Any = main(argv)
        except SystemExit as exc:  # argparse refusing a value: exit 2
            code = 0 if exc.code is None else exc.code
        except Exception:  # noqa: BLE001  # what the test looks for: anything escaping main is a traceback
            code = None
            escaped = traceback.format_exc()
        finally:
            sys.stdout, sys.stderr, sys.stdin = saved
    return {"code": code, "escaped": escaped, "stdout": stdout_path.read_text(errors="replace"),
            "stderr": stderr_path.read_text(errors="replace")}  # fmt: skip


def child(command: str, folder: str, results: str) -> None:
    """Run ``command``'s cases in this process; write what each did to ``results`` (JSON)."""
    ctx = Context(Path(folder))
    ctx.work(command).mkdir(parents=True, exist_ok=True)
    os.chdir(ctx.work(command))
    os.execve = lambda *args: None  # type: ignore[assignment]  # the dashboard: not started
    from treellm.collector import command as collect_command

    def announce(db: Path) -> Any:
        return lambda url: signal.raise_signal(signal.SIGINT)  # listening: stop at once, as Ctrl-C

    collect_command._announce = announce  # type: ignore[attr-defined]
    extra: dict[str, str] = {}
    server = None
    if command == "run":
        from openai_server import OpenAIServer, Turn

        server = OpenAIServer(lambda body: Turn(text="done")).start()
        extra["base_url"] = server.base_url
    out = ctx.folder / f"out-{command}"
    out.mkdir(exist_ok=True)
    done = []
    try:
        for label, value, argv in cases(command, ctx, extra):
            done.append({"option": label, "value": value[:40], "argv": argv, **_run_case(argv, out)})
    finally:
        if server is not None:
            server.stop()
    Path(results).write_text(json.dumps(done))


# -- the tests -----------------------------------------------------------------------------------------


def test_the_walk_finds_every_kind_of_text_option() -> None:
    """Options checked by a type of the CLI's own (paths, hosts) are walked too, not only untyped ones."""
    walked = {(command, option_name(action)) for command, actions in text_options().items() for action in actions}
    expected = {("sign", "tool"), ("run", "--base-url"), ("run", "--trace"), ("mcp-proxy", "server"),
                ("ingest", "paths"), ("ingest", "--clickhouse-table"), ("export", "--parquet"), ("gc", "--older-than"),
                ("simulate", "--out"), ("report", "--tool"), ("tune", "--clickhouse"), ("demo", "--db"),
                ("demo", "--host"), ("collect", "--journal-dir"), ("dashboard", "--host")}  # fmt: skip
    assert expected <= walked, expected - walked
    assert not {(c, o) for c, o in walked if o in ("--port", "--runs", "--timeout", "--max-connections")}


@pytest.mark.parametrize("value", ["\\", "a\\tb", "\t", "\n", "'", "\\N", "a\\", "%", "x;y", "\x00", ""])
def test_a_text_parameter_reaches_chdb_as_written(context: Context, value: str) -> None:
    """chDB reads a String parameter in ClickHouse's escaped format: ``\\`` is escaped, not an
    escape sequence (``--tool '\\'`` was a traceback, ``a\\tb`` matched a tab)."""
    from treellm.store.clickhouse import open_clickhouse

    con = open_clickhouse(context.chdb)
    try:
        frame = con.df("SELECT ? AS text, ? AS texts", [value, [value, "b"]])
    finally:
        con.close()
    assert frame["text"][0] == value and list(frame["texts"][0]) == [value, "b"]


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> Context:
    ctx = Context(tmp_path_factory.mktemp("options"))
    for target in (["--db", ctx.store], ["--clickhouse", ctx.chdb]):
        done = subprocess.run([sys.executable, "-m", "treellm", "ingest", str(DATA), *target, "--json"],
                              capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
    return ctx


def child_environment(ctx: Context) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TREELLM_", "OTEL_"))}
    env.update({"TREELLM_DB": str(ctx.folder / "default.duckdb"), "TREELLM_TEST_KEY": "sk-test", "NO_COLOR": "1",
                "COLUMNS": "120", "OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none",
                "PYTHONPATH": os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])})  # fmt: skip
    return env


def _short(text: str) -> str:
    """A traceback's treellm frames and its last line, each cut to 200 characters."""
    lines = [line.strip() for line in text.strip().splitlines()]
    frames = [line for line in lines if line.startswith("File ") and "/treellm/" in line]
    return " | ".join(line[:200] for line in [*frames[-2:], lines[-1] if lines else ""])


def problems(command: str, results: list[dict[str, Any]]) -> list[str]:
    found = []
    for result in results:
        where = f"{command} {result['option']} {result['value']!r}"
        code = result["code"]
        if result["escaped"]:
            found.append(f"{where}: escaped main: {_short(result['escaped'])}")
            continue
        if not isinstance(code, int) or not 0 <= code < 128:
            found.append(f"{where}: exit code {code!r}")
        if "Traceback" in result["stderr"] or "Traceback" in result["stdout"]:
            found.append(f"{where}: a traceback on stderr: {_short(result['stderr'])}")
        if SECRET in result["stderr"]:
            found.append(f"{where}: the password on stderr: {result['stderr'][-300:]}")
        if SECRET in result["stdout"] and (command, result["option"].split()[0]) not in ECHOED:
            found.append(f"{where}: the password on stdout: {result['stdout'][-300:]}")
    return found


@pytest.mark.parametrize("command", sorted(text_options()))
def test_hostile_values_of_every_text_option_give_an_error_or_a_result(command: str, context: Context) -> None:
    """Each value: exit 0 or a clean non-zero, no traceback anywhere, no password echoed."""
    results = context.folder / f"results-{command}.json"
    code = f"from test_cli_options import child; child({command!r}, {str(context.folder)!r}, {str(results)!r})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False,
                          env=child_environment(context), cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    walked = json.loads(results.read_text())
    assert len(walked) >= len(HOSTILE) * len(text_options()[command])
    if command != "mcp-proxy":  # its stand-in server exits at once: the proxy may say so with exit 1
        assert any(result["code"] == 0 for result in walked), "no case did the command's work"
    found = problems(command, walked)
    assert SECRET not in done.stderr, done.stderr[-2000:]
    assert not found, "\n".join(found)
