"""Which paths a shell command reads and writes (the **targets** of ``docs/architecture.md``).

Contract:

- :func:`command_targets` parses the command once (the tree-sitter grammar of
  ``_effect.py``) and returns its :class:`CommandTargets`: the effect that
  :func:`~treellm.shell.classify_command` gives, plus the paths read and the paths
  written. ``None`` means "cannot be known": an unknown program (a script, a test
  runner) reads and writes ``None``; a known writer whose targets cannot be named
  (``git checkout BRANCH``, ``git stash``, ``rm $X``) writes ``None``; a package install
  (``pip install``, ``python -m pip``, ``npm ci``, ``apt-get install``) writes
  :data:`ENVIRONMENT`, a path no read names, so it restarts the counts of program runs
  (their reads are unknown) but not of file reads; a program whose output depends on
  more than files (``date``, ``ps``, ``git log``) reads ``None``.
- Known targets: redirections (``> f``, ``>> f``, ``< f``) and heredocs into files;
  ``sed -i``, ``cp``, ``mv``, ``rm``, ``tee``, ``touch``, ``mkdir``, ``ln``, ``dd of=``,
  ``sort -o``; ``git checkout/restore [--] PATHS``; ``patch``/``git apply`` fed a
  patch text in a heredoc, or a patch file that the same command wrote from one before
  (``cat > fix.patch << 'EOF' ... EOF`` then ``patch -p1 < fix.patch``): the ``+++`` lines
  name the files; the files of ``cat``,
  ``sed -n``, ``head``, ``tail``, ``grep``, ``nl``, ``wc``, ``diff``, ``awk``, ``find``,
  ``ls``... A recursive search with no path reads ``.``. SWE-agent's file commands
  (``open``, ``create``, ``str_replace_editor``) are read like programs. SWE-agent's editor
  acts on the file it has open, which no command names: :func:`editor_use` says which
  commands open a file and which write or show the open one; which file is open is the
  run's state, followed by the caller. :func:`lists_names` tells a plain ``ls`` (names only)
  apart, whose output a caller may compare name by name.
- Relative paths are joined onto a ``cd DIR`` earlier in the same command; after a
  ``cd`` that cannot be read (``cd $X``, ``cd -``) relative targets are ``None``.
  A glob stands for its directory (``rm build/*.o`` writes ``build``).
- :func:`paths_overlap` says whether a write to one path can change what a read of
  another shows: the same path, or one inside the other. An absolute and a relative
  path overlap when the relative one can sit inside the absolute one (the working
  directory is not known), and ``.`` overlaps everything.

Pure; never raises on any input text. Costs about one parse more than nothing: the
runtime calls it once per distinct command (callers cache by text).
"""

from __future__ import annotations

import functools
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from tree_sitter import Node

from treellm.shell._effect import (
    _EXPANSIONS,
    _FIXED,
    _NO_FILE,
    ShellEffect,
    _count_option,
    _destination_effect,
    _fallback_effect,
    _parse,
    _rule_for,
    _word,
)

__all__ = [
    "ENVIRONMENT", "CommandTargets", "EditorUse", "command_targets", "editor_use", "lists_names", "paths_overlap",
]  # fmt: skip

Paths = frozenset[str] | None
"""Normalised paths, or None: cannot be known."""

_NOTHING: Final[frozenset[str]] = frozenset()


@dataclass(frozen=True, slots=True)
class CommandTargets:
    """What one command does and to which paths.

    ``effect`` is :func:`~treellm.shell.classify_command`'s answer. ``reads`` and
    ``writes`` are the paths known to be read and written; ``reads_unknown`` /
    ``writes_unknown`` say that more may be (an unknown program, a writer whose
    targets cannot be named). ``writes`` is empty when the effect is ``read``.
    ``programs`` holds the words of each simple command of unknown effect (scripts,
    test runners), for callers that know more about them; ``writer_unknown`` says that a
    part other than those (``git stash``, ``rm $X``) writes targets that cannot be named.
    """

    effect: ShellEffect
    reads: frozenset[str]
    writes: frozenset[str]
    reads_unknown: bool
    writes_unknown: bool
    programs: tuple[tuple[str, ...], ...] = ()
    writer_unknown: bool = False

    @property
    def known_reads(self) -> Paths:
        """The paths read, or None when more may be read."""
        return None if self.reads_unknown else self.reads

    @property
    def known_writes(self) -> Paths:
        """The paths written, or None when more may be written."""
        return None if self.writes_unknown else self.writes


