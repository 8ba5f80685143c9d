"""Redaction of secrets for all of osmosis_ai: logs, previews, diagnostics, errors, gateway.

Text rules, applied in this order:

1. every occurrence of a configured secret, whatever its length, becomes ``[REDACTED]``;
2. ``Bearer <token>`` / ``Basic <token>`` (any case): the token becomes ``[REDACTED]`` and the
   scheme word is kept as written;
3. an assignment ``<identifier>=<value>`` or ``<identifier>: <value>`` whose identifier has a
   segment (split on ``_`` and ``-``, any case) naming a credential: ``token``, ``secret``,
   ``password``, ``passwd``, ``credential(s)``, ``authorization``, ``api key``,
   ``access key``, ``private key`` — alone, ending a segment (``accessToken``) or followed by
   digits (``password1``); names ending in ``Exception``/``Error`` are never credentials. The
   value becomes ``[REDACTED]``. Together with rule 2, ``Authorization: Bearer x`` therefore
   becomes ``Authorization: [REDACTED] [REDACTED]``;
4. URL credentials ``scheme://user:pass@`` become ``scheme://[REDACTED]@``.

JSON-like data is walked instead: the value of a credential-like key (see `is_credential_key`)
becomes ``"[REDACTED]"``, a string containing a configured secret is replaced whole, and every
other string and key gets the text rules. Redaction only ever deletes text and inserts the
marker, and redacting twice gives the same result as redacting once.
"""

from __future__ import annotations

import json
import logging
import re
from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "REDACTED",
    "RedactingFilter",
    "Redactor",
    "is_credential_key",
    "redact_payload",
    "redact_text",
    "redact_value",
    "scrub_secrets",
]

#: The marker that replaces every redacted value.
REDACTED = "[REDACTED]"

# Bearer/Basic and assignments are matched case-sensitively on a lower-cased copy of the text
# (positions line up whenever lower-casing keeps the length, the usual case), because
# re.IGNORECASE disables the literal-prefix scan and makes a 10 KB message several times slower.
# The *_ANY_CASE twins are used for the rare texts whose length lower-casing changes.

# Token = a run of characters other than whitespace, quotes, ',' and ';'. Only the token is
# replaced: the scheme word stays as written, so redaction never introduces text of its own.
_AUTH_SCHEME_SOURCE = r"(?:bearer|basic)(?<!\wbearer)(?<!\wbasic)\s+([^\s\"',;]+)"
_AUTH_SCHEME = re.compile(_AUTH_SCHEME_SOURCE)
_AUTH_SCHEME_ANY_CASE = re.compile(_AUTH_SCHEME_SOURCE, re.IGNORECASE)

# Assignments are found from their separator by scanning the reversed text: there the
# identifier follows the separator, so each candidate costs one pass over its identifier and the
# whole scan stays linear (a forward pattern has to retry inside long identifiers). The optional
# quote between identifier and separator catches `"password": "x"` and `{'api_key': 'x'}`.
# The scan finds identifiers containing a credential word; `_names_a_credential` then decides
# on whole name segments, so `DB_PASSWORD_PROD=` and `GITHUB_TOKEN_RW:` are redacted while
# `max_tokens: 512`, `MaxTokensReachedException: Model ...` and a logger's
# `..._max_tokens_reached: message` stay readable.
_ASSIGNMENT_WORDS = (
    "api_key",
    "api-key",
    "apikey",
    "authorization",
    "password",
    "passwd",
    "credential",
    "secret",
    "token",
    "access_key",
    "access-key",
    "accesskey",
    "private_key",
    "private-key",
    "privatekey",
)
_ASSIGNMENT_HINTS = (
    "api", "authorization", "password", "passwd", "credential", "secret", "token", "key",
)  # fmt: skip
_ASSIGNMENT_HEAD_REVERSED_SOURCE = (
    r"[=:][ \t]*+[\"']?+(?=[\w-]*?(?:"
    + "|".join(re.escape(word[::-1]) for word in _ASSIGNMENT_WORDS)
    + r"))([\w-]++)"
)
# A name segment names a credential when it is one of these words, ends with one
# (`accesstoken`, `apikey`) or is one followed by digits (`password1`).
_CREDENTIAL_SEGMENT_WORDS = (
    "token", "secret", "password", "passwd", "credential", "credentials", "authorization",
    "apikey", "accesskey", "privatekey",
)  # fmt: skip
_CREDENTIAL_SEGMENT_PAIRS = (("api", "key"), ("access", "key"), ("private", "key"))
_NAME_SEGMENTS = re.compile(r"[_-]+")


