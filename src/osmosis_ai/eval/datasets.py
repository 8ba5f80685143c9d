"""Dataset files (CSV, JSONL, Parquet): streaming, row selection and row normalisation."""

from __future__ import annotations

import bisect
import contextlib
import csv
import functools
import hashlib
import json
import re
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from osmosis_ai._extras import import_optional
from osmosis_ai.errors import ConfigError, DatasetRowError
from osmosis_ai.rollout.dataset import normalize_dataset_row
from osmosis_ai.rollout.nesting import MAX_JSON_DEPTH, nests_deeper_than

__all__ = [
    "DATASET_FORMATS",
    "Dataset",
    "DatasetItem",
    "format_rows",
    "load_dataset",
    "parse_rows",
]

#: File extensions a dataset may have (compared case-insensitively).
DATASET_FORMATS = ("csv", "jsonl", "parquet")

_ROWS_SELECTOR = re.compile(r"\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*")
_CSV_FIELD_LIMIT = 16 * 1024 * 1024
_PARQUET_BATCH_ROWS = 1024
_HASH_CHUNK = 1024 * 1024

#: Inclusive ``(first, last)`` source row ranges, sorted and disjoint.
_Ranges = list[tuple[int, int]]


@dataclass(frozen=True)
class DatasetItem:
    """One selected, normalised dataset row."""

    row_index: int
    """Position within the selected rows (0-based); the index the platform sees."""

    source_row_index: int
    """Offset of the row in the file (0-based, header and blank lines not counted)."""

    prompt: list[dict[str, Any]]
    """Initial chat messages: the system prompt (if any), then the user prompt (if any)."""

    label: str | None
    """The expected answer passed to the grader, if the row has one."""

    metadata: dict[str, Any] | None
    """The row's metadata object, if it has a non-empty one."""

    error: str | None = None
    """Why this row cannot be sent (named by file, line and row); it then fails alone."""


@dataclass(frozen=True)
class Dataset:
    """The selected rows of a dataset file, and what identifies the file."""

    path: Path
    """The file the rows were read from."""

    sha256: str
    """Hex SHA-256 of the file's bytes."""

    total_rows: int
    """Number of rows in the whole file, selected or not."""

    items: list[DatasetItem]
    """The selected rows in file order."""

    @property
    def selected_source_rows(self) -> str:
        """The selected source rows in selector syntax, e.g. ``"0-9,12"``."""
        return format_rows(item.source_row_index for item in self.items)

    def work_items(self, n: int) -> list[tuple[int, int]]:
        """Every ``(row_index, run_index)`` of ``n`` runs per selected row, in order."""
        return [(item.row_index, run) for item in self.items for run in range(n)]


def parse_rows(spec: str) -> list[int]:
    """Parse a source-row selector such as ``3,7,10-20`` (ranges are inclusive).

    Args:
        spec: Comma-separated row indices and ``first-last`` ranges, without spaces.

    Returns:
        The selected indices, sorted and without duplicates.

    Raises:
        ConfigError: ``spec`` is not a selector, or a range ends before it starts.
    """
    return [index for first, last in _parse_ranges(spec) for index in range(first, last + 1)]


def format_rows(indices: Iterable[int]) -> str:
    """Write row indices in selector syntax, merging runs: ``[0, 1, 2, 5]`` -> ``"0-2,5"``.

    Args:
        indices: Row indices, in any order; duplicates are ignored.

    Returns:
        The shortest selector that :func:`parse_rows` reads back as the same rows.
    """
    return _format_ranges(_merge([(index, index) for index in indices]))


