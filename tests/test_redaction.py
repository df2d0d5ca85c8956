"""Content capture: no planted secret reaches a span, and ``capture="none"`` records no content.

The corpus (tests/data/secrets_corpus.json, synthetic values) is planted in a real
TreeExecutor run on a ScriptedModel, through the real OpenTelemetry SDK into memory:
in arguments (flat, nested, camelCase and compound keys, JSON inside strings, malformed
raw text, pair lists, base64 of JSON and of ``user:password``), results (free text, JSON,
straddling the truncation cut, 200 KB long), tool exceptions (retried, so ``tool:retry``
events carry them, then the status), the task, the model's text, the final answer and a
model error. Its ``foreign_*`` entries are planted in other frameworks' spans by
tests/test_foreign_redaction.py; the prefilter and the rules for those spans are pinned here.
"""

from __future__ import annotations

import base64
import json
import random
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import flagged_by_sql, real_trajectory_texts
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from treellm import LoopGuard, ModelRequest, ModelTurn, ScriptedModel, Tool, ToolCall, TreeConfig, TreeExecutor
from treellm.derive.transform import may_hold_secret_sql
from treellm.errors import ModelError
from treellm.telemetry import Capture, TelemetryObserver, redaction
from treellm.telemetry import semconv as sc
from treellm.telemetry.redaction import (
    BASE64_WORD_PATTERN,
    MARGIN,
    MASK,
    PREFILTER_PATTERN,
    ForeignCapture,
    content_hash,
    error_type,
    is_secret_attribute,
    is_secret_key,
    key_parts,
    may_hold_secret,
    redact_text,
    redact_value,
)

CORPUS = json.loads((Path(__file__).parent / "data" / "secrets_corpus.json").read_text(encoding="utf-8"))
OWN_KINDS = frozenset({"arguments", "raw_arguments", "result", "tool_error", "task", "think", "answer", "model_error"})
ALL_ENTRIES: list[dict[str, Any]] = CORPUS["entries"]
ENTRIES = [e for e in ALL_ENTRIES if e["kind"] in OWN_KINDS]  # the ones planted in treellm's own spans


def expand(text: str) -> str:
    return re.sub(r"<PAD:(.):(\d+)>", lambda m: m.group(1) * int(m.group(2)), text)


def of_kind(*kinds: str) -> list[dict[str, Any]]:
    return [e for e in ENTRIES if e["kind"] in kinds]


def marker(entry: dict[str, Any]) -> str:
    return f"MK{entry['id']}note"


def forbidden(entry: dict[str, Any]) -> list[str]:
    """The texts of an entry that must never appear: the secret and the pieces of a split one."""
    return [entry["secret"], *entry.get("fragments", [])]


