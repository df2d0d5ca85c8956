"""The collector's errors, each mapped to one HTTP status at the receiver's boundary.

::

    TreeLLMError
    ├── CollectorError        the collector cannot start or run (names the folder or address)
    │   ├── BadRequest        the body cannot be decoded (400, never retried)
    │   └── PayloadTooLarge   the body is above the limit, as sent or decompressed (413)
    └── StoreError
        ├── Overloaded        the journal is over a bound (429 or 503 with Retry-After)
        └── JournalError      the journal could not be written or is closed (503)

``Overloaded`` and ``JournalError`` are the store journal's (:mod:`treellm.store.journal`),
re-exported here; the collector turns a journal it cannot open into a ``CollectorError``.
"""

from __future__ import annotations

from treellm.errors import TreeLLMError
from treellm.store.journal import JournalError, Overloaded

__all__ = ["BadRequest", "CollectorError", "JournalError", "Overloaded", "PayloadTooLarge"]


class CollectorError(TreeLLMError):
    """The collector cannot start or run."""


class BadRequest(CollectorError):
    """The body cannot be decoded as an ``ExportTraceServiceRequest`` (HTTP 400).

    ``field`` names the part of the request at fault when one is known.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.reason = message
        self.field = field


class PayloadTooLarge(CollectorError):
    """The body, as sent or once decompressed, is above the configured limit (HTTP 413)."""

    def __init__(self, message: str, *, limit: int) -> None:
        super().__init__(message)
        self.limit = limit
