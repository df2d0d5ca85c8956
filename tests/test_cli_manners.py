"""The CLI's manners: strict JSON, a table for people, quiet pipes and Ctrl-C, the right usage, causes named.

Each test drives the real command (in-process through :func:`treellm.cli.main`, or as a child
process where a pipe, a signal or a terminal is the point) on stores built from tests/data/
and from ``treellm simulate`` output.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from treellm.cli import _print_json, build_parser, main

DATA = Path(__file__).parent / "data" / "external"
ENV = {k: v for k, v in os.environ.items() if not k.startswith(("TREELLM_", "OTEL_", "FORCE_COLOR", "TTY_COMPATIBLE"))}
# Commands whose every output is one JSON document, whatever the options; the others print JSON
# with --json or --format json (found on the parser below).
ALWAYS_JSON = {"sign", "export", "gc", "simulate"}


def strict(text: str) -> Any:
    """``text`` parsed as strict JSON: NaN, Infinity and -Infinity are refused."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def treellm(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "treellm", *args], capture_output=True, text=True, timeout=timeout,
                          env={**ENV, **(env or {})}, check=False)  # fmt: skip


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/data/external's traces and ten simulated runs (whose tuning holds a NaN) in one store."""
    folder = tmp_path_factory.mktemp("manners")
    simulated = folder / "simulated.jsonl"
    done = treellm("simulate", "--runs", "10", "--seed", "7", "--out", str(simulated))
    assert done.returncode == 0, done.stderr
    assert strict(done.stdout)["runs"] == 10
    db = folder / "store.duckdb"
    done = treellm("ingest", str(DATA), str(simulated), "--db", str(db), "--json")
    assert done.returncode == 0, done.stderr
    assert strict(done.stdout)["runs"] > 10
    return db


# -- strict JSON ---------------------------------------------------------------------------------------------


def json_commands() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = set(ALWAYS_JSON)
    for name, command in sub.choices.items():
        for action in command._actions:
            if "--json" in action.option_strings or ("--format" in action.option_strings and "json" in action.choices):
                found.add(name)
    return found


