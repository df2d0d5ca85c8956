"""The README documents every command and setting, and its examples run."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
from pathlib import Path

from treellm import TreeConfig
from treellm.cli import build_parser

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


def test_the_readme_opens_with_the_two_commands() -> None:
    head = README[:1500]
    assert "make demo" in head and "make test" in head


def test_every_cli_command_is_documented() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name in sub.choices:  # type: ignore[union-attr]
        assert f"`treellm {name}" in README, name


def test_every_tree_config_setting_is_documented_with_its_default() -> None:
    for field in dataclasses.fields(TreeConfig):
        row = next((line for line in README.splitlines() if line.startswith(f"| `{field.name}` |")), None)
        assert row is not None, field.name
        default = field.default
        if isinstance(default, bool | int | float | str) and field.name != "system_prompt":
            shown = f'"{default}"' if isinstance(default, str) else str(default)
            assert f"`{shown}`" in row, (field.name, row)


def test_the_quick_start_example_runs_and_prints_what_it_says() -> None:
    block = re.search(r"## Quick start.*?```python\n(.*?)```", README, re.S)
    assert block is not None
    code = block.group(1)
    expected = re.search(r"# (pruned_out \S+)", code)
    assert expected is not None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README quick start", "exec"), {})
    assert out.getvalue().strip() == expected.group(1)


def _python_blocks() -> list[tuple[str, str]]:
    """(code, the prose after it up to the next block or heading) of each README Python block."""
    found = re.finditer(r"```python\n(.*?)```\n(.*?)(?=```|\n#)", README, re.S)
    return [(m.group(1), m.group(2)) for m in found]


def test_every_readme_python_example_runs_as_written_or_names_a_runnable_example(tmp_path: Path) -> None:
    import subprocess
    import sys

    from test_examples import TESTED

    blocks = _python_blocks()
    assert len(blocks) >= 10
    ran = 0
    for code, after in blocks:
        named = re.findall(r"examples/(\w+\.py)", code + after)
        if named:
            assert set(named) <= TESTED, named  # each is run by tests/test_examples.py
            continue
        # in order, in one folder, as a new user pastes each into a file and runs it
        done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False)
        assert done.returncode == 0, (code, done.stderr[-2000:])
        ran += 1
    assert ran >= 6
