"""Tests for dataset row normalisation (osmosis_ai.rollout.dataset)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from osmosis_ai.errors import ConfigError, DatasetRowError
from osmosis_ai.rollout.dataset import DatasetRow, normalize_dataset_row

NAN = math.nan


# --- prompt mode -----------------------------------------------------------------------------


def test_prompt_row_becomes_system_then_user_message_and_label():
    row = normalize_dataset_row(
        {"system_prompt": "Be terse.", "user_prompt": "2+2?", "ground_truth": "4"}
    )
    assert row == DatasetRow(
        prompt=[
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "2+2?"},
        ],
        label="4",
        metadata=None,
    )


def test_system_prompt_is_optional():
    row = normalize_dataset_row({"user_prompt": "hi", "ground_truth": "x"})
    assert row.prompt == [{"role": "user", "content": "hi"}]


def test_label_is_accepted_as_alias_for_ground_truth():
    assert normalize_dataset_row({"user_prompt": "q", "label": "a"}).label == "a"


def test_ground_truth_wins_over_label():
    row = normalize_dataset_row({"user_prompt": "q", "ground_truth": "gt", "label": "lbl"})
    assert row.label == "gt"


@pytest.mark.parametrize("missing", ["", None, NAN])
def test_missing_ground_truth_falls_back_to_label(missing):
    row = normalize_dataset_row({"user_prompt": "q", "ground_truth": missing, "label": "lbl"})
    assert row.label == "lbl"


def test_label_is_never_placed_in_the_prompt():
    row = normalize_dataset_row({"user_prompt": "q", "ground_truth": "SECRET-ANSWER"})
    assert "SECRET-ANSWER" not in repr(row.prompt)


def test_non_string_cells_are_stringified():
    row = normalize_dataset_row({"user_prompt": 12, "ground_truth": 4.5, "system_prompt": True})
    assert row.prompt == [
        {"role": "system", "content": "True"},
        {"role": "user", "content": "12"},
    ]
    assert row.label == "4.5"


def test_other_columns_are_ignored():
    row = normalize_dataset_row(
        {"user_prompt": "q", "ground_truth": "a", "id": 7, "difficulty": "hard"}
    )
    assert row == DatasetRow(prompt=[{"role": "user", "content": "q"}], label="a", metadata=None)


@pytest.mark.parametrize("empty", ["", None, NAN])
def test_empty_system_prompt_is_left_out(empty):
    row = normalize_dataset_row({"system_prompt": empty, "user_prompt": "q", "ground_truth": "a"})
    assert row.prompt == [{"role": "user", "content": "q"}]


@pytest.mark.parametrize("missing", ["absent", "", None, NAN])
def test_prompt_row_without_user_prompt_is_an_error(missing):
    data: dict[str, object] = {"ground_truth": "a"}
    if missing != "absent":
        data["user_prompt"] = missing
    with pytest.raises(DatasetRowError) as excinfo:
        normalize_dataset_row(data, row_index=3)
    error = excinfo.value
    assert (error.row, error.column) == (3, "user_prompt")
    assert str(error).startswith("dataset row 3, column 'user_prompt': missing or empty;")
    assert "metadata" in str(error)


@pytest.mark.parametrize("missing", ["absent", "", None, NAN])
def test_prompt_row_without_ground_truth_or_label_is_an_error(missing):
    data: dict[str, object] = {"user_prompt": "q"}
    if missing != "absent":
        data["ground_truth"] = missing
        data["label"] = missing
    with pytest.raises(DatasetRowError) as excinfo:
        normalize_dataset_row(data, row_index=0)
    error = excinfo.value
    assert (error.row, error.column) == (0, "ground_truth")
    assert "row 0" in str(error)
    assert "'label'" in str(error)


def test_error_without_row_index_still_names_the_column():
    with pytest.raises(DatasetRowError, match=r"^dataset column 'user_prompt': "):
        normalize_dataset_row({"ground_truth": "a"})


def test_dataset_row_error_is_a_config_error():
    with pytest.raises(ConfigError):
        normalize_dataset_row({})


def test_whitespace_prompt_is_kept_as_written():
    # Only the empty string counts as missing for prompt columns.
    row = normalize_dataset_row({"user_prompt": " ", "ground_truth": "a"})
    assert row.prompt == [{"role": "user", "content": " "}]


# --- metadata mode ---------------------------------------------------------------------------


def test_metadata_dict_makes_prompt_and_label_optional():
    row = normalize_dataset_row({"metadata": {"task": "t1", "level": 2}})
    assert row == DatasetRow(prompt=[], label=None, metadata={"task": "t1", "level": 2})


def test_metadata_json_string_is_parsed():
    row = normalize_dataset_row({"metadata": '{"task": "t1", "tags": ["a"]}'})
    assert row.metadata == {"task": "t1", "tags": ["a"]}


def test_metadata_row_keeps_prompt_and_label_when_present():
    row = normalize_dataset_row(
        {"metadata": {"k": 1}, "user_prompt": "q", "label": "a", "system_prompt": "s"}
    )
    assert row.prompt == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q"},
    ]
    assert row.label == "a"
    assert row.metadata == {"k": 1}


def test_metadata_row_prefers_ground_truth_over_label():
    row = normalize_dataset_row({"metadata": {"k": 1}, "ground_truth": "gt", "label": "lbl"})
    assert row.label == "gt"


def test_metadata_is_copied_not_shared():
    source = {"k": 1}
    row = normalize_dataset_row({"metadata": source})
    assert row.metadata == source
    assert row.metadata is not source


@pytest.mark.parametrize("empty", ["", "   ", "{}", " {} ", {}, None, NAN])
def test_empty_metadata_counts_as_absent(empty):
    row = normalize_dataset_row({"metadata": empty, "user_prompt": "q"}, row_index=1)
    assert row.metadata is None
    assert row.prompt == [{"role": "user", "content": "q"}]
    # The metadata column decides the mode, so ground_truth stays optional.
    assert row.label is None


@pytest.mark.parametrize("empty", ["", "{}", None, NAN])
def test_row_with_neither_prompt_nor_metadata_is_an_error(empty):
    with pytest.raises(DatasetRowError) as excinfo:
        normalize_dataset_row({"metadata": empty, "ground_truth": "a"}, row_index=5)
    error = excinfo.value
    assert (error.row, error.column) == (5, "metadata")
    assert "row 5" in str(error)
    assert "non-empty metadata object" in str(error)


def test_invalid_json_metadata_is_an_error_naming_the_position_not_the_value():
    with pytest.raises(DatasetRowError) as excinfo:
        normalize_dataset_row({"metadata": '{"api_key": "sk-123",'}, row_index=2)
    error = excinfo.value
    assert (error.row, error.column) == (2, "metadata")
    message = str(error)
    assert message.startswith("dataset row 2, column 'metadata': not a JSON object: invalid JSON")
    assert "line 1 column" in message
    assert "sk-123" not in message
    assert isinstance(error.__cause__, ValueError)


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("[1, 2]", "a list"),
        ([1, 2], "a list"),
        ('"text"', "a string"),
        ("42", "a number"),
        (7, "a number"),
        ("true", "a boolean"),
        (b"{}", "a value of type bytes"),
    ],
)
def test_metadata_that_is_not_an_object_is_an_error(value, kind):
    with pytest.raises(DatasetRowError) as excinfo:
        normalize_dataset_row({"metadata": value, "user_prompt": "q"}, row_index=4)
    error = excinfo.value
    assert (error.row, error.column) == (4, "metadata")
    assert f"not a JSON object: got {kind};" in str(error)


# --- misc ------------------------------------------------------------------------------------


def test_dataset_row_is_frozen():
    row = normalize_dataset_row({"user_prompt": "q", "ground_truth": "a"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.label = "b"  # type: ignore[misc]


def test_non_mapping_row_is_an_error():
    with pytest.raises(DatasetRowError, match="expected a mapping"):
        normalize_dataset_row(["q", "a"], row_index=0)  # type: ignore[arg-type]
