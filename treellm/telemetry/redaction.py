"""Content capture for telemetry: ``redacted`` (default), ``full`` or ``none``.

- ``redacted``: content is masked, then cut to ``max_length`` characters (the rule
  below). Masked with ``[REDACTED]``: every value under a key that looks like a secret
  (:func:`is_secret_key`), in parsed arguments, in JSON text (parsed up to
  ``JSON_DEPTH`` levels of JSON held in strings) and in ``key: value`` / ``key=value``
  / ``--key value`` pairs of free text (escaped quotes of JSON-in-JSON included); and
  in any text: ``Authorization``-style ``Bearer``/``Basic``/``Digest`` credentials,
  passwords in URLs (``scheme://user:pw@host``), PEM private keys (to their END line,
  or to the end of the text), ``mysql -pPW``/``sshpass -p``/``curl -u user:pw``, and
  provider tokens by their prefix (OpenAI, Anthropic, Stripe, AWS, GitHub, GitLab,
  Slack, Google, Hugging Face, npm, PyPI, SendGrid, Twilio, Azure storage keys, JWTs,
  ...); the value of a pair under a secret key (``[["password", v]]``, ``("token", v)``,
  parsed or in text) and the item after a secret flag in an argv list (``"--password",
  "v"``, OTLP string arrays too); a base64 word (mixed case, 11 characters or more) that
  decodes to UTF-8 text holding a secret (JSON with secret keys, ``user:password``, a URL
  with a password...). A token or an unquoted value that goes on over a line break (a wrapped key,
  a shell ``\\`` continuation) is masked on the following line too, when that line
  starts with a token-like word with a digit or ``+/=`` in it that ends the line (or
  is 16 characters or more).
- ``full``: cut only.
- ``none``: no content at all: no arguments, results, answers, think text, error or
  exception messages (a status or a ``tool:retry`` event says the exception *type*
  only). Signatures and result hashes are still recorded, so loop analytics work with
  content capture off.

The truncation rule: **mask first, then cut, and never show what was not scanned**. A
text of at most ``max_length + MARGIN`` characters is redacted whole (JSON parsed and
all), then cut. A longer text is scanned on its first ``max_length + MARGIN``
characters only, and what is shown comes from its first ``max_length`` characters: a
secret that straddles the cut lies whole in the scanned window (``MARGIN`` is longer
than any secret masked as one piece; a PEM block or a quoted value that runs past the
window is masked to its end), so no half of it survives; a secret that straddles the
window's end starts after the cut and is never shown. A string inside parsed
arguments longer than ``max_length + MARGIN`` is cut the same way before the
arguments are serialized. So the cost of redacting a result is bounded whatever its
size (a 5 MB result costs what a 9 KB one does: 1.4 ms), and every regex call is short,
which matters because Python's ``re`` holds the GIL for a whole call.

Where it runs: not on the engine's event loop. :class:`~treellm.telemetry.TelemetryObserver`
hands events that arrive on a thread running an event loop to its own worker thread,
which does the capture (redaction included) and all the span work in event order; see
its module docstring.

Why our own patterns and no library: measured side by side in one session on
``tests/data/secrets_corpus.json`` (125 planted secrets, as tests/test_redaction.py
plants them) and on 160 benign lines (commit and content hashes, UUIDs, paths, base64
data URLs, ``max_tokens`` JSON, prose with "basic", "bearer", "token"), each library
masking the values it reports (detect-secrets through ``scan_file``, its real mode):

========================================================  =======  ======  ==========
library (version, licence, last release)                  recall   benign  ms per KB
========================================================  =======  ======  ==========
detect-secrets 1.5.0 (Yelp, Apache-2.0, 2024-05)          64/125   0/160   1.1
bc-detect-secrets 1.5.52 (Bridgecrew fork, Apache-2.0)    66/125   0/160   1.2
microsoft-security-utilities-secret-masker 1.0.0b4        14/125   0/160   0.7
(MIT, beta, 2025-03)
these patterns (tuned on this corpus: recall by design)   125/125  0/160   0.25
========================================================  =======  ======  ==========

detect-secrets scans files line by line for committed secrets: it has no idea of JSON
inside JSON, compound or camelCase keys (``openaiApiKey``, ``db_pass``), URL
passwords, PEM bodies (it flags the BEGIN line), ``mysql -p`` or wrapped keys; it
would also pull in ``requests`` and ``pyyaml``, and has had no release for two years.
Its ad hoc ``scan_line`` mode reports every word of a line as a candidate. Its plugin
list (keyword denylist, AWS, Azure, Stripe, GitHub, GitLab, Slack, npm, PyPI,
SendGrid, Twilio, JWT, private keys) informed the patterns here. A dependency would
not remove the structural work (keys, nested JSON, windows), which is where most
leaks were. No entropy detector: it masks hashes and ids (the result hashes and
signatures loop analytics need look exactly like secrets to it).

Other frameworks' spans: :class:`ForeignCapture` applies these rules, by the same mode,
to what the store keeps of spans that treellm did not make (``treellm.store.ingest`` runs
it after deriving signatures and ordinals from the raw values): values under secret
attribute names (:func:`is_secret_attribute`) masked whole, every other value redacted
and never cut, and under ``none`` content stored as :func:`content_hash`. Values that
cannot hold a secret are skipped by :func:`may_hold_secret` (and by
:data:`PREFILTER_PATTERN` in SQL), which is exact in one direction: a text it skips is one
:func:`redact_text` leaves unchanged.

Mode resolution: the argument > what ``treellm.configure(capture=...)`` set >
``TREELLM_CAPTURE`` > ``"redacted"``. Pure functions except that one process-wide
default, which only ``configure`` writes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from treellm import settings
from treellm.errors import ConfigError
from treellm.signature import RawArguments, canonical_json
from treellm.telemetry import conventions as conv

__all__ = [
    "BASE64_WORD_PATTERN",
    "JSON_DEPTH",
    "MARGIN",
    "MASK",
    "PREFILTER_PATTERN",
    "Capture",
    "CaptureMode",
    "ForeignCapture",
    "Rewrite",
    "ValueRule",
    "content_hash",
    "error_type",
    "is_secret_attribute",
    "is_secret_key",
    "key_parts",
    "may_hold_secret",
    "redact_text",
    "redact_value",
    "resolve_capture",
    "set_default_capture",
]

CaptureMode = Literal["redacted", "full", "none"]
MASK = "[REDACTED]"
MARGIN = 8192
"""Characters scanned past the cut (longer than any secret masked as one piece)."""
JSON_DEPTH = 3
"""Levels of JSON-in-a-string that are parsed and redacted inside."""

# -- keys ------------------------------------------------------------------------------------------------

_KEY_CHUNKS = re.compile(r"[^A-Za-z0-9]+")
_KEY_WORDS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
_SECRET_PARTS = frozenset({
    "password", "passwd", "pass", "pwd", "passphrase", "secret", "secrets", "token", "apikey", "auth",
    "authorization", "oauth", "credential", "credentials", "creds", "cookie", "cookies", "session", "bearer",
    "private", "privatekey", "signature", "sig", "jwt",
})  # fmt: skip
_KEY_QUALIFIERS = frozenset({
    "api", "access", "secret", "private", "account", "client", "signing", "encryption", "master", "shared",
    "subscription",
})  # fmt: skip
_SECRET_INFIXES = ("password", "passwd", "secret", "apikey", "credential", "privatekey")
_SECRET_SUFFIXES = ("token", "pwd", "passwd", "apikey")


def key_parts(key: str) -> tuple[str, ...]:
    """A key's words, lower-cased: split on ``_ - . :`` and spaces and on case changes.

    ``openaiApiKey`` -> ``("openai", "api", "key")``; ``DB_PASSWORD`` -> ``("db", "password")``;
    ``HTTPAuthHeader`` -> ``("http", "auth", "header")``.
    """
    return tuple(word.lower() for chunk in _KEY_CHUNKS.split(key) if chunk for word in _KEY_WORDS.findall(chunk))


def is_secret_key(key: str) -> bool:
    """True when a value under ``key`` is taken for a secret.

    A part among password, passwd, pass, pwd, secret, token, apikey, auth,
    authorization, credential(s), cookie, session, bearer, private, signature, ...;
    ``key`` next to api, access, secret, private, account (and client, signing,
    encryption, master, shared, subscription); or a one-word part that holds password,
    secret, apikey, credential (``PGPASSWORD``) or ends in token (``csrftoken``). Not
    ``max_tokens`` or ``key`` alone.
    """
    parts = key_parts(key)
    for part in parts:
        if part in _SECRET_PARTS:
            return True
        if any(infix in part for infix in _SECRET_INFIXES) or part.endswith(_SECRET_SUFFIXES):
            return True
    return "key" in parts and any(part in _KEY_QUALIFIERS for part in parts)


# -- free text -------------------------------------------------------------------------------------------

Span = tuple[int, int]

_BREAK = r"(?:\\\r?\n|\r?\n|\\n)"
_WORD = r"(?=[A-Za-z0-9+/=_.\-]*[0-9+/=])[A-Za-z0-9+/=_.\-]"
_CONTINUATION = rf"(?:{_BREAK}[ \t]*(?:{_WORD}{{4,}}(?=[\r\n\"',;)\]}}\\]|\Z)|{_WORD}{{16,}}(?=[ \t])))*"
"""Lines that carry on a token or unquoted value cut by a line break: a token-like word with a digit
or ``+/=`` that ends its line (or is 16 characters or more, when words follow it)."""

_TOKENS = [  # after a character that is not [A-Za-z0-9_] (one lookbehind first keeps the scan fast)
    r"sk-(?:proj-|ant-(?:api|admin)\d\d-|svcacct-|admin-)?[A-Za-z0-9_\-]{16,}",  # OpenAI, Anthropic
    r"[rsp]k_(?:live|test)_[A-Za-z0-9]{10,}",  # Stripe
    r"whsec_[A-Za-z0-9]{16,}",
    r"(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}\b",  # AWS access key ids
    r"eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",  # JWT
    r"gh[pousr]_[A-Za-z0-9]{16,}",
    r"github_pat_[A-Za-z0-9_]{20,}",
    r"glpat-[A-Za-z0-9_\-]{16,}",
    r"xox[abposr]-[A-Za-z0-9\-]{10,}",
    r"https://hooks\.slack\.com/services/[A-Za-z0-9/]+",
    r"AIza[0-9A-Za-z_\-]{30,}",
    r"ya29\.[0-9A-Za-z_\-]{20,}",
    r"hf_[A-Za-z0-9]{16,}",
    r"npm_[A-Za-z0-9]{30,}",
    r"pypi-AgE[A-Za-z0-9_\-]{40,}",
    r"SG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}",
    r"(?:AC|SK)[0-9a-f]{32}\b",  # Twilio
    r"[0-9a-f]{32}-us[0-9]{1,2}\b",  # Mailchimp
    r"sq0(?:atp|csp)-[0-9A-Za-z_\-]{22,}",
    r"shp(?:at|ss|ca|pa)_[a-fA-F0-9]{32}",
    r"dop_v1_[a-f0-9]{64}",
    r"dapi[a-f0-9]{32}",
]
_TOKEN = re.compile(rf"(?<![A-Za-z0-9_])(?:{'|'.join(_TOKENS)}){_CONTINUATION}")
_AZURE_KEY = re.compile(rf"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{{86}}=={_CONTINUATION}")
_PEM = re.compile(
    r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----.*?(?:-----END[A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|\Z)",
    re.DOTALL,
)
_URL_USERINFO = re.compile(r"(?i)\b[a-z][a-z0-9+.\-]{0,20}://(?P<user>[^\s/:@\"'<>]*)(?::(?P<pw>[^\s/@\"'<>]+))?@")
_SCHEME_WORDS = ("bearer", "basic", "digest", "token")
_SCHEME = re.compile(rf"(?i)\b(?:{'|'.join(_SCHEME_WORDS)})[ \t]+(?P<v>[A-Za-z0-9._~+/=\-]{{8,}}{_CONTINUATION})")
_PAIR = re.compile(
    rf"""
    (?P<key>[A-Za-z_][\w.\-]{{0,80}})(?<=[A-Za-z0-9_])
    \\*["']?[ \t]*(?:=>|[:=])[ \t]*
    (?:
        "(?P<dq>(?:[^"\\]|\\.)*)(?:"|\Z)
      | (?P<esc>\\+)"(?P<eq>.*?)(?:(?<!\\)(?P=esc)"|\Z)
      | '(?P<sq>[^'\n]*)(?:'|\Z)
      | (?P<obj>\{{[^{{}}]*\}}|\[[^\[\]]*\])
      | (?P<bare>(?:(?:bearer|basic|digest|token|negotiate)[ \t]+)?[^\s,;&"'<>{{}}\[\]\\]+{_CONTINUATION})
    )
    """,
    re.VERBOSE | re.IGNORECASE,
)
_PAIR_HINT_WORDS = r"pass|pwd|secret|token|key|auth|cred|cookie|session|bearer|private|sig|jwt"
_PAIR_HINT = re.compile(rf"(?i){_PAIR_HINT_WORDS}")
_PAIR_HINT_LOWER = re.compile(_PAIR_HINT_WORDS)
""":data:`_PAIR_HINT` over the lower-cased text of an ASCII text (the same places; 9x faster: the
case-insensitive scan tries every character)."""
_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
_FLAG = re.compile(r"(?<![\w-])--(?P<key>[A-Za-z][\w.\-]*)[ \t]+(?P<v>'[^'\n]*'|\"[^\"\n]*\"|[^\s'\"\-][^\s'\"]*)")
_COMMANDS = [
    r"(?:mysql|mysqldump|mysqladmin|mysqlimport|mariadb(?:-dump|-admin)?)\b[^\n|;&]*?[ \t]-p"
    r"(?P<v>'[^'\n]*'|\"[^\"\n]*\"|[^\s'\"]+)",
    r"sshpass[ \t]+-p[ \t]*(?P<v>'[^'\n]*'|\"[^\"\n]*\"|[^\s'\"]+)",
    r"(?:-u|--user)[ \t]+[^\s:'\"]+:(?P<v>[^\s'\"]+)",
]
_COMMAND = re.compile(
    "(?<![\\w-])(?:" + "|".join(f"(?:{c})".replace("?P<v>", f"?P<v{i}>") for i, c in enumerate(_COMMANDS)) + ")"
)
_PROSE_KEYS = r"password|passwd|passphrase|pwd|secret|token|api[ _-]?key"
_PROSE_WORDS = (
    rf"\b(?:{_PROSE_KEYS})[ \t]+(?:is|was|=|:)[ \t]+"
    r"(?P<v>[^\s,;'\"]+?)(?=[.,;:!?)]?(?:\s|\Z))"
)
_PROSE = re.compile(f"(?i){_PROSE_WORDS}")
_PROSE_LOWER = re.compile(_PROSE_WORDS)
""":data:`_PROSE` over the lower-cased text of an ASCII text: the same places and lengths (its finder
reads nothing else), twice as fast."""
_PAIR_ITEM = re.compile(
    r"""
    [\[(][ \t]*(?P<kq>\\*["'])(?P<key>[A-Za-z_][\w.\-]{0,80})(?P=kq)[ \t]*,[ \t]*
    (?:
        "(?P<dq>(?:[^"\\]|\\.)*)(?:"|\Z)
      | (?P<esc>\\+)"(?P<eq>.*?)(?:(?<!\\)(?P=esc)"|\Z)
      | '(?P<sq>[^'\n]*)(?:'|\Z)
      | (?P<bare>[^\s,;"'\[\]()\\]+)(?=[ \t]*\])
    )
    """,
    re.VERBOSE,
)
"""An item of a pair list: ``["password", "v"]``, ``('token', 'v')``, ``[\\"api_key\\", \\"v\\"]``,
``["pin", 1234]``."""
_QUOTED_FLAG = re.compile(
    r"""
    (?P<kq>\\*["'])--?(?P<key>[A-Za-z][\w.\-]{0,80})(?P=kq)[ \t]*,[ \t]*
    (?:
        "(?P<dq>(?:[^"\\]|\\.)*)(?:"|\Z)
      | (?P<esc>\\+)"(?P<eq>.*?)(?:(?<!\\)(?P=esc)"|\Z)
      | '(?P<sq>[^'\n]*)(?:'|\Z)
    )
    """,
    re.VERBOSE,
)
"""An argv list written out in text: ``"--password", "v"`` (a JSON or Python list in a message)."""
_BASE64 = re.compile(r"(?<![A-Za-z0-9+/_\-])[A-Za-z0-9+/_\-]{11,}={0,2}(?![A-Za-z0-9+/=_\-])")
"""A base64 (or URL-safe base64) word long enough to hold ``user:pw`` (8 bytes: 11 characters and more)."""
_BASIC_CREDENTIAL = re.compile(r"[^\s:]*[A-Za-z][^\s:]*:(?!//)\S{2,}")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufffd]")
_RANDOM_SPECIALS = frozenset("0123456789+/=_.~-")


def _looks_random(value: str) -> bool:
    """A credential-like word: a digit or one of ``+/=_.~-`` in it, or capitals past its first letter."""
    return any(c in _RANDOM_SPECIALS for c in value) or any(c.isupper() for c in value[1:])


def _group_spans(match: re.Match[str], names: Iterable[str]) -> list[Span]:
    spans = []
    for name in names:
        start, end = match.span(name)
        if start >= 0 and end > start:
            spans.append((start, end))
    return spans


def _pair_spans(text: str, lower: str | None) -> list[Span]:
    """Values of ``key: value`` pairs under secret keys (only keys holding a hint word are tried);
    ``lower``: the text lower-cased when it is ASCII, else None."""
    spans: list[Span] = []
    done = 0
    for hint in _PAIR_HINT.finditer(text) if lower is None else _PAIR_HINT_LOWER.finditer(lower):
        start = hint.start()
        if start < done:
            continue
        floor = max(done, start - 80)
        while start > floor and text[start - 1] in _KEY_CHARS:
            start -= 1
        while start < hint.start() and not (text[start].isalpha() or text[start] == "_"):
            start += 1
        match = _PAIR.match(text, start)
        if match is None:
            continue
        if is_secret_key(match.group("key")):
            spans.extend(_group_spans(match, ("dq", "eq", "sq", "obj", "bare")))
            done = match.end()
        else:
            done = match.end("key")
    return spans


def _flag_spans(match: re.Match[str]) -> list[Span]:
    return _group_spans(match, ("v",)) if is_secret_key(match.group("key")) else []


def _url_spans(match: re.Match[str]) -> list[Span]:
    spans = _group_spans(match, ("pw",))
    user = match.group("user")
    if user and len(user) >= 16 and _looks_random(user):
        spans.extend(_group_spans(match, ("user",)))
    return spans


def _scheme_spans(match: re.Match[str]) -> list[Span]:
    return _group_spans(match, ("v",)) if _looks_random(match.group("v")) else []


def _prose_spans(text: str, lower: str | None) -> list[Span]:
    matches = _PROSE.finditer(text) if lower is None else _PROSE_LOWER.finditer(lower)
    return [span for match in matches if len(match.group("v")) >= 6 for span in _group_spans(match, ("v",))]


_NOT_SECRETS = frozenset({"true", "false", "null", "none"})


def _pair_item_spans(match: re.Match[str]) -> list[Span]:
    """The value of a pair under a secret key; a bare one only when it ends a list (``["pin", 1234]``)
    and is not a literal (``get('pass_original', False)`` is code, not a secret)."""
    if not is_secret_key(match.group("key")) or (match.group("bare") or "").lower() in _NOT_SECRETS:
        return []
    return _group_spans(match, ("dq", "eq", "sq", "bare"))


def _quoted_flag_spans(match: re.Match[str]) -> list[Span]:
    return _group_spans(match, ("dq", "eq", "sq")) if is_secret_key(match.group("key")) else []


def _mixed_case(word: str) -> bool:
    return word != word.lower() and word != word.upper()


def _base64_text(word: str) -> str | None:
    """The text that a base64 (or URL-safe base64) word decodes to: UTF-8 without control
    characters (tabs and line breaks allowed); None when it decodes to anything else."""
    body = word.rstrip("=")
    urlsafe = "-" in body or "_" in body
    if len(body) % 4 == 1 or (urlsafe and ("+" in body or "/" in body)):
        return None
    try:
        raw = base64.b64decode(body + "=" * (-len(body) % 4), altchars=b"-_" if urlsafe else None, validate=True)
        text = raw.decode("utf-8")
    except (binascii.Error, ValueError):  # UnicodeDecodeError is a ValueError
        return None
    return None if _CONTROL.search(text) else text


def _base64_spans(text: str) -> list[Span]:
    """Base64 words (mixed case, 11 characters or more) that decode to text holding a secret:
    ``user:password`` basic credentials, or anything the rules here mask (JSON with secret keys...)."""
    spans = []
    for match in _BASE64.finditer(text):
        word = match.group()
        if not _mixed_case(word):
            continue
        decoded = _base64_text(word)
        if decoded is not None and (_BASIC_CREDENTIAL.fullmatch(decoded) or redact_text(decoded) != decoded):
            spans.append(match.span())
    return spans


_Finder = Callable[[str, str | None], list[Span]]
"""The spans one pattern finds in a text, told the text lower-cased when it is ASCII (else None)."""


def _each(pattern: re.Pattern[str], spans_of: Callable[[re.Match[str]], list[Span]]) -> _Finder:
    return lambda text, lower: [span for match in pattern.finditer(text) for span in spans_of(match)]


@dataclass(frozen=True, slots=True)
class _Gated:
    """``find``, run only on a text that holds one of ``literals`` (text the pattern cannot match
    without, as written) or, for a case-insensitive pattern, one of ``words`` (lower case: only an
    ASCII text is told it has none, where lower-casing is exactly the pattern's case folding).
    Most texts hold none, and the scan they skip costs 25-45 ns a character."""

    find: _Finder
    literals: tuple[str, ...] = ()
    words: tuple[str, ...] = ()

    def __call__(self, text: str, lower: str | None) -> list[Span]:
        if self.literals and not any(literal in text for literal in self.literals):
            return []
        if self.words and lower is not None and not any(word in lower for word in self.words):
            return []
        return self.find(text, lower)


_COMMAND_GROUPS = tuple(f"v{i}" for i in range(len(_COMMANDS)))
_FINDERS: list[_Finder | _Gated] = [
    _Gated(_each(_PEM, lambda m: [m.span()]), literals=("-----BEGIN",)),
    _each(_TOKEN, lambda m: [m.span()]),
    _Gated(_each(_AZURE_KEY, lambda m: [m.span()]), literals=("==",)),
    _Gated(_each(_URL_USERINFO, _url_spans), literals=("://",)),
    _Gated(_pair_spans, literals=(":", "=")),
    _Gated(_each(_FLAG, _flag_spans), literals=("--",)),
    _Gated(_each(_COMMAND, lambda m: _group_spans(m, _COMMAND_GROUPS)), literals=("mysql", "mariadb", "sshpass", "-u")),
    _Gated(_each(_SCHEME, _scheme_spans), words=_SCHEME_WORDS),
    _Gated(_prose_spans, words=("pass", "pwd", "secret", "token", "api")),
    _Gated(_each(_PAIR_ITEM, _pair_item_spans), literals=('"', "'")),
    _Gated(_each(_QUOTED_FLAG, _quoted_flag_spans), literals=('"-', "'-")),
    lambda text, lower: _base64_spans(text),
]
"""Each pattern's finder, gated by what its pattern cannot match without (``tests/test_redaction.py``
checks that the gates change no answer)."""


def secret_spans(text: str) -> list[Span]:
    """The ``(start, end)`` ranges of ``text`` to mask, sorted and merged (free-text patterns
    only): none for a text :func:`may_hold_secret` skips, without running the patterns."""
    return _spans(text) if may_hold_secret(text) else []


def _spans(text: str) -> list[Span]:
    """:func:`secret_spans` by every pattern (no prefilter)."""
    if len(text) < 8:
        return []
    lower = text.lower() if text.isascii() else None
    return _merged(span for find in _FINDERS for span in find(text, lower))


def _merged(spans: Iterable[Span]) -> list[Span]:
    """``spans`` sorted, those that overlap or touch made one."""
    merged: list[Span] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _masked(text: str, spans: list[Span], end: int) -> str:
    """``text[:end]`` with ``spans`` masked (a span that crosses ``end`` is masked, then the text stops)."""
    out: list[str] = []
    at = 0
    for start, stop in spans:
        if start >= end:
            break
        out.append(text[at:start])
        out.append(MASK)
        at = stop
        if stop >= end:
            return "".join(out)
    out.append(text[at:end])
    return "".join(out)


def _json_like(text: str) -> bool:
    stripped = text.lstrip()
    return stripped[:1] in ("{", "[", '"') and stripped.rstrip()[-1:] in ("}", "]", '"')


def _redact_json_text(text: str, depth: int) -> str | None:
    """``text`` parsed as JSON and redacted inside, re-serialized if anything changed; None if not JSON."""
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if isinstance(parsed, str):
        inner = _redact_string(parsed, depth + 1, None)
        return text if inner == parsed else json.dumps(inner, ensure_ascii=False)
    if not isinstance(parsed, dict | list):
        return None
    redacted = _redact(parsed, depth + 1, None)
    return text if redacted == parsed else json.dumps(redacted, ensure_ascii=False)


def redact_text(text: str) -> str:
    """``text`` with its secrets masked: JSON text is parsed (``JSON_DEPTH`` levels) and redacted
    inside, anything else goes through the free-text patterns. Costs in proportion to the text:
    :class:`Capture` bounds it."""
    return _redact_string(text, 0, None)


def _redact_string(text: str, depth: int, limit: int | None) -> str:
    if limit is not None and len(text) > limit + MARGIN:
        window = text[: limit + MARGIN]
        return _masked(window, secret_spans(window), limit) + f"…[truncated {len(text) - limit} chars]"
    if depth < JSON_DEPTH and _json_like(text):
        redacted = _redact_json_text(text, depth)
        if redacted is not None:
            return redacted
    return _masked(text, secret_spans(text), len(text))


def redact_value(value: Any, *, limit: int | None = None) -> Any:
    """A copy of a parsed JSON value with secrets masked.

    Values under secret keys (:func:`is_secret_key`) are masked whole; strings go
    through :func:`redact_text` (JSON inside them is parsed and redacted); keys that hold
    a token are masked too. With ``limit``, a string longer than ``limit + MARGIN`` is
    scanned on its first ``limit + MARGIN`` characters and cut to ``limit`` (the
    truncation rule of the module docstring).
    """
    return _redact(value, 0, limit)


def _redact(value: Any, depth: int, limit: int | None) -> Any:
    if isinstance(value, Mapping):
        return {
            (_redact_string(k, JSON_DEPTH, None) if isinstance(k, str) else k): (
                MASK if is_secret_key(str(k)) else _redact(v, depth, limit)
            )
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        if len(value) == 2 and isinstance(value[0], str) and is_secret_key(value[0]) and _scalar(value[1]):
            return [value[0], MASK]  # a pair: [["password", v]], [("token", v)] as JSON
        return [
            _masked_item(v) if i and _is_secret_flag(value[i - 1]) else _redact(v, depth, limit)
            for i, v in enumerate(value)
        ]
    if isinstance(value, str):
        return _redact_string(value, depth, limit)
    if isinstance(value, RawArguments):
        return RawArguments(_redact_string(value.text, depth, limit))
    return value


def _scalar(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | RawArguments)


_FLAG_ITEM = re.compile(r"--?(?P<key>[A-Za-z][\w.\-]*)")


def _otlp_string(item: object) -> str | None:
    """A string item, or the text of an OTLP/JSON ``{"stringValue": ...}`` item (how the store
    keeps an array attribute such as ``process.command_args``)."""
    if isinstance(item, str):
        return item
    if isinstance(item, Mapping) and isinstance(text := item.get("stringValue"), str):
        return text
    return None


def _is_secret_flag(item: object) -> bool:
    """An argv item such as ``--password`` or ``--api-key`` (its next item is the secret)."""
    text = _otlp_string(item)
    match = _FLAG_ITEM.fullmatch(text) if text is not None else None
    return match is not None and is_secret_key(match.group("key"))


def _masked_item(item: Any) -> Any:
    """The argv item after a secret flag, masked (an OTLP ``stringValue`` keeps its shape)."""
    if isinstance(item, str):
        return MASK
    if isinstance(item, Mapping) and isinstance(item.get("stringValue"), str):
        return {**item, "stringValue": MASK}
    return item


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}…[truncated {len(text) - limit} chars]"


_ERROR_TYPE = re.compile(r"[A-Za-z_][\w.]*")


def error_type(message: str) -> str:
    """The exception type that starts an ``"ExcType: message"`` text, else ``"error"`` (never content)."""
    head = message.split(":", 1)[0].strip()
    return head if len(head) <= 120 and _ERROR_TYPE.fullmatch(head) and ":" in message else "error"


# -- other frameworks' spans -------------------------------------------------------------------------

_HINTS = (
    # URLs, JSON escapes that could hide any rule's text (a quote, a slash, any letter), Azure keys'
    # padding, commands (``-u\`` a JSON tab after ``-u``), PEM blocks
    "://", "\\u", "\\/", '\\"', "==", "mysql", "mariadb", "sshpass", "-u ", "-u\t", "-u\\", "--user", "-----begin",
    # provider tokens, by their prefix (lower-cased)
    "sk-", "rk_", "sk_", "pk_", "whsec_", "akia", "asia", "abia", "acca", "eyj", "ghp_", "gho_", "ghu_", "ghs_",
    "ghr_", "github_pat_", "glpat-", "xox", "aiza", "ya29.", "hf_", "npm_", "pypi-", "sg.", "sq0", "shp",
    "dop_v1_", "dapi",
)  # fmt: skip
_HEX32 = re.compile(r"[0-9a-fA-F]{32}")  # Twilio and Mailchimp keys
_KEY_REST = r"[^ \t\n\r:=\"\x27\\,]*"  # the rest of a key: no character a key can hold ends it
_BLANK = r"(?:[ \t]|\\+t)"  # a space or a tab, or a tab written as a JSON escape
_DOTTED_I = "\u0131\u0130"  # the dotless and the dotted i
_I = f"[i{_DOTTED_I}]"
_KEY_WORD = "(?:" + _PAIR_HINT_WORDS.replace("i", _I) + ")"
"""A secret-key word, its ``i`` also the dotted and the dotless one: Python's case-insensitive scan
folds them to ``i`` (and a class of letters holds them), RE2's does not (the SQL prefilter must
let through all Python's does)."""
_KEY_CONTEXTS = (
    rf"{_KEY_WORD}{_KEY_REST}\\*[\"\x27]?{_BLANK}*[:=]",
    rf"(?:{_PROSE_KEYS.replace('i', _I)}){_BLANK}+(?:{_I}s|was)",
    rf"[\[(]{_BLANK}*\\*[\"\x27]{_KEY_REST}{_KEY_WORD}{_KEY_REST}\\*[\"\x27]{_BLANK}*,",
    rf"\"[^\"]*{_KEY_WORD}[^\"]*\"[ \t\n\r]*:",
    rf"\[[ \t\n\r]*\"[^\"]*{_KEY_WORD}[^\"]*\"[ \t\n\r]*,",
    rf"-{_KEY_REST}{_KEY_WORD}",
    rf"(?:{'|'.join(_SCHEME_WORDS).replace('i', _I)}){_BLANK}+[A-Za-z0-9._~+/=\-{_DOTTED_I}]{{8}}",
)
"""Where a secret-key word (or an auth scheme) stands as every rule that reads one needs it to,
in the raw text (a JSON text's escapes not yet read; a text with an escaped quote passes as a
whole): in a key followed by ``:``, ``=`` or ``=>`` (pairs); a word of the prose rule followed by
``is`` or ``was``; in the quoted first item of a list before a ``,`` (pair lists, in JSON any
text); in a JSON key (any text) before its ``:``; in a flag (``--db-password``); an auth scheme
before 8 characters of its value. ``passed is`` in prose and a word in a quoted value
(``"status": "passed"``) are none of them. RE2 and Python alike."""
_KEY_CONTEXT = re.compile("(?i)" + "|".join(_KEY_CONTEXTS))
_KEY_CONTEXT_LOWER = re.compile("|".join(_KEY_CONTEXTS))
""":data:`_KEY_CONTEXT` over the lower-cased text of an ASCII text (the same answer, faster)."""
_CONTEXT_WORDS = tuple(dict.fromkeys((*_PAIR_HINT_WORDS.split("|"), *_SCHEME_WORDS)))
"""Words one of :data:`_KEY_CONTEXTS` needs (the scan runs only on a text that holds one)."""


def _re2_literal(text: str) -> str:
    return "".join("\\t" if c == "\t" else f"\\{c}" if c in "\\.+*?()|[]{}^$" else c for c in text)


PREFILTER_PATTERN = (
    "(?i)" + "|".join(_re2_literal(hint) for hint in _HINTS) + "|[0-9a-f]{32}|" + "|".join(_KEY_CONTEXTS)
)
""":func:`may_hold_secret` for a SQL engine (RE2 syntax, DuckDB's ``regexp_matches``): a text of 8
characters or more may hold a secret when it matches this, or holds a mixed-case word of
:data:`BASE64_WORD_PATTERN`."""
BASE64_WORD_PATTERN = "[A-Za-z0-9+/_-]{11,}"


def may_hold_secret(text: str) -> bool:
    """False only for a text that :func:`redact_text` leaves as it is: a cheap prefilter
    (substring tests on the lower-cased text, a few regex scans). True when the text has 8
    characters or more and holds a word that starts a rule here (a scheme, ``://``, a JSON
    escape, a command, a provider token's prefix, 32 hex digits), a secret-key word where a rule
    reads one (:data:`_KEY_CONTEXTS`: ``passed`` in prose is not) or a mixed-case base64 word of 11
    characters or more that decodes to text (a ``CamelCaseName`` does not);
    ``tests/test_redaction.py`` checks the claim."""
    if len(text) < 8:
        return False
    lower = text.lower()
    for hint in _HINTS:
        if hint in lower:
            return True
    if _HEX32.search(text) is not None:
        return True
    if any(word in lower for word in _CONTEXT_WORDS):
        found = _KEY_CONTEXT_LOWER.search(lower) if text.isascii() else _KEY_CONTEXT.search(text)
        if found is not None:
            return True
    return any(_may_decode(text, match) for match in _BASE64.finditer(text))


def _may_decode(text: str, match: re.Match[str]) -> bool:
    """A base64 word that :func:`_base64_spans` reads: mixed case, decoding to text. After a
    backslash its first letter may end a JSON escape (``\\nQWxh...`` is a line break, then the
    word), so the word without it counts too."""
    word = match.group()
    if _mixed_case(word) and _base64_text(word) is not None:
        return True
    return (
        text[match.start() - 1 : match.start()] == "\\" and _mixed_case(word[1:]) and _base64_text(word[1:]) is not None
    )


_GENERIC_LEAVES = frozenset({"value", "values", "text", "content", "raw", "data", "string", "str"})
_OWN_PREFIX = "treellm."
_OWN_FILE_PREFIX = "treellm.trajectory."  # fields read from a trajectory file: its content, not ours
_OWN_CONTENT_KEYS = frozenset({
    "treellm.run.task", "treellm.run.answer", "treellm.think.text", "treellm.loop.arguments", "treellm.retry.error",
})  # fmt: skip


def is_secret_attribute(key: str) -> bool:
    """True when the value of an OpenTelemetry attribute named ``key`` is taken for a secret.

    Its last dotted segment (array indices skipped) is a secret key (:func:`is_secret_key`):
    ``http.request.header.authorization``, ``http.request.header.x-api-key``, ``db.password``;
    or it is a generic leaf (``value``, ``text``, ``content``...) under a secret key
    (``api_key.value``). A namespace is not enough: ``llm.token_count.prompt`` and
    ``session.id`` are not secrets, and treellm's own names never are (``treellm.tool.signature``).
    """
    if key.startswith(_OWN_PREFIX) and not key.startswith(_OWN_FILE_PREFIX):
        return False
    segments = [segment for segment in key.split(".") if segment and not segment.isdigit()]
    if not segments:
        return False
    if is_secret_key(segments[-1]):
        return True
    return len(segments) > 1 and segments[-1].lower() in _GENERIC_LEAVES and is_secret_key(segments[-2])


_STRUCTURAL_KEYS = frozenset({
    conv.OPERATION, conv.OPENINFERENCE_KIND, conv.TRACELOOP_KIND, conv.TRACELOOP_NAME, conv.LOGFIRE_SPAN_TYPE,
    "llm.request.type", *conv.TOOL_NAME_KEYS, *conv.CALL_ID_KEYS, *conv.MODEL_KEYS, *conv.AGENT_NAME_KEYS,
    *conv.INPUT_TOKEN_KEYS, *conv.OUTPUT_TOKEN_KEYS, "gen_ai.system", "gen_ai.provider.name", "gen_ai.tool.type",
    "gen_ai.response.finish_reasons", "gen_ai.response.id", "gen_ai.conversation.id", "llm.provider", "llm.system",
    "input.mime_type", "output.mime_type", "session.id", "exception.type", "exception.escaped",
})  # fmt: skip
"""Attributes that say what a span is, not what it carried: kept (redacted) under ``capture="none"``."""
_LITERAL = re.compile(r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?|true|false|True|False")
_HASH_MARK = re.compile(r"\[hash [0-9a-f]{16}\]")

ValueRule = Literal["mask", "redact", "hash"]
"""What is stored of an attribute's value: ``[REDACTED]`` (a secret key), its redacted text,
or (``capture="none"``) :func:`content_hash` of its redacted text."""


def content_hash(text: str) -> str:
    """``[hash <16 hex digits>]``: what ``capture="none"`` stores for a content value (blake2b,
    64 bits, of the *redacted* text, so no hash of a secret is ever stored)."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
    return f"[hash {digest}]"


Rewrite = Literal["text", "hash", "status"]
"""What :meth:`ForeignCapture.rewrite` does to a value: redact it, hash its redaction (or keep a
literal or a hash), or keep a status message's exception type."""


class ForeignCapture:
    """What the store keeps of other frameworks' spans under one capture mode: the redaction
    of treellm's own spans, applied to the values stored instead of the values captured.

    - ``full``: everything as received (:attr:`active` is False: nothing to do).
    - ``redacted``: values under secret attribute keys (:func:`is_secret_attribute`) become
      ``[REDACTED]``; every other value, status message, span name and derived argument or
      result text goes through :func:`redact_text`. Nothing is cut: a value keeps its length
      but for what is masked.
    - ``none``: as ``redacted``, then content (every attribute but the structural ones, numbers
      and booleans; derived arguments and results) is stored as :func:`content_hash`, a status
      message as its exception type (:func:`error_type`); resource attributes and span names
      are redacted, not hashed.

    A text is redacted once while it is remembered (:data:`TEXTS_KEPT_CHARS`; :func:`may_hold_secret`
    skips the rest), each key's rule decided once. Pure but for those memos; one instance per
    ingest transaction.
    """

    TEXTS_KEPT_CHARS = 8 * 1024 * 1024
    """The characters of the texts remembered at once, past which the memo starts again: a file's
    results are mostly each different, and a memo of all of them outgrew the ingest's memory limit
    (a 1 GB file of them peaked at 1.22 GB RSS; BENCHMARKS.md, "Ingest memory")."""

    def __init__(self, mode: CaptureMode) -> None:
        self.mode = mode
        self._texts: dict[str, str] = {}
        self._texts_chars = 0
        self._rules: dict[str, ValueRule] = {}

    @property
    def active(self) -> bool:
        return self.mode != "full"

    def rule(self, key: str, *, resource: bool = False) -> ValueRule:
        """The rule for the values of attribute ``key`` (a resource attribute is never hashed)."""
        found = self._rules.get(key)
        if found is None:
            if is_secret_attribute(key):
                found = "mask"
            elif self.mode == "none" and not _structural(key):
                found = "hash"
            else:
                found = "redact"
            self._rules[key] = found
        return "redact" if resource and found == "hash" else found

    def text(self, value: str) -> str:
        """``value`` redacted (``full``: as it is)."""
        if self.mode == "full" or not may_hold_secret(value):
            return value
        found = self._texts.get(value)
        if found is None:
            found = redact_text(value)
            if self._texts_chars + len(value) > self.TEXTS_KEPT_CHARS:
                self._texts.clear()
                self._texts_chars = 0
            self._texts[value] = found
            self._texts_chars += len(value)
        return found

    def value(self, value: str, rule: ValueRule) -> str:
        """What is stored of ``value`` under ``rule`` (a hash stays as it is)."""
        if rule == "mask":
            return MASK
        if rule == "hash" and not (_LITERAL.fullmatch(value) or _HASH_MARK.fullmatch(value)):
            return content_hash(self.text(value))
        return self.text(value)

    def status(self, message: str) -> str:
        """A status message: redacted, or its exception type under ``none``."""
        return error_type(message) if self.mode == "none" else self.text(message)

    def rewrite_of(self, kind: Literal["text", "content", "status"]) -> Rewrite:
        """How a value of ``kind`` is rewritten, as one of :meth:`rewrite`'s: a text (a span name) is
        redacted (``text``, which leaves every value that :func:`may_hold_secret` skips as it is); so
        is content (a derived argument or result) and a status message, but under ``none`` content
        is hashed (``hash``) and a status message keeps its exception type (``status``)."""
        if kind == "text" or self.mode != "none":
            return "text"
        return "hash" if kind == "content" else "status"

    def rewrite(self, how: Rewrite, value: str) -> str:
        """``value`` rewritten ``how`` (:meth:`rewrite_of`; a value under a key whose rule is
        ``redact`` or ``hash`` is rewritten so too): one call per distinct (how, value)."""
        if how == "status":
            return self.status(value)
        return self.value(value, "hash") if how == "hash" else self.text(value)


def _structural(key: str) -> bool:
    if key.startswith(_OWN_PREFIX):
        return key not in _OWN_CONTENT_KEYS and not key.startswith(_OWN_FILE_PREFIX)
    return key in _STRUCTURAL_KEYS


@dataclass(frozen=True, slots=True)
class Capture:
    """How much content telemetry records (see the module docstring).

    Pure and thread-safe; the observer calls it on its worker thread, off the event loop.
    """

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
        if isinstance(value, RawArguments):
            return self.text(value.text)
        if self.mode == "redacted":
            value = redact_value(value, limit=self.max_length)
        return _truncate(canonical_json(value), self.max_length)

    def text(self, text: str | None) -> str | None:
        """A result, answer, task or think text as captured, or None when capture is off."""
        if self.mode == "none" or text is None:
            return None
        if self.mode == "full":
            return _truncate(text, self.max_length)
        redacted = _redact_string(text, 0, self.max_length)
        return redacted if len(text) > self.max_length + MARGIN else _truncate(redacted, self.max_length)

    def message(self, text: str, *, default: str) -> str:
        """A status or error message as captured; ``default`` (a type, never content) when capture is off."""
        return default if self.mode == "none" else self.text(text) or default


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
