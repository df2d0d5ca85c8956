"""The collector's flusher is the store's: see :mod:`treellm.store.flusher` (re-exported here)."""

from treellm.store.flusher import Flusher, FlusherStats, IngestFn, halve_traces_line

__all__ = ["Flusher", "FlusherStats", "IngestFn", "halve_traces_line"]
