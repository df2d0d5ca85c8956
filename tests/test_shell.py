"""Shell commands: read/write/unknown on real agent commands, line windows, never raising."""

from __future__ import annotations

import json
from pathlib import Path
from typing import get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treellm.shell import DEFAULT_SHELL_TOOLS, LineWindow, ShellEffect, classify_command, command_text, line_window

TABLE_PATH = Path(__file__).parent / "data" / "shell_commands.tsv"


def _load_table() -> list[tuple[str, str, str]]:
    lines = TABLE_PATH.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# source: SWE-agent/mini-swe-agent")
    assert lines[1].split("\t") == ["command", "expected", "reason"]
    rows = []
    for line in lines[2:]:
        command, expected, reason = line.split("\t")
        rows.append((json.loads(command), expected, reason))
    return rows


TABLE = _load_table()


@pytest.mark.parametrize(
    ("command", "expected", "reason"), TABLE, ids=[f"{i}-{r[2][:40]}" for i, r in enumerate(TABLE)]
)
def test_real_command_has_the_expected_effect(command: str, expected: str, reason: str) -> None:
    assert classify_command(command) == expected, reason


def test_table_covers_the_required_kinds() -> None:
    expected = [row[1] for row in TABLE]
    commands = [row[0] for row in TABLE]
    assert len(TABLE) >= 100
    assert expected.count("write") >= 30
    assert expected.count("read") >= 30
    assert expected.count("unknown") >= 15
    assert len(set(commands)) == len(commands)
    for needle in ("|", "&&", "<<", "/dev/null", "sed -i", "> patch.txt", "cp ./pvlib/iam.py.backup ./pvlib/iam.py"):
        assert any(needle in c for c in commands), needle


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("echo hi | tee out.txt", "write"),
        ("echo hi | tee /dev/null", "read"),
        ("dd if=/dev/zero of=disk.img bs=1M count=1", "write"),
        ("dd if=disk.img of=/dev/null", "read"),
        ("perl -pi -e 's/a/b/' f.py", "write"),
        ("perl -ne 'print if /x/' f.py", "unknown"),
        ("find . -name '*.pyc' -delete", "write"),
        ("find . -name '*.pyc' -exec rm {} +", "write"),
        ("find . -name '*.py' -exec grep -l foo {} \\;", "read"),
        ("git stash list", "read"),
        ("git stash", "write"),
        ("git -C /testbed --no-pager diff", "read"),
        ("git diff --output=out.patch", "write"),
        ("git branch", "read"),
        ("git branch feature", "write"),
        ("git frobnicate", "unknown"),
        ("awk '{print $1 > \"out.txt\"}' f", "write"),
        ("awk -F: '{print $1}' /etc/passwd", "read"),
        ("cat <<EOF > notes.txt\nhello\nEOF", "write"),
        ("cat <<EOF\nhello\nEOF", "read"),
        ("python - <<EOF\nprint(1)\nEOF", "unknown"),
        ("echo $(rm -rf build)", "write"),
        ("(cd src && rm -f x.o)", "write"),
        ("for f in *.py; do cp $f $f.bak; done", "write"),
        ("bash -c 'ls > listing.txt'", "write"),
        ("bash -c 'ls -la'", "read"),
        ("bash run.sh", "unknown"),
        ("ls 2>&1 >/dev/null", "read"),
        ("make test &> build.log", "write"),
        ("ls 2> errors.txt", "write"),
        ("chmod +x run.sh && ./run.sh", "write"),
        ("ln -s a b", "write"),
        ("npm install", "write"),
        ("python setup.py develop", "write"),
        ("python setup.py build", "unknown"),
        ("sort -o sorted.txt data.txt", "write"),
        ("sort data.txt | uniq -c", "read"),
        ("sed -n '/x/w out.txt' f", "write"),
        ("sed -ni 's/a/b/p' f", "write"),
        ("sed -i.bak 's/a/b/' f", "write"),
        ("timeout 60 pytest -x", "unknown"),
        ("env PYTHONPATH=. grep -r x src", "read"),
        ("ls | xargs rm", "write"),
        ("X=1 ls", "read"),
        ("sed $OPTS 's/a/b/' f", "unknown"),
        ("grep $PATTERN f", "read"),
        ("$EDITOR f", "unknown"),
        ("/usr/bin/grep -r x .", "read"),
        ("python3.11 -m pip install x", "write"),
        ("pytest tests/", "unknown"),
        ("make", "unknown"),
        ("", "read"),
        ("# just a comment", "read"),
    ],
)
def test_rule_table(command: str, expected: ShellEffect) -> None:
    assert classify_command(command) == expected


