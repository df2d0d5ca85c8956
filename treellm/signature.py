"""Tool-call signatures compatible with the TypeScript tree-llm.

Contract:

- :func:`parse_arguments` is the one way argument text from a model or a trace
  becomes arguments. Valid JSON text gives its value, parsed with JavaScript's
  number semantics (every number is an IEEE double; integers that a double holds
  exactly stay Python ``int``); anything else gives :class:`RawArguments`.
  A mapping that arrives already parsed is used as it is.
- :func:`canonical_json` is exactly tree-llm's canonical text: JavaScript
  ``JSON.stringify`` of the value with object keys sorted recursively by
  ``Array.prototype.sort()`` (UTF-16 code-unit order), then laid out in JS
  property order (integer-like keys first, ascending).
- :func:`stable_hash` is djb2 over the UTF-16 code units of that text, printed in
  lowercase base 36; :func:`signature` is ``f"{tool}:{stable_hash(value)}"``.
- :func:`arguments_problem` says why arguments are too large to take (nested
  deeper or bigger than the caller's limits) without parsing them, or None.
- :func:`json_text` is ``json.dumps(value, ensure_ascii=False, separators=(",", ":"))``
  (keys in their order) for a value of any depth: how already parsed arguments
  become the text a provider would send, so a deep one is rejected as deep text is.

Hard rules: pure functions, no I/O, no state beyond a constant table of powers.
No function here recurses on the value: :func:`canonical_json` walks an explicit
stack, so a value nested 100,000 deep costs time, never a ``RecursionError``.
A djb2 hash is for display and telemetry only: counting uses the canonical text
(see :mod:`treellm.loop`), so a 32-bit collision never prunes a different call.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

try:  # numpy speeds up djb2 of long texts; the core install works without it
    import numpy as np
except ImportError:  # pragma: no cover - exercised by the slim-install test
    np = None  # type: ignore[assignment]

__all__ = [
    "RawArguments",
    "arguments_problem",
    "canonical_json",
    "js_number",
    "json_text",
    "parse_arguments",
    "signature",
    "stable_hash",
]

_MAX_ARRAY_INDEX = 2**32 - 2
_MAX_SAFE_INT = 2**53


@dataclass(frozen=True, slots=True)
class RawArguments:
    """Argument text that is not valid JSON, kept exactly as the model sent it."""

    text: str


def _parse_int(text: str) -> int | float:
    # JavaScript reads every number as a double. Keep an int only when the
    # double holds it exactly, so equal values stay equal across languages.
    if len(text) > 20:
        return float(text)
    value = int(text)
    return value if -_MAX_SAFE_INT <= value <= _MAX_SAFE_INT else float(value)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_int=_parse_int, parse_constant=_reject_constant)


def parse_arguments(arguments: object) -> object:
    """Turn tool-call arguments into a JSON value, or :class:`RawArguments`.

    ``str``/``bytes`` are parsed as JSON text (surrounding whitespace allowed, as
    ``JSON.parse`` allows it); text that does not parse becomes
    ``RawArguments(text)``. Anything else (a dict, a list, None) is already
    parsed and returned unchanged. Never raises.
    """
    if isinstance(arguments, bytes | bytearray):
        data = bytes(arguments)
        try:
            arguments = data.decode("utf-8")
        except UnicodeDecodeError:
            return RawArguments(data.decode("utf-8", "replace"))
    if not isinstance(arguments, str):
        return arguments
    try:
        return _DECODER.decode(arguments.strip(" \t\n\r"))
    except (ValueError, RecursionError):
        return RawArguments(arguments)


# ---------------------------------------------------------------------------
# Numbers: ECMAScript Number::toString
# ---------------------------------------------------------------------------


def js_number(value: float | int) -> str:
    """Format a number as JavaScript's ``Number.prototype.toString`` (radix 10).

    Non-finite values give ``"null"``, as ``JSON.stringify`` prints them.
    """
    if isinstance(value, int):
        if -_MAX_SAFE_INT <= value <= _MAX_SAFE_INT:
            return str(value)
        try:
            value = float(value)
        except OverflowError:
            return "null"
    if not math.isfinite(value):
        return "null"
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    # repr gives the shortest digits that round-trip; read them as digits d
    # and a decimal point position n, with |value| = 0.d * 10**n.
    mantissa, _, exp_text = repr(abs(value)).partition("e")
    int_part, _, frac_part = mantissa.partition(".")
    all_digits = int_part + frac_part
    digits = all_digits.lstrip("0")
    n = len(int_part) + int(exp_text or 0) - (len(all_digits) - len(digits))
    digits = digits.rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * (-n) + digits
    e = n - 1
    exp_str = f"e+{e}" if e >= 0 else f"e-{-e}"
    if k == 1:
        return sign + digits + exp_str
    return sign + digits[0] + "." + digits[1:] + exp_str


# ---------------------------------------------------------------------------
# Strings and keys
# ---------------------------------------------------------------------------

_encode_string = json.encoder.encode_basestring
_SURROGATE = re.compile("[\ud800-\udfff]")
_LONE_SURROGATE = re.compile("[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]")


def _js_string(text: str) -> str:
    quoted: str = _encode_string(text)
    if _SURROGATE.search(quoted) is None:
        return quoted
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", quoted)


def _is_array_index(key: str) -> bool:
    if not key or not key.isascii() or not key.isdigit():
        return False
    if len(key) > 1 and key[0] == "0":
        return False
    return len(key) <= 10 and int(key) <= _MAX_ARRAY_INDEX


def _utf16_units(text: str) -> bytes:
    return text.encode("utf-16-be", "surrogatepass")


def _js_key_order(keys: list[str]) -> list[str]:
    """Keys sorted by ``Array.prototype.sort()``, then laid out in JS property order."""
    indices = sorted((k for k in keys if _is_array_index(k)), key=int)
    names = [k for k in keys if not _is_array_index(k)]
    if all(k.isascii() for k in names):
        names.sort()
    else:
        names.sort(key=_utf16_units)
    return indices + names if indices else names


# ---------------------------------------------------------------------------
# Canonical JSON
# ---------------------------------------------------------------------------


class _Token(str):
    """Text already in canonical form (punctuation, a written key), queued between values."""

    __slots__ = ()


_COMMA, _END_OBJECT, _END_ARRAY = _Token(","), _Token("}"), _Token("]")


def _write(root: object, out: list[str]) -> None:
    # An explicit stack instead of recursion: the items still to write, the next on top.
    todo: list[object] = [root]
    push, pop, emit = todo.append, todo.pop, out.append
    while todo:
        value = pop()
        if type(value) is _Token:
            emit(value)
        elif isinstance(value, str):
            emit(_js_string(value))
        elif value is None:
            emit("null")
        elif value is True:
            emit("true")
        elif value is False:
            emit("false")
        elif isinstance(value, int | float):
            emit(js_number(value))
        elif isinstance(value, Mapping):
            keys = [str(k) for k in value]
            by_text = {str(k): v for k, v in value.items()}
            emit("{")
            push(_END_OBJECT)
            ordered = _js_key_order(keys)
            for i in range(len(ordered) - 1, 0, -1):
                push(by_text[ordered[i]])
                push(_Token("," + _js_string(ordered[i]) + ":"))
            if ordered:
                push(by_text[ordered[0]])
                push(_Token(_js_string(ordered[0]) + ":"))
        elif isinstance(value, list | tuple):
            emit("[")
            push(_END_ARRAY)
            for i in range(len(value) - 1, 0, -1):
                push(value[i])
                push(_COMMA)
            if value:
                push(value[0])
        elif isinstance(value, RawArguments):
            emit(_js_string(value.text))
        else:
            # Not a JSON value (a datetime, a set from a framework's own parser):
            # sign it by its text rather than refuse to check the call.
            emit(_js_string(str(value)))


def canonical_json(value: object) -> str:
    """tree-llm's canonical text of a parsed JSON value (see the module docstring).

    A :class:`RawArguments` is taken as a JSON string of its text. Values that are
    not JSON (a set, a datetime) are taken as the JSON string of their ``str()``.
    """
    if isinstance(value, str):
        return _js_string(value)
    out: list[str] = []
    _write(value, out)
    return "".join(out)


# ---------------------------------------------------------------------------
# JSON text of a parsed value, at any depth
# ---------------------------------------------------------------------------

_END = object()


def _json_key(key: object) -> str:
    """A mapping key as ``json.dumps`` writes it (its text, before quoting)."""
    if isinstance(key, str):
        return key
    if key is True or key is False or key is None or isinstance(key, int | float):
        return json.dumps(key)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


def _walk_json(value: object) -> str:
    """The text of ``json.dumps`` (compact, not ASCII-escaped) with an explicit stack:
    a dict or a list nested 100,000 deep costs time, never a ``RecursionError``. Raises
    what ``json.dumps`` raises: ``TypeError`` for a value JSON cannot hold, ``ValueError``
    for a circular reference."""
    out: list[str] = []
    open_ids: set[int] = set()
    stack: list[tuple[Iterator[Any], bool, int]] = []  # (items, is a dict, id), innermost last

    def enter(item: object) -> None:
        if not isinstance(item, dict | list | tuple):
            out.append(json.dumps(item, ensure_ascii=False))
            return
        if id(item) in open_ids:
            raise ValueError("Circular reference detected")
        open_ids.add(id(item))
        is_dict = isinstance(item, dict)
        out.append("{" if is_dict else "[")
        stack.append((iter(item.items()) if isinstance(item, dict) else iter(item), is_dict, id(item)))

    enter(value)
    while stack:
        items, is_dict, ident = stack[-1]
        item = next(items, _END)
        if item is _END:
            stack.pop()
            open_ids.discard(ident)
            out.append("}" if is_dict else "]")
            continue
        if out[-1] != "{" and out[-1] != "[":  # not the first item of its container
            out.append(",")
        if is_dict:
            key, item = cast(tuple[object, object], item)
            out.append(json.dumps(_json_key(key), ensure_ascii=False) + ":")
        enter(item)
    return "".join(out)


def json_text(value: object) -> str:
    """``json.dumps(value, ensure_ascii=False, separators=(",", ":"))`` at any depth (see
    :func:`_walk_json`; the C encoder is used while the stack allows it)."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except RecursionError:
        return _walk_json(value)


