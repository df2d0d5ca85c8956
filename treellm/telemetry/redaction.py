"""Content capture for telemetry: ``redacted`` (default), ``full`` or ``none``.

- ``redacted``: arguments and results are truncated to ``max_length``
  characters; values under keys that look like secrets (api_key, token, secret,
  password, authorization, cookie, ...) and values that look like credentials
  (bearer tokens, ``sk-...`` keys, AWS access keys, JWTs, GitHub and Slack
  tokens) are replaced by ``[REDACTED]``.
- ``full``: truncated only.
- ``none``: nothing is captured; signatures and result hashes are still
  recorded, so loop analytics work with content capture off.

The mode resolves as: the argument > what ``treellm.configure(capture=...)``
set > ``TREELLM_CAPTURE`` > ``"redacted"``. Pure functions except that one
process-wide default, which only ``configure`` writes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from treellm import settings
from treellm.errors import ConfigError
from treellm.signature import RawArguments, canonical_json

__all__ = ["Capture", "CaptureMode", "redact_text", "redact_value", "resolve_capture", "set_default_capture"]

CaptureMode = Literal["redacted", "full", "none"]
MASK = "[REDACTED]"

_SECRET_KEY = re.compile(
    r"(?i)(?:^|[_\-.\s])(?:api[_-]?key|apikey|x[_-]api[_-]key|token|access[_-]?token|refresh[_-]?token|id[_-]?token"
    r"|secret|client[_-]?secret|password|passwd|pwd|passphrase|authorization|auth|cookie|set[_-]?cookie"
    r"|credentials?|private[_-]?key|access[_-]?key|secret[_-]?key|session[_-]?(?:id|token)?|signature)(?:$|[_\-.\s])"
)
_SECRET_VALUES = [
    re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"(?i)\bbasic\s+[A-Za-z0-9+/=]{8,}"),
    re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{16,}"),
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"),
    re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
    re.compile(r"\bAIza[0-9A-Za-z_-]{30,}"),
]
# key=value / "key": "value" pairs inside free text (results, raw argument text)
_SECRET_PAIR = re.compile(
    r"""(?ix)
    (["']?(?:api[_-]?key|apikey|access[_-]?token|refresh[_-]?token|auth[_-]?token|token|secret|client[_-]?secret
          |password|passwd|pwd|authorization|cookie|private[_-]?key|secret[_-]?key|access[_-]?key)["']?
     \s*[:=]\s*)
    ("[^"]*"|'[^']*'|[^\s,&;}\]]+)
    """
)


def _is_secret_key(key: str) -> bool:
    return _SECRET_KEY.search(key) is not None


def redact_text(text: str) -> str:
    """Mask credential-looking values and ``secret_key: value`` pairs in free text."""

    def mask_pair(match: re.Match[str]) -> str:
        value = match.group(2)
        quote = value[0] if value[:1] in ('"', "'") else ""
        return f"{match.group(1)}{quote}{MASK}{quote}"

    text = _SECRET_PAIR.sub(mask_pair, text)
    for pattern in _SECRET_VALUES:
        text = pattern.sub(MASK, text)
    return text


def redact_value(value: Any) -> Any:
    """A copy of a parsed JSON value with secret keys and credential-like strings masked."""
    if isinstance(value, Mapping):
        return {k: MASK if _is_secret_key(str(k)) else redact_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_value(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, RawArguments):
        return RawArguments(redact_text(value.text))
    return value


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…[truncated {len(text) - limit} chars]"


@dataclass(frozen=True, slots=True)
class Capture:
    """How much tool content telemetry records."""

    mode: CaptureMode = "redacted"
    max_length: int = 1000

    def __post_init__(self) -> None:
        if self.mode not in get_args(CaptureMode):
            raise ConfigError(f"capture: expected redacted, full or none, got {self.mode!r}", setting="capture")
        if isinstance(self.max_length, bool) or not isinstance(self.max_length, int) or self.max_length < 1:
            raise ConfigError(
                f"capture max_length: expected an integer >= 1, got {self.max_length!r}", setting="capture"
            )

    def arguments(self, value: Any) -> str | None:
        """Parsed arguments as captured text, or None when capture is off."""
        if self.mode == "none":
            return None
        if self.mode == "redacted":
            value = redact_value(value)
        text = value.text if isinstance(value, RawArguments) else canonical_json(value)
        return _truncate(text, self.max_length)

    def text(self, text: str | None) -> str | None:
        """A result or answer as captured text, or None when capture is off."""
        if self.mode == "none" or text is None:
            return None
        if self.mode == "redacted":
            text = redact_text(text)
        return _truncate(text, self.max_length)


_default: Capture | None = None


def set_default_capture(capture: Capture | None) -> None:
    """Set the process-wide default (only ``treellm.configure`` calls this)."""
    global _default  # noqa: PLW0603 -- the one process-wide setting, like OTel's global provider
    _default = capture


def resolve_capture(capture: Capture | CaptureMode | None = None) -> Capture:
    """argument > configure(capture=...) > TREELLM_CAPTURE (+ _MAX_LENGTH) > redacted."""
    if isinstance(capture, Capture):
        return capture
    if capture is not None:
        return Capture(capture)
    if _default is not None:
        return _default
    mode = settings.get(settings.TREELLM_CAPTURE)
    length = settings.get(settings.TREELLM_CAPTURE_MAX_LENGTH)
    default = Capture()  # unset variables leave the dataclass defaults
    return Capture(mode or default.mode, length or default.max_length)  # type: ignore[arg-type]
