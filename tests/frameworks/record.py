"""Regenerate the small recorded traces under ``tests/data/frameworks/`` (runs 0-4 of the
scenario, one of each kind, per framework) from the real frameworks:

    .venv/bin/python tests/frameworks/record.py            # every framework
    .venv/bin/python tests/frameworks/record.py langgraph  # one

Each file is the Collector file exporter's protobuf framing (``--otlp-file``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import ROOT, frameworks, run_driver, scenario_server

OUT = ROOT / "tests" / "data" / "frameworks"
RUNS = "0-4"


def main(names: list[str]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name in names or frameworks():
        target = OUT / f"{name}.pb"
        target.unlink(missing_ok=True)
        with scenario_server() as server:
            run_driver(name, server.base_url, otlp_file=target, runs=RUNS)
        print(f"{target.relative_to(ROOT)}: {target.stat().st_size} bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
