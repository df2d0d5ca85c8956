"""Simulation throughput: 1,000 simulated runs through the real executor and telemetry pipeline.

Run: .venv/bin/python benchmarks/bench_simulate.py [--runs 1000]
Prints runs/s and spans/s, with the same runs without telemetry beside them (the ratio is the
cost of the pipeline: observer, SDK spans, OTLP/JSON encoding).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from treellm.agent import TreeExecutor
from treellm.models.scripted import ScriptedModel
from treellm.simulate import simulate
from treellm.simulate.personas import PERSONAS, persona_run
from treellm.simulate.runner import MODELS


def bare(runs: int, seed: int) -> float:
    names = list(PERSONAS)

    async def no_wait(_: float) -> None:
        return None

    t0 = time.perf_counter()
    for run in range(runs):
        name = names[run % len(names)]
        spec = persona_run(name, seed, run)
        TreeExecutor(
            ScriptedModel(spec.responder, model_name=MODELS[name]), spec.tools, spec.config, name=name,
            skills=spec.skills, telemetry=False, sleep=no_wait,
        ).run(spec.task)  # fmt: skip
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sim.jsonl"
        report = simulate(args.runs, 7, out=out)
        size = out.stat().st_size
    untraced = bare(args.runs, 7)
    print(f"{args.runs} simulated runs, {report.spans} spans, {size / 1e6:.1f} MB of OTLP JSON lines")
    print(f"{'configuration':44} {'seconds':>8} {'runs/s':>8} {'spans/s':>9} {'ratio':>6}")
    print(f"{'executor only (telemetry=False)':44} {untraced:8.2f} {args.runs / untraced:8.0f} {'':>9} {1.0:6.2f}")
    print(f"{'simulate: executor + telemetry + JSONL':44} {report.seconds:8.2f} {args.runs / report.seconds:8.0f} "
          f"{report.spans / report.seconds:9.0f} {report.seconds / untraced:6.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
