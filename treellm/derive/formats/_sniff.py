"""What detection sees of a file: :class:`Sample` values read from its first bytes, and the driver.

Detection reads a prefix only: 64 KiB first, longer when a sniffer asks
(:class:`NeedBytes`: the first line of a JSON lines file, the first protobuf message) or
when the first JSON object's keys run past the prefix (up to 64 MiB). The JSON scan
offers the formats one sample per key of the first object (of a top-level list, of its
first list), so that the first key that decides a format wins, as a person reading the
file would decide; at each step the formats are asked in registry order.
"""

from __future__ import annotations

import json
import re
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final, Literal

import orjson

if TYPE_CHECKING:
    from treellm.derive.formats._base import Format, InputFormat

SNIFF_BYTES: Final = 1 << 16
MAX_SNIFF_BYTES: Final = 64 << 20
_SPACE: Final = b" \t\r\n"
_BOM: Final = b"\xef\xbb\xbf"

Shape = Literal["none", "object", "list", "lists", "other"]
Tail = Literal["end", "more", "unknown", "bad"]


@dataclass(frozen=True, slots=True)
class NeedBytes:
    """A sniffer needs the file's first ``count`` bytes to decide."""

    count: int


Verdict = bool | NeedBytes


@dataclass(frozen=True, slots=True)
class Unrecognised:
    """No format fits; ``seen`` says what the file starts with."""

    seen: str


@dataclass(frozen=True, slots=True)
class Sample:
    """The file's first bytes and what the JSON scan has read from them so far.

    ``shape``: ``none`` (empty or blank), ``object`` (starts with ``{``), ``list`` (a list of
    objects, or an empty list), ``lists`` (a list of lists), ``other`` (anything else,
    including a list of neither). ``keys`` are the keys of the first object (of the list, of
    its first list) read so far, each with the first byte of its value; ``empty``: the
    (first inner) list is empty. ``line``: the first line from ``start`` (newline included)
    when the file starts with ``{`` and the line is complete in ``head``; ``line_doc`` that
    line parsed (None when it is not JSON). ``final``: no more keys will come, so the
    formats that are tried after every JSON reading (protobuf) may answer.
    """

    head: bytes
    size: int
    start: int
    shape: Shape
    keys: Mapping[str, int]
    empty: bool = False
    line: bytes | None = None
    line_doc: object = None
    final: bool = True
    seen: str = ""

    @property
    def eof(self) -> bool:
        return len(self.head) >= self.size

    def more(self) -> NeedBytes:
        """Ask for four times the prefix (at most the whole file)."""
        return NeedBytes(min(self.size, max(len(self.head) * 4, SNIFF_BYTES)))

    def tail(self) -> Tail:
        """What follows the first JSON value: ``end`` (only whitespace, to the end of the file),
        ``more`` (something), ``unknown`` (the prefix ends first), ``bad`` (not well-formed)."""
        try:
            end = _value_end(self.head, self.start, eof=self.eof)
        except _Truncated:
            return "unknown"
        except _NotJson:
            return "bad"
        rest = self.head[end:].lstrip(_SPACE)
        if rest:
            return "more"
        return "end" if self.eof else "unknown"


def decide(formats: Sequence[Format], head: bytes, size: int) -> InputFormat | NeedBytes | Unrecognised:
    """The format of a file whose first bytes are ``head`` (pure; see the module docstring).

    A :class:`NeedBytes` asks the caller to decide again with a longer prefix.
    """
    start = _first_non_space(head)
    if start is None:
        if len(head) < size:
            return NeedBytes(min(size, max(len(head) * 4, SNIFF_BYTES)))
        start = len(head)
    base = Sample(head=head, size=size, start=start, shape="none", keys={})
    if start < len(head):
        first = head[start]
        if first == ord("{"):
            newline = head.find(b"\n", start)
            line = head[start : newline + 1] if newline >= 0 else (head[start:] if base.eof else None)
            base = replace(base, shape="object", line=line, line_doc=_loads_quietly(line) if line else None)
        elif first == ord("["):
            base = replace(base, shape="list")
        else:
            base = replace(base, shape="other")
    sample = base
    for sample in _samples(base):
        for fmt in formats:
            verdict = fmt.sniff(sample)
            if verdict is True:
                return fmt.name
            if isinstance(verdict, NeedBytes) and verdict.count > len(head):
                return verdict
    if not sample.final:
        return sample.more()  # the JSON scan ran past the prefix
    return Unrecognised(sample.seen or _describe_bytes(head[start : start + 48]))


def _samples(base: Sample) -> Iterator[Sample]:
    """The sample before any key, one per key read, then the last one (``final`` unless the
    prefix ended inside the first object and may grow), carrying what the scan saw."""
    if base.shape not in ("object", "list"):
        yield base
        return
    yield replace(base, final=False)
    head, eof = base.head, base.eof
    shape: Shape = base.shape
    keys: dict[str, int] = {}
    what = "a JSON object"
    try:
        pos = base.start
        if shape == "list":
            pos = _skip_space(head, pos + 1, eof=eof)
            if head[pos] == ord("]"):
                yield replace(base, empty=True)
                return
            if head[pos] == ord("["):
                shape, what = "lists", "a JSON list of lists of objects"
                pos = _skip_space(head, pos + 1, eof=eof)
                if head[pos] == ord("]"):
                    yield replace(base, shape=shape, empty=True)
                    return
            else:
                what = "a JSON list of objects"
            if head[pos] != ord("{"):
                yield replace(base, shape="other", seen="a JSON list of neither objects nor lists of objects")
                return
        for key, first in _object_keys(head, pos, eof=eof):
            keys[key] = first
            yield replace(base, shape=shape, keys=dict(keys), final=False)
    except _Truncated:
        if len(head) < MAX_SNIFF_BYTES and not eof:
            yield replace(base, shape=shape, keys=dict(keys), final=False)
        else:
            seen = f"no recognised key in the first {MAX_SNIFF_BYTES >> 20} MiB of JSON"
            yield replace(base, shape=shape, keys=dict(keys), seen=seen)
        return
    except _NotJson as exc:
        seen = f"it starts like JSON but is not ({exc.where(head)})"
        yield replace(base, shape=shape, keys=dict(keys), seen=seen)
        return
    yield replace(base, shape=shape, keys=dict(keys), seen=f"{what} with keys {sorted(keys)[:12]}")


