"""Scratch folders for long work: an ingest's pieces, a derive pass's rows and DuckDB file.

A folder is ``treellm-<kind>-<pid>-<random>`` in the temporary directory and is removed when
its work ends, Ctrl-C included. A process killed outright (SIGKILL, the kernel's OOM killer)
cannot remove its own, so the next one to make a scratch folder removes those of processes
that are gone: named by a process id that no longer runs, owned by this user, and left
untouched for :data:`STALE_S` seconds (a process in another PID namespace that shares the
temporary directory is not seen by ``kill(pid, 0)``; the age keeps its live work safe).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["STALE_S", "SWEEP_EVERY_S", "scratch_folder", "sweep"]

STALE_S = 3600.0
"""A dead process's scratch folder is removed once untouched this long."""
SWEEP_EVERY_S = 600.0
"""A process sweeps at its first scratch folder, then at most this often (the collector makes
one a flush, every second or so)."""
_swept_at: list[float] = []

_NAME = re.compile(r"treellm-(?:[a-z]+-)+?(\d+)-[^/]+")
"""A scratch folder's name: the kinds are letters, the process id digits."""


@contextlib.contextmanager
def scratch_folder(kind: str) -> Iterator[Path]:
    """A new scratch folder for ``kind`` (letters and hyphens), removed when the block ends;
    the folders dead processes left behind are removed first (:func:`sweep`, at most every
    :data:`SWEEP_EVERY_S` seconds)."""
    if not re.fullmatch(r"[a-z]+(?:-[a-z]+)*", kind):
        raise ValueError(f"a scratch folder's kind is lowercase letters and hyphens, got {kind!r}")
    now = time.monotonic()
    if not _swept_at or now - _swept_at[-1] >= SWEEP_EVERY_S:
        _swept_at[:] = [now]
        sweep()
    with tempfile.TemporaryDirectory(prefix=f"treellm-{kind}-{os.getpid()}-") as folder:
        yield Path(folder)


def sweep(root: Path | None = None, *, now: float | None = None) -> list[Path]:
    """Remove the scratch folders in ``root`` (default: the temporary directory) of processes
    that are gone and untouched for :data:`STALE_S` seconds (at ``now``, default the clock's);
    the folders removed. Any other entry, and any folder that cannot be read or removed, is
    left as it is."""
    folder = Path(tempfile.gettempdir()) if root is None else root
    moment = time.time() if now is None else now
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        found = _NAME.fullmatch(entry.name)
        if found is None:
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            if not entry.is_dir(follow_symlinks=False) or info.st_uid != os.getuid():
                continue
        except OSError:
            continue
        if moment - info.st_mtime < STALE_S or _alive(int(found.group(1))):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        if not os.path.lexists(entry.path):
            removed.append(Path(entry.path))
    return removed


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` runs (another user's counts); 0, this process and a number no
    process can have are never taken for gone (``kill(0, 0)`` would signal the group)."""
    if pid <= 0 or pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except OverflowError:  # larger than any process id
        return False
    return True
