"""Line numbers of TOML tables and keys, which ``tomllib`` does not report.

A small scanner, not a parser: it runs only on text that ``tomllib`` has already accepted, and
only to point error messages at a line. It tracks the current ``[table]`` header and records
the first line of every ``key =`` it meets, stepping over strings, comments and values that
span lines (arrays, multi-line strings). Keys inside multi-line values are not recorded;
callers fall back to the enclosing key or table.
"""

from __future__ import annotations

import re

__all__ = ["key_lines"]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_TRIPLE_QUOTES = ('"""', "'''")


def key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Map each table and key path to the first (1-based) line where it appears.

    ``[evaluation]`` then ``n = 3`` records ``("evaluation",)`` and ``("evaluation", "n")``;
    a dotted key ``a.b = 1`` also records its prefix ``("a",)``.

    Args:
        text: TOML text that ``tomllib`` accepts.

    Returns:
        Key path (one element per dotted part, quotes removed) to line number.
    """
    lines: dict[tuple[str, ...], int] = {}
    table: tuple[str, ...] = ()
    depth = 0  # brackets and braces still open in a value that spans lines
    open_string: str | None = None  # delimiter of a multi-line string still open
    for number, line in enumerate(text.splitlines(), start=1):
        if open_string is not None or depth > 0:
            depth, open_string = _scan_value(line, 0, depth, open_string)
            continue
        pos = _skip_space(line, 0)
        if pos >= len(line) or line[pos] == "#":
            continue
        if line[pos] == "[":
            # `[table]` or `[[array.of.tables]]`
            pos += 2 if line.startswith("[[", pos) else 1
            parsed = _parse_key(line, pos)
            if parsed is not None:
                table = parsed[0]
                _record(lines, table, number)
            continue
        parsed = _parse_key(line, pos)
        if parsed is None:
            continue
        key, pos = parsed
        _record(lines, table + key, number)
        pos = _skip_space(line, pos)
        if line.startswith("=", pos):
            depth, open_string = _scan_value(line, pos + 1, 0, None)
    return lines


def _record(lines: dict[tuple[str, ...], int], path: tuple[str, ...], number: int) -> None:
    for end in range(1, len(path) + 1):
        lines.setdefault(path[:end], number)


def _skip_space(line: str, pos: int) -> int:
    while pos < len(line) and line[pos] in " \t":
        pos += 1
    return pos


def _parse_key(line: str, pos: int) -> tuple[tuple[str, ...], int] | None:
    """Parse a dotted key at ``pos``; return its parts and the position after it."""
    parts: list[str] = []
    while True:
        pos = _skip_space(line, pos)
        if pos < len(line) and line[pos] in "\"'":
            quote = line[pos]
            end = _string_end(line, pos + 1, quote)
            if end < 0:
                return None
            parts.append(line[pos + 1 : end - 1])
            pos = end
        else:
            match = _BARE_KEY.match(line, pos)
            if match is None:
                return None
            parts.append(match.group())
            pos = match.end()
        pos = _skip_space(line, pos)
        if not line.startswith(".", pos):
            return tuple(parts), pos
        pos += 1


def _string_end(line: str, pos: int, quote: str) -> int:
    """Position just after the closing ``quote`` of a one-line string, or -1."""
    while pos < len(line):
        char = line[pos]
        if char == "\\" and quote == '"':
            pos += 2
            continue
        if char == quote:
            return pos + 1
        pos += 1
    return -1


def _scan_value(line: str, pos: int, depth: int, open_string: str | None) -> tuple[int, str | None]:
    """Scan the rest of a value; return the bracket depth and any multi-line string left open."""
    while pos < len(line):
        if open_string is not None:
            end = _closing_triple(line, pos, open_string)
            if end < 0:
                return depth, open_string
            open_string, pos = None, end
            continue
        char = line[pos]
        if char == "#":
            break
        triple = next((q for q in _TRIPLE_QUOTES if line.startswith(q, pos)), None)
        if triple is not None:
            open_string, pos = triple, pos + 3
        elif char in "\"'":
            end = _string_end(line, pos + 1, char)
            pos = end if end > 0 else len(line)
        else:
            if char in "[{":
                depth += 1
            elif char in "]}":
                depth -= 1
            pos += 1
    return depth, open_string


def _closing_triple(line: str, pos: int, quote: str) -> int:
    """Position after the ``quote`` (three quote characters) that closes a string, or -1."""
    while pos < len(line):
        if quote == '"""' and line[pos] == "\\":
            pos += 2
            continue
        if line.startswith(quote, pos):
            # Up to two quote characters may end the content right before the delimiter.
            end = pos + 3
            while end < len(line) and line[end] == quote[0] and end - pos < 5:
                end += 1
            return end
        pos += 1
    return -1
