"""Every input format the store reads, as one registry: detection, conversion, the CLI choices, the README table.

The store ingests one shape only: OTLP/JSON ``TracesData`` objects (``{"resourceSpans":
[...]}``) in the encoding of :mod:`treellm.otlp` (lowercase hex ids, 64-bit integers as
decimal strings, ``AnyValue`` objects, OTLP span kinds INTERNAL=1 ... CONSUMER=5, status
codes UNSET=0, OK=1, ERROR=2). Each module of this package is one input format (its
docstring says what it accepts and how it is detected) and exposes ``NAME``, ``WHAT``,
``MAPPING``, ``sniff`` and ``convert``; :data:`FORMATS` orders them, and from it derive
:data:`NAMES` (the ``--input-format`` choices), the detection order and
:func:`readme_table` (the README's table, checked by a test).

Contract:

- ``sniff(sample)`` is pure and total: it looks at a :class:`~treellm.derive.formats._sniff.Sample`
  (the file's first bytes, and the keys of its first JSON object read so far) and returns
  True, False or ``NeedBytes(n)`` (decide again with the first ``n`` bytes). Detection
  asks the formats in :data:`FORMATS` order, once before any JSON key and again after
  each key of the first object, so that the first key that decides a format wins; the
  first format to say True is the file's format.
- ``convert(data, path=...)`` is pure: bytes in, new dicts out, deterministic (no clock,
  no randomness). It yields each record in file order as a :class:`Record` (its 0-based
  index and its ``TracesData``) or an :class:`~treellm.errors.IngestError` with ``path``
  and ``record`` (or ``line``) and a reason naming the field; nothing else is raised for
  bad input. After an error that leaves nothing readable (not JSON, a corrupt protobuf
  message) the iteration ends; otherwise the records after a bad one still come.
- :func:`detect_format`, :func:`iter_records` and :func:`iter_traces_data` are the thin
  readers. Detection reads only a prefix (the first line, a growing prefix of a JSON
  document up to 64 MiB, or the first protobuf message); the converters read the file
  whole. An unreadable file is an ``IngestError``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from treellm.derive.formats import (
    otlp_json,
    otlp_jsonl,
    otlp_proto,
    sdk_console,
    sdk_json,
    sdk_jsonl,
    swe_agent,
    trajectory,
)
from treellm.derive.formats._base import (
    CallsNotFound,
    Format,
    InputFormat,
    JsonObject,
    Record,
    calls_not_found_warnings,
)
from treellm.derive.formats._sniff import SNIFF_BYTES, NeedBytes, decide
from treellm.derive.formats.otlp_proto import proto_to_traces_data
from treellm.derive.formats.sdk_json import sdk_json_to_traces_data
from treellm.derive.formats.trajectory import trajectories_to_traces_data
from treellm.errors import IngestError

__all__ = [
    "FORMATS",
    "CallsNotFound",
    "NAMES",
    "Format",
    "InputFormat",
    "Record",
    "calls_not_found_warnings",
    "detect_format",
    "iter_records",
    "iter_traces_data",
    "proto_to_traces_data",
    "readme_table",
    "sdk_json_to_traces_data",
    "trajectories_to_traces_data",
]

FORMATS: Final[tuple[Format, ...]] = (
    Format(otlp_jsonl.NAME, otlp_jsonl.WHAT, otlp_jsonl.MAPPING, otlp_jsonl.sniff, otlp_jsonl.convert),
    Format(sdk_jsonl.NAME, sdk_jsonl.WHAT, sdk_jsonl.MAPPING, sdk_jsonl.sniff, sdk_jsonl.convert),
    Format(otlp_json.NAME, otlp_json.WHAT, otlp_json.MAPPING, otlp_json.sniff, otlp_json.convert),
    Format(trajectory.NAME, trajectory.WHAT, trajectory.MAPPING, trajectory.sniff, trajectory.convert),
    Format(swe_agent.NAME, swe_agent.WHAT, swe_agent.MAPPING, swe_agent.sniff, swe_agent.convert),
    Format(sdk_json.NAME, sdk_json.WHAT, sdk_json.MAPPING, sdk_json.sniff, sdk_json.convert),
    Format(sdk_console.NAME, sdk_console.WHAT, sdk_console.MAPPING, sdk_console.sniff, sdk_console.convert),
    Format(otlp_proto.NAME, otlp_proto.WHAT, otlp_proto.MAPPING, otlp_proto.sniff, otlp_proto.convert),
)
"""The input formats in detection order."""

NAMES: Final[tuple[InputFormat, ...]] = tuple(f.name for f in FORMATS)
_BY_NAME: Final[dict[str, Format]] = {f.name: f for f in FORMATS}


def detect_format(path: str | os.PathLike[str]) -> InputFormat:
    """The format of the file at ``path``, sniffed from its first bytes (see the module docstring).

    Raises :class:`IngestError` naming the file and what it starts with when no format fits.
    """
    display = os.fspath(path)
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            length = min(size, SNIFF_BYTES)
            while True:
                handle.seek(0)
                head = handle.read(length)
                found = decide(FORMATS, head, size)
                if not isinstance(found, NeedBytes):
                    break
                length = found.count
    except OSError as exc:
        raise IngestError(f"cannot read the file ({exc.strerror or exc})", path=display) from exc
    if isinstance(found, str):
        return found
    raise IngestError(
        f"unrecognised input: {found.seen}; expected one of the input formats {', '.join(NAMES)}", path=display
    )


def iter_records(path: str | os.PathLike[str], input_format: str) -> Iterator[Record | IngestError]:
    """Each record of the file at ``path`` in file order: a :class:`Record` or the
    :class:`IngestError` of a bad one (see the module docstring).

    An unreadable file yields one ``IngestError``. Raises ``ValueError`` for ``otlp-jsonl``
    (the ingester reads it in place) or an unknown format name (a caller's bug).
    """
    fmt = _BY_NAME.get(input_format)
    if fmt is None or fmt.convert is None:
        readable = ", ".join(f.name for f in FORMATS if f.convert is not None)
        raise ValueError(f"iter_records reads {readable}, not {input_format!r}")
    display = os.fspath(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        yield IngestError(f"cannot read the file ({exc.strerror or exc})", path=display)
        return
    yield from fmt.convert(data, path=display)


def iter_traces_data(path: str | os.PathLike[str], input_format: str) -> Iterator[tuple[int, JsonObject]]:
    """(record index, OTLP/JSON ``TracesData``) of each record, raising the first bad record's
    :class:`IngestError` after the good records before it; ``ValueError`` as :func:`iter_records`."""
    for item in iter_records(path, input_format):
        if isinstance(item, IngestError):
            raise item
        yield item.index, item.traces_data


def readme_table() -> str:
    """The README's table of recognised inputs, one row per format in detection order."""
    rows = ["| format | what | mapping |", "|---|---|---|"]
    rows += [f"| `{f.name}` | {f.what} | {f.mapping} |" for f in FORMATS]
    return "\n".join(rows) + "\n"