def test_every_json_output_parses_with_a_strict_parser(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(store)
    outputs: dict[str, list[str]] = {}

    def take(command: str, *args: str) -> None:
        code, out, err = run_main(capsys, command, *args)
        assert code == 0, err
        outputs.setdefault(command, []).append(out)

    take("sign", "search", '{"query": "loops", "limit": 10}')
    take("report", "--db", db, "--format", "json")
    take("tune", "--db", db, "--format", "json", "--min-samples", "1")  # a NaN in the analysis' frame
    take("tune", "--db", db, "--min-samples", "1")  # stdout is not a terminal: JSON
    take("ingest", str(DATA / "any-agent-OPENAI_trace.json"), "--db", str(tmp_path / "fresh.duckdb"), "--json")
    take("export", "--db", db, "--parquet", str(tmp_path / "parquet"))
    take("gc", "--db", str(tmp_path / "fresh.duckdb"), "--older-than", "36500d")
    done = treellm("simulate", "--scenario", "branch_local_loop", "--out", str(tmp_path / "scenario.jsonl"))
    assert done.returncode == 0, done.stderr
    outputs["simulate"] = [done.stdout]  # the persona runs' JSON: the store fixture parsed it strictly
    if "derive" in json_commands():  # ClickHouse's worker: one pass over a chDB folder
        chdb = f"chdb:{tmp_path / 'chdb'}"
        take("ingest", str(DATA / "any-agent-OPENAI_trace.json"), "--clickhouse", chdb, "--json")
        take("derive", "--clickhouse", chdb, "--once", "--wait", "0", "--json")

    assert json_commands() <= outputs.keys(), f"JSON output not checked here: {json_commands() - outputs.keys()}"
    for command, texts in outputs.items():
        for text in texts:
            assert text.count("\n") == 1 and text.endswith("\n"), (command, text[:200])
            strict(text)
    tuned = strict(outputs["tune"][0])["tools"]
    assert tuned == strict(outputs["tune"][1])["tools"]
    assert any(tool["mutating_tool"] is None for tool in tuned)


def test_nan_and_infinities_print_as_null(capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np

    _print_json({"a": math.nan, "b": [math.inf, -math.inf, 1.5], "c": (np.float64("nan"), 2), "d": "NaN"})
    assert strict(capsys.readouterr().out) == {"a": None, "b": [None, None, 1.5], "c": [None, 2], "d": "NaN"}


# -- tune: a table for people, JSON for pipes ----------------------------------------------------------------


def test_tune_prints_a_table_on_a_terminal_and_json_into_a_pipe(store: Path) -> None:
    import pty

    primary, secondary = pty.openpty()
    env = {**ENV, "COLUMNS": "160", "NO_COLOR": "1"}
    child = subprocess.Popen([sys.executable, "-m", "treellm", "tune", "--db", str(store), "--min-samples", "1"],
                             stdout=secondary, stderr=subprocess.PIPE, env=env)  # fmt: skip
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(primary)
    _, err = child.communicate(timeout=300)
    assert child.returncode == 0, err
    shown = b"".join(chunks).decode()
    assert "max_repeats per tool" in shown and "verdict" in shown and "advised" in shown
    assert not shown.lstrip().startswith("{")
    piped = treellm("tune", "--db", str(store), "--min-samples", "1")
    assert piped.returncode == 0, piped.stderr
    tools = strict(piped.stdout)["tools"]
    for tool in tools:
        assert tool["tool"] in shown and tool["verdict"] in shown  # the same tuning, as a table


def test_tune_format_table_prints_the_table_into_a_pipe_too(store: Path) -> None:
    done = treellm("tune", "--db", str(store), "--min-samples", "1", "--format", "table", env={"COLUMNS": "160"})
    assert done.returncode == 0, done.stderr
    assert "max_repeats per tool" in done.stdout and "lower" in done.stdout


# -- a closed pipe and Ctrl-C --------------------------------------------------------------------------------


def test_a_pipe_closed_before_the_output_ends_quietly_with_141(store: Path) -> None:
    """The reader is gone before the command writes (``| head -c 0``): no BrokenPipeError, no
    'Exception ignored' at exit, the status of a process SIGPIPE ended."""
    child = subprocess.Popen([sys.executable, "-m", "treellm", "report", "--db", str(store), "--format", "json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)  # fmt: skip
    assert child.stdout is not None
    child.stdout.close()  # the only reader: every write of the child now fails with EPIPE
    _, err = child.communicate(timeout=300)
    assert child.returncode == 141, err
    assert err == b""


def test_report_json_into_head_ends_quietly(store: Path) -> None:
    command = f"{sys.executable} -m treellm report --db {store} --format json | head -c 10"
    done = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, timeout=300,
                          env=ENV, check=False)  # fmt: skip
    assert done.returncode in (0, 141), done.stderr
    assert len(done.stdout) == 10 and done.stdout.startswith('{"runs": ')
    assert done.stderr == ""


def _distinct_copies(source: Path, folder: Path, count: int) -> None:
    """``count`` copies of an OTLP JSONL file whose trace ids differ (so none is a duplicate)."""
    text = source.read_text()
    folder.mkdir()
    for index in range(count):
        copy = re.sub(r'("traceId": ?")[0-9a-f]{2}', rf"\g<1>{index:02x}", text)
        (folder / f"part{index}.jsonl").write_text(copy)


def test_ctrl_c_during_ingest_exits_130_with_one_line_and_the_store_stays_readable(tmp_path: Path) -> None:
    simulated = tmp_path / "simulated.jsonl"
    made = treellm("simulate", "--runs", "150", "--seed", "3", "--out", str(simulated))
    assert made.returncode == 0, made.stderr
    per_file = strict(made.stdout)["spans"]
    _distinct_copies(simulated, tmp_path / "parts", 8)
    db = tmp_path / "store.duckdb"
    # TTY_COMPATIBLE: rich draws its live progress bar into the pipe, which names the file being ingested
    env = {**ENV, "TTY_COMPATIBLE": "1", "NO_COLOR": "1", "COLUMNS": "200"}
    # SIGINT as a terminal's Ctrl-C finds it, even when this test runs where SIGINT is ignored (a
    # background job): Python then installs its handler in the child. No other thread runs yet.
    child = subprocess.Popen([sys.executable, "-m", "treellm", "ingest", str(tmp_path / "parts"), "--db", str(db)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # noqa: PLW1509  # fmt: skip
    assert child.stderr is not None and child.stdout is not None
    err = bytearray()
    stderr = child.stderr

    def read() -> None:
        while chunk := os.read(stderr.fileno(), 4096):
            err.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 300
    while b"part1.jsonl" not in err:  # the event: the first file is in, the second one started
        assert child.poll() is None, f"ingest ended before the second file: {err.decode(errors='replace')}"
        assert time.monotonic() < deadline, "the second file never started"
        time.sleep(0.01)
    child.send_signal(signal.SIGINT)
    out = child.stdout.read().decode()
    code = child.wait(timeout=300)
    reader.join(timeout=60)
    child.stdout.close()
    child.stderr.close()
    text = err.decode(errors="replace")
    assert code == 130, text[-2000:]
    assert "Traceback" not in text and "Error" not in text, text[-2000:]
    lines = [line.strip() for line in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).replace("\r", "\n").splitlines()]
    assert [line for line in lines if line.startswith("treellm")] == ["treellm: interrupted"], lines[-5:]
    assert out == ""

    from treellm.store import open_store

    con = open_store(db, read_only=True)
    try:
        row = con.execute("SELECT count(*) FROM spans").fetchone()
        runs = con.execute("SELECT count(*) FROM runs").fetchone()
    finally:
        con.close()
    assert row is not None and runs is not None
    assert row[0] >= per_file and row[0] % per_file == 0  # whole files only: the cut one rolled back
    report = treellm("report", "--db", str(db), "--format", "json")
    assert report.returncode == 0, report.stderr
    assert strict(report.stdout)["runs"] == runs[0]


# -- usage errors and causes ---------------------------------------------------------------------------------


def test_a_wrong_flag_prints_the_subcommands_usage(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["report", "--db", str(tmp_path / "x.duckdb"), "--bogus"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: treellm report ") and "treellm report: error: unrecognized arguments: --bogus" in err
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        if any(action.nargs == argparse.REMAINDER for action in command._actions):
            continue  # mcp-proxy: everything after it is the server's command line
        with pytest.raises(SystemExit) as exc:
            main([name, "--bogus"])
        assert exc.value.code == 2, name
        assert capsys.readouterr().err.startswith(f"usage: treellm {name}"), name


def test_a_flag_before_the_command_still_gets_the_top_level_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--bogus", "sign", "t", "{}"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.startswith("usage: treellm [-h]")


def test_run_against_a_closed_port_names_connection_refused(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed when the block ends: nothing listens there
    done = treellm("run", "--base-url", f"http://127.0.0.1:{port}/v1", "--model", "m", "--root", str(tmp_path),
                   "--api-key-env", "TREELLM_NO_SUCH_KEY", "--timeout", "5", "say hi")  # fmt: skip
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("treellm: run ended failed: model 'm' at http://127.0.0.1:")
    assert "connection failed: Connection refused" in last
    assert "✗ think failed: " in done.stderr and "ended by error: " in done.stderr


_PROGRESS_BAR_SETTINGS = """
import sys, duckdb
from treellm.store import open_store
from treellm.store.connection import connect_quietly
def bar(con):
    try:
        return con.execute("SELECT current_setting('enable_progress_bar')").fetchone()[0]
    finally:
        con.close()
db = sys.argv[1]
print([bar(duckdb.connect()), bar(open_store(db)), bar(open_store(db, read_only=True)), bar(connect_quietly())])
"""


def test_duckdb_draws_no_progress_bar_of_its_own_into_the_output(tmp_path: Path) -> None:
    """DuckDB's Python client draws a progress bar on stdout for any query past two seconds, terminal
    or not (``treellm report --json`` would carry it into the JSON): every connection treellm opens
    turns it off, and treellm says its own progress. In a process of its own with stdout a pipe, as a
    user's (pytest's own process starts with it off): a bare connection has the bar on, treellm's
    have it off."""
    done = subprocess.run([sys.executable, "-c", _PROGRESS_BAR_SETTINGS, str(tmp_path / "s.duckdb")],
                          check=False, capture_output=True, text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[True, False, False, False]"
