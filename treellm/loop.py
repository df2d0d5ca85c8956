"""Path-local loop detection: :class:`LoopDetector` and :class:`PathSignatures`.

Contract (the definitions of ``docs/architecture.md``):

- A call is identified by :class:`CallKey`: the tool name and the full canonical
  text of its arguments (or, for arguments that are not valid JSON, their exact
  raw text, kept apart from any parsed value). Counting never uses the 32-bit
  djb2 hash, so a hash collision cannot prune a different call; the tree-llm
  signature string is carried for display and telemetry.
- **count** = earlier identical calls on the path since the path's last
  successful **state change** by another call (another tool's, or the same
  tool's with other arguments) that can have changed what this call reads. A
  state change carries the paths it wrote (``writes``; ``None``: cannot be
  known) and a call the paths it reads (``reads``; ``None``: cannot be known):
  a write restarts the counts of the calls that read what it wrote
  (:func:`treellm.shell.paths_overlap`) and of calls whose reads are unknown; a
  write to unknown targets restarts every count. Its own key keeps counting, so
  the same write repeated with nothing between is still a loop. A call is caught
  when count >= limit. **ordinal** = count + 1. Which calls change state, and
  their targets, are decided by ``treellm.engine.repeats``; this module only
  records them.
- **limit precedence**: limits file > the tool's own ``max_repeats`` > the
  detector's default.
- :class:`PathSignatures` is immutable. ``extend`` returns a new value in
  O(log n) time and memory (a hash array mapped trie shares the parent's
  structure), so sibling branches extend one parent independently and a deep
  path costs no more per step than a shallow one. ``count`` looks back over the
  writes with known targets made since the key's first call (each compared
  once, the answer for a pair of path sets memoised), stopping at the first that
  touches what the key reads.

Pure: no I/O, no clocks, no state but the memo of a pure function (``lru_cache``,
thread-safe). Thread-safe because nothing else mutates.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import immutables

from treellm.errors import ConfigError
from treellm.shell import paths_overlap
from treellm.signature import RawArguments, canonical_json, hash_text, parse_arguments

__all__ = ["CallKey", "LimitSource", "LoopDecision", "LoopDetector", "PathSignatures", "Paths", "call_key", "key_of"]

LimitSource = Literal["file", "tool", "default"]


@dataclass(frozen=True, slots=True)
class CallKey:
    """What makes two calls identical: the tool and the canonical arguments."""

    tool: str
    canonical: str
    raw: bool
    """True when the arguments were not valid JSON: ``canonical`` is then the raw text."""

    @property
    def signature(self) -> str:
        """tree-llm's display form ``tool:hash`` (not used for counting)."""
        return f"{self.tool}:{hash_text(self.canonical if not self.raw else canonical_json(self.canonical))}"


def call_key(tool: str, arguments: object) -> CallKey:
    """The :class:`CallKey` of a call; ``arguments`` is text, bytes or a parsed value."""
    return key_of(tool, parse_arguments(arguments))


def key_of(tool: str, value: object) -> CallKey:
    """The :class:`CallKey` of a call whose arguments are already parsed (``parse_arguments``'s
    answer: a JSON value, a string included, or :class:`RawArguments`), never parsed again."""
    if isinstance(value, RawArguments):
        return CallKey(tool, value.text, raw=True)
    return CallKey(tool, canonical_json(value), raw=False)


Paths = frozenset[str] | None
"""Paths a call reads or writes; None: cannot be known."""


@dataclass(frozen=True, slots=True)
class _Calls:
    """The identical calls of one key on a path: (position on the path, node id), and
    what the key reads (the same for every call of the key)."""

    positions: tuple[int, ...]
    node_ids: tuple[str | None, ...]
    reads: Paths = None


@dataclass(frozen=True, slots=True)
class _Write:
    """A state change with known targets, linked to the one before it (newest first)."""

    position: int
    key: CallKey
    writes: frozenset[str]
    before: _Write | None


@functools.lru_cache(maxsize=4096)
def _touches(writes: frozenset[str], reads: frozenset[str]) -> bool:
    """Whether a write to ``writes`` can change a read of ``reads`` (pure, memoised: a long run
    asks it of the same few files' sets again and again, and a count walks back over every state
    change since its key's first call)."""
    return any(paths_overlap(w, r) for w in writes for r in reads)


