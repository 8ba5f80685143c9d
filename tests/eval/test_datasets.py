"""Tests for reading dataset files (osmosis_ai.eval.datasets)."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.errors import ConfigError, DatasetRowError
from osmosis_ai.eval import Dataset, DatasetItem, format_rows, load_dataset, parse_rows

ROWS = [
    {"user_prompt": f"What is {i} + {i}?", "ground_truth": str(2 * i), "extra": i}
    for i in range(12)
]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    with path.open("w", encoding="utf-8", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_parquet(path: Path, rows: list[dict[str, Any]], *, row_group_size: int = 5) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return path


WRITERS = {"jsonl": write_jsonl, "csv": write_csv, "parquet": write_parquet}


def sources(dataset: Dataset) -> list[int]:
    return [item.source_row_index for item in dataset.items]


# --- formats --------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_each_format_yields_normalised_items(tmp_path, fmt):
    path = WRITERS[fmt](tmp_path / f"rows.{fmt}", ROWS)
    dataset = load_dataset(path)
    assert dataset.path == path
    assert dataset.total_rows == 12
    assert len(dataset.items) == 12
    assert dataset.items[3] == DatasetItem(
        row_index=3,
        source_row_index=3,
        prompt=[{"role": "user", "content": "What is 3 + 3?"}],
        label="6",
        metadata=None,
    )


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_sha256_is_the_hash_of_the_file_bytes(tmp_path, fmt):
    path = WRITERS[fmt](tmp_path / f"rows.{fmt}", ROWS)
    assert load_dataset(path).sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_extension_is_case_insensitive(tmp_path):
    path = write_jsonl(tmp_path / "ROWS.JSONL", ROWS[:2])
    assert load_dataset(path).total_rows == 2


def test_unknown_extension_is_refused(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text("[]", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"unsupported format.*\.csv, \.jsonl, \.parquet"):
        load_dataset(path)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_dataset(tmp_path / "nope.csv")


def test_jsonl_skips_blank_lines(tmp_path):
    path = tmp_path / "rows.jsonl"
    lines = [json.dumps(ROWS[0]), "", "   ", json.dumps(ROWS[1]), ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    dataset = load_dataset(path)
    assert dataset.total_rows == 2
    assert dataset.items[1].label == "2"


def test_jsonl_invalid_json_names_file_line_and_row(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n{not json\n", encoding="utf-8")
    with pytest.raises(DatasetRowError) as info:
        load_dataset(path)
    message = str(info.value)
    assert message.startswith(f"{path}, line 3: dataset row 1")
    assert "invalid JSON" in message
    assert "not json" not in message  # the line's content is never echoed
    assert info.value.row == 1


def _nested(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"k": value}
    return value


@pytest.mark.parametrize("levels", [300, 5000])  # 5000 is past what the JSON parser reads
def test_a_row_nested_past_the_limit_fails_alone_named_by_file_and_row(tmp_path, levels):
    path = tmp_path / "rows.jsonl"
    deep = json.dumps({"user_prompt": "x", "ground_truth": "y"})[:-1] + ', "metadata": '
    deep += "{" + '"k": {' * (levels - 1) + "}" * levels + "}"
    path.write_text("\n".join([json.dumps(ROWS[0]), deep, json.dumps(ROWS[1])]) + "\n")
    dataset = load_dataset(path)
    assert [item.error is None for item in dataset.items] == [True, False, True]
    bad = dataset.items[1]
    assert bad.error is not None and bad.error.startswith(f"{path}, line 2: dataset row 1")
    assert "deeper than 64 levels" in bad.error and bad.metadata is None
    assert dataset.items[2].label == ROWS[1]["ground_truth"]


def test_metadata_just_under_the_limit_is_kept(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", [{**ROWS[0], "metadata": _nested(63)}])
    (item,) = load_dataset(path).items
    assert item.error is None and item.metadata == _nested(63)


def test_jsonl_line_that_is_not_an_object_is_a_row_error(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("[1, 2]\n", encoding="utf-8")
    with pytest.raises(DatasetRowError, match="expected a mapping"):
        load_dataset(path)


def test_jsonl_with_byte_order_mark_and_crlf_is_read(tmp_path):
    path = tmp_path / "rows.jsonl"
    body = "\r\n".join(json.dumps(row) for row in ROWS[:2])
    path.write_bytes(b"\xef\xbb\xbf" + body.encode())
    assert load_dataset(path).items[0].label == "0"


def test_non_utf8_file_names_the_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(json.dumps(ROWS[0]).encode() + b'\n{"user_prompt": "\xff"}\n')
    with pytest.raises(ConfigError, match=r"line 2: not UTF-8 text \(byte 0xff"):
        load_dataset(path)


def test_csv_without_header_is_refused(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("", encoding="utf-8")
    with pytest.raises(ConfigError, match="no header row"):
        load_dataset(path)


def test_csv_with_only_a_header_has_no_rows(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("user_prompt,ground_truth\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="no rows to evaluate"):
        load_dataset(path)


def test_csv_accepts_a_one_megabyte_cell(tmp_path):
    big = "x" * (1024 * 1024)
    path = write_csv(tmp_path / "rows.csv", [{"user_prompt": big, "ground_truth": "1"}])
    before = csv.field_size_limit()
    dataset = load_dataset(path)
    assert dataset.items[0].prompt == [{"role": "user", "content": big}]
    assert csv.field_size_limit() == before  # the process-wide limit is restored


def test_csv_multiline_cells_and_empty_cells(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text(
        'system_prompt,user_prompt,ground_truth\n,"line one\nline two",a\nBe terse.,q2,b\n',
        encoding="utf-8",
    )
    items = load_dataset(path).items
    assert items[0].prompt == [{"role": "user", "content": "line one\nline two"}]
    assert items[1].prompt[0] == {"role": "system", "content": "Be terse."}


def test_csv_bad_row_error_names_file_line_row_and_column(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text('user_prompt,ground_truth\n"a\nb",1\nq,\n', encoding="utf-8")
    with pytest.raises(DatasetRowError) as info:
        load_dataset(path)
    assert str(info.value).startswith(f"{path}, line 4: dataset row 1, column 'ground_truth'")
    assert info.value.row == 1
    assert info.value.column == "ground_truth"


def test_parquet_bad_row_error_names_file_row_and_column(tmp_path):
    rows = [{"user_prompt": "q", "ground_truth": "a"}] * 7 + [
        {"user_prompt": None, "ground_truth": "a"}
    ]
    path = write_parquet(tmp_path / "rows.parquet", rows)
    with pytest.raises(DatasetRowError) as info:
        load_dataset(path)
    assert str(info.value).startswith(f"{path}: dataset row 7, column 'user_prompt'")
    assert (info.value.row, info.value.column) == (7, "user_prompt")


def test_garbage_parquet_file_is_a_config_error(tmp_path):
    path = tmp_path / "rows.parquet"
    path.write_bytes(b"not parquet at all")
    with pytest.raises(ConfigError, match="not a readable Parquet file"):
        load_dataset(path)


# --- metadata rows --------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_metadata_only_rows(tmp_path, fmt):
    rows = [
        {"metadata": json.dumps({"task": "sum", "args": [1, 2]})},
        {"metadata": json.dumps({"task": "neg"})},
    ]
    dataset = load_dataset(WRITERS[fmt](tmp_path / f"rows.{fmt}", rows))
    assert dataset.items[0] == DatasetItem(
        row_index=0,
        source_row_index=0,
        prompt=[],
        label=None,
        metadata={"task": "sum", "args": [1, 2]},
    )


def test_jsonl_metadata_may_be_an_object(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", [{"metadata": {"k": 1}, "user_prompt": "q"}])
    item = load_dataset(path).items[0]
    assert item.metadata == {"k": 1}
    assert item.prompt == [{"role": "user", "content": "q"}]


def test_empty_metadata_row_reports_file_and_column(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", [{"metadata": {"k": 1}}, {"metadata": "{}"}])
    with pytest.raises(DatasetRowError) as info:
        load_dataset(path)
    assert str(info.value).startswith(f"{path}, line 2: dataset row 1, column 'metadata'")


# --- selection ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("3", [3]),
        ("3,7,10-12", [3, 7, 10, 11, 12]),
        ("10-12,3,11,3", [3, 10, 11, 12]),
        ("0-2,2-4", [0, 1, 2, 3, 4]),
        ("5-5", [5]),
    ],
)
def test_parse_rows_deduplicates_and_sorts(spec, expected):
    assert parse_rows(spec) == expected


@pytest.mark.parametrize("spec", ["", " 3", "3,", "a", "1-2-3", "-1", "3 ,4", "1,,2"])
def test_parse_rows_rejects_malformed_selectors(spec):
    with pytest.raises(ConfigError, match="row selector .* is invalid"):
        parse_rows(spec)


def test_parse_rows_rejects_inverted_range():
    with pytest.raises(ConfigError, match="range 20-10 ends before it starts; write it as 10-20"):
        parse_rows("3,20-10")


def test_format_rows_merges_runs():
    assert format_rows([12, 0, 1, 2, 3, 9, 2]) == "0-3,9,12"
    assert parse_rows(format_rows([5, 1, 2])) == [1, 2, 5]


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_rows_select_exact_source_rows_and_count_all(tmp_path, fmt):
    path = WRITERS[fmt](tmp_path / f"rows.{fmt}", ROWS)
    dataset = load_dataset(path, rows="7,2,4-5")
    assert sources(dataset) == [2, 4, 5, 7]
    assert [item.row_index for item in dataset.items] == [0, 1, 2, 3]
    assert dataset.items[0].label == "4"
    assert dataset.total_rows == 12
    assert dataset.selected_source_rows == "2,4-5,7"


def test_rows_override_limit(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    assert sources(load_dataset(path, rows="10,11", limit=2)) == [10, 11]


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_rows_beyond_the_file_are_listed(tmp_path, fmt):
    path = WRITERS[fmt](tmp_path / f"rows.{fmt}", ROWS)
    with pytest.raises(ConfigError) as info:
        load_dataset(path, rows="1,11-13,20,30-40")
    assert "rows 12-13,20,30-40 are beyond the end" in str(info.value)
    assert "has 12 rows (0-11)" in str(info.value)


def test_huge_range_is_rejected_without_expanding_it(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    with pytest.raises(ConfigError, match="rows 12-999999999999 are beyond"):
        load_dataset(path, rows="0-999999999999")


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_limit_keeps_the_first_rows_and_counts_all(tmp_path, fmt):
    path = WRITERS[fmt](tmp_path / f"rows.{fmt}", ROWS)
    dataset = load_dataset(path, limit=3)
    assert sources(dataset) == [0, 1, 2]
    assert dataset.total_rows == 12


@pytest.mark.parametrize("limit", [None, 0, -5, 100])
def test_non_positive_or_large_limit_keeps_every_row(tmp_path, limit):
    path = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    assert len(load_dataset(path, limit=limit).items) == 12


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_only_selected_rows_are_normalised(tmp_path, fmt):
    rows = [dict(row) for row in ROWS]
    rows[5]["user_prompt"] = ""  # would fail normalisation if selected
    path = WRITERS[fmt](tmp_path / f"rows.{fmt}", rows)
    dataset = load_dataset(path, rows="4,6")
    assert sources(dataset) == [4, 6]
    assert dataset.total_rows == 12


def test_unselected_jsonl_lines_are_counted_but_not_parsed(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n{broken\n", encoding="utf-8")
    dataset = load_dataset(path, limit=1)
    assert dataset.total_rows == 2


def test_parquet_only_selected_rows_are_normalised(tmp_path):
    rows: list[dict[str, Any]] = [dict(row) for row in ROWS]
    rows[5]["user_prompt"] = None
    path = write_parquet(tmp_path / "rows.parquet", rows, row_group_size=4)
    dataset = load_dataset(path, rows="4,6,11")
    assert sources(dataset) == [4, 6, 11]
    assert dataset.total_rows == 12


def test_empty_file_is_an_empty_selection(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="no rows to evaluate"):
        load_dataset(path)
    with pytest.raises(ConfigError, match="dataset .* is empty"):
        load_dataset(path, rows="0")