def _segment_names_credential(segment: str) -> bool:
    return any(
        segment.endswith(word) or (segment.startswith(word) and segment[len(word) :].isdigit())
        for word in _CREDENTIAL_SEGMENT_WORDS
    )


def _names_a_credential(identifier: str) -> bool:
    """Whether an assignment's name says its value is a credential (see above)."""
    name = identifier.lower()
    if name.endswith(("exception", "error")):
        return False
    segments = _NAME_SEGMENTS.split(name)
    if any(_segment_names_credential(segment) for segment in segments):
        return True
    return any(
        (first, second.rstrip("0123456789")) in _CREDENTIAL_SEGMENT_PAIRS
        for first, second in zip(segments, segments[1:], strict=False)
    )


_ASSIGNMENT_HEAD_REVERSED = re.compile(_ASSIGNMENT_HEAD_REVERSED_SOURCE)
_ASSIGNMENT_HEAD_REVERSED_ANY_CASE = re.compile(_ASSIGNMENT_HEAD_REVERSED_SOURCE, re.IGNORECASE)
# An existing marker is matched whole first, so `api_key=[REDACTED]` stays as it is.
_ASSIGNMENT_VALUE = re.compile(
    r"""[ \t]*+(\[REDACTED\]|"(?:[^"\\\r\n]|\\.)*+"|'(?:[^'\\\r\n]|\\.)*+'|[^\s,;\]}]++)"""
)

# Anchored on "://" (a fast literal scan). The userinfo run is greedy so that an unencoded '@'
# inside a password is covered up to the last '@' of the authority.
_URL_USERINFO = re.compile(r"://(?<=[a-z0-9+.-]://)([^\s/?#\"'<>]*)@", re.IGNORECASE)

_CAMEL_ACRONYM = re.compile(r"([A-Z]+)([A-Z][a-z])")
_CAMEL_WORD = re.compile(r"([a-z0-9])([A-Z])")

_CREDENTIAL_WORDS = frozenset(
    {
        "api_key",
        "apikey",
        "authorization",
        "credential",
        "credentials",
        "password",
        "secret",
        "token",
    }
)
_CREDENTIAL_SUFFIXES = tuple(sorted("_" + word for word in _CREDENTIAL_WORDS)) + (
    "access_key",
    "access_key_id",
    "private_key",
    "secret_key",  # beyond the reference: AWS/Django-style SECRET_KEY values
)

_Span = tuple[int, int]


def _normalize_secrets(secrets: Iterable[str]) -> tuple[str, ...]:
    """Deduplicate, drop empty strings and sort longest first (ties in a fixed order)."""
    if isinstance(secrets, str):
        # A bare string would be iterated character by character and scrub every letter.
        raise TypeError("secrets must be an iterable of strings, not a str; pass (secret,)")
    unique: set[str] = set()
    for secret in secrets:
        if not isinstance(secret, str):
            raise TypeError(f"secrets must be str, got {type(secret).__name__}")
        if secret:
            unique.add(secret)
    return tuple(sorted(unique, key=lambda s: (-len(s), s)))


def _replace_spans(text: str, spans: list[_Span], *, keep_quotes: bool) -> str:
    """Replace each span by the marker, merging spans that overlap so no fragment survives."""
    if not spans:
        return text
    spans.sort()
    pieces: list[str] = []
    position = 0
    current_start, current_end = spans[0]
    for start, end in [*spans[1:], (len(text) + 1, len(text) + 1)]:
        if start <= current_end:
            current_end = max(current_end, end)
            continue
        value = text[current_start:current_end]
        pieces.append(text[position:current_start])
        if keep_quotes and len(value) >= 2 and value[0] in "\"'" and value[-1] == value[0]:
            pieces.append(value[0] + REDACTED + value[0])
        else:
            pieces.append(REDACTED)
        position = current_end
        current_start, current_end = start, end
    pieces.append(text[position:])
    return "".join(pieces)


def _scrub_secrets(text: str, secrets: tuple[str, ...]) -> str:
    # Occurrences are collected for every secret and merged, so overlapping secrets leave no
    # fragment behind; for nested secrets this equals replacing the longest first.
    spans: list[_Span] = []
    for secret in secrets:
        start = text.find(secret)
        while start >= 0:
            spans.append((start, start + len(secret)))
            start = text.find(secret, start + 1)
    if spans:
        spans = _outside_markers(text, spans)
    return _replace_spans(text, spans, keep_quotes=False)


def _outside_markers(text: str, spans: list[_Span]) -> list[_Span]:
    # A short secret such as "RED" must not match inside an existing marker, or redacting twice
    # would differ from redacting once.
    marker_starts: list[int] = []
    start = text.find(REDACTED)
    while start >= 0:
        marker_starts.append(start)
        start = text.find(REDACTED, start + len(REDACTED))
    if not marker_starts:
        return spans
    kept = []
    for span_start, span_end in spans:
        index = bisect_right(marker_starts, span_start) - 1
        if index >= 0 and span_end <= marker_starts[index] + len(REDACTED):
            continue
        kept.append((span_start, span_end))
    return kept


