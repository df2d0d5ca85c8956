"""What a shell command does to the world: read, write or unknown; and which lines it pages.

Contract:

- :func:`classify_command` tells whether one shell command (as an agent's ``bash``
  tool receives it) changes state. The text is parsed with the tree-sitter bash
  grammar; every simple command anywhere in it (pipelines, ``&&``/``||``/``;``
  lists, subshells, ``$(...)``, loops, heredoc bodies) and every redirection is
  judged, and the whole is the worst of its parts: ``write`` > ``unknown`` > ``read``.
  A program is judged by its row in :data:`_PROGRAMS` (program -> rule); a program
  not in the table (scripts, ``python``, ``pytest``, ``make``, ``./run.sh``) is
  ``unknown``, which callers treat as writing (see **state change** in
  ARCHITECTURE.md). A rule that reads the arguments (``sed``, ``git``, ``find``...)
  gives at least ``unknown`` when an unquoted expansion could hide an option.
- :func:`line_window` gives the line range that a read command shows of one file
  (``sed -n 'A,Bp' f``, ``head``, ``tail``, ``awk 'NR>=A && NR<=B'``, through
  ``cat -n`` / ``nl`` pipes), the **paging** position of ARCHITECTURE.md, else None.
- :func:`command_text` finds the command in a shell tool's parsed arguments.

Hard rules: pure functions, no I/O, no module state besides constant tables and the
immutable tree-sitter language. Nothing here raises on any input text: a parse with
errors falls back to a conservative :mod:`shlex` tokenizer, and text that even shlex
cannot split is ``unknown``.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal

import tree_sitter_bash
from tree_sitter import Language, Node, Parser, Tree

__all__ = [
    "DEFAULT_SHELL_TOOLS",
    "LineWindow",
    "ShellEffect",
    "classify_command",
    "command_text",
    "line_window",
]

ShellEffect = Literal["read", "write", "unknown"]

DEFAULT_SHELL_TOOLS: Final = (
    "bash",
    "shell",
    "sh",
    "terminal",
    "execute_command",
    "run_command",
    "run_shell_command",
)

_BASH: Final = Language(tree_sitter_bash.language())
_ASTRAL: Final = re.compile("[\U00010000-\U0010ffff]")
_RANK: Final[Mapping[ShellEffect, int]] = MappingProxyType({"read": 0, "unknown": 1, "write": 2})


def _worst(effects: Iterator[ShellEffect] | Sequence[ShellEffect]) -> ShellEffect:
    result: ShellEffect = "read"
    for effect in effects:
        if _RANK[effect] > _RANK[result]:
            result = effect
            if result == "write":
                break
    return result


# --------------------------------------------------------------------------- rules
# A rule gets the arguments after the program name, already unquoted, and returns
# the effect of that one simple command (its redirections are judged separately).

Rule = Callable[[tuple[str, ...]], ShellEffect]

_HARMLESS_FILES: Final = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty", "-"})


def _read(_args: tuple[str, ...]) -> ShellEffect:
    return "read"


def _write(_args: tuple[str, ...]) -> ShellEffect:
    return "write"


def _unknown(_args: tuple[str, ...]) -> ShellEffect:
    return "unknown"


def _subcommand(
    *, read: frozenset[str], write: frozenset[str], options_with_value: frozenset[str] = frozenset()
) -> Rule:
    """A rule for ``tool SUBCOMMAND ...``: read, write, or unknown when not listed."""

    def rule(args: tuple[str, ...]) -> ShellEffect:
        sub = _first_operand(args, options_with_value)
        if sub is None:
            return "read" if args and all(a in {"--version", "-V", "--help", "-h"} for a in args) else "unknown"
        if sub in write:
            return "write"
        return "read" if sub in read else "unknown"

    return rule


def _first_operand(args: Sequence[str], options_with_value: frozenset[str]) -> str | None:
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in options_with_value:
            skip = True
        elif not arg.startswith("-") or arg == "-":
            return arg
    return None


def _short_flag(args: Sequence[str], letter: str, *, long: str) -> bool:
    """Whether ``-x``, a cluster such as ``-ni``/``-i.bak``, or ``--long`` is among the options."""
    for arg in args:
        if arg == "--":
            return False
        if arg == long or arg.startswith(long + "="):
            return True
        if arg.startswith("-") and not arg.startswith("--") and letter in arg[1:].split(".", 1)[0]:
            return True
    return False


_SED_WRITE_COMMAND: Final = re.compile(r"(?:(?:^|[;{}\n])\s*|[/0-9$][gpIiMme0-9]*)[wW]\s+\S")


def _sed(args: tuple[str, ...]) -> ShellEffect:
    # -i / -ni / -i.bak / --in-place edit the file; a `w file` command writes one.
    if _short_flag(args, "i", long="--in-place"):
        return "write"
    if any(_SED_WRITE_COMMAND.search(a) for a in args if not a.startswith("-")):
        return "write"
    return "read"


_AWK_OUTPUT: Final = re.compile(r"\bprintf?\b[^;}]*(?:>|\|)|\|\s*getline|\bsystem\s*\(|\bclose\s*\(")


def _awk(args: tuple[str, ...]) -> ShellEffect:
    if "-i" in args or "--inplace" in args or any(a.startswith("-i") and "inplace" in a for a in args):
        return "write"
    if any(a == "-f" or a.startswith("--file") for a in args):
        return "unknown"  # the program is in a file we cannot see
    program = _first_operand(args, frozenset({"-F", "-v", "-f"}))
    if program is not None and _AWK_OUTPUT.search(program):
        return "write"
    return "read"


def _perl(args: tuple[str, ...]) -> ShellEffect:
    return "write" if _short_flag(args, "i", long="--in-place") else "unknown"


def _tee(args: tuple[str, ...]) -> ShellEffect:
    files = [a for a in args if not a.startswith("-") and a not in _HARMLESS_FILES]
    return "write" if files else "read"


def _dd(args: tuple[str, ...]) -> ShellEffect:
    outputs = [a[3:] for a in args if a.startswith("of=")]
    return "write" if any(o not in _HARMLESS_FILES for o in outputs) else "read"


def _sort(args: tuple[str, ...]) -> ShellEffect:
    return "write" if any(a == "-o" or a.startswith(("--output", "-o")) for a in args) else "read"


def _uniq(args: tuple[str, ...]) -> ShellEffect:
    operands = [a for a in args if not a.startswith("-")]
    return "write" if len(operands) >= 2 and operands[1] not in _HARMLESS_FILES else "read"


def _tar(args: tuple[str, ...]) -> ShellEffect:
    mode = args[0].lstrip("-") if args else ""
    if "t" in mode or "--list" in args:
        return "read"
    return "write"


def _curl(args: tuple[str, ...]) -> ShellEffect:
    writes = {"-o", "-O", "--output", "--remote-name", "--remote-name-all", "-D", "--dump-header"}
    return "write" if any(a in writes or a.startswith("--output=") for a in args) else "unknown"


_FIND_WRITES: Final = frozenset({"-delete", "-fprint", "-fprint0", "-fprintf", "-fls"})
_FIND_EXEC: Final = frozenset({"-exec", "-execdir", "-ok", "-okdir"})


def _find(args: tuple[str, ...]) -> ShellEffect:
    effects: list[ShellEffect] = ["read"]
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in _FIND_WRITES:
            return "write"
        if arg in _FIND_EXEC:
            end = i + 1
            while end < len(args) and args[end] not in {";", "+"}:
                end += 1
            effects.append(_classify_argv(args[i + 1 : end]) if end > i + 1 else "unknown")
            i = end
        i += 1
    return _worst(effects)


def _xargs(args: tuple[str, ...]) -> ShellEffect:
    with_value = {"-I", "-i", "-n", "-P", "-d", "-L", "-l", "-s", "-E", "-e", "-a", "--max-args", "--delimiter"}
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 2 if args[i] in with_value else 1
    rest = args[i:]
    return _classify_argv(rest) if rest else "read"  # bare xargs runs echo


def _wrapper(with_value: frozenset[str], *, positional: int = 0) -> Rule:
    """A rule for ``timeout 5 CMD``, ``nice -n 5 CMD``, ``env X=1 CMD``: the effect of CMD."""

    def rule(args: tuple[str, ...]) -> ShellEffect:
        i = 0
        while i < len(args) and (args[i].startswith("-") or ("=" in args[i] and not args[i].startswith("="))):
            i += 2 if args[i] in with_value else 1
        rest = args[i + positional :]
        return _classify_argv(rest) if rest else "read"

    return rule


def _command_builtin(args: tuple[str, ...]) -> ShellEffect:
    if args and args[0] in {"-v", "-V"}:
        return "read"
    return _classify_argv(args[1:] if args and args[0] == "-p" else args) if args else "read"


def _shell(args: tuple[str, ...]) -> ShellEffect:
    # bash -c 'SCRIPT' is the script's effect; bash script.sh is an unknown program.
    for i, arg in enumerate(args):
        if arg.startswith("-") and not arg.startswith("--") and "c" in arg:
            return classify_command(args[i + 1]) if i + 1 < len(args) else "unknown"
        if not arg.startswith("-"):
            return "unknown"
    return "unknown"


_GIT_OPTIONS_WITH_VALUE: Final = frozenset({"-C", "-c", "--git-dir", "--work-tree", "--namespace"})
_GIT_READ: Final = frozenset(
    {
        "blame", "cat-file", "describe", "diff", "grep", "help", "log", "ls-files", "ls-remote", "ls-tree",
        "merge-base", "name-rev", "rev-list", "rev-parse", "shortlog", "show", "show-ref", "status",
        "version", "whatchanged", "check-ignore", "annotate", "count-objects", "diff-tree", "diff-files",
        "diff-index", "for-each-ref", "var",
    }
)  # fmt: skip
_GIT_WRITE: Final = frozenset(
    {
        "add", "am", "apply", "checkout", "cherry-pick", "clean", "clone", "commit", "fetch", "format-patch",
        "gc", "init", "merge", "mv", "pull", "push", "rebase", "reset", "restore", "revert", "rm", "switch",
        "worktree", "update-index", "update-ref", "submodule", "prune", "bisect", "notes", "replace",
    }
)  # fmt: skip


def _git(args: tuple[str, ...]) -> ShellEffect:
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 2 if args[i] in _GIT_OPTIONS_WITH_VALUE else 1
    if i >= len(args):
        return "read" if args and all(a in {"--version", "--help"} for a in args) else "unknown"
    sub, rest = args[i], args[i + 1 :]
    if sub in {"diff", "log", "show", "format-patch"} and any(a.startswith("--output") for a in rest):
        return "write"
    if sub in _GIT_WRITE:
        return "write"
    if sub in _GIT_READ:
        return "read"
    operands = [a for a in rest if not a.startswith("-")]
    if sub == "stash":
        return "read" if operands[:1] in (["list"], ["show"]) else "write"
    if sub in {"branch", "tag"}:
        listing = {"-l", "--list", "-a", "-r", "--all", "-v", "-vv", "--show-current", "--contains", "--merged"}
        return "read" if not operands or any(a in listing for a in rest) else "write"
    if sub == "remote":
        return "read" if not operands or operands[0] in {"show", "get-url"} else "write"
    if sub == "config":
        reading = {"--get", "--get-all", "--list", "-l", "--get-regexp"}
        return "read" if any(a in reading for a in rest) or len(operands) == 1 else "write"
    if sub == "reflog":
        return "read" if not operands or operands[0] == "show" else "write"
    return "unknown"


_PIP: Final = _subcommand(
    read=frozenset({"list", "show", "freeze", "check", "help", "search", "index", "inspect", "debug"}),
    write=frozenset({"install", "uninstall", "download", "wheel", "cache"}),
)


def _python(args: tuple[str, ...]) -> ShellEffect:
    if args[:1] in (("-V",), ("--version",)):
        return "read"
    if len(args) >= 2 and args[0] == "-m" and args[1] in {"pip", "pip3"}:
        return _PIP(args[2:])
    if len(args) >= 2 and args[0] == "setup.py" and args[1] in {"install", "develop"}:
        return "write"
    return "unknown"  # scripts, -c code, -m modules: anything may happen


def _uv(args: tuple[str, ...]) -> ShellEffect:
    if args[:1] == ("pip",):
        return _PIP(args[1:])
    return _subcommand(read=frozenset({"tree", "version"}), write=frozenset({"add", "remove", "sync", "lock"}))(args)


def _xxd(args: tuple[str, ...]) -> ShellEffect:
    operands = [a for a in args if not a.startswith("-")]
    return "write" if len(operands) >= 2 and operands[1] not in _HARMLESS_FILES else "read"


_READ_PROGRAMS: Final = (
    # files and text
    "cat", "tac", "nl", "head", "tail", "less", "more", "grep", "egrep", "fgrep", "rg", "ag", "ack", "zcat",
    "zgrep", "bzcat", "xzcat", "wc", "cut", "paste", "join", "comm", "cmp", "diff", "sdiff", "tr", "rev",
    "fold", "fmt", "column", "expand", "unexpand", "strings", "od", "hexdump", "base64", "md5sum",
    "sha1sum", "sha256sum", "sha512sum", "cksum", "jq", "file", "stat", "du", "df", "ls", "tree",
    "realpath", "readlink", "basename", "dirname", "locate", "look",
    # shell and system
    "echo", "printf", "pwd", "cd", "pushd", "popd", "which", "whereis", "type", "hash", "true", "false",
    ":", "test", "[", "sleep", "date", "whoami", "id", "uname", "hostname", "printenv", "ps", "nproc",
    "free", "uptime", "seq", "expr", "set", "shopt", "alias", "ulimit", "umask", "trap", "read", "wait",
    "exit", "return", "break", "continue", "shift", "let", "history", "clear", "man", "help", "getconf",
    "lsb_release", "locale", "tput", "stty",
)  # fmt: skip

_WRITE_PROGRAMS: Final = (
    "cp", "mv", "rm", "rmdir", "mkdir", "touch", "chmod", "chown", "chgrp", "ln", "patch", "install",
    "truncate", "rsync", "scp", "wget", "unzip", "zip", "gzip", "gunzip", "bzip2", "xz", "split",
    "csplit", "mktemp", "mkfifo", "shred", "unlink", "apt", "apt-get", "dpkg", "yum", "dnf", "apk",
    "brew", "easy_install", "kill", "pkill", "killall", "useradd", "git-apply",
)  # fmt: skip

_PACKAGE_MANAGERS: Final[Mapping[str, Rule]] = {
    "pip": _PIP,
    "pip3": _PIP,
    "uv": _uv,
    "conda": _subcommand(
        read=frozenset({"list", "info", "search"}),
        write=frozenset({"install", "remove", "uninstall", "create", "update", "upgrade", "clean"}),
    ),
    "mamba": _subcommand(read=frozenset({"list", "info", "search"}), write=frozenset({"install", "remove", "create"})),
    "npm": _subcommand(
        read=frozenset({"ls", "list", "view", "info", "outdated", "search", "config", "root", "bin"}),
        write=frozenset({"install", "i", "ci", "uninstall", "remove", "rm", "update", "add", "link", "prune"}),
    ),
    "yarn": _subcommand(read=frozenset({"list", "info", "why"}), write=frozenset({"add", "install", "remove"})),
    "apt-cache": _read,
}

#: program -> rule. Extend here; anything missing is "unknown".
_PROGRAMS: Final[Mapping[str, Rule]] = MappingProxyType(
    {
        **dict.fromkeys(_READ_PROGRAMS, _read),
        **dict.fromkeys(_WRITE_PROGRAMS, _write),
        **_PACKAGE_MANAGERS,
        "sed": _sed,
        "gsed": _sed,
        "awk": _awk,
        "gawk": _awk,
        "mawk": _awk,
        "perl": _perl,
        "tee": _tee,
        # SWE-agent's file commands (it runs them in its shell)
        **dict.fromkeys(("open", "goto", "search_file", "search_dir", "find_file", "filemap"), _read),
        **dict.fromkeys(("create", "edit"), _write),
        "str_replace_editor": _subcommand(
            read=frozenset({"view"}), write=frozenset({"create", "str_replace", "insert", "undo_edit"})
        ),
        "dd": _dd,
        "sort": _sort,
        "uniq": _uniq,
        "tar": _tar,
        "curl": _curl,
        "xxd": _xxd,
        "find": _find,
        "xargs": _xargs,
        "git": _git,
        "python": _python,
        "python3": _python,
        "bash": _shell,
        "sh": _shell,
        "dash": _shell,
        "zsh": _shell,
        "command": _command_builtin,
        "builtin": _command_builtin,
        "exec": _wrapper(frozenset()),
        "nohup": _wrapper(frozenset()),
        "time": _wrapper(frozenset({"-f", "-o"})),
        "env": _wrapper(frozenset({"-u", "-C", "--unset", "--chdir"})),
        "nice": _wrapper(frozenset({"-n"})),
        "stdbuf": _wrapper(frozenset({"-i", "-o", "-e"})),
        "sudo": _wrapper(frozenset({"-u", "-g", "-C", "-h", "-p", "-U"})),
        "timeout": _wrapper(frozenset({"-s", "-k", "--signal", "--kill-after"}), positional=1),
    }
)

# Rules whose answer does not depend on the arguments: an expansion cannot change it.
_FIXED: Final = frozenset({_read, _write})
_PYTHON_NAME: Final = re.compile(r"python[0-9.]*")


def _classify_argv(argv: Sequence[str]) -> ShellEffect:
    """The effect of one simple command given as words (program first), redirections aside."""
    if not argv:
        return "read"
    return _rule_for(argv[0])(tuple(argv[1:]))


def _rule_for(program: str) -> Rule:
    """The table row of a program: ``/usr/bin/grep`` is ``grep``, ``python3.11`` is ``python``."""
    if "/" in program and not program.startswith("."):
        program = posixpath.basename(program)
    if _PYTHON_NAME.fullmatch(program):
        program = "python"
    return _PROGRAMS.get(program, _unknown)


# --------------------------------------------------------------------------- parse


@dataclass(frozen=True, slots=True)
class _Word:
    text: str  # unquoted when the word is literal, else its source text
    dynamic: bool  # an unquoted expansion or substitution may become any number of words


_EXPANSIONS: Final = frozenset({"simple_expansion", "expansion", "command_substitution", "process_substitution"})


def _text(node: Node) -> str:
    return (node.text or b"").decode("utf-8", "replace")


# Words that shlex.split would return unchanged (no whitespace, quote or backslash), or
# whole '...' / "..." (no backslash or inner quote) that it would only unquote: most words,
# read here without shlex's character-by-character lexer (about 7 us a word).
_SHLEX_PLAIN: Final = re.compile(r"[^ \t\r\n'\"\\]+|'([^']*)'|\"([^\"\\]*)\"")


def _word(node: Node) -> _Word:
    source = _text(node)
    dynamic = node.type in _EXPANSIONS or (
        node.type == "concatenation" and any(c.type in _EXPANSIONS for c in node.children)
    )
    plain = _SHLEX_PLAIN.fullmatch(source)
    if plain is not None:
        return _Word(source if plain.lastindex is None else plain[plain.lastindex], dynamic)
    try:
        parts = shlex.split(source)
    except ValueError:
        return _Word(source, dynamic)
    return _Word(parts[0] if len(parts) == 1 else source, dynamic)


def _command_words(node: Node) -> tuple[_Word, ...] | None:
    """The program and arguments of a ``command`` node, or None when it has no name."""
    name = node.child_by_field_name("name")
    if name is None:
        return None
    arguments = node.children_by_field_name("argument")
    return (_word(name), *(_word(a) for a in arguments))


def _command_effect(node: Node) -> ShellEffect:
    return _words_effect(_command_words(node))


def _words_effect(words: tuple[_Word, ...] | None) -> ShellEffect:
    """The effect of one simple command given its words (None: only assignments)."""
    if words is None:
        return "read"  # only assignments
    if words[0].dynamic:
        return "unknown"
    effect = _classify_argv([w.text for w in words])
    if effect == "read" and _rule_for(words[0].text) not in _FIXED and any(w.dynamic for w in words[1:]):
        return "unknown"
    return effect


_NO_FILE: Final = frozenset({"<", "<&", "<&-", ">&-"})


def _redirect_effect(node: Node) -> ShellEffect:
    operator = next((c.type for c in node.children if not c.is_named), "")
    destination = node.child_by_field_name("destination")
    if operator in _NO_FILE or destination is None:
        return "read"
    return _destination_effect(operator, destination, _word(destination))


def _destination_effect(operator: str, destination: Node, target: _Word) -> ShellEffect:
    """The effect of a redirection whose operator is not in ``_NO_FILE``, given its target."""
    if operator in {">&", "<&"} and (destination.type == "number" or target.text in {"-", "1", "2"}):
        return "read"  # 2>&1: a duplication, no file
    if target.text in _HARMLESS_FILES or target.text.startswith("/dev/fd/"):
        return "read"
    return "write"


def _parse(command: str) -> Tree | None:
    """The syntax tree, or None when the parser found errors.

    tree-sitter-bash 0.25.1 can read out of bounds (SIGSEGV, found here by fuzzing) on
    a ``{`` followed, anywhere later, by a 4-byte UTF-8 character (upstream
    tree-sitter-bash#337, open), so every character outside the BMP becomes U+FFFD
    before parsing; no rule looks at such characters.
    """
    text = _ASTRAL.sub("\ufffd", command)
    tree = Parser(_BASH).parse(text.encode("utf-8", "replace"))
    return None if tree.root_node.has_error else tree


def _tree_effect(root: Node) -> ShellEffect:
    effects: list[ShellEffect] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "command":
            effects.append(_command_effect(node))
        elif node.type == "file_redirect":
            effects.append(_redirect_effect(node))
        stack.extend(node.children)
    return _worst(effects)


# --------------------------------------------------------------------------- shlex fallback

_PUNCTUATION: Final = frozenset("();<>|&\n")
_SEPARATOR_CHARS: Final = frozenset("();|&\n")
_KEYWORDS: Final = frozenset({"if", "then", "elif", "else", "fi", "do", "done", "while", "until", "!", "{", "}"})
_REDIRECTS: Final = frozenset({">", ">>", "&>", "&>>", ">|", ">&", "<>"})
_ASSIGNMENT: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def _fallback_effect(command: str) -> ShellEffect:
    """Conservative effect from shlex tokens, when the parser found errors."""
    if "$(" in command or "`" in command or "<<" in command:
        return "unknown"  # hidden commands or bodies we cannot delimit
    lexer = shlex.shlex(command, posix=True, punctuation_chars="();<>|&\n")
    lexer.whitespace = " \t\r"
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        tokens = list(lexer)
    except ValueError:
        return "unknown"
    effects: list[ShellEffect] = []
    argv: list[str] = []
    pending_redirect = ""
    for token in [*tokens, ";"]:
        if pending_redirect:
            dup = pending_redirect == ">&" and token.isdigit()
            effects.append("read" if dup or token in _HARMLESS_FILES else "write")
            pending_redirect = ""
        elif token in _REDIRECTS:
            pending_redirect = token
        elif token in {"<", "<&"}:
            continue
        elif set(token) <= _SEPARATOR_CHARS:
            effects.append(_classify_argv(argv))
            argv = []
        elif set(token) <= _PUNCTUATION:
            return "unknown"  # an operator run we do not know, such as `|>`
        elif argv or not (token in _KEYWORDS or _ASSIGNMENT.match(token)):
            argv.append(token)
    return _worst(effects)


def classify_command(command: str) -> ShellEffect:
    """Whether a shell command reads, writes, or may do anything (``unknown``).

    Never raises. The effect is the worst over every simple command and redirection
    in the text (write > unknown > read); see the module docstring for the rules.
    """
    tree = _parse(command)
    if tree is None:
        return _fallback_effect(command)
    return _tree_effect(tree.root_node)


# --------------------------------------------------------------------------- paging


@dataclass(frozen=True, slots=True)
class LineWindow:
    """The lines of ``resource`` that a read command shows.

    ``start`` and ``end`` are 1-based and inclusive; ``end=None`` runs to the end of
    the file. A negative ``start`` counts from the end (``tail -n 20 f`` is
    ``start=-20, end=None``), so two tails of one file with different N differ.
    ``program`` is the command that picks the lines (``sed``, ``head``, ``tail``,
    ``awk``), ``resource`` the file, joined onto a leading ``cd DIR &&``.
    """

    program: str
    resource: str
    start: int
    end: int | None


@dataclass(frozen=True, slots=True)
class _Range:
    start: int
    end: int | None


@dataclass(frozen=True, slots=True)
class _Stage:
    program: str | None  # None: passes lines through (cat -n, nl)
    window: _Range
    files: tuple[str, ...]


_SED_RANGE: Final = re.compile(r"\s*(\d+)\s*(?:,\s*(\d+|\$|\+\d+)\s*)?p\s*;?\s*")
_AWK_TEST: Final = re.compile(r"\s*NR\s*(==|>=|<=|>|<)\s*(\d+)\s*")
_AWK_ACTION: Final = re.compile(r"\s*(?:\{\s*print\b[^{}]*\})?\s*")
_AWK_RANGE: Final = re.compile(r"\s*NR\s*==\s*(\d+)\s*,\s*NR\s*==\s*(\d+)\s*")
_COUNT: Final = re.compile(r"\d+")


def _sed_stage(args: Sequence[str]) -> _Stage | None:
    quiet = False
    scripts: list[str] = []
    operands: list[str] = []
    pending_e = False
    for arg in args:
        if pending_e:
            scripts.append(arg)
            pending_e = False
        elif arg in {"-n", "--quiet", "--silent"}:
            quiet = True
        elif arg in {"-e", "--expression"}:
            pending_e = True
        elif arg in {"-E", "-r", "-u", "--posix", "--regexp-extended"}:
            continue
        elif arg.startswith("-") and arg != "-":
            return None
        else:
            operands.append(arg)
    if not scripts and operands:
        scripts.append(operands.pop(0))
    match = _SED_RANGE.fullmatch(scripts[0]) if quiet and len(scripts) == 1 else None
    if match is None:
        return None
    start, end_text = int(match[1]), match[2]
    if end_text is None:
        end: int | None = start
    elif end_text == "$":
        end = None
    elif end_text.startswith("+"):
        end = start + int(end_text[1:])
    else:
        end = max(start, int(end_text))  # sed prints only line A when B < A
    return _Stage("sed", _Range(start, end), tuple(operands))


def _count_option(args: Sequence[str], *, program: str) -> tuple[str, tuple[str, ...]] | None:
    """The -n count (as written, sign kept) of head/tail and the file operands."""
    count = "10"
    operands: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in {"-n", "--lines"} and i + 1 < len(args):
            count, i = args[i + 1], i + 2
            continue
        if arg.startswith("--lines="):
            count = arg.removeprefix("--lines=")
        elif arg.startswith("-n") and len(arg) > 2:
            count = arg[2:]
        elif arg.startswith("-") and _COUNT.fullmatch(arg[1:]):
            count = arg[1:]  # head -20, tail -20
        elif program == "tail" and arg.startswith("+") and _COUNT.fullmatch(arg[1:]):
            count = arg  # tail +20
        elif arg.startswith("-") and arg != "-":
            return None  # -c bytes, -f follow, -q...: not a line window
        else:
            operands.append(arg)
        i += 1
    return count, tuple(operands)


def _head_tail_stage(program: str, args: Sequence[str]) -> _Stage | None:
    parsed = _count_option(args, program=program)
    if parsed is None:
        return None
    count, operands = parsed
    if program == "head":
        if not _COUNT.fullmatch(count) or int(count) == 0:
            return None
        return _Stage("head", _Range(1, int(count)), operands)
    if count.startswith("+") and _COUNT.fullmatch(count[1:]):
        return _Stage("tail", _Range(max(1, int(count[1:])), None), operands)
    if not _COUNT.fullmatch(count) or int(count) == 0:
        return None
    return _Stage("tail", _Range(-int(count), None), operands)


def _awk_stage(args: Sequence[str]) -> _Stage | None:
    if not args or args[0].startswith("-"):
        return None
    program, operands = args[0], tuple(args[1:])
    ranged = _AWK_RANGE.fullmatch(program)
    if ranged is not None:
        return _Stage("awk", _Range(int(ranged[1]), int(ranged[2])), operands)
    condition, _, action = program.partition("{")
    if action and not _AWK_ACTION.fullmatch("{" + action):
        return None
    start, end = 1, None
    for test in condition.split("&&"):
        match = _AWK_TEST.fullmatch(test)
        if match is None:
            return None
        op, value = match[1], int(match[2])
        if op in {"==", ">=", ">"}:
            start = max(start, value + (op == ">"))
        if op in {"==", "<=", "<"}:
            bound = value - (op == "<")
            end = bound if end is None else min(end, bound)
    if (end is not None and end < start) or (start == 1 and end is None):
        return None
    return _Stage("awk", _Range(start, end), operands)


_PASS_THROUGH_CAT: Final = frozenset({"-n", "-b", "-A", "-v", "-e", "-E", "-t", "-T", "--number"})


def _stage(words: Sequence[str]) -> _Stage | None:
    program, args = words[0], words[1:]
    if program == "sed":
        return _sed_stage(args)
    if program in {"head", "tail"}:
        return _head_tail_stage(program, args)
    if program == "awk":
        return _awk_stage(args)
    if program == "cat" and all(a in _PASS_THROUGH_CAT or not a.startswith("-") for a in args):
        return _Stage(None, _Range(1, None), tuple(a for a in args if not a.startswith("-")))
    if program == "nl":
        operands = [a for a in args if not a.startswith("-")]
        if any(a in {"-b", "-n", "-w", "-s", "-v", "-i"} for a in args):
            return None  # option values would pass for files
        return _Stage(None, _Range(1, None), tuple(operands))
    return None


def _compose(outer: _Range, inner: _Range) -> _Range | None:
    """The file lines shown when ``inner`` picks from the lines ``outer`` already picked."""
    if outer.start < 0:
        if inner.start < 0:
            return _Range(max(outer.start, inner.start), None)
        return None  # head of a tail: the file length would be needed
    if inner.start < 0:
        if outer.end is None:
            return _Range(inner.start, None)
        return _Range(max(outer.start, outer.end + inner.start + 1), outer.end)
    start = outer.start + inner.start - 1
    end = None if inner.end is None else outer.start + inner.end - 1
    if outer.end is not None:
        end = outer.end if end is None else min(end, outer.end)
    return None if end is not None and end < start else _Range(start, end)


_STAGE_NODES: Final = frozenset({"program", "list", "pipeline", "redirected_statement"})
_OPERATORS: Final = frozenset({"&&", "||", "|", "|&", ";"})


def _flatten(root: Node) -> list[tuple[str, ...] | str] | None:
    """Commands and operators in text order, or None for any other construct."""
    items: list[tuple[str, ...] | str] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if node.type == "command":
            words = _command_words(node)
            redirects = node.children_by_field_name("redirect")
            if words is None or any(w.dynamic for w in words) or any(_redirect_effect(r) != "read" for r in redirects):
                return None
            items.append(tuple(w.text for w in words))
        elif node.type in _STAGE_NODES:
            stack.extend(reversed(node.children))
        elif node.type in _OPERATORS or (node.type == "file_redirect" and _redirect_effect(node) == "read"):
            if node.type != "file_redirect":
                items.append(node.type)
        elif node.type != "comment":
            return None
    return items


def line_window(command: str) -> LineWindow | None:
    """The line window a read command shows of one file, for paging; None otherwise.

    Accepts an optional ``cd DIR &&`` prefix, then a pipeline whose first stage reads
    one file (``sed -n 'A,Bp' f``, ``head -n N f``, ``tail -n +N f``, ``awk 'NR>=A &&
    NR<=B' f``, or ``cat -n f`` / ``nl -ba f`` followed by such a filter). Windows of
    successive filters compose (``head -n 50 f | tail -n 10`` is lines 41-50).
    """
    tree = _parse(command)
    if tree is None or _tree_effect(tree.root_node) != "read":
        return None
    items = _flatten(tree.root_node)
    if not items or len(items) % 2 == 0 or any(isinstance(item, str) != (i % 2 == 1) for i, item in enumerate(items)):
        return None  # empty, or two statements on separate lines
    directory = ""
    while len(items) >= 3 and items[1] in {"&&", ";"} and isinstance(items[0], tuple) and items[0][0] == "cd":
        if len(items[0]) != 2 or items[0][1] in {"-", "~"} or items[0][1].startswith("~"):
            return None
        directory = posixpath.join(directory, items[0][1])
        items = items[2:]
    if "||" in items:
        # a fallback list (``sed -n 'A,Bp' f 2>/dev/null || sed -n 'C,Dp' f``) shows the first
        # window when every alternative windows the same file
        parts = [p for p in (_pipeline_window(items[i : i + 1], directory) for i in range(0, len(items), 2)) if p]
        one_file = len({p.resource for p in parts}) == 1
        if len(parts) * 2 - 1 == len(items) and all(i == "||" for i in items[1::2]) and one_file:
            return parts[0]
        return None
    return _pipeline_window(items, directory)


def _pipeline_window(items: list[tuple[str, ...] | str], directory: str) -> LineWindow | None:
    if any(isinstance(item, str) and item not in {"|", "|&"} for item in items):
        return None
    stages = [_stage(item) if isinstance(item, tuple) else None for item in items[::2]]
    first = stages[0]
    if first is None or len(first.files) != 1 or first.files[0] == "-":
        return None
    program, window = first.program, first.window
    for stage in stages[1:]:
        if stage is None or stage.files:
            break  # a filter we do not model: later stages no longer pick file lines
        if stage.program is None:
            continue
        composed = _compose(window, stage.window)
        if composed is None:
            return None
        program, window = program or stage.program, composed
    if program is None:
        return None
    resource = posixpath.normpath(posixpath.join(directory, first.files[0]))
    return LineWindow(program, resource, window.start, window.end)


# --------------------------------------------------------------------------- arguments


def command_text(arguments: object) -> str | None:
    """The command in a shell tool's parsed arguments, or None.

    A string is the command itself; a mapping gives its ``command``, ``cmd``,
    ``script`` or ``commands`` value (a list of strings is joined with newlines).
    """
    if isinstance(arguments, str):
        return arguments
    if not isinstance(arguments, Mapping):
        return None
    for key in ("command", "cmd", "script", "commands"):
        value = arguments.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, list | tuple) and value and all(isinstance(v, str) for v in value):
            return "\n".join(value)
    return None
