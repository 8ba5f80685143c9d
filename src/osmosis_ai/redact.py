"""Redaction of secrets for all of osmosis_ai: logs, previews, diagnostics, errors, gateway.

Text rules; each reads the original text, and what they match is merged and replaced:

1. every occurrence of a configured secret, whatever its length, becomes ``[REDACTED]``;
2. ``Bearer <token>`` / ``Basic <token>`` (any case): the token becomes ``[REDACTED]`` and the
   scheme word is kept as written;
3. an assignment ``<name>=<value>`` or ``<name>: <value>`` whose name says it holds a
   credential (`is_credential_key`: ``password``, ``passwd``, ``DB_PASSWORD_PROD``,
   ``accessToken``, ``X-Api-Key``... but not ``max_tokens``, ``token_count`` or
   ``InvalidTokenError``): the value becomes ``[REDACTED]``, a bracketed value (``[...]``,
   ``{...}``, ``(...)``) up to its closing bracket. Together with rule 2,
   ``Authorization: Bearer x`` therefore becomes ``Authorization: [REDACTED] [REDACTED]``;
4. URL credentials ``scheme://user:pass@`` become ``scheme://[REDACTED]@``.

JSON-like data is walked instead: the value of a key that names a credential (the same
`is_credential_key`) becomes ``"[REDACTED]"``, a string containing a configured secret is
replaced whole, and every other string and key gets the text rules. So the text of dumped data
and the data itself lose the same values. Redaction only ever deletes text and inserts the
marker, and redacting twice gives the same result as redacting once.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "REDACTED",
    "RedactingFilter",
    "Redactor",
    "credential_env_values",
    "is_credential_key",
    "normalize_secrets",
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
# A scheme word glued to a word is none (`mybearer`), nor to a marker, which stands for one:
# otherwise `<secret>Bearer x` would be redacted differently the second time.
_AUTH_SCHEME_SOURCE = (
    r"(?:bearer|basic)(?<!\wbearer)(?<!\wbasic)(?<!\[redacted\]bearer)(?<!\[redacted\]basic)"
    r"\s+([^\s\"',;]+)"
)
_AUTH_SCHEME = re.compile(_AUTH_SCHEME_SOURCE)
_AUTH_SCHEME_ANY_CASE = re.compile(_AUTH_SCHEME_SOURCE, re.IGNORECASE)

# Assignments are found from their separator by scanning the reversed text: there the
# identifier follows the separator, so each candidate costs one pass over its identifier and the
# whole scan stays linear (a forward pattern has to retry inside long identifiers). The optional
# quote between identifier and separator catches `"password": "x"` and `{'api_key': 'x'}`.
# The scan finds identifiers containing a credential word; `is_credential_key` then decides, so
# the text rules and JSON-like data share one vocabulary: `DB_PASSWORD_PROD=` and
# `GITHUB_TOKEN_RW:` are redacted while `max_tokens: 512`, `MaxTokensReachedException: Model ...`
# and a logger's `..._max_tokens_reached: message` stay readable.
_ASSIGNMENT_WORDS_REVERSED = (
    "nekot", "terces", "drowssap", "dwssap", "laitnederc", "noitazirohtua",
    r"yek[_-]*+(?:ipa|ssecca|etavirp)",
)  # fmt: skip
_ASSIGNMENT_HINTS = (
    "api", "authorization", "password", "passwd", "credential", "secret", "token", "key",
)  # fmt: skip
_ASSIGNMENT_HEAD_REVERSED_SOURCE = (
    r"[=:][ \t]*+[\"']?+(?=[\w-]*?(?:" + "|".join(_ASSIGNMENT_WORDS_REVERSED) + r"))([\w-]++)"
)
_ASSIGNMENT_HEAD_REVERSED = re.compile(_ASSIGNMENT_HEAD_REVERSED_SOURCE)
_ASSIGNMENT_HEAD_REVERSED_ANY_CASE = re.compile(_ASSIGNMENT_HEAD_REVERSED_SOURCE, re.IGNORECASE)
# An existing marker is matched whole first, so `api_key=[REDACTED]` stays as it is.
_ASSIGNMENT_VALUE = re.compile(
    r"""[ \t]*+(\[REDACTED\]|"(?:[^"\\\r\n]|\\.)*+"|'(?:[^'\\\r\n]|\\.)*+'|[^\s,;\]}]++)"""
)
# A value opening a bracket (`token: ["a", "b"]`, a dumped dict) is hidden up to its closing
# bracket, quoted strings skipped, so no element survives; an unclosed one runs to the end.
_CONTAINER_TOKEN = re.compile(
    r"""[\[\]{}()]|"(?:[^"\\]|\\.)*+"|'(?:[^'\\]|\\.)*+'|["']""", re.DOTALL
)