def _lowered(text: str) -> str | None:
    lowered = text.lower()
    return lowered if len(lowered) == len(text) else None


def _redact_auth_schemes(text: str) -> str:
    lowered = _lowered(text)
    if lowered is None:
        matches = _AUTH_SCHEME_ANY_CASE.finditer(text)
    else:
        matches = _AUTH_SCHEME.finditer(lowered)
    return _replace_spans(text, [match.span(1) for match in matches], keep_quotes=False)


def _redact_assignments(text: str) -> str:
    lowered = _lowered(text)
    if lowered is not None and not any(word in lowered for word in _ASSIGNMENT_HINTS):
        # Substring checks are far cheaper than the scan on separator-dense text such as JSON.
        return text
    if lowered is None:
        heads = _ASSIGNMENT_HEAD_REVERSED_ANY_CASE.finditer(text[::-1])
    else:
        heads = _ASSIGNMENT_HEAD_REVERSED.finditer(lowered[::-1])
    last = len(text) - 1
    spans: list[_Span] = []
    for head in heads:
        if not _names_a_credential(head.group(1)[::-1]):
            continue
        value = _ASSIGNMENT_VALUE.match(text, last - head.start() + 1)
        if value is not None:
            spans.append(value.span(1))
    return _replace_spans(text, spans, keep_quotes=True)


def _url_repl(match: re.Match[str]) -> str:
    userinfo = match.group(1)
    colon = userinfo.find(":")
    if colon < 0 or colon == len(userinfo) - 1:
        return match.group(0)
    return "://" + REDACTED + "@"


def _redact_text(text: str, secrets: tuple[str, ...]) -> str:
    if secrets:
        text = _scrub_secrets(text, secrets)
    # Bearer/Basic before assignments: the reverse order would hide the scheme word as the
    # assignment value and leave the token itself in place.
    text = _redact_auth_schemes(text)
    text = _redact_assignments(text)
    return _URL_USERINFO.sub(_url_repl, text)