# ---------------------------------------------------------------------------
# Limits on arguments: depth and size, checked before parsing
# ---------------------------------------------------------------------------

_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_BRACKET = re.compile(r"[\[\]{}]")


def _text_too_deep(text: str, max_depth: int) -> bool:
    if text.count("[") + text.count("{") <= max_depth:
        return False  # cannot nest deeper than it has brackets
    depth = 0
    for match in _BRACKET.finditer(_JSON_STRING.sub('""', text)):
        if match.group() in "[{":
            depth += 1
            if depth > max_depth:
                return True
        elif depth:
            depth -= 1
    return False


def _value_problem(value: object, max_depth: int, max_bytes: int) -> str | None:
    # An already parsed value: walk it with an explicit stack, stopping at the first limit.
    size = 0
    todo: list[tuple[object, int]] = [(value, 0)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, Mapping | list | tuple):
            if depth + 1 > max_depth:
                return f"they nest deeper than {max_depth} levels of arrays and objects"
            size += 2 + len(item)
            if isinstance(item, Mapping):
                for key, child in item.items():
                    size += len(str(key)) + 3
                    todo.append((child, depth + 1))
            else:
                todo.extend((child, depth + 1) for child in item)
        elif isinstance(item, str | RawArguments):
            text = item if isinstance(item, str) else item.text
            size += 2 + (len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass")))
        else:
            size += 8  # a number or a constant: its text is short, or it prints as null
        if size > max_bytes:
            return f"they take more than {max_bytes:,} bytes as JSON (the limit)"
    return None


def arguments_problem(arguments: object, *, max_depth: int, max_bytes: int) -> str | None:
    """Why tool-call arguments are too large to take, or None when they are within the limits.

    ``arguments`` is JSON text (``str``/``bytes``, looked at without parsing it:
    its UTF-8 size, and how deep its arrays and objects nest outside strings) or
    an already parsed value (walked with an explicit stack; its size estimated
    as JSON). The answer completes "the arguments were rejected: ...". Never
    raises and never recurses; the cost is linear in the text, and stops at the
    first limit crossed for a parsed value.
    """
    if isinstance(arguments, bytes | bytearray):
        if len(arguments) > max_bytes:
            return f"they are {len(arguments):,} bytes, above the limit of {max_bytes:,}"
        arguments = bytes(arguments).decode("utf-8", "replace")
    if not isinstance(arguments, str):
        return _value_problem(arguments, max_depth, max_bytes)
    size = len(arguments) if arguments.isascii() else len(arguments.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        return f"they are {size:,} bytes, above the limit of {max_bytes:,}"
    if _text_too_deep(arguments, max_depth):
        return f"they nest deeper than {max_depth} levels of arrays and objects"
    return None


# ---------------------------------------------------------------------------
# djb2 over UTF-16 code units
# ---------------------------------------------------------------------------

_TABLE_SIZE = 4096
_SMALL = 24  # below this many code units a Python loop beats numpy's call overhead
_DIGITS36 = "0123456789abcdefghijklmnopqrstuvwxyz"
if np is not None:
    # 33**i mod 2**32 for i = 0 .. _TABLE_SIZE, a constant table (never mutated).
    _POWERS = np.ones(_TABLE_SIZE + 1, dtype=np.uint32)
    for _i in range(1, _TABLE_SIZE + 1):
        _POWERS[_i] = np.uint32((int(_POWERS[_i - 1]) * 33) & 0xFFFFFFFF)
    _REVERSED = _POWERS[:_TABLE_SIZE][::-1].copy()


def _djb2_units(units: Any) -> int:
    h = 5381
    for start in range(0, len(units), _TABLE_SIZE):
        chunk = units[start : start + _TABLE_SIZE]
        n = len(chunk)
        poly = int(np.dot(chunk, _REVERSED[_TABLE_SIZE - n :]).astype(np.uint32))
        h = (h * int(_POWERS[n]) + poly) & 0xFFFFFFFF
    return h


def _djb2_loop(units: Any) -> int:
    h = 5381
    for unit in units:
        h = (h * 33 + unit) & 0xFFFFFFFF
    return h


def djb2(text: str) -> int:
    """djb2 (h = h * 33 + unit, mod 2**32, from 5381) over UTF-16 code units (numpy for
    long texts when it is installed, a Python loop otherwise: the same value)."""
    if text.isascii():
        data = text.encode("ascii")
        if len(text) < _SMALL or np is None:
            return _djb2_loop(data)
        return _djb2_units(np.frombuffer(data, dtype=np.uint8).astype(np.uint32))
    if np is None:  # native order, so that memoryview's "H" reads code units
        native = "utf-16-le" if sys.byteorder == "little" else "utf-16-be"
        return _djb2_loop(memoryview(text.encode(native, "surrogatepass")).cast("H"))
    raw = text.encode("utf-16-le", "surrogatepass")
    return _djb2_units(np.frombuffer(raw, dtype="<u2").astype(np.uint32))


def _base36(n: int) -> str:
    if n == 0:
        return "0"
    out = []
    while n:
        n, r = divmod(n, 36)
        out.append(_DIGITS36[r])
    return "".join(reversed(out))


def hash_text(canonical: str) -> str:
    """The base-36 djb2 of an already canonical text."""
    return _base36(djb2(canonical))


def stable_hash(value: object) -> str:
    """tree-llm's ``stableHash``: djb2 of :func:`canonical_json`, base 36."""
    return hash_text(canonical_json(value))


def signature(tool_name: str, value: object) -> str:
    """tree-llm's signature of a call: ``f"{tool_name}:{stable_hash(value)}"``."""
    return f"{tool_name}:{stable_hash(value)}"