# Anchored on "://" (a fast literal scan). The userinfo run is greedy so that an unencoded '@'
# inside a password is covered up to the last '@' of the authority.
_URL_USERINFO = re.compile(r"://(?<=[a-z0-9+.-]://)([^\s/?#\"'<>]*)@", re.IGNORECASE)

# --- the credential vocabulary ----------------------------------------------------------------
# A name is split into segments (camelCase, `_`, `-`); trailing qualifiers are dropped; the last
# segment must then name a credential (end with a word, digits allowed after it: `accesstoken`,
# `password1`) or close a pair such as `api key`.
_CAMEL_ACRONYM = re.compile(r"([A-Z]+)([A-Z][a-z])")
_CAMEL_WORD = re.compile(r"([a-z0-9])([A-Z])")
_NAME_SEGMENTS = re.compile(r"[_-]+")
_NAME_REVERSED = re.compile(r"[\w-]*")
_CREDENTIAL_WORDS = (
    "token", "secret", "password", "passwd", "credential", "credentials", "authorization",
    "apikey", "accesskey", "privatekey", "secretkey",
)  # fmt: skip
_PAIR_FIRST_WORDS = frozenset({"api", "access", "private", "secret"})
# Words that say which copy of a credential a name holds, not what it is: `DB_PASSWORD_PROD`,
# `GITHUB_TOKEN_RW`, `AWS_ACCESS_KEY_ID`. Any other last word makes the name describe the
# credential instead (`token_count`, `secret_santa`, `api_key_env`).
_QUALIFIERS = frozenset(
    {
        "prod", "production", "dev", "development", "staging", "stage", "test", "qa", "live",
        "sandbox", "local", "ci", "rw", "ro", "read", "write", "readonly", "admin", "id", "old",
        "new", "current", "previous", "primary", "secondary", "backup", "confirm",
        "confirmation", "value", "raw", "b64", "base64",
    }
)  # fmt: skip
_VERSION = re.compile(r"v?[0-9]+")

_Span = tuple[int, int]


#: Environment variable names that mark their value as a credential.
_CREDENTIAL_ENV_NAME = re.compile(
    r".+_(API_KEY|TOKEN|SECRET|PASSWORD|CREDENTIALS)|.*_ACCESS_KEY.*", re.IGNORECASE
)
#: Shorter values are not taken for credentials: scrubbing ``1`` or ``true`` from everything
#: written would garble it, and no real key is that short.
_MIN_CREDENTIAL_LENGTH = 8


