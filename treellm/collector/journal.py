"""The collector's journal is the store's: see :mod:`treellm.store.journal` (re-exported here)."""

from treellm.store.journal import Journal, JournalStats, Segment, truncate_torn_tail

__all__ = ["Journal", "JournalStats", "Segment", "truncate_torn_tail"]
