"""One function masks every URL that reaches a message, whatever the URL's shape, and every place uses it."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from treellm.cli import main
from treellm.errors import ConfigError
from treellm.urls import display_url, host_problem, mask_urls, scrub, shown, url_problem

PASSWORD = "S3cretPW"

# (url, what a message shows): malformed ones included, each as a parser would misread it.
SHAPES = [
    ("http://treellm:S3cretPW@ch.internal:8123/otel", "http://treellm:***@ch.internal:8123/otel"),
    ("http://u:S3cretPW#x@127.0.0.1:1", "http://u:***@127.0.0.1:1"),  # '#' would start a fragment
    ("u:S3cretPW@127.0.0.1:1", "u:***@127.0.0.1:1"),  # no scheme
    ("127.0.0.1:1", "127.0.0.1:1"),
    ("clickhouse://u:p%40S3cretPW@h", "clickhouse://u:***@h"),  # percent-encoded '@'
    ("http://u:p@S3cretPW:w@rd@h:1/db", "http://u:***@h:1/db"),  # several '@': the last one ends it
    ("http://u@x:S3cretPW@h", "http://u@x:***@h"),
    ("http://:S3cretPW@host", "http://:***@host"),
    ("http://u%3AS3cretPW@h", "http://u:***@h"),  # a percent-encoded ':' between user and password
    ("http://u:S3cretPW@[::1]:8123/db", "http://u:***@[::1]:8123/db"),  # IPv6
    ("http://u:S3cretPW@[::1", "http://u:***@[::1"),  # IPv6 unclosed
    ("http://u:S3cret PW@h", "http://u:***@h"),  # whitespace in the password
    ("http:/u:S3cretPW@h:1", "http:***@h:1"),  # a path-normalised URL: more is masked, never less
    ("https://host:8123/db?user=me&password=S3cretPW", "https://host:8123/db?user=me&password=***"),
    ("https://host/v1?token=S3cretPW&x=1", "https://host/v1?token=***&x=1"),
    ("http://default@host:8123", "http://default@host:8123"),  # a user alone is shown
    ("http://localhost:notaport", "http://localhost:notaport"),
    ("chdb:./traces", "chdb:./traces"),
    ("", ""),
]


@pytest.mark.parametrize(("url", "expected"), SHAPES)
def test_display_url_masks_the_password_whatever_the_shape(url: str, expected: str) -> None:
    assert display_url(url) == expected
    assert PASSWORD not in display_url(url) and "S3cret" not in display_url(url)


@given(
    scheme=st.sampled_from(["", "http://", "https://", "clickhouse://", "ftp://"]),
    user=st.text(alphabet="abcdefgh0123-_.~", max_size=8),
    secret=st.text(max_size=24),
    host=st.sampled_from(["h", "127.0.0.1:1", "[::1]:8123", "ch.internal:8123/otel?x=1", ""]),
)
def test_no_password_survives_display_url(scheme: str, user: str, secret: str, host: str) -> None:
    password = "SECRET" + secret
    assert "SECRET" not in display_url(f"{scheme}{user}:{password}@{host}")


def test_free_text_is_masked_word_by_word_quotes_and_brackets_kept() -> None:
    text = "got 'http://u:S3cretPW@h:1', (u:S3cretPW@h) and [\"https://x/?api_key=S3cretPW&y=1\"]\nthen http://a:S3cretPW#x@b"
    masked = mask_urls(text)
    assert PASSWORD not in masked
    assert masked == ("got 'http://u:***@h:1', (u:***@h) and [\"https://x/?api_key=***&y=1\"]\nthen http://a:***@b")
    plain = "no url here: git@github.com:org/repo and 12:30"
    assert mask_urls(plain) == plain


def test_a_drivers_message_loses_the_password_plain_or_percent_decoded() -> None:
    url = "http://u:P%40ss%23w0rd@h:1/db"
    text = f"cannot reach {url}: user u, password P@ss#w0rd or P%40ss%23w0rd refused"
    assert scrub(text, url) == "cannot reach http://u:***@h:1/db: user u, password *** or *** refused"


def test_shown_quotes_a_value_masked_and_cut() -> None:
    assert shown("http://u:S3cretPW@h") == "'http://u:***@h'"
    assert shown("x" * 5000) == repr("x" * 120 + "...")


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://localhost:8123", None),
        ("https://u:p%23w@[::1]:4318/v1", None),
        ("u:S3cretPW@127.0.0.1:1", "starting with http://"),
        ("http://u:S3cretPW#x@127.0.0.1:1", "percent-encode"),
        ("http://u:S3cretPW@127.0.0.1:notaport", "port"),
        ("http://u:S3cretPW@[::1", "host"),
        ("http://", "host"),
        ("http://h\x00/", "control"),
        ("http://h /", "spaces"),
    ],
)
def test_url_problem_says_what_a_client_would_misread(url: str, problem: str | None) -> None:
    found = url_problem(url)
    assert (found is None) if problem is None else (found is not None and problem in found), found


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "[::1]", "localhost", "0.0.0.0", "fe80::1%eth0", "ch.internal."])
def test_a_host_name_or_address_is_a_host(host: str) -> None:
    assert host_problem(host) is None


@pytest.mark.parametrize(
    "host", ["", "x;y", "../../etc/passwd", "http://u:S3cretPW@h", "127.0.0.1:1", "x" * 300, "\x00"]
)
def test_anything_else_is_not_a_host(host: str) -> None:
    assert host_problem(host) is not None


# -- each place that shows a URL uses it ------------------------------------------------------------------


def test_the_clickhouse_store_re_exports_the_one_function() -> None:
    from treellm.store import clickhouse

    assert clickhouse.display_url is display_url


def test_the_dashboard_describes_its_clickhouse_source_masked() -> None:
    pytest.importorskip("streamlit")
    from dashboard.data import Source, describe_source

    for url, expected in SHAPES:
        described = describe_source(Source("clickhouse", (url,), "otel_traces"))
        assert described == f"ClickHouse: {expected} (otel_traces)"


@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"])
def test_an_otlp_endpoint_the_sdk_would_misread_is_refused_masked(
    variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unchecked, the SDK's exporter logged ``'u:S3cretPW' is not a valid host`` at every export."""
    from treellm.setup import configure

    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError) as caught:
        configure(otlp="http://u:S3cretPW#x@127.0.0.1:1")
    assert str(caught.value).startswith("otlp: expected a URL whose user and password percent-encode")
    assert "http://u:***@127.0.0.1:1" in str(caught.value) and PASSWORD not in str(caught.value)
    monkeypatch.setenv(variable, "u:S3cretPW@127.0.0.1:1")
    with pytest.raises(ConfigError) as caught:
        configure()
    assert str(caught.value).startswith(f"{variable}: expected a URL starting with http://")
    assert PASSWORD not in str(caught.value)


