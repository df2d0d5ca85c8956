"""What every input format shares: the registry's value types and the readers of bytes and JSON.

A format is a :class:`Format`: a ``name`` (one of :data:`InputFormat`), a ``sniff`` that
looks at a :class:`~treellm.derive.formats._sniff.Sample` of the file's first bytes, and a
``convert`` that turns the file's bytes into :class:`Record` values (or ``None``: the
ingester reads the format in place). Converters are pure: bytes in, new dicts out, no
clock, no randomness; a malformed record is *yielded* as an :class:`IngestError` (with
``path`` and ``record`` or ``line``) so that ``--skip-bad`` can keep the good records
after it; an error after which nothing more can be read ends the iteration.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from treellm.errors import IngestError
from treellm.otlp import StructureError, normalize_traces_data
from treellm.telemetry import semconv as sc

if TYPE_CHECKING:
    from treellm.derive.formats._sniff import Sample, Verdict

InputFormat = Literal[
    "otlp-jsonl", "sdk-jsonl", "otlp-json", "trajectory", "swe-agent", "sdk-json", "sdk-console", "otlp-proto"
]
JsonObject = dict[str, Any]

ORPHAN_PARENT = sc.INGEST_ORPHAN_PARENT
SCOPE_NAME = "treellm.derive.foreign"  # kept: it is stored on the spans of converted trajectories


@dataclass(frozen=True, slots=True)
class CallsNotFound:
    """A run stored with assistant turns in which its reader found no tool call: the run's index in
    its file, its assistant turns, and where the reader looked (one phrase per format)."""

    run: int
    turns: int
    looked_for: str


@dataclass(frozen=True, slots=True)
class Record:
    """One good record of an input file: its 0-based index and its OTLP/JSON ``TracesData``;
    ``warnings`` say what the reader stored but doubts, and ``calls_not_found`` the runs whose
    calls it could not find (the ingest says those once per file: :func:`calls_not_found_warnings`)."""

    index: int
    traces_data: JsonObject
    warnings: tuple[str, ...] = ()
    calls_not_found: tuple[CallsNotFound, ...] = ()


RUNS_NAMED = 10
"""The runs a warning of :func:`calls_not_found_warnings` names; it counts the rest."""


def calls_not_found_warnings(found: list[CallsNotFound]) -> list[str]:
    """The warnings of a file's runs without a call found: one per place its readers looked. A run
    alone is named with its turns; several are counted, the first :data:`RUNS_NAMED` named (a file of
    200 chat-only runs says so in one line, not 200)."""
    by_place: dict[str, list[CallsNotFound]] = {}
    for run in found:
        by_place.setdefault(run.looked_for, []).append(run)
    warnings = []
    for looked_for, runs in by_place.items():
        if len(runs) == 1:
            (run,) = runs
            warnings.append(
                f"run {run.run}: {run.turns} assistant turn(s) but no tool call found ({looked_for}); "
                "the run is stored with no calls"
            )
            continue
        named = ", ".join(str(run.run) for run in runs[:RUNS_NAMED])
        more = f" and {len(runs) - RUNS_NAMED} more" if len(runs) > RUNS_NAMED else ""
        warnings.append(
            f"{len(runs)} runs with assistant turns but no tool call found ({looked_for}): "
            f"runs {named}{more}; they are stored with no calls"
        )
    return warnings


class Converter(Protocol):
    """Bytes of a whole file to its records, in file order (``path`` names the file in errors)."""

    def __call__(self, data: bytes, *, path: str) -> Iterator[Record | IngestError]: ...


@dataclass(frozen=True, slots=True)
class Format:
    """One input format of the registry (see :mod:`treellm.derive.formats`).

    ``sniff(sample)`` is pure and never raises for any bytes: True (this format), False
    (not this one) or :class:`~treellm.derive.formats._sniff.NeedBytes` (ask again with a
    longer prefix). ``convert(data, path=...)`` yields each record in file order, as a
    :class:`Record` or an :class:`IngestError`; it is ``None`` for ``otlp-jsonl``, which the
    ingester reads in place. ``what`` and ``mapping`` are the README table's columns.
    """

    name: InputFormat
    what: str
    mapping: str
    sniff: Callable[[Sample], Verdict]
    convert: Converter | None


class Malformed(Exception):
    """Why a record is malformed; becomes an IngestError where the record index is known."""


def kind_of(value: object) -> str:
    return "null" if value is None else type(value).__name__


def decode_text(data: bytes, path: str) -> str:
    """``data`` as text (a UTF-8 BOM dropped); an ``IngestError`` when it is not UTF-8."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise IngestError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", path=path) from exc


def load_json(data: bytes, path: str) -> Any:
    """The one JSON document in ``data``; an ``IngestError`` naming the line when it is not one."""
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise IngestError(f"invalid JSON: {exc.msg} (column {exc.colno})", path=path, line=exc.lineno) from exc
    except UnicodeDecodeError as exc:
        raise IngestError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", path=path) from exc
    except RecursionError as exc:
        raise IngestError("JSON nested too deeply", path=path) from exc


def mapping(value: object, what: str) -> Mapping[str, Any]:
    """``value`` as an object (None: empty); ``Malformed`` naming ``what`` otherwise."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise Malformed(f"{what}: expected an object, got {kind_of(value)}")
    return value


def sequence(value: object, what: str) -> list[Any]:
    """``value`` as a list (None: empty); ``Malformed`` naming ``what`` otherwise."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise Malformed(f"{what}: expected a list, got {kind_of(value)}")
    return value


def checked(
    index: int,
    doc: JsonObject,
    *,
    path: str,
    line: int | None = None,
    warnings: tuple[str, ...] = (),
    calls_not_found: tuple[CallsNotFound, ...] = (),
) -> Iterator[Record | IngestError]:
    """One record's ``TracesData`` through the one validator (:func:`treellm.otlp.normalize_traces_data`):
    the record with its good spans (none when it has none), ``warnings`` and ``calls_not_found``, then
    an ``IngestError`` naming each rejected span and its field; a document of the wrong structure is
    one ``IngestError``."""
    try:
        normalized = normalize_traces_data(doc, max_reasons=None)
    except StructureError as exc:
        yield IngestError(str(exc), path=path, line=line, record=index)
        return
    if normalized.traces_data is not None:
        yield Record(index, normalized.traces_data, warnings, calls_not_found)
    for reason in normalized.reasons:
        yield IngestError(reason, path=path, line=line, record=index)


def with_schema(out: JsonObject, schema_url: str) -> JsonObject:
    if schema_url:
        out["schemaUrl"] = schema_url
    return out
