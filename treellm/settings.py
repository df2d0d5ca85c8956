"""Every ``TREELLM_*`` environment variable, declared once.

Each :class:`Setting` names its variable, its kind (how the text is parsed), its
default and a one-line meaning; modules read a variable only through :func:`get`
(``settings.get(TREELLM_DB)``), never through ``os.environ``. A value is parsed when
read, and a bad one raises :class:`~treellm.errors.ConfigError` naming the variable:
``TREELLM_CAPTURE_MAX_LENGTH: expected an integer >= 1, got 'ten'``.

A default owned by a config dataclass (STYLE rule 9) stays there: the declaration
has no ``default`` and names the owner in ``default_from``; :func:`get` then returns
``None`` and the caller lets the dataclass decide. An empty or blank value counts as
unset, except for a comma list, where it means the empty list.

Settings whose ``scope`` is ``"tests"`` or ``"benchmarks"`` are read by the test suite
or the benchmarks only; they are declared here so the README lists every variable.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from treellm.errors import ConfigError

__all__ = [
    "SETTINGS",
    "TREELLM_BASE_URL",
    "TREELLM_BENCH_KEEP",
    "TREELLM_CAPTURE",
    "TREELLM_CAPTURE_MAX_LENGTH",
    "TREELLM_CLICKHOUSE",
    "TREELLM_CLICKHOUSE_DATABASE",
    "TREELLM_DASHBOARD_DB",
    "TREELLM_DASHBOARD_PARQUET",
    "TREELLM_DB",
    "TREELLM_INGEST_MEMORY_LIMIT",
    "TREELLM_INTERNAL_TOOLS",
    "TREELLM_MODEL",
    "TREELLM_REQUIRE_BROWSER",
    "TREELLM_REQUIRE_NODE",
    "TREELLM_UPDATE_SNAPSHOTS",
    "Kind",
    "Scope",
    "Setting",
    "age",
    "get",
    "size_bytes",
]

T = TypeVar("T")
D = TypeVar("D")

Kind = Literal["str", "int", "float", "bool", "path", "paths", "size", "list"]
"""``paths`` is a list of paths separated by ``os.pathsep``; ``list`` is comma-separated;
``size`` is a byte size in DuckDB's spelling (``1GB``, ``512MiB``), kept as text."""
Scope = Literal["library", "tests", "benchmarks"]

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_UNITS = {"b": 1, "bytes": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip
"""A size's units, as DuckDB reads them: ``1GB`` is 10**9 bytes, ``1GiB`` 2**30; none: bytes."""
_SIZE = re.compile(rf"(?i)(\d+(?:\.\d+)?)\s*({'|'.join(sorted(_UNITS, key=len, reverse=True))})?")


@dataclass(frozen=True, slots=True)
class Setting(Generic[T, D]):
    """One ``TREELLM_*`` variable: ``get`` gives a ``T`` when set, else ``D`` (the parsed
    default, or ``None`` when there is none here)."""

    name: str
    kind: Kind
    meaning: str
    default: str | None = None
    """The default, spelled as in the environment; ``None``: unset means ``None``."""
    default_from: str | None = None
    """Where the default lives when a dataclass or constant owns it (dotted path)."""
    choices: tuple[str, ...] = ()
    """For ``str``: the allowed values (matched case-insensitively, returned lower-case)."""
    minimum: int | None = None
    """For ``int``: the smallest allowed value."""
    scope: Scope = "library"

    def parse(self, text: str) -> T:
        """The typed value of ``text``; :class:`ConfigError` naming the variable when bad."""
        value: object = _PARSERS[self.kind](self, text)
        return value  # type: ignore[return-value]  # the kind decides T (see declare)

    def expected(self) -> str:
        """What a good value looks like, for the error message and the README."""
        if self.choices:
            return _either(self.choices)
        if self.kind == "int":
            return "an integer" if self.minimum is None else f"an integer >= {self.minimum}"
        return _EXPECTED[self.kind]

    def fail(self, text: str) -> ConfigError:
        return ConfigError(f"{self.name}: expected {self.expected()}, got {text!r}", setting=self.name)


def _either(words: tuple[str, ...]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def _str(setting: Setting[Any, Any], text: str) -> str:
    value = text.strip()
    if setting.choices:
        value = value.lower()
        if value not in setting.choices:
            raise setting.fail(value)
    return value


def _int(setting: Setting[Any, Any], text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise setting.fail(text) from None
    if setting.minimum is not None and value < setting.minimum:
        raise setting.fail(text)
    return value


def _float(setting: Setting[Any, Any], text: str) -> float:
    try:
        return float(text.strip())
    except ValueError:
        raise setting.fail(text) from None


def _bool(setting: Setting[Any, Any], text: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise setting.fail(text)


def _path(setting: Setting[Any, Any], text: str) -> Path:
    return Path(text.strip())


def _paths(setting: Setting[Any, Any], text: str) -> tuple[Path, ...]:
    return tuple(Path(part) for part in text.split(os.pathsep) if part.strip())


def _size(setting: Setting[Any, Any], text: str) -> str:
    value = text.strip()
    if not _SIZE.fullmatch(value):
        raise setting.fail(text)
    return value


def size_bytes(text: str) -> int:
    """Bytes of a ``size`` setting's value (:data:`_SIZE`, in :data:`_UNITS`)."""
    found = _SIZE.fullmatch(text.strip())
    if found is None:
        raise ValueError(f"expected a size such as 1GB or 512MiB, got {text!r}")
    return int(float(found[1]) * (_UNITS[found[2].lower()] if found[2] else 1))


_AGE = re.compile(r"\s*(\d+)\s*([smhdw])\s*")
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def age(text: str) -> dt.timedelta | None:
    """An age such as ``30d``, ``12h`` or ``2w`` (a whole number and one of s, m, h, d, w) as a
    timedelta; None when ``text`` is not one."""
    found = _AGE.fullmatch(text)
    return None if found is None else dt.timedelta(seconds=int(found[1]) * _AGE_UNITS[found[2]])


def _list(setting: Setting[Any, Any], text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


_PARSERS: dict[Kind, Callable[[Setting[Any, Any], str], object]] = {
    "str": _str,
    "int": _int,
    "float": _float,
    "bool": _bool,
    "path": _path,
    "paths": _paths,
    "size": _size,
    "list": _list,
}
_EXPECTED: dict[Kind, str] = {
    "str": "text",
    "int": "an integer",
    "float": "a number",
    "bool": "1, 0, true or false",
    "path": "a path",
    "paths": f"paths separated by {os.pathsep!r}",
    "size": "a size like 1GB or 512MB",
    "list": "a comma-separated list",
}


def get(setting: Setting[T, D], environ: Mapping[str, str] | None = None) -> T | D:
    """The variable's value from ``environ`` (default ``os.environ``), parsed; its
    default when unset or blank (a comma list: blank is the empty list)."""
    text = (os.environ if environ is None else environ).get(setting.name)
    if text is not None and (text.strip() or setting.kind == "list"):
        return setting.parse(text)
    if setting.default is None:
        return None  # type: ignore[return-value]  # D is None when there is no default here
    return setting.parse(setting.default)


def _declare(setting: Setting[T, D]) -> Setting[T, D]:
    if setting.default is not None:
        setting.parse(setting.default)  # a bad default is a bug here, caught at import
    return setting


TREELLM_DB: Setting[Path, Path] = _declare(
    Setting("TREELLM_DB", "path", "the DuckDB store when no `--db` or path is given", default="treellm.duckdb")
)
TREELLM_CAPTURE: Setting[str, None] = _declare(
    Setting(
        "TREELLM_CAPTURE",
        "str",
        "tool content telemetry records: `redacted`, `full` or `none` (`configure(capture=...)` wins)",
        default_from="treellm.telemetry.redaction.Capture.mode",
        choices=("redacted", "full", "none"),
    )
)
TREELLM_CAPTURE_MAX_LENGTH: Setting[int, None] = _declare(
    Setting(
        "TREELLM_CAPTURE_MAX_LENGTH",
        "int",
        "characters of a captured argument or result kept before truncation",
        default_from="treellm.telemetry.redaction.Capture.max_length",
        minimum=1,
    )
)
TREELLM_INGEST_MEMORY_LIMIT: Setting[str, str] = _declare(
    Setting(
        "TREELLM_INGEST_MEMORY_LIMIT",
        "size",
        "the memory of a `treellm ingest` process (DuckDB gets what the process does not hold, less 160 MiB "
        "for its Python work); DuckDB's alone in an exporter, a collector or a Python caller",
        default="1GB",
    )
)
TREELLM_INTERNAL_TOOLS: Setting[tuple[str, ...], None] = _declare(
    Setting(
        "TREELLM_INTERNAL_TOOLS",
        "list",
        "framework-internal tool names, kept out of counts and tuning (empty: none)",
        default_from="treellm.telemetry.conventions.DEFAULT_INTERNAL_TOOLS",
    )
)
TREELLM_CLICKHOUSE: Setting[str, None] = _declare(
    Setting(
        "TREELLM_CLICKHOUSE",
        "str",
        "the ClickHouse store when no URL is given: `http(s)://user:password@host:8123/db` or `chdb:PATH`",
    )
)
TREELLM_CLICKHOUSE_DATABASE: Setting[str, str] = _declare(
    Setting(
        "TREELLM_CLICKHOUSE_DATABASE",
        "str",
        "the ClickHouse database that holds treellm's tables and views (created if absent) when no "
        "`--clickhouse-database`",
        default="treellm",
    )
)
TREELLM_BASE_URL: Setting[str, None] = _declare(
    Setting("TREELLM_BASE_URL", "str", "the endpoint of `treellm run` without `--base-url`")
)
TREELLM_MODEL: Setting[str, None] = _declare(
    Setting("TREELLM_MODEL", "str", "the model name of `treellm run` without `--model`")
)
TREELLM_DASHBOARD_DB: Setting[Path, None] = _declare(
    Setting(
        "TREELLM_DASHBOARD_DB",
        "path",
        "the store the dashboard reads (set by `treellm dashboard`)",
        default_from="treellm.settings.TREELLM_DB",
    )
)
TREELLM_DASHBOARD_PARQUET: Setting[tuple[Path, ...], None] = _declare(
    Setting(
        "TREELLM_DASHBOARD_PARQUET",
        "paths",
        "Parquet folders the dashboard reads instead of a store (set by `treellm dashboard --parquet`)",
    )
)
TREELLM_REQUIRE_BROWSER: Setting[bool, bool] = _declare(
    Setting("TREELLM_REQUIRE_BROWSER", "bool", "tests: fail, not skip, without Chromium", default="0", scope="tests")
)
TREELLM_REQUIRE_NODE: Setting[bool, bool] = _declare(
    Setting(
        "TREELLM_REQUIRE_NODE",
        "bool",
        "tests: fail, not skip, without the JavaScript exporter",
        default="0",
        scope="tests",
    )
)
TREELLM_UPDATE_SNAPSHOTS: Setting[bool, bool] = _declare(
    Setting("TREELLM_UPDATE_SNAPSHOTS", "bool", "tests: rewrite the inspector snapshots", default="0", scope="tests")
)
TREELLM_BENCH_KEEP: Setting[str, None] = _declare(
    Setting("TREELLM_BENCH_KEEP", "str", "benchmarks: keep the generated files (any value)", scope="benchmarks")
)

SETTINGS: Mapping[str, Setting[Any, Any]] = {
    s.name: s
    for s in (
        TREELLM_DB,
        TREELLM_CAPTURE,
        TREELLM_CAPTURE_MAX_LENGTH,
        TREELLM_INGEST_MEMORY_LIMIT,
        TREELLM_INTERNAL_TOOLS,
        TREELLM_CLICKHOUSE,
        TREELLM_CLICKHOUSE_DATABASE,
        TREELLM_BASE_URL,
        TREELLM_MODEL,
        TREELLM_DASHBOARD_DB,
        TREELLM_DASHBOARD_PARQUET,
        TREELLM_REQUIRE_BROWSER,
        TREELLM_REQUIRE_NODE,
        TREELLM_UPDATE_SNAPSHOTS,
        TREELLM_BENCH_KEEP,
    )
}
"""Every variable by name, in the README's order."""