def load_dataset(path: Path, *, rows: str | None = None, limit: int | None = None) -> Dataset:
    """Read a dataset file, select rows and normalise each selected row.

    The file is streamed: only the selected rows are kept and normalised, but every row is
    counted for :attr:`Dataset.total_rows`.

    Args:
        path: A ``.csv`` (UTF-8, header required), ``.jsonl`` (one JSON object per non-blank
            line) or ``.parquet`` file (needs the ``eval`` extra for pyarrow).
        rows: Source-row selector (see :func:`parse_rows`); overrides ``limit``.
        limit: Keep the first ``limit`` rows when positive; otherwise keep every row.

    Returns:
        The selected rows, with the file's SHA-256 and total row count.

    Raises:
        ConfigError: The file is missing, unreadable or of an unknown format; the selector
            is invalid or names rows past the end of the file; or nothing is selected.
        DatasetRowError: A selected row cannot be normalised; the message starts with the
            file and names the row and the column.
        MissingExtraError: A Parquet file is read without pyarrow installed.

    A row that is valid but nested past what a rollout request may carry
    (``MAX_JSON_DEPTH``) is kept as an item with an ``error``, so it fails alone.
    """
    extension = path.suffix.lower().lstrip(".")
    if extension not in DATASET_FORMATS:
        raise ConfigError(
            f"dataset {path} has an unsupported format; use a file ending in "
            + ", ".join(f".{ext}" for ext in DATASET_FORMATS)
        )
    ranges: _Ranges | None = None
    if rows is not None:
        ranges = _parse_ranges(rows)
        stop: int | None = ranges[-1][1] + 1
    else:
        stop = limit if limit is not None and limit > 0 else None

    sha256 = _sha256_of(path)
    if extension == "parquet":
        known_total, reader = _parquet_rows(path, stop)
    else:
        known_total, reader = None, (_csv_rows if extension == "csv" else _jsonl_rows)(path)
    with contextlib.closing(reader):
        items, counted = _read_items(path, reader, ranges, stop)
    total = counted if known_total is None else known_total
    if ranges is not None:
        _check_within(path, ranges, total)
    if not items:
        raise ConfigError(f"dataset {path} has no rows to evaluate; add rows to the file")
    return Dataset(path=path, sha256=sha256, total_rows=total, items=items)


def _read_items(
    path: Path, reader: _Rows, ranges: _Ranges | None, stop: int | None
) -> tuple[list[DatasetItem], int]:
    """The selected rows of ``reader`` as items, and how many rows it had (to ``stop``)."""
    items: list[DatasetItem] = []
    counted = 0
    for index, (where, load) in enumerate(reader):
        counted = index + 1
        if not _selected(index, ranges, stop):
            continue
        try:
            row = normalize_dataset_row(load(), row_index=index)
        except DatasetRowError as exc:
            raise _located(f"{path}{where}", exc) from exc
        except RecursionError:  # deeper than the parser reads
            items.append(_too_deep(f"{path}{where}", len(items), index, column=None))
            continue
        if nests_deeper_than(row.metadata, MAX_JSON_DEPTH - 1):
            items.append(_too_deep(f"{path}{where}", len(items), index, column="metadata"))
            continue
        items.append(
            DatasetItem(
                row_index=len(items),
                source_row_index=index,
                prompt=row.prompt,
                label=row.label,
                metadata=row.metadata,
            )
        )
    return items, counted


def _check_within(path: Path, ranges: _Ranges, total: int) -> None:
    beyond = [(max(first, total), last) for first, last in ranges if last >= total]
    if beyond:
        raise ConfigError(
            f"rows {_format_ranges(beyond)} are beyond the end of dataset {path}, which "
            f"has {total} rows (0-{total - 1})"
            if total
            else f"rows {_format_ranges(beyond)} were selected but dataset {path} is empty"
        )


# --- row selection --------------------------------------------------------------------------------


def _parse_ranges(spec: str) -> _Ranges:
    if not _ROWS_SELECTOR.fullmatch(spec):
        raise ConfigError(
            f"row selector {spec!r} is invalid; write source row indices and inclusive ranges "
            "separated by commas, without spaces, e.g. 3,7,10-20"
        )
    ranges: _Ranges = []
    for part in spec.split(","):
        first, _, last = part.partition("-")
        pair = (int(first), int(last or first))
        if pair[1] < pair[0]:
            raise ConfigError(
                f"row selector {spec!r}: range {part} ends before it starts; "
                f"write it as {pair[1]}-{pair[0]}"
            )
        ranges.append(pair)
    return _merge(ranges)


def _merge(ranges: _Ranges) -> _Ranges:
    merged: _Ranges = []
    for first, last in sorted(ranges):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


def _format_ranges(ranges: _Ranges) -> str:
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in ranges)


def _selected(index: int, ranges: _Ranges | None, stop: int | None) -> bool:
    if ranges is None:
        return stop is None or index < stop
    position = bisect.bisect_right(ranges, index, key=_first) - 1
    return position >= 0 and index <= ranges[position][1]


def _first(pair: tuple[int, int]) -> int:
    return pair[0]


