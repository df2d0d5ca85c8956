"""URLs in messages: the one place that masks their secrets, and the checks of the URLs treellm dials.

Every URL that reaches an error, a log line, ``/health`` or the dashboard goes through
:func:`display_url` (a value known to be a URL) or :func:`mask_urls` (free text that may hold
URLs: a driver's message, an echoed option value); :func:`scrub` also removes a known URL's
password wherever a message repeats it on its own, plain or percent-decoded.

Hard rules: every function here is pure and never fails. The masking never parses (a
malformed URL is exactly the one a parser misreads: ``http://u:PW#x@host:1``, where ``#``
starts a fragment, or ``u:PW@host:1`` with no scheme); it reads the user and password as
everything between ``scheme://`` (or the start) and the *last* ``@``, so when in doubt it
masks more (the host of ``http://h:1/?mail=a@b`` is lost), never less. A password holding
whitespace is masked by :func:`display_url` but not found in free text (:func:`mask_urls`
splits on whitespace). :func:`url_problem` and :func:`host_problem` say what keeps a value
from being a URL or a host that a client reads as written, for a :class:`ConfigError` that
names the option; they show no value, so a caller shows it through :func:`display_url`.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Final
from urllib.parse import unquote, urlsplit

__all__ = ["display_url", "host_problem", "mask_urls", "scrub", "shown", "url_problem"]

# ``scheme://`` (or nothing), then the user and password: everything up to the *last* ``@``.
_USERINFO: Final = re.compile(r"^(?P<head>(?:[A-Za-z][A-Za-z0-9+.\-]*://)?)(?P<userinfo>.*)@", re.S)
# The user ends at its first ``:`` (or a percent-encoded one); the rest is the password.
_USER_END: Final = re.compile(r":|%3[Aa]")
_SECRET_PARAMETER: Final = re.compile(
    r"(?i)([?&;](?:password|passwd|pwd|secret|token|access_token|api_key|apikey|key)=)[^&#;\s]*"
)
_WORD: Final = re.compile(r"(?P<open>[\"'(\[<{]*)(?P<word>\S+)")
_MASK: Final = "***"


def _split(url: str) -> tuple[str, str, str, str] | None:
    """(head, user, password, rest after the last ``@``), or None when ``url`` holds no password."""
    found = _USERINFO.match(url)
    if found is None:
        return None
    userinfo = found["userinfo"]
    end = _USER_END.search(userinfo)
    if end is None:
        return None  # a user alone (``http://default@host``): nothing secret to mask
    return found["head"], userinfo[: end.start()], userinfo[end.end() :], url[found.end() :]


def display_url(url: str) -> str:
    """``url`` with its password (and any password-like query parameter) masked, for messages
    and logs, whatever the URL's shape: ``http://u:***@host:8123/db``."""
    parts = _split(url)
    masked = url if parts is None else f"{parts[0]}{parts[1]}:{_MASK}@{parts[3]}"
    return _SECRET_PARAMETER.sub(rf"\1{_MASK}", masked)


def mask_urls(text: str) -> str:
    """``text`` with every password of the URLs it holds masked (each whitespace-separated
    word goes through :func:`display_url`; a quote or bracket around a URL is kept)."""
    if "@" not in text and "=" not in text:
        return text
    return _WORD.sub(lambda found: found["open"] + display_url(found["word"]), text)


def scrub(text: str, url: str) -> str:
    """``text`` (a driver's message about ``url``) with ``url`` masked and its password
    replaced by ``***`` wherever it appears on its own, plain or percent-decoded."""
    text = text.replace(url, display_url(url))
    parts = _split(url)
    for secret in {parts[2], unquote(parts[2])} if parts else set():
        if secret:
            text = text.replace(secret, _MASK)
    return mask_urls(text)


def shown(value: str, limit: int = 120) -> str:
    """``value`` as a message quotes it: masked (:func:`mask_urls`), cut to ``limit`` characters, repr'd."""
    masked = mask_urls(value)
    return repr(masked if len(masked) <= limit else masked[:limit] + "...")


_CONTROL: Final = re.compile(r"[\x00-\x20\x7f]")
_LABEL: Final = r"[A-Za-z0-9_](?:[A-Za-z0-9_\-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME: Final = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*\.?$")


def url_problem(url: str, schemes: tuple[str, ...] = ("http", "https")) -> str | None:
    """What keeps ``url`` from being an absolute URL (one of ``schemes``) that a client reads as
    written, as ``expected ...`` text without the URL; None when it is one."""
    names = " or ".join(f"{scheme}://" for scheme in schemes)
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in schemes:
        return f"expected a URL starting with {names}"
    if _CONTROL.search(url):
        return "expected a URL without spaces or control characters"
    if any(c in rest.rpartition("@")[0] for c in "/?#"):
        return "expected a URL whose user and password percent-encode '/', '?' and '#' (%2F, %3F, %23)"
    try:
        parts = urlsplit(url)
    except ValueError:
        return "expected a URL whose host is a name or an address ([::1] for IPv6)"
    try:
        parts.port  # noqa: B018  # parses the port: ValueError when it is no number in 0-65535
    except ValueError:
        return "expected a URL whose port is a number 0-65535"
    if not parts.hostname:
        return "expected a URL with a host"
    return None


def host_problem(host: str) -> str | None:
    """What keeps ``host`` from being a host name or an IP address to listen on or dial, as
    ``expected ...`` text without the host; None when it is one."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        if len(host) > 253 or _HOSTNAME.match(host) is None:
            return "expected a host name or an IP address such as 127.0.0.1, ::1 or localhost"
    return None
