"""OTLP/JSON requests normalised to the store's canonical encoding, for the collector. Pure.

A thin shell over the one validator, :func:`treellm.otlp.normalize_traces_data` (its
docstring lists the OTLP/JSON rules, what is rejected per span, the all-zero parent and
the duplicate-key decision): the collector's JSON path calls :func:`normalize_request`, and
so does its protobuf path when a resource's or scope's attributes repeat a key (otherwise
protobuf is checked in one pass against the same rules, :mod:`treellm.collector.decode`). A
request whose structure is wrong raises :class:`~treellm.collector.errors.BadRequest`
(HTTP 400); a bad span is rejected alone (``partial_success``).
"""

from __future__ import annotations

from typing import Any

from treellm.collector.errors import BadRequest
from treellm.otlp import MAX_VALUE_DEPTH, Normalized, StructureError, normalize_traces_data

__all__ = ["MAX_VALUE_DEPTH", "JsonObject", "Normalized", "normalize_request"]

JsonObject = dict[str, Any]


def normalize_request(doc: object, *, max_reasons: int = 5) -> Normalized:
    """A parsed OTLP/JSON ``ExportTraceServiceRequest`` in canonical form; :class:`BadRequest`
    when its structure is wrong."""
    try:
        return normalize_traces_data(doc, max_reasons=max_reasons)
    except StructureError as exc:
        raise BadRequest(exc.reason, field=exc.field) from None