def _too_deep(
    where: str, row_index: int, source_row_index: int, *, column: str | None
) -> DatasetItem:
    # Sending it would fail at the rollout server, or deeper still at serialisation, with
    # no row named: it fails alone here, and the other rows run.
    error = DatasetRowError(
        f"{column or 'the row'} nests too deeply: a rollout request may not nest deeper than "
        f"{MAX_JSON_DEPTH} levels and the metadata sits one level down (docs/protocol.md); "
        "flatten it",
        row=source_row_index,
        column=column,
    )
    return DatasetItem(
        row_index=row_index,
        source_row_index=source_row_index,
        prompt=[],
        label=None,
        metadata=None,
        error=str(_located(where, error)),
    )


def _located(where: str, exc: DatasetRowError) -> DatasetRowError:
    located = DatasetRowError(str(exc), row=exc.row, column=exc.column)
    # DatasetRowError's constructor begins the message with "dataset row N"; put the file first.
    located.args = (f"{where}: {exc}",)
    return located


# --- file formats ---------------------------------------------------------------------------------
#
# Each reader yields, for every row of the file in order, a location for error messages and
# a function returning the row. Rows outside the selection are counted but never decoded.

_Rows = Generator[tuple[str, Callable[[], Any]], None, None]


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as file:
            while chunk := file.read(_HASH_CHUNK):
                digest.update(chunk)
    except FileNotFoundError as exc:
        raise ConfigError(f"dataset {path} does not exist") from exc
    except OSError as exc:
        raise ConfigError(f"dataset {path} cannot be read: {exc.strerror}") from exc
    return digest.hexdigest()


def _text_lines(path: Path, file: BinaryIO) -> Iterator[str]:
    # Decoded line by line (not by a text wrapper's buffer) so errors name the right line.
    for number, raw in enumerate(file, start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"dataset {path}, line {number}: not UTF-8 text (byte "
                f"{raw[exc.start]:#04x} at column {exc.start + 1}); save the file as UTF-8"
            ) from exc
        # Editors on Windows may start the file with a byte-order mark.
        yield text.removeprefix("\ufeff") if number == 1 else text


def _jsonl_rows(path: Path) -> _Rows:
    index = 0
    with path.open("rb") as file:
        for line_number, line in enumerate(_text_lines(path, file), start=1):
            if line.strip():
                yield f", line {line_number}", functools.partial(_json_object, line, index)
                index += 1


def _json_object(line: str, index: int) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        # The parser's position only: the line itself may hold secrets.
        raise DatasetRowError(
            f"invalid JSON ({exc.msg} at column {exc.colno}); each non-blank line must be "
            "one JSON object",
            row=index,
        ) from exc


def _csv_rows(path: Path) -> _Rows:
    # The limit is process-wide state of the csv module: raise it for this read only.
    previous = csv.field_size_limit(_CSV_FIELD_LIMIT)
    try:
        with path.open("rb") as file:
            reader = csv.DictReader(_text_lines(path, file))
            try:
                if not reader.fieldnames:
                    raise ConfigError(
                        f"dataset {path} has no header row; the first line must name the "
                        "columns, e.g. user_prompt,ground_truth"
                    )
                line_number = reader.line_num
                for record in reader:
                    # line_num counts physical lines, and a quoted cell may span several.
                    yield f", line {line_number + 1}", record.copy
                    line_number = reader.line_num
            except csv.Error as exc:
                raise ConfigError(
                    f"dataset {path}, line {reader.line_num}: malformed CSV ({exc})"
                ) from exc
    finally:
        csv.field_size_limit(previous)


def _parquet_rows(path: Path, stop: int | None) -> tuple[int, _Rows]:
    pyarrow = import_optional("pyarrow", extra="eval", feature="Parquet datasets")
    parquet = import_optional("pyarrow.parquet", extra="eval", feature="Parquet datasets")
    try:
        file = parquet.ParquetFile(path)
    except pyarrow.ArrowException as exc:
        raise ConfigError(f"dataset {path} is not a readable Parquet file: {exc}") from exc
    total: int = file.metadata.num_rows
    return total, _parquet_batches(path, file, pyarrow.ArrowException, stop)


def _parquet_batches(
    path: Path, file: Any, arrow_error: type[Exception], stop: int | None
) -> _Rows:
    index = 0
    try:
        with contextlib.closing(file):
            for batch in file.iter_batches(batch_size=_PARQUET_BATCH_ROWS):
                for offset in range(batch.num_rows):
                    if stop is not None and index >= stop:
                        return
                    yield "", functools.partial(_parquet_row, batch, offset)
                    index += 1
    except arrow_error as exc:
        raise ConfigError(f"dataset {path}: Parquet row {index} cannot be read: {exc}") from exc


def _parquet_row(batch: Any, offset: int) -> Any:
    return batch.slice(offset, 1).to_pylist()[0]
