"""``otlp-json``: OTLP/JSON ``TracesData`` documents.

One (possibly pretty-printed) ``TracesData`` object, several of them one after the other,
or a JSON list of them; each object is one record. Detection: the first object (or the
first object of a top-level list) has a ``resourceSpans`` key before any key that decides
another format. A document that is not JSON ends the file (its line is named); an item that
is not a ``TracesData`` object is a bad record, and the records after it are still read; each
document goes through the one validator (:func:`treellm.otlp.normalize_traces_data`), so a
bad span is reported alone and the rest of its document kept.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Final

from treellm.derive.formats._base import Record, checked, decode_text, kind_of
from treellm.derive.formats._sniff import Sample, Verdict
from treellm.errors import IngestError

NAME: Final = "otlp-json"
WHAT: Final = "OTLP/JSON request documents: one (pretty-printed or not), several one after the other, or a list"
MAPPING: Final = "converted to OTLP/JSON lines, one per document"

_NOT_SPACE = re.compile(r"\S")


def sniff(sample: Sample) -> Verdict:
    return sample.shape in ("object", "list") and "resourceSpans" in sample.keys


def convert(data: bytes, *, path: str) -> Iterator[Record | IngestError]:
    """Each ``TracesData`` object of ``data`` (see the module docstring)."""
    try:
        text = decode_text(data, path)
    except IngestError as exc:
        yield exc
        return
    decoder = json.JSONDecoder()
    index = 0
    pos = _after_space(text, 0)
    while pos < len(text):
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            yield IngestError(f"invalid JSON: {exc.msg} (column {exc.colno})", path=path, line=exc.lineno)
            return
        except RecursionError:
            yield IngestError("JSON nested too deeply", path=path, record=index)
            return
        for item in obj if isinstance(obj, list) else [obj]:
            if isinstance(item, dict) and isinstance(item.get("resourceSpans"), list):
                yield from checked(index, item, path=path)
            else:
                yield IngestError(
                    f"expected an OTLP/JSON TracesData object (with resourceSpans), got {kind_of(item)}",
                    path=path,
                    record=index,
                )
            index += 1
        pos = _after_space(text, end)


def _after_space(text: str, pos: int) -> int:
    match = _NOT_SPACE.search(text, pos)
    return len(text) if match is None else match.start()
