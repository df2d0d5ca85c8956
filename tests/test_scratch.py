"""Scratch folders: removed when their work ends, and the next process removes those a killed
one left behind (its process gone, the folder untouched for an hour), nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from treellm.store.scratch import STALE_S, scratch_folder, sweep

ENV = {**os.environ, "NO_COLOR": "1"}


def gone_pid() -> int:
    """The id of a process that has ended."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           check=True, capture_output=True, text=True)  # fmt: skip
    return int(child.stdout)


def left(root: Path, name: str, *, age_s: float) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "piece-0.jsonl").write_text("{}\n")
    then = time.time() - age_s
    os.utime(folder, (then, then))
    return folder


def test_only_a_gone_processs_old_scratch_folders_are_removed(tmp_path: Path) -> None:
    dead = gone_pid()
    running = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        old = STALE_S + 60
        removed = [left(tmp_path, f"treellm-pieces-{dead}-ab12", age_s=old),
                   left(tmp_path, f"treellm-ch-ingest-{dead}-x_9", age_s=old)]  # fmt: skip
        kept = [
            left(tmp_path, f"treellm-derive-{dead}-cd34", age_s=60),  # gone, but touched a minute ago
            left(tmp_path, f"treellm-ingest-{running.pid}-ef56", age_s=old),  # its process runs
            left(tmp_path, f"treellm-ingest-{os.getpid()}-gh78", age_s=old),  # this process's
            left(tmp_path, "treellm-ingest-ij90", age_s=old),  # no process id in its name
            left(tmp_path, f"treellm-Ingest-{dead}-kl12", age_s=old),  # not a name treellm makes
            left(tmp_path, f"other-ingest-{dead}-mn34", age_s=old),
            left(tmp_path, "treellm-ingest-0-op56", age_s=old),  # kill(0, 0) would signal the group
        ]
        target = left(tmp_path, "elsewhere", age_s=old)
        (tmp_path / f"treellm-pieces-{dead}-link").symlink_to(target, target_is_directory=True)
        (tmp_path / f"treellm-pieces-{dead}-file").write_text("not a folder")
        assert sorted(sweep(tmp_path)) == sorted(removed)
        assert not any(folder.exists() for folder in removed)
        assert all((folder / "piece-0.jsonl").exists() for folder in [*kept, target])
        assert (tmp_path / f"treellm-pieces-{dead}-file").is_file()
        assert sweep(tmp_path, now=time.time() + STALE_S) == [kept[0]]  # an hour later, the derive folder too
    finally:
        running.communicate(b"", timeout=60)


def test_a_scratch_folder_is_named_for_its_process_and_removed_when_its_work_ends(tmp_path: Path) -> None:
    with scratch_folder("ch-ingest") as folder:
        assert folder.is_dir() and folder.name.startswith(f"treellm-ch-ingest-{os.getpid()}-")
        (folder / "x").write_text("x")
    assert not folder.exists()
    with pytest.raises(RuntimeError, match="stop"), scratch_folder("pieces") as failed:
        raise RuntimeError("stop")
    assert not failed.exists()
    with pytest.raises(ValueError, match="lowercase letters and hyphens, got 'pieces-1'"), scratch_folder("pieces-1"):
        pass


def test_the_next_ingest_removes_what_a_killed_one_left_in_the_temporary_directory(tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    dead = gone_pid()
    leftovers = [left(scratch, f"treellm-pieces-{dead}-a1", age_s=STALE_S + 1),
                 left(scratch, f"treellm-ingest-{dead}-b2", age_s=STALE_S + 1)]  # fmt: skip
    sample = Path(__file__).resolve().parent.parent / "sample_traces"
    trace = sorted(sample.glob("*.jsonl"))[0]
    done = subprocess.run([sys.executable, "-m", "treellm", "ingest", str(trace), "--db", str(tmp_path / "s.duckdb")],
                          check=False, capture_output=True, text=True, env={**ENV, "TMPDIR": str(scratch)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not any(folder.exists() for folder in leftovers)
    assert list(scratch.iterdir()) == []  # and its own folders are gone with its work


def test_a_process_sweeps_at_its_first_scratch_folder_then_every_ten_minutes(monkeypatch: pytest.MonkeyPatch) -> None:
    from treellm.store import scratch

    clock = [1000.0]
    sweeps: list[float] = []
    monkeypatch.setattr(scratch, "_swept_at", [])

    def counted() -> list[Path]:
        sweeps.append(clock[0])
        return []

    monkeypatch.setattr(time, "monotonic", lambda: clock[0])  # the module's clock: time.monotonic
    monkeypatch.setattr(scratch, "sweep", counted)
    for moment in (1000.0, 1001.0, 1000.0 + scratch.SWEEP_EVERY_S - 1, 1000.0 + scratch.SWEEP_EVERY_S, 2000.0):
        clock[0] = moment
        with scratch_folder("pieces"):
            pass
    assert sweeps == [1000.0, 1000.0 + scratch.SWEEP_EVERY_S]
