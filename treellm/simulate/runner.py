"""Run simulated workloads through the real executor and telemetry pipeline, deterministically.

The same seed gives the same bytes: ids from a seeded generator, time from a step
clock (each run starts at its own moment of a simulated day), no real waiting, async
tools only, a fixed resource per service (no host or process attributes), and a span
processor that writes each run's spans as one OTLP/JSON line when the run ends
(never on a timer).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.id_generator import IdGenerator

from treellm._version import __version__
from treellm.agent import TreeExecutor
from treellm.engine.executor import RunResult
from treellm.errors import ConfigError
from treellm.models.scripted import ScriptedModel
from treellm.otlp import traces_data_line
from treellm.simulate.personas import PERSONAS, persona_run
from treellm.telemetry.observer import TelemetryObserver
from treellm.telemetry.redaction import Capture

__all__ = ["SimulationReport", "simulate"]

DAY_START = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)
MODELS = {"coder": "sim-coder-1", "researcher": "sim-research-1", "operator": "sim-ops-1"}


class SeededIds(IdGenerator):
    """Trace and span ids from a seeded generator (never zero)."""

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)

    def generate_span_id(self) -> int:
        return self._random.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self._random.getrandbits(128) or 1


class StepClock:
    """A clock that advances a fixed step at each reading, from a given start."""

    def __init__(self, start_ns: int, step_ns: int = 1_700_000) -> None:
        self.now = start_ns
        self.step = step_ns

    def __call__(self) -> int:
        self.now += self.step
        return self.now


class RunCollector(SpanProcessor):
    """Collects finished spans; ``drain`` hands over the run's spans in end order."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)

    def drain(self) -> list[ReadableSpan]:
        spans, self.spans = self.spans, []
        return spans

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


@dataclass(slots=True)
class SimulationReport:
    runs: int = 0
    spans: int = 0
    seconds: float = 0.0
    outcomes: dict[str, int] = field(default_factory=dict)
    by_persona: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "spans": self.spans,
            "seconds": round(self.seconds, 3),
            "runs_per_s": round(self.runs / self.seconds, 1) if self.seconds else None,
            "spans_per_s": round(self.spans / self.seconds, 1) if self.seconds else None,
            "outcomes": dict(sorted(self.outcomes.items())),
            "by_persona": dict(sorted(self.by_persona.items())),
        }


def _pipelines(seed: int, personas: Sequence[str]) -> dict[str, tuple[TracerProvider, RunCollector]]:
    out = {}
    for index, name in enumerate(personas):
        resource = Resource(
            {
                "service.name": PERSONAS[name].service,
                "service.version": __version__,
                "telemetry.sdk.name": "opentelemetry",
                "telemetry.sdk.language": "python",
                "treellm.simulated": True,
            }
        )
        provider = TracerProvider(resource=resource, id_generator=SeededIds(seed * 1000 + index))
        collector = RunCollector()
        provider.add_span_processor(collector)
        out[name] = (provider, collector)
    return out


def _run_id(seed: int, run: int, name: str) -> Callable[[], str]:
    return lambda: f"sim-{seed}-{run:06d}-{name}"


def iter_runs(
    runs: int, seed: int, personas: Sequence[str] | None = None
) -> Iterator[tuple[str, RunResult, list[ReadableSpan]]]:
    """Run ``runs`` simulated runs (personas in turn) and yield each with its spans."""
    names = list(personas or PERSONAS)
    unknown = [n for n in names if n not in PERSONAS]
    if unknown:
        raise ConfigError(f"--persona: expected one of {', '.join(PERSONAS)}, got {', '.join(unknown)}")
    if runs < 0:
        raise ConfigError(f"--runs: expected a number >= 0, got {runs}")
    pipelines = _pipelines(seed, names)
    meter_provider = MeterProvider()
    capture = Capture("redacted")

    async def no_wait(_: float) -> None:
        return None

    day_ns = 86_400 * 10**9
    start_ns = int(DAY_START.timestamp()) * 10**9
    try:
        for run in range(runs):
            name = names[run % len(names)]
            spec = persona_run(name, seed, run)
            provider, collector = pipelines[name]
            observer = TelemetryObserver(provider, meter_provider, capture=capture)
            executor = TreeExecutor(
                ScriptedModel(spec.responder, model_name=MODELS[name]),
                spec.tools,
                spec.config,
                name=name,
                skills=spec.skills,
                observers=[observer],
                telemetry=False,
                clock=StepClock(start_ns + run * day_ns // max(runs, 1)),
                sleep=no_wait,
                run_ids=_run_id(seed, run, name),
            )
            result = executor.run(spec.task)
            yield name, result, collector.drain()
    finally:
        for provider, _ in pipelines.values():
            provider.shutdown()
        meter_provider.shutdown()


def simulate(
    runs: int, seed: int = 0, *, out: str | Path | None = None, personas: Sequence[str] | None = None
) -> SimulationReport:
    """Simulate ``runs`` runs and (when ``out`` is given) write them as OTLP JSON lines.

    The file is written afresh (not appended): the same arguments give the same bytes.
    """
    report = SimulationReport()
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        handle = stack.enter_context(Path(out).open("wb")) if out is not None else None
        for name, result, spans in iter_runs(runs, seed, personas):
            report.runs += 1
            report.spans += len(spans)
            report.outcomes[result.outcome] = report.outcomes.get(result.outcome, 0) + 1
            report.by_persona[name] = report.by_persona.get(name, 0) + 1
            if handle is not None and spans:
                handle.write(traces_data_line(spans))
    report.seconds = time.perf_counter() - t0
    return report