def is_span(keys: Mapping[str, object]) -> bool:
    """Whether an object with ``keys`` looks like one OpenTelemetry SDK span (``to_json()``)."""
    return "context" in keys and "name" in keys


def _first_non_space(head: bytes) -> int | None:
    skip = len(_BOM) if head.startswith(_BOM) else 0
    rest = head[skip:].lstrip(_SPACE)
    return len(head) - len(rest) if rest else None


def _describe_bytes(head: bytes) -> str:
    text = head.decode("utf-8", "replace")
    if all(c.isprintable() or c.isspace() for c in text):
        return f"it starts with {text[:40]!r}"
    return f"it starts with the bytes {head[:16].hex(' ')}"


def _loads_quietly(line: bytes) -> object:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return None


class _Truncated(Exception):
    """The prefix ends inside the part of the document that decides the format."""


class _NotJson(Exception):
    """The prefix is not JSON: ``reason``, found at byte ``offset`` of the file."""

    def __init__(self, reason: str, offset: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.offset = offset

    def where(self, head: bytes) -> str:
        """``line L, column C: reason`` (both 1-based; the column counts characters, as
        Python's JSON errors do), from the file's first bytes ``head``."""
        return f"{_line_column(head, self.offset)}: {self.reason}"


def _line_column(head: bytes, offset: int) -> str:
    """``line L, column C`` of byte ``offset`` in ``head`` (a BOM is not a column)."""
    offset = min(offset, len(head))
    line_start = head.rfind(b"\n", 0, offset) + 1
    if line_start == 0 and head.startswith(_BOM):
        line_start = len(_BOM)
    column = len(head[line_start:offset].decode("utf-8", "replace")) + 1
    line = head.count(b"\n", 0, offset) + 1
    return f"line {line}, column {column}"


_TOKEN = re.compile(rb'[ \t\r\n]*("[^"\\]*(?:\\.[^"\\]*)*"|[{}\[\]:,]|-?[0-9][0-9.eE+-]*|true|false|null)', re.DOTALL)


def _skip_space(buf: bytes, pos: int, *, eof: bool) -> int:
    while pos < len(buf) and buf[pos] in _SPACE:
        pos += 1
    if pos >= len(buf):
        raise _NotJson("the file ends early", pos) if eof else _Truncated
    return pos


def _next_token(buf: bytes, pos: int, *, eof: bool) -> tuple[bytes, int]:
    match = _TOKEN.match(buf, pos)
    if match is None:
        rest = buf[pos:].lstrip(_SPACE)
        if not eof and (rest[:1] == b'"' or len(rest) < 8):
            raise _Truncated
        at = len(buf) - len(rest)
        if not rest:
            raise _NotJson("the file ends early", at)
        if rest[:1] == b'"' and _TOKEN.match(rest + b'"') is not None:  # only the closing quote is missing
            raise _NotJson(f"the file ends inside the string {rest[:24].decode('utf-8', 'replace')}", at)
        raise _NotJson(f"unexpected {rest[:12]!r}", at)
    return match.group(1), match.end()


def _object_keys(buf: bytes, pos: int, *, eof: bool) -> Generator[tuple[str, int], None, int]:
    """Keys of the object opening at ``buf[pos]``, each with the first byte of its value;
    returns the offset after the object's closing brace."""
    depth, state, key = 0, "open", ""
    while True:
        token, pos = _next_token(buf, pos, eof=eof)
        at = pos - len(token)
        if depth >= 2:
            depth += (token in (b"{", b"[")) - (token in (b"}", b"]"))
        elif state == "open":
            if token != b"{":
                raise _NotJson("expected an object", at)
            depth, state = 1, "key"
        elif state in ("key", "comma") and token == b"}":
            return pos
        elif state == "key" and token[:1] == b'"':
            try:
                key = json.loads(token)
            except (ValueError, UnicodeDecodeError) as exc:
                raise _NotJson("a key is not a JSON string", at) from exc
            state = "colon"
        elif state == "colon" and token == b":":
            state = "value"
        elif state == "value" and token not in (b"}", b"]", b":", b","):
            yield key, token[0]
            state = "comma"
            if token in (b"{", b"["):
                depth = 2
        elif state == "comma" and token == b",":
            state = "key"
        else:
            raise _NotJson(f"unexpected {token[:12]!r}", at)


def _value_end(buf: bytes, pos: int, *, eof: bool) -> int:
    """The offset after the object opening at ``buf[pos]``."""
    keys = _object_keys(buf, pos, eof=eof)
    while True:
        try:
            next(keys)
        except StopIteration as stop:
            end: int = stop.value
            return end