# --------------------------------------------------------------------------- paths

_GLOB: Final = re.compile(r"[*?\[]")


def _normal(path: str, cwd: str | None) -> str | None:
    """``path`` joined onto ``cwd`` and normalised; None when it cannot be placed."""
    if not path:
        return None
    if _GLOB.search(path):
        head = path[: _GLOB.search(path).start()]  # type: ignore[union-attr]
        path = head.rsplit("/", 1)[0] if "/" in head else "."
        path = path or "/"
    if not path.startswith(("/", "~")):
        if cwd is None:
            return None
        path = _join(cwd, path) if cwd else path
    return posixpath.normpath(path)


def _join(directory: str, relative: str) -> str:
    """``posixpath.join`` of a non-empty directory and a relative path, without its checks."""
    return directory + relative if directory.endswith("/") else f"{directory}/{relative}"


@functools.lru_cache(maxsize=4096)
def _parts(path: str) -> tuple[bool, tuple[str, ...]]:
    return path.startswith("/"), tuple(p for p in path.split("/") if p and p != ".")


def _prefix_related(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def paths_overlap(a: str, b: str) -> bool:
    """Whether a write to ``a`` can change what a read of ``b`` shows (symmetric)."""
    a_abs, a_parts = _parts(a)
    b_abs, b_parts = _parts(b)
    if not a_parts or not b_parts or ".." in a_parts[:1] or ".." in b_parts[:1]:
        return True  # the working directory, the root, or above it: everything
    if a_abs == b_abs:
        return _prefix_related(a_parts, b_parts)
    rel, absolute = (a_parts, b_parts) if b_abs else (b_parts, a_parts)
    return any(_prefix_related(absolute[i:], rel) for i in range(len(absolute)))


# --------------------------------------------------------------------------- per program


def _operands(args: Sequence[str], with_value: frozenset[str] = _NOTHING) -> list[str]:
    """Arguments that are not options (everything after ``--``), skipping option values."""
    out: list[str] = []
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
        elif arg == "--":
            out.extend(a for a in args[i + 1 :] if a != "-")
            break
        elif arg in with_value:
            skip = True
        elif not arg.startswith("-"):  # "-" (stdin) is no operand either
            out.append(arg)
    return out


_Found = tuple[Sequence[str] | None, Sequence[str] | None]
"""(paths read, paths written) as written in the command; None: cannot be known."""

_READ_FILES: Final = frozenset(
    {"cat", "tac", "nl", "less", "more", "wc", "diff", "sdiff", "cmp", "comm", "strings", "od", "hexdump",
     "md5sum", "sha1sum", "sha256sum", "sha512sum", "cksum", "file", "stat", "zcat", "bzcat", "xzcat",
     "base64", "paste", "join", "cut", "fold", "fmt", "column", "expand", "unexpand", "rev", "realpath",
     "readlink", "basename", "dirname"}
)  # fmt: skip
_READ_DIRS: Final = frozenset({"ls", "tree", "du"})
_PURE: Final = frozenset(
    {"echo", "printf", "pwd", "true", "false", ":", "test", "[", "export", "set", "unset", "shopt", "alias",
     "sleep", "seq", "expr", "exit", "return", "break", "continue", "shift", "let", "type", "which", "hash",
     "command", "clear", "wait", "trap", "umask", "ulimit", "read", "local", "declare", "source", "."}
)  # fmt: skip
_REMOVERS: Final = frozenset({"rm", "rmdir", "mkdir", "touch", "shred", "unlink", "truncate", "mkfifo"})
_MODE_FIRST: Final = frozenset({"chmod", "chown", "chgrp"})
_GREP: Final = frozenset({"grep", "egrep", "fgrep", "zgrep"})
_SEARCHERS: Final = frozenset({"rg", "ag", "ack"})
_GREP_VALUE: Final = frozenset(
    {"-e", "-f", "-m", "-A", "-B", "-C", "-d", "-D", "--regexp", "--file", "--max-count", "--context",
     "--after-context", "--before-context", "--include", "--exclude", "--exclude-dir", "--label", "--color"}
)  # fmt: skip
_RG_VALUE: Final = frozenset(
    {"-e", "-f", "-g", "-m", "-A", "-B", "-C", "-t", "-T", "--glob", "--type", "--type-not", "-j", "-M",
     "--max-count", "--context", "--regexp"}
)  # fmt: skip
_PATCH_TARGET: Final = re.compile(r"^\+\+\+ (\S+)", re.MULTILINE)
_SWE_READ: Final = frozenset({"open", "search_file", "search_dir", "find_file", "filemap"})
_SWE_PROGRAMS: Final = _SWE_READ | {"str_replace_editor", "create"}


_GREP_PATTERN: Final = frozenset({"-e", "-f", "--regexp", "--file"})
_SED_SCRIPT: Final = frozenset({"-e", "-f", "--expression", "--file"})
_SED_VALUE: Final = _SED_SCRIPT | {"-l"}
_AWK_VALUE: Final = frozenset({"-F", "-v", "-f", "--field-separator", "--assign", "--file"})
# grep and sed run in most real commands: plain loops, cheaper than any(...) generators


def _grep(program: str, args: Sequence[str]) -> _Found:
    operands = _operands(args, _GREP_VALUE if program in _GREP else _RG_VALUE)
    pattern_given = False
    for a in args:
        if a in _GREP_PATTERN or a.startswith(("--regexp=", "-e")):
            pattern_given = True
            break
    files = operands if pattern_given else operands[1:]
    if files:
        return files, ()
    recursive = program in _SEARCHERS
    if not recursive:
        for a in args:
            if a == "--recursive" or (a.startswith("-") and not a.startswith("--") and ("r" in a or "R" in a)):
                recursive = True
                break
    return (["."] if recursive else []), ()


def _sed(args: Sequence[str]) -> _Found:
    scripted = in_place = False
    for a in args:
        if a in _SED_SCRIPT:
            scripted = True
        elif a.startswith("--"):
            in_place = in_place or a == "--in-place" or a.startswith("--in-place=")
        elif a.startswith("-") and "i" in a[1:].split(".", 1)[0]:
            in_place = True
    operands = _operands(args, _SED_VALUE)
    files = operands if scripted else operands[1:]
    return (files, files) if in_place else (files, ())


def _awk(args: Sequence[str]) -> _Found:
    from_file = any(a == "-f" or a.startswith("--file") for a in args)
    operands = _operands(args, _AWK_VALUE)
    files = [a for a in (operands if from_file else operands[1:]) if "=" not in a]
    return files, ()


def _find(args: Sequence[str], effect: ShellEffect) -> _Found:
    starts: list[str] = []
    for arg in args:
        if arg.startswith(("-", "(", "!")) and arg not in {"-", "--"}:
            break
        starts.append(arg)
    starts = starts or ["."]
    if effect == "read":
        return starts, ()
    return (starts, starts) if "-delete" in args and "-exec" not in args else (None, None)


_COPY_VALUE: Final = frozenset({"-t", "-S", "--target-directory", "--suffix", "-o", "-g", "-m"})


def _copy(program: str, args: Sequence[str]) -> _Found:
    target = next((args[i + 1] for i, a in enumerate(args[:-1]) if a in {"-t", "--target-directory"}), None)
    operands = _operands(args, _COPY_VALUE)
    if target is None:
        if len(operands) < 2:
            return None, None
        target, operands = operands[-1], operands[:-1]
    if program == "mv":
        return list(operands), [*operands, target]
    return list(operands), [target]


def _patch_targets(body: str | None) -> list[str] | None:
    if not body:
        return None
    found = []
    for name in _PATCH_TARGET.findall(body):
        if name == "/dev/null":
            continue
        found.append(name[2:] if name.startswith(("a/", "b/")) else name)
    return found or None


def _git(args: Sequence[str], node: Node, bodies: dict[str, Node], cwd: str | None) -> _Found:
    i = 0
    while i < len(args) and args[i].startswith("-"):
        i += 2 if args[i] in {"-C", "-c", "--git-dir", "--work-tree"} else 1
    if i >= len(args):
        return None, _NOTHING_SEQ
    sub, rest = args[i], list(args[i + 1 :])
    if sub in {"checkout", "restore"}:
        if "--" in rest:
            paths = rest[rest.index("--") + 1 :]
            return paths, paths
        operands = [a for a in rest if not a.startswith("-")]
        if sub == "restore" or (operands and all("." in a or "/" in a for a in operands)):
            return operands, operands
        return None, None
    if sub == "apply":
        if any(a in {"--check", "--stat", "--numstat", "--summary"} for a in rest):
            return None, _NOTHING_SEQ
        operands = [a for a in rest if not a.startswith("-")]
        return None, _patch_targets(_heredoc_body(node) if not operands else _fed(bodies, operands[0], cwd))
    if sub in {"diff", "log", "show", "blame", "status"} and "--" in rest:
        return rest[rest.index("--") + 1 :], _NOTHING_SEQ
    return None, _NOTHING_SEQ


_NOTHING_SEQ: Final[tuple[str, ...]] = ()


def _swe_agent(program: str, args: Sequence[str]) -> _Found:
    """SWE-agent's file commands, which it runs as shell commands."""
    if program == "str_replace_editor":
        if len(args) >= 2 and args[0] == "view":
            return [args[1]], ()
        if len(args) >= 2 and args[0] in {"create", "str_replace", "insert", "undo_edit"}:
            return [args[1]], [args[1]]
        return None, None
    if program == "create":
        return (), list(args[:1]) or None
    if program in {"open", "search_file"}:
        files = list(args[:1]) if program == "open" else list(args[1:2])
        return files or None, ()
    if program in {"search_dir", "find_file"}:
        return list(args[1:2]) or ["."], ()
    return None, ()


_JQ_VALUE: Final = frozenset({"--arg", "--argjson", "-f"})
_SORT_VALUE: Final = frozenset({"-o", "--output", "-k", "-t", "-S"})
_UNIQ_VALUE: Final = frozenset({"-f", "-s", "-w"})
_REMOVER_VALUE: Final = frozenset({"-m", "-s", "--mode", "--size"})
_MODE_VALUE: Final = frozenset({"--reference"})
_LN_VALUE: Final = frozenset({"-t", "-S"})
_PATCH_VALUE: Final = frozenset({"-i", "-p", "-d", "-o", "-r", "-B", "-D", "-F", "-z", "-V"})


ENVIRONMENT: Final = "/<environment>"
"""What a package install writes: the interpreter's environment, never a file a read names
(a program run reads it: its reads are unknown)."""

_INSTALLERS: Final = frozenset({"pip", "pip3", "conda", "mamba", "npm", "yarn", "apt", "apt-get", "uv", "poetry"})
_INSTALLING: Final = frozenset({"install", "uninstall", "remove", "add", "i", "ci", "sync", "update", "upgrade"})


def _installs(program: str, args: Sequence[str]) -> bool:
    """Whether a writing command is a package install (``pip install``, ``python -m pip
    install``, ``uv pip install``, ``setup.py install``...)."""
    words = list(args)
    if program.startswith("python"):
        if words[:1] == ["-m"] and len(words) > 1 and words[1] in {"pip", "pip3"}:
            program, words = words[1], words[2:]
        elif words[:1] == ["setup.py"]:
            return len(words) > 1 and words[1] in {"install", "develop"}
        else:
            return False
    if program == "uv" and words[:1] == ["pip"]:
        words = words[1:]
    sub = next((w for w in words if not w.startswith("-")), None)
    return program in _INSTALLERS and sub in _INSTALLING


def _fed(bodies: dict[str, Node], name: str, cwd: str | None) -> str | None:
    """The text the file ``name`` holds when an earlier part of the same command wrote it from a
    heredoc (``cat > fix.patch << 'EOF' ... EOF``: its command in ``bodies``, by path), else None."""
    if not bodies:
        return None
    path = _normal(name, cwd)
    filler = None if path is None else bodies.get(path)
    return None if filler is None else _heredoc_body(filler)


def _program_targets(
    program: str, args: Sequence[str], effect: ShellEffect, node: Node, *, bodies: dict[str, Node], cwd: str | None
) -> _Found:
    """(read, written) paths of one simple command as written; None: cannot be known.

    ``program`` is the program's name (``/usr/bin/grep`` is ``grep``), ``node`` the command
    node, for the heredoc a patch is fed (looked up only then), ``bodies`` and ``cwd`` for a patch
    file the same command wrote before it (``patch -p1 < fix.patch``, ``git apply fix.patch``:
    :func:`_fed`)."""
    if program in _PURE:
        return (), ()
    if effect == "write" and _installs(program, args):
        return None, (ENVIRONMENT,)
    if program in _READ_FILES:
        return _operands(args), ()
    if program in _READ_DIRS:
        return _operands(args) or ["."], ()
    if program in {"head", "tail"}:
        parsed = _count_option(args, program=program)
        return (list(parsed[1]) if parsed is not None else None), ()
    if program in _GREP or program in _SEARCHERS:
        return _grep(program, args)
    if program in {"sed", "gsed"}:
        return _sed(args)
    if program in {"awk", "gawk", "mawk"} and effect == "read":
        return _awk(args)
    if program == "find":
        return _find(args, effect)
    if program == "jq":
        return _operands(args, _JQ_VALUE)[1:], ()
    if program == "sort":
        out = [a[2:] or "" for a in args if a.startswith("-o")] + [
            args[i + 1] for i, a in enumerate(args[:-1]) if a in {"-o", "--output"}
        ]
        return _operands(args, _SORT_VALUE), [o for o in out if o]
    if program == "uniq":
        operands = _operands(args, _UNIQ_VALUE)
        return operands[:1], operands[1:2]
    if program == "tee":
        return (), _operands(args)
    if program in _REMOVERS:
        return (), _operands(args, _REMOVER_VALUE) or None
    if program in _MODE_FIRST:
        return (), _operands(args, _MODE_VALUE)[1:] or None
    if program in {"cp", "mv", "install"}:
        return _copy(program, args)
    if program == "ln":
        operands = _operands(args, _LN_VALUE)
        return (), operands[-1:] or None
    if program == "dd":
        return [a[3:] for a in args if a.startswith("if=")], [a[3:] for a in args if a.startswith("of=")]
    if program == "patch":
        operands = _operands(args, _PATCH_VALUE)
        if operands:
            return None, operands[:1]
        stdin = _stdin_file(node)
        return None, _patch_targets(_heredoc_body(node) if stdin is None else _fed(bodies, stdin, cwd))
    if program == "git":
        return _git(args, node, bodies, cwd)
    if program in _SWE_PROGRAMS:
        return _swe_agent(program, args)
    if effect == "read":
        return None, ()
    return None, None


# --------------------------------------------------------------------------- the walk


def _heredoc_body(node: Node) -> str | None:
    parent = node.parent
    if parent is None or parent.type != "redirected_statement":
        return None
    for child in parent.children:
        if child.type == "heredoc_redirect":
            body = next((c for c in child.children if c.type == "heredoc_body"), None)
            return (body.text or b"").decode("utf-8", "replace") if body is not None else None
    return None


def _redirects(node: Node, operators: frozenset[str]) -> list[Node]:
    """The destinations of the file redirections with one of ``operators`` of the statement
    that ``node`` is the command of."""
    parent = node.parent
    if parent is None or parent.type != "redirected_statement":
        return []
    found = []
    for child in parent.children:
        if child.type == "file_redirect":
            operator = next((c.type for c in child.children if not c.is_named), "")
            destination = child.child_by_field_name("destination")
            if operator in operators and destination is not None:
                found.append(destination)
    return found


def _stdin_file(node: Node) -> str | None:
    """The file a command's input is redirected from (``< fix.patch``), as written; None when there
    is none or it is an expansion."""
    for destination in _redirects(node, _FROM_FILE):
        word = _word(destination)
        return None if word.dynamic else word.text
    return None


def _keep_heredoc(node: Node, program: str, args: Sequence[str], cwd: str | None, bodies: dict[str, Node]) -> None:
    """Keep, by path, the command ``cat > FILE << 'EOF'`` or ``tee FILE << 'EOF'`` that fills its
    files with its heredoc's text (nothing for ``cat`` of files, or a file named by an expansion);
    the text is read only when a patch applies the file (:func:`_fed`)."""
    if program == "tee":
        names = [a for a in args if not a.startswith("-")]
    elif args:
        return
    else:
        names = [w.text for w in map(_word, _redirects(node, _INTO_FILE)) if not w.dynamic]
    for name in names:
        if (path := _normal(name, cwd)) is not None:
            bodies[path] = node


def _forget_rewritten(bodies: dict[str, Node], written: frozenset[str], node: Node) -> None:
    """Drop the kept heredoc of each file in ``written`` that ``node`` wrote again (``echo x > f``,
    ``cat more >> f``), unless ``node`` is that heredoc's own command or one of its redirections."""
    for path in written & bodies.keys():
        filler = bodies[path]
        if filler != node and filler.parent != node.parent:
            del bodies[path]


_FILLERS: Final = frozenset({"cat", "tee"})


_FROM_FILE: Final = frozenset({"<"})
_INTO_FILE: Final = frozenset({">", ">|"})
_DEVICES: Final = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty"})


def _resolved(paths: Sequence[str] | None, cwd: str | None) -> Paths:
    if paths is None:
        return None
    if not paths:
        return _NOTHING
    out = []
    for path in paths:
        if path in _DEVICES or path.startswith("/dev/fd/"):
            continue
        placed = _normal(path, cwd)
        if placed is None:
            return None
        out.append(placed)
    return frozenset(out)


def _cd(args: Sequence[str], cwd: str | None) -> str | None:
    """The working directory after ``cd ARGS``; None when it cannot be known."""
    if len(args) != 1 or args[0].startswith("~") or args[0] == "-":
        return None
    target = args[0]
    if target.startswith("/"):
        return posixpath.normpath(target)
    return None if cwd is None else posixpath.normpath(_join(cwd, target)) if cwd else target


def _dynamic(node: Node) -> bool:
    """``_word(node).dynamic`` without unquoting the text."""
    kind = node.type
    return kind in _EXPANSIONS or (kind == "concatenation" and any(c.type in _EXPANSIONS for c in node.children))


_Part = tuple[ShellEffect, Paths, Paths]
_READ_NOTHING: Final[_Part] = ("read", _NOTHING, _NOTHING)
_READ_UNKNOWN: Final[_Part] = ("read", None, _NOTHING)
_UNKNOWN_ALL: Final[_Part] = ("unknown", None, None)
_SHELLS: Final = frozenset({"bash", "sh"})
_CHDIR: Final = frozenset({"cd", "pushd"})
# Programs whose effect is read whatever the arguments and which touch no file: their
# arguments need not be unquoted (only whether one is an expansion matters).
_PURE_READ: Final = frozenset(p for p in _PURE if _rule_for(p) in _FIXED and _rule_for(p)(()) == "read")


def _command_part(
    node: Node, cwd: str | None, programs: list[tuple[str, ...]], bodies: dict[str, Node]
) -> tuple[_Part, str | None]:
    """(effect, reads, writes) of one command node and the working directory after it;
    the words of an unknown program are appended to ``programs``; ``bodies``: the command that
    filled each file from a heredoc in an earlier part of this command, by path (this part's are
    added: :func:`_keep_heredoc`).

    The effect is ``_words_effect``'s, computed here from the words already unquoted."""
    name = node.child_by_field_name("name")
    if name is None:
        return _READ_NOTHING, cwd  # only assignments
    first = _word(name)
    arguments = node.children_by_field_name("argument")
    program = first.text
    if first.dynamic:
        programs.append((program, *[_word(a).text for a in arguments]))
        return _UNKNOWN_ALL, cwd
    base = posixpath.basename(program) if "/" in program and not program.startswith(".") else program
    if base in _PURE_READ:
        for argument in arguments:
            if _dynamic(argument):
                return _READ_UNKNOWN, cwd
        return _READ_NOTHING, cwd
    words = [_word(a) for a in arguments]
    args = [w.text for w in words]
    dynamic = False
    for w in words:
        if w.dynamic:
            dynamic = True
            break
    if program in _CHDIR:
        return _READ_NOTHING, None if dynamic else _cd(args, cwd)
    rule = _rule_for(program)
    effect = rule(tuple(args))
    if effect == "read" and dynamic and rule not in _FIXED:
        effect = "unknown"
    if program in _SHELLS and "-c" in args[:-1]:
        inner = command_targets(args[args.index("-c") + 1])
        return (inner.effect, inner.known_reads, inner.known_writes), cwd
    if effect == "unknown":
        programs.append((program, *args))
        return _UNKNOWN_ALL, cwd
    if base in _FILLERS and not dynamic:
        _keep_heredoc(node, base, args, cwd, bodies)
    reads, writes = _program_targets(base, args, effect, node, bodies=bodies, cwd=cwd)
    if dynamic:
        reads = None
        if effect != "read":
            writes = None
    read_paths = _resolved(reads, cwd)
    if effect == "read":
        return (effect, read_paths, _NOTHING), cwd
    # a writer whose targets were not found: they cannot be known
    return (effect, read_paths, _resolved(writes, cwd) or None), cwd


def _redirect_part(node: Node, cwd: str | None) -> _Part:
    operator = next((c.type for c in node.children if not c.is_named), "")
    destination = node.child_by_field_name("destination")
    if destination is None or (operator in _NO_FILE and operator != "<"):
        return _READ_NOTHING
    word = _word(destination)
    if operator == "<":
        return _READ_UNKNOWN if word.dynamic else ("read", _resolved((word.text,), cwd), _NOTHING)
    effect = _destination_effect(operator, destination, word)
    if effect != "write":
        return effect, _NOTHING, _NOTHING
    return effect, _NOTHING, (None if word.dynamic else _resolved((word.text,), cwd))


def command_targets(command: str) -> CommandTargets:
    """The effect of ``command`` and the paths it reads and writes (see the module docstring).

    Never raises; text the parser cannot read gets ``classify_command``'s conservative
    effect with unknown targets.
    """
    tree = _parse(command)
    if tree is None:
        effect = _fallback_effect(command)
        return CommandTargets(effect, _NOTHING, _NOTHING, True, effect != "read")
    worst: ShellEffect = "read"
    reads = writes = _NOTHING
    reads_unknown = writes_unknown = writer_unknown = False
    programs: list[tuple[str, ...]] = []
    bodies: dict[str, Node] = {}  # files written from a heredoc so far: a patch applied later reads them
    cwd: str | None = ""
    # commands and file redirections in text order: a pre-order walk, children pushed reversed
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        kind = node.type
        known = len(programs)
        if kind == "command":
            (effect, r, w), cwd = _command_part(node, cwd, programs, bodies)
        elif kind == "file_redirect":
            effect, r, w = _redirect_part(node, cwd)
        else:
            stack.extend(node.children[::-1])
            continue
        stack.extend(node.children[::-1])
        if effect == "write" or (effect == "unknown" and worst == "read"):
            worst = effect  # the worst part: write > unknown > read
        if r is None:
            reads_unknown = True
        elif r:
            reads = reads | r if reads else r
        if w is None:
            writes_unknown = True
            writer_unknown = writer_unknown or len(programs) == known
            bodies.clear()  # it may have rewritten a kept file: a patch applied from it is unknown
        elif w:
            writes = writes | w if writes else w
            if bodies:
                _forget_rewritten(bodies, w, node)
    if worst == "read":
        return CommandTargets(worst, reads, _NOTHING, reads_unknown, False)
    return CommandTargets(worst, reads, writes, reads_unknown, writes_unknown, tuple(programs), writer_unknown)


EditorUse = Literal["opens", "writes", "shows"]
"""How a command uses SWE-agent's editor: opens a file, writes the open file, or shows it."""
_EDITOR_USES: Final[dict[str, EditorUse]] = {
    "open": "opens", "create": "opens", "edit": "writes", "insert": "writes",
    "goto": "shows", "scroll_up": "shows", "scroll_down": "shows",
}  # fmt: skip


@functools.lru_cache(maxsize=4096)
def editor_use(command: str) -> tuple[EditorUse, str | None] | None:
    """How ``command`` uses SWE-agent's editor, which acts on the one file it has open: ``("opens",
    FILE)`` for ``open FILE [LINE]`` and ``create FILE`` (FILE None when the command names no one
    file, or does more than that: the open file is then unknown), ``("writes", None)`` for ``edit``
    and ``insert`` (they write the open file), ``("shows", None)`` for ``goto`` and ``scroll_up``
    / ``scroll_down`` (they show part of it); None for any other command. Pure, never raises."""
    words = command.split(None, 1)
    use = _EDITOR_USES.get(words[0]) if words else None
    if use != "opens":
        return None if use is None else (use, None)
    found = command_targets(command)
    named = found.reads if words[0] == "open" else found.writes
    one = len(named) == 1 and not found.programs and not found.reads_unknown and not found.writes_unknown
    return "opens", next(iter(named)) if one else None


_NAME_LISTING: Final = re.compile(r"ls(?:\s+-[aAFp1CxrtSUXdR]+)*(?:\s+[\w./][\w./-]*)*")
"""``ls`` with options that print names only (no long format: no ``-l``, ``-s``, ``-n``...) of
plain paths, alone."""


def lists_names(command: str) -> bool:
    """Whether ``command`` is a plain ``ls`` that prints names only, so that its output is the
    set of names of what it lists (``ls``, ``ls -F src``, ``ls -a``; never ``ls -la``, a pipe,
    a glob or a second command). The command starts with ``ls``: a store finds the calls that
    may list names by ``"ls`` in their argument text (``treellm.store.views.REPEAT_CALLS_SQL``)."""
    return _NAME_LISTING.fullmatch(command.rstrip()) is not None
