"""Regenerate the small recorded traces under ``tests/data/frameworks/`` (runs 0-4 of the
scenario, one of each kind, per framework and, under ``shapes/``, per agent shape of
``SHAPES``) from the real frameworks:

    .venv/bin/python tests/frameworks/record.py                      # every framework and shape
    .venv/bin/python tests/frameworks/record.py langgraph            # one framework
    .venv/bin/python tests/frameworks/record.py langgraph:supervisor # one shape
    .venv/bin/python tests/frameworks/record.py strands@on           # content capture on

Each file is the Collector file exporter's protobuf framing (``--otlp-file``). With content
capture switched on (``@on``, the frameworks of ``CAPTURE_SWITCHED`` only) the trace goes
to ``capture/<name>.pb``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import CAPTURE_SWITCHED, ROOT, SHAPES, frameworks, run_driver, scenario_server

OUT = ROOT / "tests" / "data" / "frameworks"
RUNS = "0-4"


def record(name: str, shape: str = "default", capture: str = "default") -> Path:
    if capture != "default":
        target = OUT / "capture" / f"{name}.pb"
    else:
        target = OUT / f"{name}.pb" if shape == "default" else OUT / "shapes" / f"{name}-{shape}.pb"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    with scenario_server() as server:
        run_driver(name, server.base_url, otlp_file=target, runs=RUNS, shape=shape, capture=capture)
    return target


def _chosen(text: str) -> tuple[str, str, str]:
    text, _, capture = text.partition("@")
    name, _, shape = text.partition(":")
    return name, shape or "default", capture or "default"


def main(names: list[str]) -> None:
    everything = [
        *((n, "default", "default") for n in frameworks()),
        *((n, s, "default") for n, s in SHAPES),
        *((n, "default", "on") for n in CAPTURE_SWITCHED),
    ]
    for name, shape, capture in [_chosen(n) for n in names] or everything:
        target = record(name, shape, capture)
        print(f"{target.relative_to(ROOT)}: {target.stat().st_size} bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
