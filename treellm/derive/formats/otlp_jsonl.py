"""``otlp-jsonl``: OTLP/JSON, one ``TracesData`` per line (treellm's exporter, the Collector's file exporter).

Detection: the first non-space byte is ``{`` and the first line is a complete JSON object
with ``resourceSpans``. An empty or blank file is reported as ``otlp-jsonl`` too (the
ingester reports empty files). A file whose first line holds ``"resourceSpans"`` but is not
a complete object (a JSON lines file whose first line is broken) is ``otlp-jsonl`` as well,
so that the line reader reports it by its line number.

There is no converter: :mod:`treellm.store.ingest` reads these files in place, line by line.
"""

from __future__ import annotations

from typing import Final

from treellm.derive.formats._sniff import Sample, Verdict

NAME: Final = "otlp-jsonl"
WHAT: Final = "OTLP/JSON, one `TracesData` per line (treellm's exporter, the Collector's file exporter)"
MAPPING: Final = "read in place by DuckDB"
convert: Final = None


def sniff(sample: Sample) -> Verdict:
    if sample.shape == "none":
        return True
    if sample.shape != "object":
        return False
    if sample.line is None:
        return sample.more()  # the first line decides: read it whole
    if isinstance(sample.line_doc, dict) and "resourceSpans" in sample.line_doc:
        return True
    return "resourceSpans" in sample.keys and b'"resourceSpans"' in sample.line
