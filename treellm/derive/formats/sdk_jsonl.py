"""``sdk-jsonl``: OpenTelemetry SDK spans as JSON lines, one ``to_json(indent=None)`` per line.

What ``ConsoleSpanExporter(formatter=lambda s: s.to_json(indent=None) + "\\n")`` writes.
Each non-blank line is one record (``record`` counts them from 0, ``line`` is the line
number); a bad line is reported and the lines after it are still read. Spans convert as
in ``sdk-json`` (:mod:`treellm.derive.formats._sdk`), parents looked up in the whole file.

Detection: the first line is one complete JSON object with ``context`` and ``name``, and
something follows it (a file of exactly one span is ``sdk-json``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Final

import orjson

from treellm.derive.formats._base import Malformed, Record, decode_text
from treellm.derive.formats._sdk import SdkSpan, sdk_span, span_records
from treellm.derive.formats._sniff import Sample, Verdict, is_span
from treellm.errors import IngestError

NAME: Final = "sdk-jsonl"
WHAT: Final = "OpenTelemetry SDK spans as JSON lines, one `ReadableSpan.to_json(indent=None)` per line"
MAPPING: Final = "as `sdk-json`; each line is one record"


def sniff(sample: Sample) -> Verdict:
    if sample.shape != "object" or not isinstance(sample.line_doc, dict) or not is_span(sample.line_doc):
        return False
    tail = sample.tail()
    return sample.more() if tail == "unknown" else tail == "more"


def convert(data: bytes, *, path: str) -> Iterator[Record | IngestError]:
    """Each non-blank line's span as one record (see the module docstring)."""
    try:
        text = decode_text(data, path)
    except IngestError as exc:
        yield exc
        return
    items: list[SdkSpan | IngestError] = []
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            items.append(_line_span(line, number, len(items), path=path))
    yield from span_records(items, path=path)


def _line_span(line: str, number: int, index: int, *, path: str) -> SdkSpan | IngestError:
    try:
        raw = orjson.loads(line)
    except orjson.JSONDecodeError:
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            return IngestError(f"invalid JSON: {exc.msg} (column {exc.colno})", path=path, line=number, record=index)
        except RecursionError:
            return IngestError("JSON nested too deeply", path=path, line=number, record=index)
    try:
        return sdk_span(raw)
    except Malformed as exc:
        return IngestError(str(exc), path=path, line=number, record=index)
