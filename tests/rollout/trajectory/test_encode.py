"""The trajectory file encoding: json.dumps(indent=2) layout, number arrays compact on one line."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, computed_field

from osmosis_ai.rollout.trajectory.atif import Trajectory
from osmosis_ai.rollout.trajectory.encode import encode_document


def reference_encoding(document: Any) -> str:
    """json.dumps(indent=2) with every all-number array written compactly on one line."""
    text = json.dumps(document, indent=2, allow_nan=False, ensure_ascii=False)
    number = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
    array = re.compile(rf"\[\s*({number}(?:,\s*{number})*)\s*\]")
    return array.sub(lambda m: "[" + ",".join(re.split(r",\s*", m.group(1))) + "]", text) + "\n"


def test_layout_matches_json_dumps_indent_2() -> None:
    document = {
        "text": 'quote " backslash \\ newline \n tab \t control \x01 nul \x00 é 你好 \u2028',
        "empty_list": [],
        "empty_dict": {},
        "nested": {"list": [{"a": None}, True, False, "s", [1, "x"]], "n": -3},
        "float": 0.25,
    }
    assert encode_document(document).decode("utf-8") == reference_encoding(document)


def test_number_arrays_are_printed_on_one_line_wherever_they_are() -> None:
    document = {"ids": [1, 2, 3], "deep": [{"logprobs": [-0.5, 0.0]}, [[7], [8, 9.5]]]}
    text = encode_document(document).decode("utf-8")
    assert '"ids": [1,2,3]' in text
    assert '"logprobs": [-0.5,0.0]' in text
    assert "[7],\n" in text and "[8,9.5]\n" in text
    assert text == reference_encoding(document)


def test_mixed_arrays_stay_one_item_per_line() -> None:
    text = encode_document({"mixed": [1, "2", None]}).decode("utf-8")
    assert text == '{\n  "mixed": [\n    1,\n    "2",\n    null\n  ]\n}\n'


@pytest.mark.parametrize(
    "document",
    [{"x": math.nan}, {"x": [1.0, math.inf]}, {"x": [{"y": -math.inf}]}, math.nan, {math.inf: 1}],
    ids=["value", "in-number-array", "nested", "top-level", "key"],
)
def test_non_finite_numbers_are_rejected(document: Any) -> None:
    with pytest.raises(ValueError, match="not JSON compliant"):
        encode_document(document)


def test_keys_are_coerced_like_json_dumps() -> None:
    document = {1: "a", None: "b", False: "c", 2.5: "d"}
    assert json.loads(encode_document(document)) == json.loads(json.dumps(document))


def test_unsupported_key_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="keys must be"):
        encode_document({(1, 2): "tuple key"})


def test_lone_surrogates_are_escaped_instead_of_failing() -> None:
    data = encode_document({"text": "bad \udc80 byte", "ok": "é", "ids": [1, 2]})
    document = json.loads(data.decode("utf-8"))
    assert document == {"text": "bad \\udc80 byte", "ok": "é", "ids": [1, 2]}
    assert b'"ids": [1,2]' in data


def test_huge_integers_in_arrays_are_kept_exactly() -> None:
    document = {"ids": [10**400, 1]}
    assert json.loads(encode_document(document)) == document


def test_model_is_encoded_as_its_json_dict_without_nulls() -> None:
    trajectory = Trajectory.model_validate(
        {
            "agent": {"name": "a", "version": "1"},
            "steps": [
                {
                    "step_id": 1,
                    "source": "agent",
                    "message": [{"type": "text", "text": "t"}],
                    "metrics": {"prompt_token_ids": [1, 2], "extra": {"k": None}},
                }
            ],
        }
    )
    data = encode_document(trajectory)
    assert json.loads(data) == trajectory.to_json_dict()
    assert data.decode("utf-8") == reference_encoding(trajectory.to_json_dict())


text = st.text(st.characters(exclude_categories=["Cs"]))  # lone surrogates are repaired
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(text, children, max_size=5),
    max_leaves=30,
)


@given(json_values)
def test_encoding_round_trips_any_json_value(value: Any) -> None:
    data = encode_document(value)
    assert data.endswith(b"\n")
    assert json.loads(data.decode("utf-8")) == value


class _Extended(BaseModel):
    model_config = ConfigDict(extra="allow")

    ids: list[int]
    note: str | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def count(self) -> int:
        return len(self.ids)


def test_other_models_are_encoded_as_pydantic_dumps_them() -> None:
    model = _Extended.model_validate({"ids": [1, 2], "tag": "x"})
    data = encode_document({"model": model})
    assert json.loads(data) == {"model": {"ids": [1, 2], "tag": "x", "count": 2}}
    assert b'"ids": [1,2]' in data
