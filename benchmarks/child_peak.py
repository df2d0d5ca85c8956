"""Run a command as a child process and read its peak RSS from /proc (``VmHWM``), which starts
afresh at exec (``getrusage`` would count the pages the fork inherited). Shared by the ingest
benchmarks, each of which runs ``treellm ingest`` as a whole command."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class ChildRun:
    seconds: float
    peak_mb: float  # VmHWM, sampled every 50 ms
    returncode: int
    out: str
    err: str


def run_with_peak(argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: Path = ROOT) -> ChildRun:
    """Run ``argv`` from ``cwd`` (the repository's root by default; ``python -m`` imports from it
    first, before ``PYTHONPATH``) with ``env`` (else this environment); its wall time, peak RSS and
    output."""
    t0 = time.perf_counter()
    with subprocess.Popen(
        list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
        env=None if env is None else dict(env),
    ) as child:  # fmt: skip
        peak_kb = 0
        status = Path(f"/proc/{child.pid}/status")
        while child.poll() is None:
            try:
                for line in status.read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        peak_kb = max(peak_kb, int(line.split()[1]))
            except OSError:
                break
            time.sleep(0.05)
        out, err = child.communicate()
    return ChildRun(time.perf_counter() - t0, peak_kb / 1024, child.returncode, out, err)