def test_the_collectors_messages_mask_it() -> None:
    pytest.importorskip("uvicorn")
    from treellm.collector import CollectorConfig
    from treellm.collector.config import parse_size
    from treellm.collector.server import token_from_env

    for refused in (
        lambda: CollectorConfig(host="http://u:S3cretPW@127.0.0.1"),
        lambda: parse_size("http://u:S3cretPW@h", setting="--max-body"),
        lambda: token_from_env("http://u:S3cretPW@h"),
    ):
        with pytest.raises(ConfigError) as caught:
            refused()
        assert PASSWORD not in str(caught.value) and "***" in str(caught.value), caught.value


@pytest.mark.parametrize(
    "argv",
    [
        ["gc", "--older-than", "http://u:S3cretPW@h:1"],  # an error echoing the value
        ["report", "--format", "http://u:S3cretPW#x@h:1"],  # argparse's usage error echoing it
        ["report", "--db", "http://u:S3cretPW@h:1"],  # a store path that is a URL
        ["report", "--clickhouse", "u:S3cretPW@127.0.0.1:1"],  # no scheme
        ["report", "--clickhouse", "http://u:S3cretPW#x@127.0.0.1:1"],  # a URL the driver would misread
        ["run", "--base-url", "http://u:S3cretPW#x@127.0.0.1:1", "--model", "m", "task"],
        ["dashboard", "--host", "http://u:S3cretPW@127.0.0.1"],
    ],
)
def test_the_command_line_never_echoes_a_password(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TREELLM_CLICKHOUSE", raising=False)
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code  # type: ignore[assignment]
    out, err = capsys.readouterr()
    assert code in (1, 2), err
    assert "***" in err and PASSWORD not in err + out and "Traceback" not in err, err
