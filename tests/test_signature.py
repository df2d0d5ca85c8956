"""Signatures: tree-llm vectors, JavaScript number and string semantics, properties."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from treellm import RawArguments, canonical_json, parse_arguments, signature, stable_hash
from treellm.signature import djb2, js_number

VECTORS = json.loads((Path(__file__).parent / "data" / "signatures.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", VECTORS, ids=[f"{c['tool']}-{i}" for i, c in enumerate(VECTORS)])
def test_every_tree_llm_vector_matches(case: dict[str, str]) -> None:
    value = parse_arguments(case["args_json"])
    assert canonical_json(value) == case["canonical"]
    assert signature(case["tool"], value) == case["signature"]


def test_vectors_cover_the_hard_cases() -> None:
    assert len(VECTORS) >= 20
    tools = {c["tool"] for c in VECTORS}
    assert {"intkeys", "unicode", "lone", "nums", "exp"} <= tools


@pytest.mark.parametrize(
    ("number", "text"),
    [
        (1e-6, "0.000001"),
        (1e-7, "1e-7"),
        (1.5e-7, "1.5e-7"),
        (2.0**64, "18446744073709552000"),
        (1.0, "1"),
        (-0.0, "0"),
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (123.456, "123.456"),
        (-2.5e-8, "-2.5e-8"),
        (0.1, "0.1"),
        (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (float("inf"), "null"),
        (float("nan"), "null"),
        (2**53 + 1, "9007199254740992"),
        (10**400, "null"),
    ],
)
def test_numbers_print_as_javascript_does(number: float, text: str) -> None:
    assert js_number(number) == text


def test_djb2_matches_the_reference_loop_for_long_and_non_ascii_text() -> None:
    def reference(text: str) -> int:
        h = 5381
        raw = text.encode("utf-16-le", "surrogatepass")
        for i in range(0, len(raw), 2):
            h = (h * 33 + int.from_bytes(raw[i : i + 2], "little")) & 0xFFFFFFFF
        return h

    for text in ["", "a", "x" * 23, "x" * 24, "é" * 5000, "😀abc" * 3000, "q" * 9000]:
        assert djb2(text) == reference(text)


def test_malformed_json_becomes_raw_arguments_not_an_empty_object() -> None:
    a = parse_arguments('{"path": "a.py"')
    b = parse_arguments('{"path": "b.py"')
    assert a == RawArguments('{"path": "a.py"')
    assert signature("read_file", a) != signature("read_file", b)
    assert signature("read_file", a) != signature("read_file", {})


def test_non_json_constants_are_rejected_as_javascript_rejects_them() -> None:
    assert isinstance(parse_arguments('{"x": NaN}'), RawArguments)
    assert isinstance(parse_arguments("Infinity"), RawArguments)


def test_numbers_parse_with_javascript_semantics() -> None:
    assert parse_arguments('{"n": 9007199254740993}') == {"n": 9007199254740992.0}
    assert parse_arguments('{"n": 10}') == {"n": 10}
    assert isinstance(parse_arguments('{"n": 10}')["n"], int)  # type: ignore[index]
    assert parse_arguments('{"n": 1e400}') == {"n": math.inf}


def test_parsed_mappings_are_used_as_they_are() -> None:
    args = {"b": 1, "a": [1, 2]}
    assert parse_arguments(args) is args


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6), st.randoms())
def test_key_order_never_matters(value: dict[str, object], rnd: object) -> None:
    items = list(value.items())
    rnd.shuffle(items)  # type: ignore[attr-defined]
    assert canonical_json(dict(items)) == canonical_json(value)
    assert stable_hash(dict(items)) == stable_hash(value)


@given(json_values)
def test_canonical_text_parses_back_to_an_equal_value(value: object) -> None:
    text = canonical_json(value)
    assert parse_arguments(text) == value  # JavaScript number semantics: doubles
    assert canonical_json(parse_arguments(text)) == text


@given(json_values)
def test_equal_values_give_equal_signatures(value: object) -> None:
    copy = json.loads(json.dumps(value))
    assert signature("t", copy) == signature("t", value)
