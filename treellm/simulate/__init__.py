"""Simulated agent workloads with planted, known behaviour per tool.

``simulate(runs, seed, out=...)`` runs the personas through the real executor and
telemetry pipeline and writes OTLP JSON lines; ``PLANTED`` is the truth per tool (the
verdict the tuning should reach), documented in the README.
"""

from pathlib import Path

from treellm.simulate.personas import PERSONAS, PLANTED, Persona, PlantedTool, Verdict
from treellm.simulate.runner import SimulationReport, iter_runs, simulate

__all__ = [
    "PERSONAS",
    "PLANTED",
    "Persona",
    "PlantedTool",
    "SimulationReport",
    "Verdict",
    "iter_runs",
    "sample_traces_dir",
    "simulate",
]


def sample_traces_dir() -> Path:
    """The shipped ``sample_traces/`` folder (inside the installed package, or the repository's)."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "sample_traces", package.parent / "sample_traces"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("sample_traces/ is missing from this installation")
