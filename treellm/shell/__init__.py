"""What a shell command does to the world: read, write or unknown; which paths it reads and
writes; and which lines of a file it pages.

- :func:`classify_command` (``_effect.py``): read / write / unknown of one command.
- :func:`command_targets` (``targets.py``): the same effect with the paths the command
  reads and writes (``None`` where they cannot be known), for the target-aware
  **state change** rule of ``docs/architecture.md``; :func:`paths_overlap` says
  whether a write to one path can change what a read of another shows.
- :func:`line_window`: the line range a read command shows of one file (paging).
- :func:`command_text`: the command in a shell tool's parsed arguments.

Pure functions, no I/O; nothing here raises on any input text.
"""

from treellm.shell._effect import (
    DEFAULT_SHELL_TOOLS,
    LineWindow,
    ShellEffect,
    classify_command,
    command_text,
    line_window,
)
from treellm.shell.targets import (
    ENVIRONMENT,
    CommandTargets,
    EditorUse,
    command_targets,
    editor_use,
    lists_names,
    paths_overlap,
)

__all__ = [
    "DEFAULT_SHELL_TOOLS",
    "ENVIRONMENT",
    "CommandTargets",
    "EditorUse",
    "LineWindow",
    "ShellEffect",
    "classify_command",
    "command_targets",
    "command_text",
    "editor_use",
    "line_window",
    "lists_names",
    "paths_overlap",
]
