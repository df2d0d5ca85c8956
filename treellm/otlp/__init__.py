"""OTLP in one place: the builder of OTLP/JSON from SDK spans and the one span validator.

- :mod:`treellm.otlp.encode`: SDK spans to OTLP/JSON ``TracesData`` and compact JSON lines
  (:func:`spans_to_traces_data`, :func:`traces_data_line`, :func:`json_line`, ...).
- :mod:`treellm.otlp.validate`: what a valid span is, written once (the rule table, the
  canonical normaliser :func:`normalize_traces_data` and the SQL check generated from the
  same rules); the collector, every input format, ingest and ``--skip-bad`` use it.

Pure: no I/O.
"""

from __future__ import annotations

from treellm.otlp.encode import any_value, json_line, key_values, span_to_json, spans_to_traces_data, traces_data_line
from treellm.otlp.validate import (
    DUPLICATE_KEYS,
    MAX_VALUE_DEPTH,
    VALIDATE_SQL,
    Normalized,
    StructureError,
    normalize_traces_data,
)

__all__ = [
    "DUPLICATE_KEYS",
    "MAX_VALUE_DEPTH",
    "VALIDATE_SQL",
    "Normalized",
    "StructureError",
    "any_value",
    "json_line",
    "key_values",
    "normalize_traces_data",
    "span_to_json",
    "spans_to_traces_data",
    "traces_data_line",
]