def credential_env_values(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The values of the variables in ``environ`` whose names mark them as credentials
    (``*_API_KEY``, ``*_TOKEN``, ``*_SECRET``, ``*_PASSWORD``, ``*_ACCESS_KEY*``,
    ``*_CREDENTIALS``) and that are at least 8 characters long: a run treats them as its
    secrets whether or not it passes them on, since a workflow can read its environment."""
    return tuple(
        value
        for name, value in environ.items()
        if len(value) >= _MIN_CREDENTIAL_LENGTH and _CREDENTIAL_ENV_NAME.fullmatch(name)
    )


def normalize_secrets(secrets: Iterable[str]) -> tuple[str, ...]:
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


def _replace_spans(text: str, spans: list[_Span], quoted: frozenset[_Span] = frozenset()) -> str:
    """Replace each span by the marker, merging spans that overlap so no fragment survives.

    A merged span that is exactly one of ``quoted`` (an assignment's quoted value) keeps its
    quotes: ``password="[REDACTED]"``.
    """
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
        if (current_start, current_end) in quoted and value[0] in "\"'" and value[-1] == value[0]:
            pieces.append(value[0] + REDACTED + value[0])
        else:
            pieces.append(REDACTED)
        position = current_end
        current_start, current_end = start, end
    pieces.append(text[position:])
    return "".join(pieces)


def _secret_spans(text: str, secrets: tuple[str, ...]) -> list[_Span]:
    """Where the secrets occur, as sorted spans that do not overlap.

    Occurrences are collected for every secret and merged, so overlapping secrets leave no
    fragment behind; for nested secrets this equals replacing the longest first.
    """
    spans: list[_Span] = []
    for secret in secrets:
        start = text.find(secret)
        while start >= 0:
            spans.append((start, start + len(secret)))
            start = text.find(secret, start + 1)
    if not spans:
        return spans
    merged: list[_Span] = []
    for start, end in sorted(_outside_markers(text, spans)):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _scrub_secrets(text: str, secrets: tuple[str, ...]) -> str:
    return _replace_spans(text, _secret_spans(text, secrets))


def _names_credential(text: str, start: int, end: int, secret_spans: list[_Span]) -> bool:
    """Whether ``text[start:end]`` names a credential as written, or as what is left of it
    after the secrets (``_secret_spans`` of ``text``) are scrubbed: redacting again sees that,
    and must not find a credential the first pass missed."""
    if is_credential_key(text[start:end]):
        return True
    index = bisect_left(secret_spans, (end,)) - 1
    if index < 0 or secret_spans[index][1] <= start:
        return False
    return is_credential_key(text[secret_spans[index][1] : end])


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


def _auth_scheme_spans(text: str, lowered: str | None) -> list[_Span]:
    if lowered is None:
        matches = _AUTH_SCHEME_ANY_CASE.finditer(text)
    else:
        matches = _AUTH_SCHEME.finditer(lowered)
    return [match.span(1) for match in matches]


def _container_end(text: str, start: int) -> int:
    """Where the bracketed value opening at ``start`` closes; the text's end if it never does."""
    depth = 0
    for token in _CONTAINER_TOKEN.finditer(text, start):
        found = token.group()
        if found in ('"', "'"):
            break  # an unclosed quote: everything after it may belong to the value
        if found in ("[", "{", "("):
            depth += 1
        elif found in ("]", "}", ")"):
            depth -= 1
            if depth == 0:
                return token.end()
    return len(text)


def _assignment_spans(text: str, lowered: str | None, secret_spans: list[_Span]) -> list[_Span]:
    if lowered is not None and not any(word in lowered for word in _ASSIGNMENT_HINTS):
        # Substring checks are far cheaper than the scan on separator-dense text such as JSON.
        return []
    if lowered is None:
        heads = list(_ASSIGNMENT_HEAD_REVERSED_ANY_CASE.finditer(text[::-1]))
    else:
        heads = list(_ASSIGNMENT_HEAD_REVERSED.finditer(lowered[::-1]))
    size = len(text)
    spans: list[_Span] = []
    hidden_until = 0
    # In text order, so that the assignments inside a hidden container are skipped and each
    # character is scanned for brackets at most once.
    for head in reversed(heads):
        name_start, name_end, value_start = (
            size - head.end(1),
            size - head.start(1),
            size - head.start(),
        )
        if value_start < hidden_until:
            continue
        if not _names_credential(text, name_start, name_end, secret_spans):
            continue
        value = _ASSIGNMENT_VALUE.match(text, value_start)
        if value is None:
            continue
        start, end = value.span(1)
        if text[start] in "[{(" and value.group(1) != REDACTED:
            end = hidden_until = _container_end(text, start)
        spans.append((start, end))
    return spans


def _url_spans(text: str) -> list[_Span]:
    spans = []
    for match in _URL_USERINFO.finditer(text):
        colon = match.group(1).find(":")
        if 0 <= colon < len(match.group(1)) - 1:  # a password, not just a user name
            spans.append(match.span(1))
    return spans


def _redact_text(text: str, secrets: tuple[str, ...]) -> str:
    # Every rule reads the original text and the spans are merged, so no rule can hide
    # another's match: a secret inside `GITHUB_TOKEN` does not unmask its value, and
    # `Authorization: Bearer x` loses both the scheme word (an assignment's value) and x.
    lowered = _lowered(text)
    secret_spans = _secret_spans(text, secrets) if secrets else []
    assignments = _assignment_spans(text, lowered, secret_spans)
    spans = [
        *secret_spans,
        *_auth_scheme_spans(text, lowered),
        *assignments,
        *_url_spans(text),
    ]
    return _replace_spans(text, spans, frozenset(assignments))


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
            elif _names_credential(key, 0, len(key), _secret_spans(key, secrets)):
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


def _judge_name(name: str) -> bool:
    lowered = name.lower()
    if not any(word in lowered for word in _ASSIGNMENT_HINTS):
        return False  # most names: no need to split
    normalized = _CAMEL_WORD.sub(r"\1_\2", _CAMEL_ACRONYM.sub(r"\1_\2", name)).lower()
    segments = [segment for segment in _NAME_SEGMENTS.split(normalized) if segment]
    while segments and (segments[-1] in _QUALIFIERS or _VERSION.fullmatch(segments[-1])):
        segments.pop()
    if not segments:
        return False
    last = segments[-1].rstrip("0123456789")
    if last.endswith(_CREDENTIAL_WORDS):
        return True
    return last == "key" and len(segments) > 1 and segments[-2] in _PAIR_FIRST_WORDS


# The same few keys (role, content, max_tokens...) are judged over and over; long names, which
# could fill the cache with junk, are judged afresh.
_judge_name_cached = functools.lru_cache(maxsize=4096)(_judge_name)
_MAX_CACHED_NAME = 64


def is_credential_key(key: str) -> bool:
    """Whether a name says its value is a credential: one vocabulary for every redaction.

    Both the text rule for assignments (``name=value``, ``name: value``) and the walk of
    JSON-like data (the value of a mapping key) ask this. The name is the key's last run of
    letters, digits, ``_`` and ``-`` (what an assignment in text shows before its separator),
    split into segments at camelCase humps, ``_`` and ``-``. Trailing qualifiers (digits,
    ``v2``, ``prod``, ``rw``, ``id``, ...) are ignored; the last remaining segment must end with
    ``token``, ``secret``, ``password``, ``passwd``, ``credential(s)``, ``authorization``,
    ``apikey``, ``accesskey``, ``privatekey`` or ``secretkey`` (digits may follow), or be
    ``key`` after ``api``, ``access``, ``private`` or ``secret``.

    Args:
        key: The name as written, e.g. ``"apiKey"``, ``"X-Api-Key"`` or ``"DB_PASSWORD_PROD"``.

    Returns:
        True for ``api_key``, ``clientSecret``, ``awsAccessKeyId``, ``passwd``,
        ``GITHUB_TOKEN_RW`` and the like; False for ``max_tokens``, ``token_count``,
        ``secret_santa`` or ``InvalidTokenError``.
    """
    match = _NAME_REVERSED.match(key[::-1])
    name = match.group()[::-1] if match else ""
    return (_judge_name_cached if len(name) <= _MAX_CACHED_NAME else _judge_name)(name)


def scrub_secrets(text: str, *, secrets: Iterable[str] = ()) -> str:
    """Replace every occurrence of each secret in ``text`` with ``[REDACTED]``, nothing else.

    The narrowest redaction: for records whose other content must stay as it was (saved
    trajectories), where pattern rules would alter legitimate text.
    """
    return _scrub_secrets(text, normalize_secrets(secrets))


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
    return _redact_text(text, normalize_secrets(secrets))


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
    return _redact_value(value, normalize_secrets(secrets))


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
    return _redact_payload(text, normalize_secrets(secrets))


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
        object.__setattr__(self, "secrets", normalize_secrets(self.secrets))

    def __repr__(self) -> str:
        count = len(self.secrets)
        return f"Redactor(<{count} secret{'' if count == 1 else 's'}>)"

    def with_secrets(self, *more: str) -> Redactor:
        """Return a redactor that also scrubs ``more``.

        Args:
            *more: Additional secrets; empty strings are ignored.

        Returns:
            A new redactor; this one (unchanged) when it already scrubs all of ``more``.
        """
        # A rollout's context adds the key its server entry's redactor already holds.
        if all(isinstance(s, str) and (not s or s in self.secrets) for s in more):
            return self
        return Redactor(self.secrets + more)

    def scrub(self, text: str) -> str:
        """Return `scrub_secrets` of ``text`` with this redactor's secrets (no pattern rules).

        Args:
            text: Text whose only possible secrets are the configured ones, such as a message
                the package writes itself.

        Returns:
            The text with every secret replaced by ``[REDACTED]``.
        """
        return _scrub_secrets(text, self.secrets)

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

    def record(self, record: logging.LogRecord) -> None:
        """Redact a log record in place, before any handler formats it.

        The message is formatted (``msg % args``), redacted into ``record.msg`` and
        ``record.args`` is cleared. An attached exception is formatted into ``exc_text``,
        redacted, and the exception itself dropped (``exc_info``), so that no handler can
        render it afresh; ``stack_info`` is redacted too.

        Args:
            record: The record; it is modified.
        """
        try:
            message = record.getMessage()
        except Exception:
            # logging would print the raw arguments to stderr on a bad format string.
            message = f"{record.msg} {record.args!r}"
        record.msg = _redact_text(message, self.secrets)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        record.exc_info = None
        if record.exc_text:
            record.exc_text = _redact_text(record.exc_text, self.secrets)
        if record.stack_info:
            record.stack_info = _redact_text(record.stack_info, self.secrets)


class RedactingFilter(logging.Filter):
    """A logging filter that redacts each record before any handler formats it.

    See `Redactor.record` for what is redacted. Attach it to a handler
    (``handler.addFilter(RedactingFilter(redactor))``) to cover every logger that reaches that
    handler. (The package's own loggers are redacted anyway while a server, gateway or run is
    alive: see ``osmosis_ai._log_redaction``.)

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
        self.redactor.record(record)
        return True
