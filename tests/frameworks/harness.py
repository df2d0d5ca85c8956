"""The test side of the framework drivers (main virtual environment): the scripted server,
building a framework's environment when it is missing, and running its driver.

    with scenario_server() as server:
        run_driver("langgraph", server.base_url, otlp_file=tmp / "spans.pb")
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from openai_server import Call, OpenAIServer, Turn
from scenario import TRUTH, Responder, without_arguments

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def frameworks() -> list[str]:
    return sorted(p.parent.name for p in HERE.glob("*/requirements.txt"))


SHAPES: tuple[tuple[str, str], ...] = (
    ("agents", "handoff"),
    ("langgraph", "react"),
    ("langgraph", "stategraph"),
    ("langgraph", "subgraph"),
    ("langgraph", "supervisor"),
    ("smolagents", "managed"),
)
"""(framework, ``--shape``): the agent shapes other than each driver's default, each one
run per scripted run whatever its graph (see each driver's docstring)."""

CAPTURE_SWITCHED: tuple[str, ...] = ("adk", "autogen", "strands")
"""The frameworks whose driver's ``--capture on`` differs from the instrumentation as it comes
(a switch that records tool-call content, or where it records it): each is run, and recorded,
both ways. The other drivers' instrumentation records the content as it comes."""

WITHOUT_ARGUMENTS: frozenset[tuple[str, str]] = frozenset({("adk", "default"), ("autogen", "default")})
"""(framework, capture) whose tool spans hold no arguments: their truth is
``scenario.without_arguments`` (no repeat, every call's arguments unknown)."""


def _turn(reply: dict[str, Any]) -> Turn:
    if "calls" in reply:
        return Turn(tool_calls=[Call(name, arguments) for name, arguments in reply["calls"]])
    return Turn(text=reply["text"])


@contextlib.contextmanager
def scenario_server() -> Iterator[OpenAIServer]:
    """The fake model answering ``scenario.RUNS`` (fresh per-run turn counters)."""
    responder = Responder()
    with OpenAIServer(lambda body: _turn(responder.reply(body)), plain_json=True) as server:
        yield server


def framework_python(name: str) -> Path:
    """The framework's interpreter; builds its environment with make when it is missing."""
    python = ROOT / ".venv-fw" / name / "bin" / "python"
    stamp = ROOT / ".venv-fw" / name / ".installed"
    if not stamp.exists():
        subprocess.run(["make", "-C", str(ROOT), f".venv-fw/{name}/.installed"], check=True)
    return python


def run_driver(
    name: str,
    base_url: str,
    *,
    otlp_endpoint: str | None = None,
    otlp_file: Path | None = None,
    console_file: Path | None = None,
    runs: str = "0-24",
    shape: str = "default",
    capture: str = "default",
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """Run ``tests/frameworks/<name>/drive.py`` (building the agent of ``shape``, with the
    framework's content capture as it comes or ``capture="on"``); raises with its output when
    it fails."""
    command = [str(framework_python(name)), str(HERE / name / "drive.py"), "--base-url", base_url, "--runs", runs]
    command += ["--shape", shape, "--capture", capture]
    if otlp_endpoint:
        command += ["--otlp-endpoint", otlp_endpoint]
    elif otlp_file:
        command += ["--otlp-file", str(otlp_file)]
    elif console_file:
        command += ["--console-file", str(console_file)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TREELLM_"))}
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{name} driver failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


def truth(name: str, capture: str = "default", of: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a correct import of ``name``'s traces says (``of``: the truth of the runs played, all
    by default): the script's, without arguments where its spans hold none."""
    found = TRUTH if of is None else of
    return without_arguments(found) if (name, capture) in WITHOUT_ARGUMENTS else dict(found)


def figures(con: Any) -> dict[str, Any]:
    """What treellm says of a store, in the shape of ``scenario.TRUTH``."""
    from treellm.analysis import content_by_tool, near_repeat_pairs, repeat_outcome_by_tool, totals, tuning_by_tool

    counted = totals(con)
    calls = dict(
        con.execute(
            "SELECT tool, count(*) FROM tool_calls WHERE NOT internal AND run_id IS NOT NULL GROUP BY tool"
        ).fetchall()
    )
    outcomes = repeat_outcome_by_tool(con).groupby("tool")[["repeats", "productive", "wasted"]].sum()
    pairs = near_repeat_pairs(con)
    paging = pairs[pairs["kind"] == "paging"].groupby("tool").size() if not pairs.empty else {}
    tuning = tuning_by_tool(con)
    return {
        "runs": counted["runs"],
        "calls": counted["tool_calls"],
        "calls_by_tool": {str(k): int(v) for k, v in calls.items()},
        "repeats_by_tool": {str(k): int(v) for k, v in outcomes["repeats"].items()},
        "productive_by_tool": {str(k): int(v) for k, v in outcomes["productive"].items()},
        "wasted_by_tool": {str(k): int(v) for k, v in outcomes["wasted"].items()},
        "paging_by_tool": {str(k): int(v) for k, v in dict(paging).items()},
        "verdicts": {str(r.tool): str(r.verdict) for r in tuning.itertuples() if r.samples},
        "arguments_unknown_by_tool": {
            str(r.tool): int(r.arguments_unknown) for r in content_by_tool(con).itertuples() if r.arguments_unknown
        },
    }
