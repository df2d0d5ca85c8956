"""``sdk-json``: OpenTelemetry SDK span JSON as one document.

Spans as the OpenTelemetry Python SDK's ``ReadableSpan.to_json()`` writes them (see
:mod:`treellm.derive.formats._sdk` for the accepted variants), as ``{"spans": [...]}``
(other keys ignored), a bare list, or a file holding exactly one span object. The whole
file's good spans are one record; each bad span is reported by its index as ``record`` (the
good ones are kept with ``--skip-bad``).

Detection: a top-level ``spans`` list, a list whose first object has ``context`` and
``name``, or a single span object with nothing after it (several are ``sdk-console``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final

from treellm.derive.formats._base import Malformed, Record, checked, kind_of, load_json
from treellm.derive.formats._sdk import SdkSpan, sdk_span, traces_data
from treellm.derive.formats._sniff import Sample, Verdict, is_span
from treellm.errors import IngestError

NAME: Final = "sdk-json"
WHAT: Final = 'OpenTelemetry SDK span JSON (`{"spans": [...]}` or a list; ids hex, `0x` hex or integers)'
MAPPING: Final = "a span whose parent is missing is kept as a root, flagged `treellm.ingest.orphan_parent`"


def sniff(sample: Sample) -> Verdict:
    if sample.shape == "list":
        return is_span(sample.keys)
    if sample.shape != "object":
        return False
    if sample.keys.get("spans") == ord("["):
        return True
    if not is_span(sample.keys):
        return False
    tail = sample.tail()
    return sample.more() if tail == "unknown" else tail in ("end", "bad")


def convert(data: bytes, *, path: str) -> Iterator[Record | IngestError]:
    """The file's good spans as one record (record 0), then each bad span as an ``IngestError``
    with its index as ``record``, so that ``--skip-bad`` keeps the good ones."""
    try:
        raws = _sdk_span_list(load_json(data, path), path=path)
    except IngestError as exc:
        yield exc
        return
    spans: list[SdkSpan] = []
    bad: list[IngestError] = []
    for index, raw in enumerate(raws):
        try:
            spans.append(sdk_span(raw))
        except Malformed as exc:
            bad.append(IngestError(str(exc), path=path, record=index))
    if spans:
        yield from checked(0, traces_data(spans, {(s.trace_id, s.span_id) for s in spans}), path=path)
    yield from bad


def sdk_json_to_traces_data(obj: object, *, path: str) -> dict[str, Any]:
    """OTLP/JSON ``TracesData`` of OpenTelemetry SDK span JSON (see the module docstring).

    ``obj`` is the parsed file: ``{"spans": [...]}``, a list of spans or one span. A
    malformed span raises :class:`IngestError` with its index as ``record``; the result went
    through the one validator (:func:`treellm.otlp.normalize_traces_data`), whose first
    rejection raises too.
    """
    spans: list[SdkSpan] = []
    for index, raw in enumerate(_sdk_span_list(obj, path=path)):
        try:
            spans.append(sdk_span(raw))
        except Malformed as exc:
            raise IngestError(str(exc), path=path, record=index) from None
    doc: dict[str, Any] = {"resourceSpans": []}
    for item in checked(0, traces_data(spans, {(s.trace_id, s.span_id) for s in spans}), path=path):
        if isinstance(item, IngestError):
            raise item
        doc = item.traces_data
    return doc


def _sdk_span_list(obj: object, *, path: str) -> list[Any]:
    if isinstance(obj, Mapping) and isinstance(obj.get("spans"), list):
        return list(obj["spans"])
    if isinstance(obj, list):
        return obj
    if isinstance(obj, Mapping) and is_span(obj):
        return [obj]
    raise IngestError(f'expected {{"spans": [...]}} or a list of SDK spans, got {kind_of(obj)}', path=path)
