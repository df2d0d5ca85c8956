"""The core install: ``pip install treellm`` with no extras gives the detector, executor, guard,
the adapters' glue, the OpenTelemetry SDK and the JSONL exporter, and nothing heavy.

A fresh virtual environment gets the wheel built from this tree and its dependencies from the
wheelhouse the Makefile fills (``make wheelhouse``: pinned by constraints.txt), offline.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHEELHOUSE = ROOT / ".wheelhouse"
HEAVY = {"duckdb", "pandas", "numpy", "pyarrow", "streamlit", "altair", "igraph", "openai", "starlette", "uvicorn"}

SCRIPT = textwrap.dedent(
    """
    import json, subprocess, sys
    import treellm
    from treellm import LoopGuard, configure
    import treellm.integrations.langgraph  # an adapter's glue imports without its framework
    import treellm.integrations.openai_agents
    import treellm.integrations.pydantic_ai
    import treellm.integrations.smolagents


    provider = configure(service_name="slim", jsonl=sys.argv[1])
    guard = LoopGuard(limits={"search": 1})
    first = guard.check("search", {"q": "x"}, path="c1")
    guard.record("search", {"q": "x"}, "3 results", path="c1")
    second = guard.check("search", {"q": "x"}, path="c1")
    guard.end(path="c1")
    provider.force_flush()
    try:
        import treellm.store
    except treellm.MissingExtraError as exc:
        store_error = str(exc)
    else:
        store_error = ""
    try:
        treellm.OpenAICompatibleModel
    except treellm.MissingExtraError as exc:
        openai_error = str(exc)
    else:
        openai_error = ""
    cli = subprocess.run([sys.executable, "-m", "treellm", "ingest", sys.argv[1]], capture_output=True, text=True)
    print(json.dumps({"allowed": [first.allowed, second.allowed], "store": store_error, "openai": openai_error,
                      "cli": [cli.returncode, cli.stderr.strip().splitlines()]}))
    """
)


def _ensure_wheelhouse() -> None:
    if not (WHEELHOUSE / ".complete").exists():
        subprocess.run(["make", "-C", str(ROOT), "wheelhouse"], check=True)


def test_the_core_install_runs_the_guard_an_adapter_and_jsonl_without_the_extras(tmp_path: Path) -> None:
    _ensure_wheelhouse()
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(dist),
         str(ROOT)],
        check=True,
    )  # fmt: skip
    env_dir = tmp_path / "core"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index",
         "--find-links", str(WHEELHOUSE), "--find-links", str(dist), "treellm"],
        check=True,
    )  # fmt: skip
    frozen = subprocess.run([str(python), "-m", "pip", "freeze"], capture_output=True, text=True, check=True).stdout
    installed = {line.split("==")[0].lower() for line in frozen.splitlines()}
    assert not installed & HEAVY, installed & HEAVY
    trace = tmp_path / "spans.jsonl"
    done = subprocess.run([str(python), "-c", SCRIPT, str(trace)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["allowed"] == [True, False]
    assert "pip install 'treellm[store]'" in out["store"]
    assert "pip install 'treellm[openai]'" in out["openai"]
    code, lines = out["cli"]
    assert code != 0 and len(lines) == 1 and "treellm[store]" in lines[0]  # one clear line, no traceback
    spans = [json.loads(line) for line in trace.read_text(encoding="utf-8").splitlines()]
    assert spans and all("resourceSpans" in s for s in spans)