class Pipeline:
    """A real SDK pipeline into memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])

    @property
    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())


@pytest.fixture
def pipeline(monkeypatch: pytest.MonkeyPatch) -> Iterator[Pipeline]:
    monkeypatch.delenv("TREELLM_CAPTURE", raising=False)
    monkeypatch.delenv("TREELLM_CAPTURE_MAX_LENGTH", raising=False)
    monkeypatch.setattr(redaction, "_default", None)  # no configure() from another test
    p = Pipeline()
    yield p
    p.tracer_provider.shutdown()
    p.meter_provider.shutdown()


async def no_sleep(_: float) -> None:
    return None


def planted_responder(request: ModelRequest) -> ModelTurn:
    if request.purpose == "collapse":
        return ModelTurn(text="dense summary")
    args = of_kind("arguments")
    if request.depth == 0:
        calls = [ToolCall("probe", {"id": e["id"], **e["arguments"]}) for e in args]
        calls += [ToolCall("probe", e["text"]) for e in of_kind("raw_arguments")]
        calls += [ToolCall("fetch", {"id": e["id"]}) for e in of_kind("result")]
        calls += [ToolCall("explode", {"id": e["id"]}) for e in of_kind("tool_error")]
        return ModelTurn(text="\n".join(e["text"] for e in of_kind("think")), tool_calls=calls)
    if request.depth == 1:  # the same calls again: caught, so loop:detected events carry their arguments
        calls = [ToolCall("probe", {"id": e["id"], **e["arguments"]}) for e in args]
        return ModelTurn(tool_calls=[*calls, ToolCall("fetch", {"id": "none"})])
    answer = "\n".join(e["text"] for e in of_kind("answer"))
    return ModelTurn(tool_calls=[ToolCall("task_complete", {"result": answer})])


def model_error_responder(request: ModelRequest) -> ModelTurn:
    raise ModelError("\n".join(e["text"] for e in of_kind("model_error")))  # data: the ThinkNode's status


def crashing_responder(request: ModelRequest) -> ModelTurn:
    raise RuntimeError("\n".join(e["text"] for e in of_kind("model_error")))  # propagates: the run's status


def planted_tools() -> list[Tool]:
    texts = {e["id"]: expand(e["text"]) for e in ENTRIES if "text" in e}

    async def probe(args: dict[str, Any]) -> str:
        return f"probed {args.get('id')}"

    async def fetch(args: dict[str, Any]) -> str:
        return texts.get(str(args["id"]), "nothing")

    async def explode(args: dict[str, Any]) -> str:
        raise RuntimeError(texts[str(args["id"])])

    return [Tool("probe", "p", handler=probe), Tool("fetch", "f", handler=fetch), Tool("explode", "e", handler=explode)]


def planted_runs(pipeline: Pipeline, capture: Capture | None) -> list[ReadableSpan]:
    """The corpus run, then a run whose model fails and one whose model crashes.

    With the executor's own telemetry (the default capture) when ``capture`` is None.
    """
    config = TreeConfig(node_budget=10_000, collapse_threshold=10**9)
    task = "\n".join(e["text"] for e in of_kind("task"))
    for responder in (planted_responder, model_error_responder, crashing_responder):
        model = ScriptedModel(responder)
        if capture is None:  # the default: what TreeExecutor attaches by itself
            ex = TreeExecutor(
                model,
                planted_tools(),
                config,
                tracer_provider=pipeline.tracer_provider,
                meter_provider=pipeline.meter_provider,
                sleep=no_sleep,
            )
        else:
            observer = TelemetryObserver(pipeline.tracer_provider, pipeline.meter_provider, capture=capture)
            ex = TreeExecutor(model, planted_tools(), config, telemetry=False, observers=[observer], sleep=no_sleep)
        if responder is crashing_responder:
            with pytest.raises(RuntimeError, match="MKme01note"):
                ex.run(task)
        else:
            ex.run(task)
    return pipeline.spans


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from strings(item)


def recorded_texts(spans: list[ReadableSpan]) -> list[tuple[str, str]]:
    """Every string a span carries, with where it is: name, attributes, events, links, status."""
    out: list[tuple[str, str]] = []
    for span in spans:
        out.append((f"{span.name}: name", span.name))
        for key, value in (span.attributes or {}).items():
            out += [(f"{span.name}: {key}", s) for s in strings(value)]
        for event in span.events:
            out.append((f"{span.name}: event name", event.name))
            for key, value in (event.attributes or {}).items():
                out += [(f"{span.name}: {event.name}.{key}", s) for s in strings(value)]
        for link in span.links:
            for key, value in (link.attributes or {}).items():
                out += [(f"{span.name}: link.{key}", s) for s in strings(value)]
        if span.status.description:
            out.append((f"{span.name}: status", span.status.description))
    return out


def leaks(texts: list[tuple[str, str]], needles: dict[str, list[str]]) -> list[str]:
    return [
        f"{entry_id} in {where}"
        for entry_id, pieces in needles.items()
        for where, text in texts
        if any(piece in text for piece in pieces)
    ]


def test_the_corpus_is_big_and_covers_every_place() -> None:
    assert len(ENTRIES) >= 140 and len(ALL_ENTRIES) - len(ENTRIES) >= 18
    ids, secrets = {e["id"] for e in ALL_ENTRIES}, {e["secret"] for e in ALL_ENTRIES}
    assert len(ids) == len(ALL_ENTRIES) and len(secrets) == len(ALL_ENTRIES)
    kinds = {e["kind"] for e in ALL_ENTRIES}
    assert kinds == OWN_KINDS | {"foreign_attribute", "foreign_text"}
    labels = " ".join(e["label"] for e in ENTRIES)
    for place in ("camelCase", "compound", "double-encoded", "PEM", "URL", "Bearer", "Basic", "mysql", "Stripe"):
        assert place in labels, place
    assert sum("pair list" in e["label"] for e in ENTRIES) >= 6 and sum("base64" in e["label"] for e in ENTRIES) >= 10
    assert any("AccountKey" in e.get("text", "") for e in ENTRIES) and any("hf_" in e["secret"] for e in ENTRIES)
    assert sum(1 for e in ENTRIES if e.get("fragments")) >= 6  # split across lines


def test_no_planted_secret_reaches_a_span_with_the_default_capture(pipeline: Pipeline) -> None:
    spans = planted_runs(pipeline, None)
    texts = recorded_texts(spans)
    assert leaks(texts, {e["id"]: forbidden(e) for e in ENTRIES}) == []

    # the run went everywhere the corpus says
    events = [e for s in spans for e in s.events]
    assert sum(1 for e in events if e.name == sc.EVENT_TOOL_RETRY) == 2 * len(of_kind("tool_error"))
    assert sum(1 for e in events if e.name == sc.EVENT_LOOP_DETECTED) == len(of_kind("arguments"))
    failed_tools = [s for s in spans if s.name == "execute_tool explode" and s.status.description]
    assert len(failed_tools) == len(of_kind("tool_error"))
    model_error = marker(of_kind("model_error")[0])
    model_errors = [s for s in spans if s.status.description and model_error in s.status.description]
    assert {s.name for s in model_errors} == {"chat scripted", "invoke_agent agent"}
    # ... and redaction masks, it does not drop: the content around every secret is still there
    everything = "\n".join(text for _, text in texts)
    assert [e["id"] for e in ENTRIES if marker(e) not in everything] == []
    assert MASK in everything


def test_capture_none_records_no_content_at_all(pipeline: Pipeline) -> None:
    spans = planted_runs(pipeline, Capture("none"))
    texts = recorded_texts(spans)
    needles = {e["id"]: [*forbidden(e), marker(e)] for e in ENTRIES}
    assert leaks(texts, needles) == []
    everything = "\n".join(text for _, text in texts)
    for content in ("probed", "explode failed", "dense summary", "provider said"):
        assert content not in everything
    retries = [dict(e.attributes or {}) for s in spans for e in s.events if e.name == sc.EVENT_TOOL_RETRY]
    assert retries and {r[sc.RETRY_ERROR] for r in retries} == {"RuntimeError"}  # the exception type only
    statuses = {s.status.description for s in spans if s.status.description}
    assert statuses == {"tool error", "model error", "RuntimeError"}
    tool = next(s for s in spans if s.name == "execute_tool fetch")
    assert sc.TOOL_RESULT_HASH in (tool.attributes or {}) and sc.TOOL_SIGNATURE in (tool.attributes or {})


# -- keys ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "parts"),
    [
        ("openaiApiKey", ("openai", "api", "key")),
        ("userPassword", ("user", "password")),
        ("db_pass", ("db", "pass")),
        ("DB_PASSWORD", ("db", "password")),
        ("HTTPAuthHeader", ("http", "auth", "header")),
        ("X-Auth-Token", ("x", "auth", "token")),
        ("smtp.password", ("smtp", "password")),
        ("aws2SecretKey", ("aws", "2", "secret", "key")),
    ],
)
def test_keys_split_on_case_changes_and_separators(key: str, parts: tuple[str, ...]) -> None:
    assert key_parts(key) == parts


@pytest.mark.parametrize(
    "key",
    [
        "password", "passwd", "pwd", "db_pass", "userPassword", "PGPASSWORD", "openaiApiKey", "api_key",
        "x-api-key", "apikey", "accessKey", "secretKey", "private_key", "accountKey", "AccountKey", "token",
        "csrftoken", "refreshToken", "auth", "Authorization", "credentials", "cookie", "Set-Cookie",
        "sessionId", "bearer", "client_secret", "signing-secret",
    ],
)  # fmt: skip
def test_secret_looking_keys(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key", ["key", "keys", "max_tokens", "input_tokens", "author", "keyboard", "primary_key", "monkey", "name", "id"]
)
def test_ordinary_keys(key: str) -> None:
    assert not is_secret_key(key)


def test_values_under_secret_keys_are_masked_at_any_depth_and_inside_json_strings() -> None:
    value = {
        "q": "status",
        "openaiApiKey": "k1-value",
        "nested": [{"config": {"db_pass": "p4ss-word"}}],
        "payload": json.dumps({"user": "u", "password": "pw-in-json"}),
        "twice": json.dumps(json.dumps({"accessToken": "tok-twice"})),
        "argv": ["pg_dump", "--password", "argv-pw", "main"],
    }
    out = redact_value(value)
    text = json.dumps(out)
    for secret in ("k1-value", "p4ss-word", "pw-in-json", "tok-twice", "argv-pw"):
        assert secret not in text
    assert out["q"] == "status" and out["openaiApiKey"] == MASK
    assert out["argv"] == ["pg_dump", "--password", MASK, "main"]
    assert json.loads(out["payload"]) == {"user": "u", "password": MASK}


# -- free text -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("Authorization: Bearer abcDEF123ghiJKL456", "abcDEF123ghiJKL456"),
        ("sent Authorization: Basic dXNlcjpwYXNzd29yZA== upstream", "dXNlcjpwYXNzd29yZA=="),
        ("clone https://deploy:s3cr3t-Pw@git.example.com/r.git", "s3cr3t-Pw"),
        ("redis://:only-pw-123@cache:6379/0", "only-pw-123"),
        ("mysql -h db -u root -pTopS3cret main", "TopS3cret"),
        ("sshpass -p 'Pw 1 2' ssh host", "Pw 1 2"),
        ("curl -u admin:Adm1nPw https://ci", "Adm1nPw"),
        ("pg_restore --password Hunter2x dump", "Hunter2x"),
        ("key sk_live_4eC39HqLyjWDarjtT1zdp7dc in use", "sk_live_4eC39HqLyjWDarjtT1zdp7dc"),
        ("conn AccountName=a;AccountKey=Zm9vYmFy+/Zm9vYmFyZm9v==;Suffix=x", "Zm9vYmFy+/Zm9vYmFyZm9v=="),
        ("login hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789", "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"),
        ("-----BEGIN PRIVATE KEY-----\nMIIEv0123\nQWxhZGRp\n-----END PRIVATE KEY-----", "QWxhZGRp"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIEv0123\nno end line: cut", "no end line"),
        ('body {"login": "x", "userPassword": "pw-9876"}', "pw-9876"),
        ('log {\\"db_pass\\": \\"esc-pw-1\\"}', "esc-pw-1"),
        ("GET /login?user=bob&password=Qs-pw-77&next=/", "Qs-pw-77"),
        ("Cookie: sessionid=c00kieValue1; theme=dark", "c00kieValue1"),
        ("the db password is Hunter2-x9", "Hunter2-x9"),
        ("token: ghp_aaaaBBBBccccDDDD1234\nEEEEffff5678\n(end)", "EEEEffff5678"),
        ("export API_TOKEN=abcDEF123\\\nghiJKL456", "ghiJKL456"),
    ],
)
def test_free_text_patterns_mask_the_secret(text: str, secret: str) -> None:
    assert secret not in redact_text(text)


@pytest.mark.parametrize(
    "text",
    [
        "the basic functionality works; the bearer of the token limit is the session manager",
        "commit 356a192b7913b04c54574d18c28d46e6395428ab Merge branch 'main'",
        "request id 5d3f1a2b-9c8e-4f6a-b1d2-3e4f5a6b7c8d took 12 ms",
        '{"max_tokens": 512, "key": "row-1", "model": "gpt-4o-mini"}',
        "see https://github.com/org/repo/blob/main/README.md",
        "ssh git@github.com:org/repo.git",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert redact_text(text) == text


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


B64_JSON = b64(json.dumps({"api_key": "sk-b64b64b64b64b64b64b64"}))


@pytest.mark.parametrize(
    ("value", "secret"),
    [
        ({"headers": [["password", "pl-pw-1234"]]}, "pl-pw-1234"),
        ({"env": [["API_TOKEN", "tok-9876543"], ["REGION", "eu"]]}, "tok-9876543"),
        ({"kv": [("db_password", 48213377561)]}, "48213377561"),
        ({"blob": B64_JSON}, B64_JSON),
        ({"login": b64("admin:pw")}, b64("admin:pw")),
        ({"argv": {"values": [{"stringValue": "--password"}, {"stringValue": "otlp-argv-pw"}]}}, "otlp-argv-pw"),
    ],
)  # fmt: skip
def test_pair_lists_and_base64_are_masked_in_parsed_values(value: dict[str, Any], secret: str) -> None:
    out = redact_value(value)
    assert secret not in json.dumps(out)
    assert secret not in redact_text(json.dumps(value))  # and in their JSON text


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ('creds [["password", "pl-free-77"], ["user", "bob"]]', "pl-free-77"),
        ("config items: [('client_secret', 'cs-tuple-55'), ('region', 'us')]", "cs-tuple-55"),
        ('escaped [[\\"passphrase\\", \\"esc-pair-99\\"]] here', "esc-pair-99"),
        ('bad pair ("password", "lone-tuple-1") in settings', "lone-tuple-1"),
        ("auth " + b64("admin:pw"), b64("admin:pw")),
        ("auth " + b64("admin:pw").rstrip("="), b64("admin:pw").rstrip("=")),
        ("blob " + b64(json.dumps({"api_key": "abc123secret"})) + " end", b64(json.dumps({"api_key": "abc123secret"}))),
        ("dburl: " + b64("postgres://app:pgpw-123@db/main"), b64("postgres://app:pgpw-123@db/main")),
        ("urlsafe " + base64.urlsafe_b64encode(b'{"client_secret": "u~s?fe>>sec"}').decode().rstrip("="), "Y2xpZW50"),
    ],
)  # fmt: skip
def test_pair_lists_and_base64_are_masked_in_free_text(text: str, secret: str) -> None:
    assert secret not in redact_text(text)


@pytest.mark.parametrize(
    "text",
    [
        "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==",
        "hello " + b64("hello world, nothing here"),
        "clock " + b64("12:34:56"),
        "url " + b64("https://example.com/path"),
        "ConversationalRetrievalChain and MixedCaseIdentifierName",
        '[["user", "bob"], ["region", "eu-west-1"]]',
        "call_0123456789abcdef and 5d3f1a2b-9c8e-4f6a-b1d2-3e4f5a6b7c8d",
    ],
)
def test_benign_base64_and_pairs_are_left_alone(text: str) -> None:
    assert redact_text(text) == text


def _corpus_texts() -> list[str]:
    texts = []
    for entry in ALL_ENTRIES:
        if "arguments" in entry:
            texts.append(json.dumps(entry["arguments"]))
        else:
            texts.append(re.sub(r"<PAD:(.):(\d+)>", lambda m: m.group(1) * min(int(m.group(2)), 64), entry["text"]))
    return texts


def _fuzz_texts(count: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    pieces = ["a", "B", "0", "9", ":", "/", "@", "=", "+", "-", "_", ".", " ", "\n", '"', "'", "{", "}", "[", "]",
              ",", "\\", "u", "x", "Z", "q", "--", "p", "sk", "hf", "://", "Pw", "ey", "J", "f", "c",
              "Ab9+/xY="]  # fmt: skip
    return ["".join(rng.choice(pieces) for _ in range(rng.randrange(1, 40))) for _ in range(count)]


def test_the_prefilter_never_skips_a_text_that_redaction_would_change() -> None:
    corpus = _corpus_texts()
    assert [text for text in corpus if not may_hold_secret(text) and redact_text(text) != text] == []
    assert sum(map(may_hold_secret, corpus)) > len(corpus) - 5  # it skips only a few look-alikes left alone
    skipped = [text for text in _fuzz_texts(30_000) if not may_hold_secret(text)]
    assert len(skipped) > 10_000  # it does skip: most short or plain texts never reach the rules
    assert [text for text in skipped if redact_text(text) != text] == []
    assert [text for text in skipped if redaction._spans(text)] == []  # every pattern, without the prefilter
    for plain in ("call_0123456789ab", "gpt-4o-mini", "x" * 500, "src/pkg/module_12.py", "1234567890"):
        assert not may_hold_secret(plain)


def _key_context_texts(count: int, seed: int) -> list[str]:
    """Texts made of secret-key words, every separator the rules read (in JSON escapes too),
    quotes, flags and values; each also as JSON text (a string, a list, an object's value and
    key, a pair, JSON inside JSON), where redaction reads it decoded."""
    rng = random.Random(seed)
    pieces = ["pass", "password", "Passwd", "token", "TOKEN", "key", "api", "secret", "basic", "bearer", "digest",
              "session", "sig", "auth", "cred", "jwt", "my", "db", "x", ":", "=", "=>", " ", "  ", "\t", "\\t",
              "\\\\t", "\n", "\\n", '"', "'", '\\"', "\\", ",", " is ", " was ", "is", "-", "--", "_", ".", "[",
              "(", "{", "}", "]", "hunter2xyz", "abc123def456", "Ab9+/xY=", "12345678", "passed", "keys",
              b64("admin:hunter2x"), b64('{"token": "t0k3n-value"}'), "ConversationalRetrievalChain"]  # fmt: skip
    texts = []
    for _ in range(count):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 14)))
        texts += [text, json.dumps(text), json.dumps([text]), json.dumps({"k": text}), json.dumps({text: "hunter2xyz"})]
        texts += [json.dumps([text, "hunter2xyz"]), json.dumps(json.dumps({text: "hunter2xyz"}))]
    return texts


def test_a_secret_key_word_passes_the_prefilter_only_where_a_rule_reads_it() -> None:
    texts = _key_context_texts(6_000, seed=5)
    skipped = [text for text in texts if not may_hold_secret(text)]
    assert len(skipped) > 5_000  # key words out of a key's place are skipped
    assert [text for text in skipped if redact_text(text) != text] == []
    assert [text for text in skipped if redaction._spans(text)] == []
    least = ["-----BEGIN PRIVATE KEY-----\nabc", "x ('token', 'abc123def')", "[\\'token\\', 12345678]"]
    least += ['{"my password"\n: "hunter2xyz"}', '[\n"my password"\n, "hunter2xyz"]', "passphrase is hunter2xyz"]
    least += [json.dumps("[\t'token', 'abc123def']")]  # a JSON tab before a pair list's key
    for text in [*_GATED_TEXTS, *least]:
        assert redact_text(text) != text and may_hold_secret(text), text  # the least of each rule
        for blank in (" ", "\t", "\n"):  # and as JSON text, its blanks tabs or line breaks (escaped there)
            variant = text.replace(" ", blank)
            for form in (json.dumps(variant), json.dumps([variant]), json.dumps(json.dumps({"k": variant}))):
                assert may_hold_secret(form) or redact_text(form) == form, form
    for prose in ("5 passed, 1 failed in 0.31s", "the keys of the session were sorted", "basic usage", "passed is ok"):
        assert not may_hold_secret(prose), prose
    tab_escaped = json.dumps(["curl -u\tadmin:hunter2x now"])  # a JSON tab after -u: was skipped
    assert may_hold_secret(tab_escaped)
    assert "hunter2x" not in redact_text(tab_escaped)


def _python_passes_sql_skips(texts: list[str]) -> list[str]:
    """The texts that Python's prefilter lets through and DuckDB's (RE2) skips: none, for the SQL
    prefilter to be safe."""
    kept = flagged_by_sql(texts, may_hold_secret_sql)
    return [text for i, text in enumerate(texts) if may_hold_secret(text) and i not in kept]


def test_the_prefilters_skip_no_real_text_that_redaction_changes() -> None:
    texts = real_trajectory_texts()
    assert len(texts) > 10_000
    skipped = [text for text in texts if not may_hold_secret(text)]
    assert len(skipped) > len(texts) // 2  # most of a coding agent's texts never reach the rules
    assert [text for text in skipped if redact_text(text) != text] == []
    assert sum(redact_text(text) != text for text in texts) > 50  # the trajectories do hold what it masks
    assert _python_passes_sql_skips(texts) == []


_GATED_TEXTS = [
    "-----BEGIN RSA PRIVATE KEY-----\nMIIBOgIBAAJBAKj34GkxFhD9\n-----END RSA PRIVATE KEY-----",
    "key " + "Ab9+" * 21 + "x/==",
    "clone https://deploy:pa55word@git.example.com/repo",
    "password: hunter2x", "config token=abc123def456", "session_key => 'Zq81kd93ms'",
    "run --password hunter2x now", "--api-key=abc123def456",
    "mysql -u root -phunter2x db", "mariadb -u root -phunter2x", "mariadb-dump -phunter2x db",
    "sshpass -p hunter2x ssh host", "curl -u admin:hunter2x https://x", "wget --user admin:hunter2x",
    "Authorization: Bearer abc123def456ghi", "basic YWxhZGRpbjpvcGVuc2VzYW1l", "Digest abc123/def456",
    "token Abc123DEF456ghi",
    "the password is hunter2xyz.", "passwd was hunter2xyz", "passphrase: hunter2xyz!", "pwd = hunter2xyz",
    "the secret is hunter2xyz", "token was hunter2xyz", "api key is hunter2xyz", "API-KEY: hunter2xyz",
    '["password", "hunter2x"]', "('token', 'abc123def')", '[\\"api_key\\", \\"abc123def\\"]', '["password", 123456]',
    '"--password", "hunter2x"', "'--token', 'abc123def'",
]  # fmt: skip
"""A secret for every literal and word that gates a pattern of :data:`redaction._FINDERS`."""


def _folded_variants(texts: list[str]) -> list[str]:
    """``texts`` in upper and lower case, and with the letters that a case-insensitive pattern folds
    to ASCII ones put in their place (the long s, the Kelvin sign, the dotless and the dotted i)."""
    out = []
    for text in texts:
        out += [text.upper(), text.lower()]
        for letter, folded in (("s", "\u017f"), ("k", "\u212a"), ("i", "\u0131"), ("I", "\u0130")):
            out += [text.replace(letter, folded), text.replace(letter.upper(), folded)]
    return out


def test_the_gates_and_the_lower_cased_scans_change_no_secret_found() -> None:
    gated = [find for find in redaction._FINDERS if isinstance(find, redaction._Gated)]
    assert len(gated) == 10
    for text in _GATED_TEXTS:  # each is a secret of a gated pattern
        lower = text.lower()
        assert any(find.find(text, lower) for find in gated), text
    corpus = _corpus_texts()
    texts = [*_GATED_TEXTS, *_folded_variants(_GATED_TEXTS), *corpus, *_folded_variants(corpus)]
    texts += _fuzz_texts(5_000, seed=17)
    ungated = [find.find if isinstance(find, redaction._Gated) else find for find in redaction._FINDERS]
    for text in texts:
        lower = text.lower() if text.isascii() else None
        for find in gated:
            assert find(text, lower) == find.find(text, lower), (text, find)
        # every pattern ungated and told no lower-cased text: each case-insensitive scan over the text itself
        every = redaction._merged(span for find in ungated for span in find(text, None)) if len(text) >= 8 else []
        assert redaction._spans(text) == every, text


def test_the_sql_prefilter_lets_through_every_text_the_python_one_does() -> None:
    texts = [*_corpus_texts(), *_fuzz_texts(5_000, seed=11), *_key_context_texts(1_000, seed=13)]
    texts += [*_folded_variants(_GATED_TEXTS), "bearer \u0131\u0130\u0131\u0130\u0131\u0130\u0131\u0130"]
    texts += [
        "key x bas\u0131c abcdefgh1",
        "token x pr\u0131vate: v1",
        "key x ap\u0131 key is v1",
    ]  # another word lets Python scan
    assert _python_passes_sql_skips(texts) == []
    assert "'" not in PREFILTER_PATTERN + BASE64_WORD_PATTERN  # both are spliced into SQL text


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("http.request.header.authorization", True),
        ("http.request.header.x-api-key", True),
        ("http.response.header.set-cookie", True),
        ("http.request.header.proxy-authorization", True),
        ("aws.secret_access_key", True),
        ("llm.openai.api_key", True),
        ("db.password", True),
        ("api_key.value", True),
        ("http.request.header.authorization.0", True),
        ("treellm.trajectory.api_key", True),
        ("llm.token_count.prompt", False),
        ("gen_ai.usage.input_tokens", False),
        ("session.id", False),
        ("input.value", False),
        ("exception.message", False),
        ("treellm.tool.signature", False),
        ("treellm.loop.signature", False),
        ("llm.input_messages.0.message.content", False),
    ],
)
def test_secret_attribute_names(key: str, secret: bool) -> None:
    assert is_secret_attribute(key) is secret


def test_what_each_capture_mode_keeps_of_a_foreign_value() -> None:
    text = "called with password=Qs-pw-77 ok"
    redacted, none, full = ForeignCapture("redacted"), ForeignCapture("none"), ForeignCapture("full")
    assert not full.active and full.value(text, full.rule("input.value")) == text
    assert redacted.value(text, redacted.rule("input.value")) == "called with password=[REDACTED] ok"
    assert redacted.rule("http.request.header.authorization") == "mask"
    assert none.rule("input.value") == "hash" and none.rule("input.value", resource=True) == "redact"
    hashed = none.value(text, "hash")
    assert hashed == content_hash("called with password=[REDACTED] ok")  # the hash of the redacted text
    assert none.value(hashed, "hash") == hashed and none.value("42", "hash") == "42"  # hashes and numbers stay
    assert none.rule("gen_ai.tool.name") == none.rule("treellm.tool.ordinal") == "redact"  # what a span is
    assert none.rule("treellm.loop.arguments") == none.rule("treellm.trajectory.submission") == "hash"
    assert none.status("RuntimeError: password=hunter2") == "RuntimeError"
    assert redacted.status("RuntimeError: password=hunter2x") == "RuntimeError: password=[REDACTED]"


def test_a_foreign_capture_remembers_a_bounded_share_of_the_texts_it_redacted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ForeignCapture, "TEXTS_KEPT_CHARS", 2_000)
    capture = ForeignCapture("redacted")
    texts = [f"run {i}: password={i:05d}Qx-secret and the tests passed" for i in range(300)]
    for _ in range(2):  # asked again after the memo started over: the same answers
        assert [capture.text(text) for text in texts] == [redact_text(text) for text in texts]
        kept = sum(len(text) for text in capture._texts)
        assert 0 < kept <= 2_000  # of the 14,000 characters asked
    assert capture.text(texts[-1]) == "run 299: password=[REDACTED] and the tests passed"


def test_a_secret_straddling_the_cut_is_masked_not_half_shown() -> None:
    capture = Capture("redacted", max_length=50)
    key = "sk_live_" + "Ab1" * 10
    for tail in ("", " " + "z" * (2 * MARGIN)):  # a short text (redacted whole) and a long one (windowed)
        out = capture.text("x" * 45 + " " + key + tail)
        assert out is not None and out.startswith("x" * 45)
        assert "sk_li" not in out and "Ab1Ab1" not in out and "truncated" in out
    pem = "-----BEGIN PRIVATE KEY-----\n" + "QUJD" * 2000 + "\n-----END PRIVATE KEY-----"
    out = capture.text("y" * 40 + pem + "tail" * 5000)
    assert out is not None and "QUJD" not in out and "BEGIN" not in out


def test_a_huge_argument_string_is_scanned_on_a_window_and_cut() -> None:
    capture = Capture("redacted", max_length=100)
    blob = "note " + "n" * 90 + " key=sk_live_" + "Zz9" * 10 + " " + "q" * 10 * MARGIN
    out = capture.arguments({"blob": blob})
    assert out is not None and "sk_live" not in out and "Zz9Zz9" not in out and len(out) < 200


def test_error_types_never_carry_content() -> None:
    assert error_type("RuntimeError: the password is hunter2") == "RuntimeError"
    assert error_type("requests.exceptions.HTTPError: 401") == "requests.exceptions.HTTPError"
    assert error_type("a message with no type: sk_live_x") == "error"
    assert error_type("no colon at all") == "error"
    none = Capture("none")
    assert none.message("RuntimeError: hunter2", default="RuntimeError") == "RuntimeError"
    assert Capture().message("RuntimeError: password=hunter2x", default="x") == "RuntimeError: password=[REDACTED]"


# -- off the event loop ------------------------------------------------------------------------------


def test_a_5_mb_result_is_redacted_on_the_telemetry_worker_not_the_event_loop(pipeline: Pipeline) -> None:
    big = "r" * 5_000_000 + " token=ghp_" + "Q1" * 20
    seen: list[tuple[int, str]] = []  # (length of the text captured, thread name)
    loop_threads: list[int] = []

    class Recording(Capture):
        def text(self, text: str | None) -> str | None:
            if text is not None and len(text) >= len(big):
                seen.append((threading.get_ident(), threading.current_thread().name))
            return super().text(text)

    async def huge(_: dict[str, Any]) -> str:
        loop_threads.append(threading.get_ident())  # an async handler runs on the event loop's thread
        return big

    observer = TelemetryObserver(pipeline.tracer_provider, pipeline.meter_provider, capture=Recording())
    model = ScriptedModel([ModelTurn(tool_calls=[ToolCall("huge", {})]), ModelTurn(text="done")])
    config = TreeConfig(collapse_threshold=10**9)
    TreeExecutor(model, [Tool("huge", "h", handler=huge)], config, telemetry=False, observers=[observer]).run("t")

    assert loop_threads and seen
    assert all(ident not in loop_threads for ident, _ in seen)
    assert {name for _, name in seen} == {"treellm-telemetry"}
    tool = next(s for s in pipeline.spans if s.name == "execute_tool huge")  # ended by the time run() returned
    result = str((tool.attributes or {})[sc.GEN_AI_TOOL_CALL_RESULT])
    assert result.startswith("r" * 100) and "truncated" in result and len(result) < 2000
    assert observer.failures == 0


def test_outside_an_event_loop_events_are_handled_inline(pipeline: Pipeline) -> None:
    guard = LoopGuard(tracer_provider=pipeline.tracer_provider, meter_provider=pipeline.meter_provider, name="lg")
    guard.record("search", {"q": "x", "api_key": "sk-" + "A1b2" * 6}, "found ghp_" + "Z9" * 12)
    tool = next(s for s in pipeline.spans if s.name == "execute_tool search")  # already ended: no flush needed
    a = dict(tool.attributes or {})
    assert '"api_key":"[REDACTED]"' in str(a[sc.GEN_AI_TOOL_CALL_ARGUMENTS])
    assert str(a[sc.GEN_AI_TOOL_CALL_RESULT]) == "found [REDACTED]"
    guard.end()