def _redact_value(value: Any, secrets: tuple[str, ...]) -> Any:
    if isinstance(value, str):
        if any(secret in value for secret in secrets):
            return REDACTED
        return _redact_text(value, secrets)
    if value is None or isinstance(value, int | float):
        return value
    if isinstance(value, Mapping):
        result: dict[Any, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                result[key] = _redact_value(item, secrets)
            elif is_credential_key(key):
                result[_redact_text(key, secrets)] = REDACTED
            else:
                result[_redact_text(key, secrets)] = _redact_value(item, secrets)
        return result
    if isinstance(value, list):
        return [_redact_value(item, secrets) for item in value]
    if isinstance(value, tuple):
        return tuple(_redact_value(item, secrets) for item in value)
    return _redact_value(str(value), secrets)


def _redact_payload(text: str, secrets: tuple[str, ...]) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        return _redact_text(text, secrets)
    return json.dumps(_redact_value(data, secrets), ensure_ascii=True, separators=(",", ":"))


def is_credential_key(key: str) -> bool:
    """Whether a mapping key names a credential whose value must be hidden whole.

    The key is normalised first (camelCase to snake_case, ``-`` to ``_``, lower case). It is
    credential-like if it equals, or ends with ``_`` plus, one of ``api_key``, ``apikey``,
    ``authorization``, ``credential``, ``credentials``, ``password``, ``secret``, ``token``; or if
    it ends with ``access_key``, ``access_key_id``, ``private_key`` or ``secret_key``.

    Args:
        key: The key as written, e.g. ``"apiKey"``, ``"X-Api-Key"`` or ``"awsAccessKeyId"``.

    Returns:
        True for ``api_key``, ``clientSecret``, ``awsAccessKeyId``, ``privateKey`` and the like;
        False for ``max_tokens`` or ``secret_santa``.
    """
    normalized = _CAMEL_WORD.sub(r"\1_\2", _CAMEL_ACRONYM.sub(r"\1_\2", key))
    normalized = normalized.replace("-", "_").lower()
    return normalized in _CREDENTIAL_WORDS or normalized.endswith(_CREDENTIAL_SUFFIXES)


def scrub_secrets(text: str, *, secrets: Iterable[str] = ()) -> str:
    """Replace every occurrence of each secret in ``text`` with ``[REDACTED]``, nothing else.

    The narrowest redaction: for records whose other content must stay as it was (saved
    trajectories), where pattern rules would alter legitimate text.
    """
    return _scrub_secrets(text, _normalize_secrets(secrets))


def redact_text(text: str, *, secrets: Iterable[str] = ()) -> str:
    """Apply the text rules: configured secrets, Bearer/Basic tokens, assignments, URL passwords.

    Args:
        text: Any text, e.g. a log message, an error message or a tool result.
        secrets: Values to scrub wherever they occur, whatever their length (the rollout's API
            key is one of them). Empty strings are ignored.

    Returns:
        The text with every match replaced by ``[REDACTED]``; unchanged text is returned as is.

    Raises:
        TypeError: ``secrets`` is a single ``str`` or contains a non-string.
    """
    return _redact_text(text, _normalize_secrets(secrets))


def redact_value(value: Any, *, secrets: Iterable[str] = ()) -> Any:
    """Return a redacted copy of JSON-like data; the input is never mutated.

    Mappings become dicts, lists stay lists and tuples stay tuples. The value of a
    credential-like key (`is_credential_key`) becomes ``"[REDACTED]"`` whatever its type, a
    string containing a configured secret becomes ``"[REDACTED]"`` entirely, and every other
    string and string key gets `redact_text`. Numbers, booleans and None are kept; any other
    object is replaced by its redacted ``str()``.

    Args:
        value: Data to redact, e.g. a message list or a tool call's arguments.
        secrets: Values to scrub, as for `redact_text`.

    Returns:
        New redacted data.

    Raises:
        TypeError: ``secrets`` is a single ``str`` or contains a non-string.
    """
    return _redact_value(value, _normalize_secrets(secrets))


def redact_payload(text: str, *, secrets: Iterable[str] = ()) -> str:
    """Redact a payload that may be JSON.

    Args:
        text: A request or response body, a file's content, or any other text.
        secrets: Values to scrub, as for `redact_text`.

    Returns:
        If ``text`` parses as JSON, the `redact_value` of it re-serialised compactly with
        ``ensure_ascii=True``; otherwise `redact_text` of it.

    Raises:
        TypeError: ``secrets`` is a single ``str`` or contains a non-string.
    """
    return _redact_payload(text, _normalize_secrets(secrets))


@dataclass(frozen=True, repr=False)
class Redactor:
    """A fixed set of secrets bound to the redaction functions.

    Example:
        ``Redactor((api_key,)).text("Authorization: Bearer " + api_key)``

    Its ``repr`` shows only how many secrets it holds, so a redactor can be logged safely.
    """

    secrets: tuple[str, ...] = ()
    """The configured secrets: deduplicated, without empty strings, longest first."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "secrets", _normalize_secrets(self.secrets))

    def __repr__(self) -> str:
        count = len(self.secrets)
        return f"Redactor(<{count} secret{'' if count == 1 else 's'}>)"

    def with_secrets(self, *more: str) -> Redactor:
        """Return a redactor that also scrubs ``more``.

        Args:
            *more: Additional secrets; empty strings are ignored.

        Returns:
            A new redactor; this one is unchanged.
        """
        return Redactor(self.secrets + more)

    def text(self, text: str) -> str:
        """Return `redact_text` of ``text`` with this redactor's secrets.

        Args:
            text: Any text.

        Returns:
            The redacted text.
        """
        return _redact_text(text, self.secrets)

    def value(self, value: Any) -> Any:
        """Return `redact_value` of ``value`` with this redactor's secrets.

        Args:
            value: JSON-like data; it is not mutated.

        Returns:
            New redacted data.
        """
        return _redact_value(value, self.secrets)

    def payload(self, text: str) -> str:
        """Return `redact_payload` of ``text`` with this redactor's secrets.

        Args:
            text: A payload that may be JSON.

        Returns:
            The redacted payload.
        """
        return _redact_payload(text, self.secrets)


class RedactingFilter(logging.Filter):
    """A logging filter that redacts each record before any handler formats it.

    The message is formatted (``msg % args``), redacted into ``record.msg`` and ``record.args``
    is cleared; an attached traceback (``exc_text``) and ``stack_info`` are redacted too.
    Attach it to a handler (``handler.addFilter(RedactingFilter(redactor))``) to cover every
    logger that reaches that handler.

    Args:
        redactor: The redactor holding the secrets to scrub.
    """

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        """Redact ``record`` in place and let it through.

        Args:
            record: The record about to be handled.

        Returns:
            Always True.
        """
        try:
            message = record.getMessage()
        except Exception:
            # logging would print the raw arguments to stderr on a bad format string.
            message = f"{record.msg} {record.args!r}"
        record.msg = self.redactor.text(message)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redactor.text(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redactor.text(record.stack_info)
        return True