def test_parser_errors_fall_back_to_shlex_then_unknown() -> None:
    # tree-sitter reports an error; shlex still splits: cd is a read, rm a write.
    assert classify_command("cd x && rm y )") == "write"
    assert classify_command("ls )") == "read"
    # an unterminated quote defeats both
    assert classify_command('cat "unterminated') == "unknown"


WINDOWS = [
    # real commands
    ("sed -n '70,95p' ./pvlib/iam.py", LineWindow("sed", "pvlib/iam.py", 70, 95)),
    ("sed -n '1117p' src/marshmallow/fields.py", LineWindow("sed", "src/marshmallow/fields.py", 1117, 1117)),
    (
        "sed -n '253p' /testbed/src/marshmallow/marshalling.py",
        LineWindow("sed", "/testbed/src/marshmallow/marshalling.py", 253, 253),
    ),
    (
        "cd /testbed && sed -n '200,220p' astroid/modutils.py",
        LineWindow("sed", "/testbed/astroid/modutils.py", 200, 220),
    ),
    (
        "sed -n '101,150p' src/sqlfluff/core/linter/linter.py | cat -n",
        LineWindow("sed", "src/sqlfluff/core/linter/linter.py", 101, 150),
    ),
    (
        "sed -n '1113,1120p' src/marshmallow/fields.py | cat -A",
        LineWindow("sed", "src/marshmallow/fields.py", 1113, 1120),
    ),
    ("cat -n ./pvlib/tools.py | sed -n '340,385p'", LineWindow("sed", "pvlib/tools.py", 340, 385)),
    ("cat pydicom/jsonrep.py | sed -n '225,232p'", LineWindow("sed", "pydicom/jsonrep.py", 225, 232)),
    (
        "cd /testbed && cat pydicom/dataset.py.backup | sed -n '2490,2505p'",
        LineWindow("sed", "/testbed/pydicom/dataset.py.backup", 2490, 2505),
    ),
    ("head -300 pvlib/pvsystem.py", LineWindow("head", "pvlib/pvsystem.py", 1, 300)),
    ("cat -n pydicom/jsonrep.py | head -250", LineWindow("head", "pydicom/jsonrep.py", 1, 250)),
    (
        'head -40 src/sqlfluff/rules/L060.py | grep -n "def _eval" -A 1',
        LineWindow("head", "src/sqlfluff/rules/L060.py", 1, 40),
    ),
    ("cat ./pvlib/iam.py | tail -100", LineWindow("tail", "pvlib/iam.py", -100, None)),
    (
        "cd /testbed && tail -50 astroid/nodes/as_string.py",
        LineWindow("tail", "/testbed/astroid/nodes/as_string.py", -50, None),
    ),
    (
        "tail -20 /testbed/test/fixtures/rules/std_rule_cases/L003.yml",
        LineWindow("tail", "/testbed/test/fixtures/rules/std_rule_cases/L003.yml", -20, None),
    ),
    (
        "awk 'NR >= 927 && NR <= 970' ./astroid/brain/brain_builtin_inference.py",
        LineWindow("awk", "astroid/brain/brain_builtin_inference.py", 927, 970),
    ),
    # the other forms the paging rule names
    (
        "tail -n +962 ./astroid/brain/brain_builtin_inference.py",
        LineWindow("tail", "astroid/brain/brain_builtin_inference.py", 962, None),
    ),
    ("tail -n 30 f.py", LineWindow("tail", "f.py", -30, None)),
    ("head -n 5 f.py", LineWindow("head", "f.py", 1, 5)),
    ("head f.py", LineWindow("head", "f.py", 1, 10)),
    ("nl -ba src/x.py | sed -n '10,20p'", LineWindow("sed", "src/x.py", 10, 20)),
    ("sed -n '10,$p' f.py", LineWindow("sed", "f.py", 10, None)),
    ("awk 'NR==7' f.py", LineWindow("awk", "f.py", 7, 7)),
    ("awk 'NR>10 && NR<20 {print}' f.py", LineWindow("awk", "f.py", 11, 19)),
    ("awk 'NR==5,NR==9' f.py", LineWindow("awk", "f.py", 5, 9)),
    ("head -n 50 f.py | tail -n 10", LineWindow("head", "f.py", 41, 50)),
    ("sed -n '100,200p' f.py 2>/dev/null | head -20", LineWindow("sed", "f.py", 100, 119)),
]


def test_a_fallback_list_of_windows_on_one_file_shows_the_first() -> None:
    command = (
        "sed -n '486,550p' src/sqlfluff/core/linter/linted_file.py 2>/dev/null"
        " || sed -n '486,$p' src/sqlfluff/core/linter/linted_file.py"
    )
    assert line_window(command) == LineWindow("sed", "src/sqlfluff/core/linter/linted_file.py", 486, 550)


