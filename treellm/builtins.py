"""Safe built-in tools for ``treellm run``: read-only access under one root folder.

Every path argument is resolved inside ``root``; a path that escapes it (``..``,
an absolute path elsewhere, a symlink out) is refused with an error result. No
tool writes, deletes or runs anything. Results are bounded in size.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from treellm.engine.tools import Tool

__all__ = ["builtin_tools"]

MAX_READ_LINES = 200
MAX_ENTRIES = 200
MAX_MATCHES = 50
MAX_FILE_BYTES = 2_000_000


class ToolInputError(ValueError):
    """A built-in tool was called with an argument it cannot use (sent back to the model)."""


def _inside(root: Path, relative: object) -> Path:
    if not isinstance(relative, str):
        raise ToolInputError(f"path: expected a string, got {type(relative).__name__}")
    target = (root / relative).resolve()
    if target != root and root not in target.parents:
        raise ToolInputError(f"path {relative!r} is outside the allowed folder")
    return target


def _int_arg(args: dict[str, Any], name: str, default: int) -> int:
    value = args.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ToolInputError(f"{name}: expected a non-negative integer, got {value!r}")
    return int(value)


def _read_file(root: Path) -> Callable[[dict[str, Any]], str]:
    def read_file(args: dict[str, Any]) -> str:
        path = _inside(root, args.get("path"))
        if not path.is_file():
            raise ToolInputError(f"no such file: {args.get('path')}")
        offset = _int_arg(args, "offset", 1)
        limit = min(_int_arg(args, "limit", MAX_READ_LINES), MAX_READ_LINES)
        with path.open("r", encoding="utf-8", errors="replace") as handle:
            lines = handle.read(MAX_FILE_BYTES).splitlines()
        start = max(offset, 1)
        chosen = lines[start - 1 : start - 1 + limit]
        body = "\n".join(f"{start + i:>5}  {line}" for i, line in enumerate(chosen))
        more = len(lines) - (start - 1 + len(chosen))
        tail = f"\n[{more} more line(s); read on with offset={start + len(chosen)}]" if more > 0 else ""
        return body + tail

    return read_file


def _list_dir(root: Path) -> Callable[[dict[str, Any]], str]:
    def list_dir(args: dict[str, Any]) -> str:
        path = _inside(root, args.get("path", "."))
        if not path.is_dir():
            raise ToolInputError(f"not a folder: {args.get('path', '.')}")
        entries = sorted(path.iterdir(), key=lambda p: (not p.is_dir(), p.name))
        shown = [f"{e.name}/" if e.is_dir() else e.name for e in entries[:MAX_ENTRIES]]
        extra = f"\n[{len(entries) - MAX_ENTRIES} more]" if len(entries) > MAX_ENTRIES else ""
        return "\n".join(shown) + extra if shown else "(empty folder)"

    return list_dir


def _search_text(root: Path) -> Callable[[dict[str, Any]], str]:
    def search_text(args: dict[str, Any]) -> str:
        pattern = args.get("pattern")
        if not isinstance(pattern, str) or not pattern:
            raise ToolInputError("pattern: expected a non-empty string")
        try:
            regex = re.compile(pattern, 0 if args.get("case_sensitive") else re.IGNORECASE)
        except re.error as exc:
            raise ToolInputError(f"pattern is not a valid regular expression: {exc}") from exc
        base = _inside(root, args.get("path", "."))
        files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
        matches: list[str] = []
        for file in files:
            if file.stat().st_size > MAX_FILE_BYTES:
                continue
            try:
                text = file.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            for number, line in enumerate(text.splitlines(), 1):
                if regex.search(line):
                    matches.append(f"{file.relative_to(root)}:{number}: {line.strip()[:200]}")
                    if len(matches) >= MAX_MATCHES:
                        return "\n".join(matches) + f"\n[stopped at {MAX_MATCHES} matches]"
        return "\n".join(matches) if matches else "no matches"

    return search_text


def _current_time(_: dict[str, Any]) -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def builtin_tools(root: str | Path) -> list[Tool]:
    """read_file, list_dir, search_text and current_time, confined to ``root``."""
    base = Path(root).resolve()
    path_arg = {"type": "string", "description": "a path relative to the root folder"}
    return [
        Tool(
            "read_file",
            "Read a text file (numbered lines). Use offset and limit to page through long files.",
            {
                "type": "object",
                "properties": {
                    "path": path_arg,
                    "offset": {"type": "integer", "description": "first line (1-based)"},
                    "limit": {"type": "integer", "description": f"lines to read (at most {MAX_READ_LINES})"},
                },
                "required": ["path"],
            },
            _read_file(base),
        ),
        Tool(
            "list_dir",
            "List a folder (folders end with /).",
            {"type": "object", "properties": {"path": path_arg}},
            _list_dir(base),
        ),
        Tool(
            "search_text",
            "Search text files for a regular expression; returns file:line: text.",
            {
                "type": "object",
                "properties": {
                    "pattern": {"type": "string"},
                    "path": path_arg,
                    "case_sensitive": {"type": "boolean"},
                },
                "required": ["pattern"],
            },
            _search_text(base),
        ),
        Tool(
            "current_time",
            "The current time (UTC, ISO 8601).",
            {"type": "object", "properties": {}},
            _current_time,
            max_repeats=3,
        ),
    ]
