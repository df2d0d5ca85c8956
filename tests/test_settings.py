"""Every ``TREELLM_*`` variable is declared once (``treellm.settings``), documented in the
README's table, read only through the registry, and parsed with errors naming it."""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path
from typing import Any, get_args

import pytest

from treellm import settings
from treellm.errors import ConfigError
from treellm.settings import SETTINGS, Setting

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def resolve(dotted: str) -> tuple[Any, str]:
    """The value at ``module.Name[.field]`` (a dataclass field gives its default) and the
    name after the module (``Capture.max_length``)."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            value: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            if dataclasses.is_dataclass(value) and isinstance(value, type):
                value = {f.name: f.default for f in dataclasses.fields(value)}[name]
            else:
                value = getattr(value, name)
        return value, ".".join(parts[cut:])
    raise AssertionError(f"cannot import {dotted}")


def default_cell(setting: Setting[Any, Any]) -> str:
    """The README's default column for ``setting``."""
    if setting.default is not None:
        return f"`{setting.default}`"
    if setting.default_from is None:
        return "unset"
    value, owner = resolve(setting.default_from)
    if isinstance(value, Setting):
        return f"as `{value.name}`"
    shown = ",".join(value) if isinstance(value, tuple) else str(value)
    return f"`{shown}` (`{owner}`)"


def readme_table() -> dict[str, tuple[str, str]]:
    section = re.search(r"^## Environment variables\n(.*?)(?=^## )", README, re.S | re.M)
    assert section is not None, "README has no '## Environment variables' section"
    rows = {}
    for line in section.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `TREELLM_") and len(cells) == 3:
            rows[cells[0].strip("`")] = (cells[1], cells[2])
    return rows


def test_the_readme_table_is_the_registry() -> None:
    table = readme_table()
    assert list(table) == list(SETTINGS)
    for name, setting in SETTINGS.items():
        default, meaning = table[name]
        assert default == default_cell(setting), name
        assert meaning == setting.meaning, name


def test_every_setting_is_well_formed() -> None:
    for name, setting in SETTINGS.items():
        assert name == setting.name and re.fullmatch(r"TREELLM_[A-Z0-9_]+", name), name
        assert getattr(settings, name) is setting
        assert setting.meaning and "\n" not in setting.meaning and "|" not in setting.meaning, name
        assert not (setting.default is not None and setting.default_from is not None), name
        if setting.default_from is not None:
            resolve(setting.default_from)  # the owner of the default exists
    assert set(settings.__all__) >= set(SETTINGS)


def test_capture_choices_are_the_capture_modes() -> None:
    from treellm.telemetry.redaction import CaptureMode

    assert settings.TREELLM_CAPTURE.choices == get_args(CaptureMode)


SPELLED = re.compile(r"""["']TREELLM_""")