@pytest.mark.parametrize(("command", "window"), WINDOWS, ids=[c for c, _ in WINDOWS])
def test_line_window(command: str, window: LineWindow) -> None:
    assert line_window(command) == window


@pytest.mark.parametrize(
    "command",
    [
        'grep -n "import" src/marshmallow/marshalling.py | head -20',
        "git diff pvlib/pvsystem.py | head -50",
        "cd /testbed && python -m pytest tests/ -x 2>&1 | tail -30",
        "grep -n x src/a.py || sed -n '1,30p' src/a.py",  # a fallback that is not a window of one file
        "cat -n src/marshmallow/fields.py | sed -n '1067,1155p' > /tmp/datetime.txt && cat /tmp/datetime.txt",
        "cat ./pvlib/iam.py",
        "awk 'NR>486 && /^[[:space:]]*def / {print NR, $0; exit}' src/sqlfluff/core/linter/linted_file.py",
        "sed -i '863,866d' src/marshmallow/schema.py",
        "sed -n '10,20p;30,40p' f.py",
        "sed -n '10,20p' a.py b.py",
        "head -c 100 f.py",
        "tail -f log.txt",
        "sed -n '1,5p' $FILE",
        "cd $HOME && sed -n '1,5p' f.py",
        "ls\nsed -n '1,5p' f.py",
        "",
    ],
)
def test_no_line_window(command: str) -> None:
    assert line_window(command) is None


def test_tails_of_different_length_are_different_windows() -> None:
    assert line_window("tail -n 20 f.py") != line_window("tail -n 40 f.py")
    assert line_window("tail -n +20 f.py") != line_window("tail -n 20 f.py")


def test_paging_moves_the_window_on_the_same_resource() -> None:
    first = line_window("cd /testbed && sed -n '1,50p' src/a.py")
    second = line_window("cd /testbed && cat -n src/a.py | sed -n '51,100p'")
    assert first is not None and second is not None
    assert (first.program, first.resource) == (second.program, second.resource)
    assert (first.start, second.start) == (1, 51)


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ("ls -la", "ls -la"),
        ({"command": "cat f"}, "cat f"),
        ({"cmd": "pwd"}, "pwd"),
        ({"script": "echo hi"}, "echo hi"),
        ({"commands": ["cd /x", "ls"]}, "cd /x\nls"),
        ({"command": 3, "cmd": "ls"}, "ls"),
        ({"path": "f.py"}, None),
        ({"commands": []}, None),
        ({"commands": ["ls", 1]}, None),
        (["ls"], None),
        (None, None),
        (42, None),
    ],
)
def test_command_text(arguments: object, text: str | None) -> None:
    assert command_text(arguments) == text


def test_default_shell_tools() -> None:
    assert "bash" in DEFAULT_SHELL_TOOLS
    assert len(set(DEFAULT_SHELL_TOOLS)) == len(DEFAULT_SHELL_TOOLS) == 7


def test_astral_characters_after_a_brace_do_not_crash_the_parser() -> None:
    # tree-sitter-bash#337: `{` then a 4-byte UTF-8 character segfaulted about one
    # run in two before the characters were replaced.
    for text in ("{\U00031860", "_{\U000c52f3 x", "echo {a} \U0001f600 > out", "{" + "\U0001d72f" * 20):
        for _ in range(300):
            assert classify_command(text) in get_args(ShellEffect)
    assert classify_command("echo '\U0001f600' > out.txt") == "write"
    assert line_window("sed -n '1,5p' 'f\U0001f600.py'") is not None


SHELL_PIECES = st.sampled_from(
    [
        "ls", "rm", "sed", "-n", "-i", "'1,2p'", "f", ">", ">>", "2>&1", "/dev/null", "|", "&&", "||", ";",
        "\n", "(", ")", "$(", "`", '"', "'", "<<", "EOF", "cat", "git", "diff", "find", "-exec", "{}", "\\;",
        "xargs", "bash", "-c", "awk", "NR==1", "{", "}", "for", "do", "done", "if", "then", "fi", "\\", "#",
        "<<<", "&", "|&", ">&", "<(", "$x", "${x}", "=", "X=1", "\x00", "\ud800", "\U0001f600", "\U00031860",
    ]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.lists(SHELL_PIECES, max_size=30).map(" ".join)))
def test_classify_command_never_raises(command: str) -> None:
    assert classify_command(command) in get_args(ShellEffect)
    window = line_window(command)
    assert window is None or isinstance(window, LineWindow)
