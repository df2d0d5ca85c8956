"""``sdk-console``: what the OpenTelemetry Python SDK's ``ConsoleSpanExporter`` writes to a file.

Each span's ``ReadableSpan.to_json()`` (pretty-printed with indent 4) followed by a newline,
concatenated: many JSON objects one after the other, not a JSON list. Any whitespace (or
none) between the objects is accepted, so other formatters' output reads too. Each span
object is one record (``record`` counts them from 0; the reason names the line it starts
on). Spans convert as in ``sdk-json`` (:mod:`treellm.derive.formats._sdk`), parents looked
up in the whole file.

A bad object does not lose the good ones after it: a span that is not valid is reported
alone; an object that is not valid JSON is reported, and reading resumes at the next line
that starts with ``{`` (where the exporter starts each object; nested objects are
indented).

Detection: the file starts with an object with ``context`` and ``name`` (an SDK span) and
something follows it; its first line is not a complete object (else it is ``sdk-jsonl``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Final

from treellm.derive.formats._base import Malformed, Record, decode_text
from treellm.derive.formats._sdk import SdkSpan, sdk_span, span_records
from treellm.derive.formats._sniff import Sample, Verdict, is_span
from treellm.errors import IngestError

NAME: Final = "sdk-console"
WHAT: Final = (
    "the OpenTelemetry Python SDK's `ConsoleSpanExporter` output: span objects (`to_json()`) one after the other"
)
MAPPING: Final = "as `sdk-json`; each span object is one record, a bad one is reported and the rest kept"

_NOT_SPACE = re.compile(r"\S")


def sniff(sample: Sample) -> Verdict:
    if sample.shape != "object" or not is_span(sample.keys):
        return False
    tail = sample.tail()
    return sample.more() if tail == "unknown" else tail == "more"


def convert(data: bytes, *, path: str) -> Iterator[Record | IngestError]:
    """Each span object as one record (see the module docstring)."""
    try:
        text = decode_text(data, path)
    except IngestError as exc:
        yield exc
        return
    yield from span_records(list(_objects(text, path=path)), path=path)


def _objects(text: str, *, path: str) -> Iterator[SdkSpan | IngestError]:
    decoder = json.JSONDecoder()
    pos, line, counted = _after_space(text, 0), 1, 0
    index = 0
    while pos < len(text):
        line += text.count("\n", counted, pos)
        counted = pos
        try:
            raw, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            yield IngestError(
                f"span object at line {line}: invalid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
                path=path,
                record=index,
            )
            resume = text.find("\n{", pos)
            end = len(text) if resume < 0 else resume + 1
        except RecursionError:
            yield IngestError(f"span object at line {line}: JSON nested too deeply", path=path, record=index)
            resume = text.find("\n{", pos)
            end = len(text) if resume < 0 else resume + 1
        else:
            try:
                yield sdk_span(raw)
            except Malformed as exc:
                yield IngestError(f"span object at line {line}: {exc}", path=path, record=index)
        index += 1
        pos = _after_space(text, end)


def _after_space(text: str, pos: int) -> int:
    match = _NOT_SPACE.search(text, pos)
    return len(text) if match is None else match.start()