def test_no_module_outside_the_registry_spells_a_variable_name() -> None:
    offenders = []
    for folder in ("treellm", "dashboard"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "treellm" / "settings.py":
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if SPELLED.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == [], "read TREELLM_* variables through treellm.settings:\n" + "\n".join(offenders)


def test_unset_and_blank_give_the_default() -> None:
    assert settings.get(settings.TREELLM_DB, {}) == Path("treellm.duckdb")
    assert settings.get(settings.TREELLM_DB, {"TREELLM_DB": "  "}) == Path("treellm.duckdb")
    assert settings.get(settings.TREELLM_INGEST_MEMORY_LIMIT, {}) == "1GB"
    assert settings.get(settings.TREELLM_CAPTURE, {"TREELLM_CAPTURE": ""}) is None
    assert settings.get(settings.TREELLM_INTERNAL_TOOLS, {}) is None
    assert settings.get(settings.TREELLM_REQUIRE_BROWSER, {}) is False


def test_values_are_parsed_by_kind() -> None:
    env = {
        "TREELLM_DB": "runs.duckdb",
        "TREELLM_CAPTURE": " FULL ",
        "TREELLM_CAPTURE_MAX_LENGTH": "20",
        "TREELLM_INGEST_MEMORY_LIMIT": "512MiB",
        "TREELLM_INTERNAL_TOOLS": "a, b,,",
        "TREELLM_DASHBOARD_PARQUET": f"w1{__import__('os').pathsep}w2",
        "TREELLM_REQUIRE_NODE": "true",
    }
    assert settings.get(settings.TREELLM_DB, env) == Path("runs.duckdb")
    assert settings.get(settings.TREELLM_CAPTURE, env) == "full"
    assert settings.get(settings.TREELLM_CAPTURE_MAX_LENGTH, env) == 20
    assert settings.get(settings.TREELLM_INGEST_MEMORY_LIMIT, env) == "512MiB"
    assert settings.get(settings.TREELLM_INTERNAL_TOOLS, env) == ("a", "b")
    assert settings.get(settings.TREELLM_INTERNAL_TOOLS, {"TREELLM_INTERNAL_TOOLS": ""}) == ()
    assert settings.get(settings.TREELLM_DASHBOARD_PARQUET, env) == (Path("w1"), Path("w2"))
    assert settings.get(settings.TREELLM_REQUIRE_NODE, env) is True


@pytest.mark.parametrize(
    ("setting", "text", "message"),
    [
        (settings.TREELLM_CAPTURE, "everything", "TREELLM_CAPTURE: expected redacted, full or none, got 'everything'"),
        (settings.TREELLM_CAPTURE_MAX_LENGTH, "ten", "TREELLM_CAPTURE_MAX_LENGTH: expected an integer >= 1, got 'ten'"),
        (settings.TREELLM_CAPTURE_MAX_LENGTH, "0", "TREELLM_CAPTURE_MAX_LENGTH: expected an integer >= 1, got '0'"),
        (
            settings.TREELLM_INGEST_MEMORY_LIMIT,
            "1GB'; DROP",
            'TREELLM_INGEST_MEMORY_LIMIT: expected a size like 1GB or 512MB, got "1GB\'; DROP"',
        ),
        (settings.TREELLM_INGEST_MEMORY_LIMIT, "lots", "TREELLM_INGEST_MEMORY_LIMIT: expected a size like 1GB"),
        (settings.TREELLM_REQUIRE_BROWSER, "maybe", "TREELLM_REQUIRE_BROWSER: expected 1, 0, true or false, got"),
    ],
)
def test_a_bad_value_is_a_config_error_naming_the_variable(setting: Setting[Any, Any], text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        settings.get(setting, {setting.name: text})
    assert caught.value.setting == setting.name


def test_float_kind_parses_and_refuses() -> None:
    number: Setting[float, None] = Setting("TREELLM_TEST_NUMBER", "float", "a test number")
    assert settings.get(number, {"TREELLM_TEST_NUMBER": "2.5"}) == 2.5
    with pytest.raises(ConfigError, match="TREELLM_TEST_NUMBER: expected a number, got 'x'"):
        settings.get(number, {"TREELLM_TEST_NUMBER": "x"})


def test_the_readers_use_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    from treellm.store.connection import default_db_path
    from treellm.store.ingest import internal_tools
    from treellm.telemetry import redaction
    from treellm.telemetry.redaction import Capture, resolve_capture

    monkeypatch.setattr(redaction, "_default", None)  # no configure(capture=...) in effect
    monkeypatch.setenv("TREELLM_DB", "elsewhere.duckdb")
    assert default_db_path() == Path("elsewhere.duckdb")
    monkeypatch.setenv("TREELLM_INTERNAL_TOOLS", "x,y")
    assert internal_tools() == frozenset({"x", "y"})
    monkeypatch.setenv("TREELLM_CAPTURE", "full")
    monkeypatch.setenv("TREELLM_CAPTURE_MAX_LENGTH", "7")
    assert resolve_capture() == Capture("full", 7)
    monkeypatch.delenv("TREELLM_CAPTURE_MAX_LENGTH")
    assert resolve_capture() == Capture("full")
