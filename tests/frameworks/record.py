"""Regenerate the small recorded traces under ``tests/data/frameworks/`` (runs 0-4 of the
scenario, one of each kind, per framework and, under ``shapes/``, per agent shape of
``SHAPES``) from the real frameworks:

    .venv/bin/python tests/frameworks/record.py                      # every framework and shape
    .venv/bin/python tests/frameworks/record.py langgraph            # one framework
    .venv/bin/python tests/frameworks/record.py langgraph:supervisor # one shape

Each file is the Collector file exporter's protobuf framing (``--otlp-file``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import ROOT, SHAPES, frameworks, run_driver, scenario_server

OUT = ROOT / "tests" / "data" / "frameworks"
RUNS = "0-4"


def record(name: str, shape: str = "default") -> Path:
    target = OUT / f"{name}.pb" if shape == "default" else OUT / "shapes" / f"{name}-{shape}.pb"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    with scenario_server() as server:
        run_driver(name, server.base_url, otlp_file=target, runs=RUNS, shape=shape)
    return target


def main(names: list[str]) -> None:
    chosen = [tuple(n.split(":", 1)) if ":" in n else (n, "default") for n in names]
    for name, shape in chosen or [*((n, "default") for n in frameworks()), *SHAPES]:
        target = record(name, shape)
        print(f"{target.relative_to(ROOT)}: {target.stat().st_size} bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