@dataclass(frozen=True, slots=True)
class PathSignatures:
    """The calls made on one path from the root, immutable and structurally shared.

    Use :meth:`empty` to start a path and :meth:`extend` to add a call. Equality
    is identity-free: two paths are equal when they hold the same calls.
    """

    _calls: immutables.Map[CallKey, _Calls] = field(default_factory=immutables.Map)
    length: int = 0
    """How many calls the path holds."""
    _last_reset: int = -1
    """Position of the last state change on the path (-1: none)."""
    _last_reset_key: CallKey | None = None
    """The key of that state change."""
    _other_reset: int = -1
    """Position of the last state change whose key is not ``_last_reset_key``."""
    _last_blind: int = -1
    """Position of the last state change to unknown targets (it restarts every count)."""
    _last_blind_key: CallKey | None = None
    _other_blind: int = -1
    _writes: _Write | None = None
    """The state changes with known targets, newest first."""

    @classmethod
    def empty(cls) -> PathSignatures:
        return cls()

    def _reset_point(self, key: CallKey, calls: _Calls) -> int:
        """The last state change by another key that can have changed what ``key`` reads."""
        if calls.reads is None:
            return self._other_reset if key == self._last_reset_key else self._last_reset
        point = self._other_blind if key == self._last_blind_key else self._last_blind
        first = calls.positions[0]
        write = self._writes
        while write is not None and write.position > point and write.position > first:
            if write.key != key and _touches(write.writes, calls.reads):
                return write.position
            write = write.before
        return point

    def earlier(self, key: CallKey) -> tuple[str | None, ...]:
        """Node ids of the earlier identical calls that count (oldest first)."""
        calls = self._calls.get(key)
        if calls is None:
            return ()
        start = bisect.bisect_right(calls.positions, self._reset_point(key, calls))
        return calls.node_ids[start:]

    def count(self, key: CallKey) -> int:
        """The count of ``key`` on this path, as defined in the module docstring."""
        calls = self._calls.get(key)
        if calls is None:
            return 0
        return len(calls.positions) - bisect.bisect_right(calls.positions, self._reset_point(key, calls))

    def extend(
        self,
        key: CallKey,
        node_id: str | None = None,
        *,
        mutates: bool = False,
        reads: Paths = None,
        writes: Paths = None,
    ) -> PathSignatures:
        """A new path with one more call of ``key``; this path is unchanged.

        ``reads``: the paths the call reads (None: cannot be known, so every state
        change restarts its count). ``mutates=True`` says the call was a *successful
        state change*; ``writes`` names what it wrote (None: cannot be known, so it
        restarts every other key's count). It restarts the counts of the other keys
        that read what it wrote, the same tool's other arguments included; ``key``'s
        own count goes on. O(log n) time and memory.
        """
        position = self.length
        old = self._calls.get(key)
        if old is None:
            calls = _Calls((position,), (node_id,), reads)
        else:
            calls = _Calls((*old.positions, position), (*old.node_ids, node_id), old.reads)
        last, last_key, other = self._last_reset, self._last_reset_key, self._other_reset
        blind, blind_key, other_blind = self._last_blind, self._last_blind_key, self._other_blind
        known = self._writes
        if mutates:
            if key != last_key:
                other, last_key = last, key
            last = position
            if writes is None:
                if key != blind_key:
                    other_blind, blind_key = blind, key
                blind = position
            elif writes:
                known = _Write(position, key, writes, known)
        return PathSignatures(
            self._calls.set(key, calls), position + 1, last, last_key, other, blind, blind_key, other_blind, known
        )

    def __len__(self) -> int:
        return self.length


@dataclass(frozen=True, slots=True)
class LoopDecision:
    """The detector's verdict on one call, with what telemetry needs to explain it."""

    tool: str
    key: CallKey
    signature: str
    count: int
    limit: int
    limit_source: LimitSource
    earlier_node_ids: tuple[str | None, ...]

    @property
    def caught(self) -> bool:
        """True when the call would repeat past its limit (count >= limit)."""
        return self.count >= self.limit

    @property
    def ordinal(self) -> int:
        """1 for the first call of its kind on the path, 2 for the first repeat..."""
        return self.count + 1


def _check_limit(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name}: expected an integer >= 0, got {value!r}")
    return value


class LoopDetector:
    """Decides whether a call would loop on a path, and extends paths.

    ``max_repeats`` is the default limit; ``file_limits`` (tool -> limit, from a
    limits file tuned from data) override every other limit. Stateless past its
    construction: one detector serves any number of paths and threads.
    """

    def __init__(self, max_repeats: int = 1, *, file_limits: Mapping[str, int] | None = None) -> None:
        self.max_repeats = _check_limit("max_repeats", max_repeats)
        self.file_limits: Mapping[str, int] = {
            tool: _check_limit(f"limit of {tool}", n) for tool, n in (file_limits or {}).items()
        }

    def limit_for(self, tool: str, max_repeats: int | None = None) -> tuple[int, LimitSource]:
        """The limit that applies to ``tool`` and where it comes from."""
        if tool in self.file_limits:
            return self.file_limits[tool], "file"
        if max_repeats is not None:
            return max_repeats, "tool"
        return self.max_repeats, "default"

    def check_key(self, path: PathSignatures, key: CallKey, max_repeats: int | None = None) -> LoopDecision:
        """The decision for a call already turned into a :class:`CallKey`."""
        limit, source = self.limit_for(key.tool, max_repeats)
        earlier = path.earlier(key)
        return LoopDecision(key.tool, key, key.signature, len(earlier), limit, source, earlier)

    def check(self, path: PathSignatures, tool: str, args: object, max_repeats: int | None = None) -> LoopDecision:
        """The typed decision for calling ``tool`` with ``args`` on ``path``."""
        return self.check_key(path, call_key(tool, args), max_repeats)

    def would_loop(self, path: PathSignatures, tool: str, args: object, max_repeats: int | None = None) -> bool:
        """True when the call's count on the path is >= its limit."""
        key = call_key(tool, args)
        limit, _ = self.limit_for(tool, max_repeats)
        return path.count(key) >= limit

    def extend_path(
        self,
        path: PathSignatures,
        tool: str,
        args: object,
        node_id: str | None = None,
        mutates: bool = False,
        *,
        reads: Paths = None,
        writes: Paths = None,
    ) -> PathSignatures:
        """``path`` with the call added (see :meth:`PathSignatures.extend`)."""
        return path.extend(call_key(tool, args), node_id, mutates=mutates, reads=reads, writes=writes)
