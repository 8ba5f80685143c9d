"""Tests for the redaction rules of osmosis_ai.redact."""

from __future__ import annotations

import copy
import io
import json
import logging
from collections.abc import Iterator

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from osmosis_ai.redact import (
    REDACTED,
    RedactingFilter,
    Redactor,
    credential_env_values,
    is_credential_key,
    redact_payload,
    redact_text,
    redact_value,
)

# --- text rules ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Bearer abc.def-123", "Bearer [REDACTED]"),
        ("curl -H 'Bearer abc' x", "curl -H 'Bearer [REDACTED]' x"),
        ("Basic dXNlcjpwYXNz", "Basic [REDACTED]"),
        ("header bearer abc", "header bearer [REDACTED]"),
        ("BASIC abc;next", "BASIC [REDACTED];next"),
        ('"Bearer abc", ok', '"Bearer [REDACTED]", ok'),
    ],
)
def test_bearer_and_basic_tokens_are_redacted_keeping_the_scheme_word(text, expected):
    assert redact_text(text) == expected


def test_bearer_inside_a_longer_word_is_not_a_scheme():
    assert redact_text("mybearer abc and basically fine") == "mybearer abc and basically fine"


def test_authorization_header_redacts_scheme_and_token():
    assert redact_text("Authorization: Bearer x") == "Authorization: [REDACTED] [REDACTED]"


def test_reference_curl_example_is_reproduced():
    text = "curl -H 'Authorization: Bearer x' https://user:pass@host/x api_key=sk-123"
    assert redact_text(text) == (
        "curl -H 'Authorization: [REDACTED] [REDACTED]' https://[REDACTED]@host/x "
        "api_key=[REDACTED]"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("postgres://admin:hunter2@db:5432/app", "postgres://[REDACTED]@db:5432/app"),
        ("see https://u:p@ss@host/x", "see https://[REDACTED]@host/x"),
        ("git+ssh://me:tok@github.com/x.git", "git+ssh://[REDACTED]@github.com/x.git"),
    ],
)
def test_url_credentials_are_redacted(text, expected):
    assert redact_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "https://user@host/path",
        "ftp://user:@host/",
        "https://host/path?email=a:b@c",
        "https://host:8080/x",
    ],
)
def test_urls_without_a_password_are_left_alone(text):
    assert redact_text(text) == text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("api_key=sk-123", "api_key=[REDACTED]"),
        ("OPENAI_API_KEY = sk-123,next", "OPENAI_API_KEY = [REDACTED],next"),
        ("x-api-key: abc def", "x-api-key: [REDACTED] def"),
        ("ApiKey:abc}", "ApiKey:[REDACTED]}"),
        ("password='hunter 2' rest", "password='[REDACTED]' rest"),
        ('client_secret="a\\"b" rest', 'client_secret="[REDACTED]" rest'),
        ("db_password=abc;x=1", "db_password=[REDACTED];x=1"),
        ("[access_token=abc]", "[access_token=[REDACTED]]"),
        ("credentials:\tabc", "credentials:\t[REDACTED]"),
        ('{"password": "x"}', '{"password": "[REDACTED]"}'),
        ("{'api_key': 'sk'}", "{'api_key': '[REDACTED]'}"),
        ("foo=token=abc", "foo=token=[REDACTED]"),
        ("AWS_SECRET_ACCESS_KEY=wJalr x", "AWS_SECRET_ACCESS_KEY=[REDACTED] x"),
        ("DJANGO_SECRET_KEY=abc", "DJANGO_SECRET_KEY=[REDACTED]"),
        ("OPENAI_API_KEY_2=sk-9", "OPENAI_API_KEY_2=[REDACTED]"),
        ("DB_PASSWORD_PROD=hunter2", "DB_PASSWORD_PROD=[REDACTED]"),
        ("GITHUB_TOKEN_RW: ghp_1", "GITHUB_TOKEN_RW: [REDACTED]"),
        ("password1: p", "password1: [REDACTED]"),
        ("accessToken=abc", "accessToken=[REDACTED]"),
        ("aws_access_key_id=AKIA1", "aws_access_key_id=[REDACTED]"),
        ("token=password:x", "token=[REDACTED]"),
    ],
)
def test_assignments_have_their_value_redacted(text, expected):
    assert redact_text(text) == expected


def test_assignment_without_a_value_or_keyword_is_left_alone():
    text = "session_id=abc user: bob token= \n max_len: 5"
    assert redact_text(text) == text


@pytest.mark.parametrize(
    "text",
    [
        "MaxTokensReachedException: Model stopped generating",
        "InvalidTokenError: signature mismatch",
        "raised SecretStoreException:  vault unreachable",
        "max_tokens: 512, completion_tokens: 42",
        "INFO strands.event_loop._recover_message_on_max_tokens_reached: replacing tool uses",
    ],
)
def test_exception_names_are_not_assignments(text):
    assert redact_text(text) == text


def test_existing_marker_is_kept_as_a_value():
    assert redact_text("api_key=[REDACTED], x") == "api_key=[REDACTED], x"


def test_case_changing_text_still_redacts():
    # "İ" lower-cases to two characters; the case-insensitive fallback must still apply.
    text = "İstanbul TOKEN=abc BEARER xyz"
    assert redact_text(text) == "İstanbul TOKEN=[REDACTED] BEARER [REDACTED]"


def test_plain_text_is_unchanged():
    text = "The model said 42, then: done. Tokens used = 17"
    assert redact_text("The model said 42, then: done.") == "The model said 42, then: done."
    assert redact_text(text) == "The model said 42, then: done. Tokens used = 17"


# --- configured secrets ----------------------------------------------------------------------


def test_secret_inside_a_longer_string_is_redacted_as_a_substring_in_text_mode():
    assert redact_text("prefix-sk-live-123-suffix", secrets=["sk-live-123"]) == (
        "prefix-[REDACTED]-suffix"
    )


def test_short_configured_secret_is_still_scrubbed():
    assert redact_text("a xyz b xyzxyz", secrets=("xyz",)) == "a [REDACTED] b [REDACTED]"


def test_empty_secret_is_ignored():
    assert redact_text("abc", secrets=("",)) == "abc"


def test_longest_secret_wins_and_overlaps_leave_no_fragment():
    assert redact_text("abcdef", secrets=("abc", "abcdef")) == REDACTED
    assert redact_text("xabcdefx", secrets=("abcd", "cdef")) == "x[REDACTED]x"


def test_secret_with_regex_metacharacters_is_matched_literally():
    assert redact_text("a.*b a+b", secrets=(".*",)) == "a[REDACTED]b a+b"


def test_bare_string_as_secrets_is_rejected():
    with pytest.raises(TypeError, match="not a str"):
        redact_text("abc", secrets="abc")


def test_non_string_secret_is_rejected_without_showing_it():
    with pytest.raises(TypeError) as excinfo:
        redact_text("abc", secrets=[b"hunter2"])  # type: ignore[list-item]
    assert "hunter2" not in str(excinfo.value)


# --- idempotence -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "curl -H 'Authorization: Bearer x' https://user:pass@host/x api_key=sk-123",
        'password="a b" token=c Basic d',
        "RED is a secret, and so is [REDACTED]",
        "https://token:abc@host token=https://u:p@h",
    ],
)
def test_redacting_twice_equals_redacting_once(text):
    once = redact_text(text, secrets=("RED", "sk-123"))
    assert redact_text(once, secrets=("RED", "sk-123")) == once


_FRAGMENTS = st.sampled_from(
    [
        "token",
        "Password",
        "api-key",
        "=",
        ":",
        " ",
        "\t",
        "\n",
        '"',
        "'",
        "\\",
        ",",
        ";",
        "]",
        "}",
        "{",
        "@",
        "/",
        "https://",
        "Bearer",
        "basic",
        "x",
        "7",
        "[",
        "(",
        "_",
        "Key",
        "TOKEN",
        REDACTED,
    ]
)


@given(st.lists(_FRAGMENTS, max_size=30).map("".join))
def test_redaction_is_idempotent_on_rule_heavy_text(text):
    once = redact_text(text, secrets=("x7", "TOKEN"))
    assert redact_text(once, secrets=("x7", "TOKEN")) == once


@given(prefix=st.text(), secret=st.text(min_size=1), suffix=st.text(), repeat=st.booleans())
def test_an_inserted_secret_never_survives(prefix, secret, suffix, repeat):
    # A secret sharing a character with the marker could be re-formed by the marker itself.
    assume(not set(secret) & set(REDACTED))
    text = prefix + secret + suffix + (secret if repeat else "")
    assert secret not in redact_text(text, secrets=[secret])


# --- JSON-like data --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "api_key",
        "apiKey",
        "APIKey",
        "X-Api-Key",
        "apikey",
        "Authorization",
        "password",
        "db_password",
        "clientSecret",
        "credentials",
        "access_token",
        "awsAccessKeyId",
        "AWS_SECRET_ACCESS_KEY",
        "privateKey",
        "OAuthToken",
        "SECRET_KEY",
        "djangoSecretKey",
    ],
)
def test_credential_keys_are_recognised(key):
    assert is_credential_key(key)


@pytest.mark.parametrize(
    "key", ["max_tokens", "tokens", "token_count", "secret_santa", "role", "content", "passwords"]
)
def test_ordinary_keys_are_not_credentials(key):
    assert not is_credential_key(key)


def test_camel_case_json_keys_have_any_value_redacted():
    data = {
        "apiKey": "sk-1",
        "clientSecret": {"nested": True},
        "awsAccessKeyId": 12345,
        "privateKey": None,
        "model": "gpt",
    }
    assert redact_value(data) == {
        "apiKey": REDACTED,
        "clientSecret": REDACTED,
        "awsAccessKeyId": REDACTED,
        "privateKey": REDACTED,
        "model": "gpt",
    }


def test_password_json_payload_is_redacted():
    assert redact_payload('{"password": "x", "user": "bob"}') == (
        '{"password":"[REDACTED]","user":"bob"}'
    )


def test_string_containing_a_secret_is_replaced_whole_in_json_mode():
    payload = json.dumps({"note": "the key sk-live-123 leaked", "n": 1})
    assert json.loads(redact_payload(payload, secrets=["sk-live-123"])) == {
        "note": REDACTED,
        "n": 1,
    }


def test_nested_structures_are_walked():
    data = {
        "messages": [
            {"role": "user", "content": "my api_key=abc"},
            {"role": "tool", "tool_calls": [{"arguments": {"a": 6, "token": "t"}}]},
        ],
        "pair": ("Bearer q", 2.5, True),
        7: "password: p",
    }
    assert redact_value(data) == {
        "messages": [
            {"role": "user", "content": "my api_key=[REDACTED]"},
            {"role": "tool", "tool_calls": [{"arguments": {"a": 6, "token": REDACTED}}]},
        ],
        "pair": ("Bearer [REDACTED]", 2.5, True),
        7: "password: [REDACTED]",
    }


def test_keys_get_the_text_rules():
    assert redact_value({"token=abc": 1, "sk-9": 2}, secrets=["sk-9"]) == {
        "token=[REDACTED]": 1,
        REDACTED: 2,
    }


def test_other_objects_become_their_redacted_str():
    class Holder:
        def __str__(self) -> str:
            return "Holder(api_key=abc, n=1)"

    assert redact_value([Holder()]) == ["Holder(api_key=[REDACTED], n=1)"]


def test_input_is_not_mutated():
    data = {"a": [{"password": "p", "text": "Bearer t"}], "b": ("sk-1",)}
    before = copy.deepcopy(data)
    result = redact_value(data, secrets=["sk-1"])
    assert data == before
    assert result is not data
    assert result["a"] is not data["a"]


def test_non_json_payload_uses_the_text_rules():
    text = "error: {password: hunter2"  # not JSON
    assert redact_payload(text) == "error: {password: [REDACTED]"
    assert redact_payload("Bearer abc") == "Bearer [REDACTED]"


def test_payload_is_reserialised_ascii_only_and_compact():
    assert redact_payload('{"msg": "caf\u00e9 token=1",  "n": [1, 2]}') == (
        '{"msg":"caf\\u00e9 token=[REDACTED]","n":[1,2]}'
    )


# --- Redactor and logging --------------------------------------------------------------------


def test_redactor_normalises_its_secrets():
    redactor = Redactor(("ab", "", "abcd", "ab", "xyz"))
    assert redactor.secrets == ("abcd", "xyz", "ab")
    assert redactor == Redactor(("xyz", "abcd", "ab"))


def test_redactor_repr_hides_secrets():
    redactor = Redactor(("sk-live-123", "hunter2"))
    assert repr(redactor) == "Redactor(<2 secrets>)"
    assert "sk-live" not in str(redactor)
    assert repr(Redactor(("a",))) == "Redactor(<1 secret>)"


def test_redactor_methods_delegate_to_the_functions():
    redactor = Redactor(("k3y",)).with_secrets("s3cret", "")
    assert redactor.secrets == ("s3cret", "k3y")
    assert redactor.text("k3y and s3cret") == "[REDACTED] and [REDACTED]"
    assert redactor.value({"x": "has k3y"}) == {"x": REDACTED}
    assert redactor.payload('["s3cret", "ok"]') == '["[REDACTED]","ok"]'


def test_redactor_scrub_hides_only_the_secrets():
    text = "send 'Authorization: Bearer <gateway token>' not k3y"
    assert (
        Redactor(("k3y",)).scrub(text)
        == "send 'Authorization: Bearer <gateway token>' not [REDACTED]"
    )


@pytest.fixture
def captured_logger() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    handler.addFilter(RedactingFilter(Redactor(("sk-live-123",))))
    logger = logging.getLogger("tests.redact.filter")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield logger, stream
    logger.removeHandler(handler)


def test_logging_filter_redacts_formatted_arguments(captured_logger):
    logger, stream = captured_logger
    logger.info("calling %s with %r", "https://u:p@host", {"key": "sk-live-123"})
    assert stream.getvalue() == "INFO calling https://[REDACTED]@host with {'key': '[REDACTED]'}\n"


def test_logging_filter_redacts_tracebacks(captured_logger):
    logger, stream = captured_logger
    try:
        raise ValueError("bad key sk-live-123")
    except ValueError:
        logger.exception("failed with token=%s", "abc")
    output = stream.getvalue()
    assert "sk-live-123" not in output
    assert "abc" not in output
    assert "ValueError: bad key [REDACTED]" in output


def test_logging_filter_survives_a_bad_format_string(captured_logger):
    logger, stream = captured_logger
    logger.info("%d items", "sk-live-123")
    assert "sk-live-123" not in stream.getvalue()
    assert "[REDACTED]" in stream.getvalue()


# --- one vocabulary for text and JSON-like data ----------------------------------------------


def test_issue_example_is_hidden_by_both_paths():
    text = '{"passwd": "hunter2", "db_password_prod": "x"}'
    assert "hunter2" not in redact_text(text) and '"x"' not in redact_text(text)
    assert redact_value(json.loads(text)) == {"passwd": REDACTED, "db_password_prod": REDACTED}
    assert json.loads(redact_payload(text)) == {"passwd": REDACTED, "db_password_prod": REDACTED}


@pytest.mark.parametrize(
    ("name", "credential"),
    [
        ("passwd", True),
        ("db_password_prod", True),
        ("GITHUB_TOKEN_RW", True),
        ("OPENAI_API_KEY_2", True),
        ("awsAccessKeyId", True),
        ("api__key", True),
        ("db.password", True),
        ("token_count", False),
        ("secret_santa", False),
        ("max_tokens", False),
        ("InvalidTokenError", False),
    ],
)
def test_text_rules_and_json_keys_agree_on_a_name(name, credential):
    text = redact_text(f"{name}=v4lue")
    assert ("v4lue" not in text) is credential
    assert is_credential_key(name) is credential
    assert (redact_value({name: "v4lue"})[name] == REDACTED) is credential


@pytest.mark.parametrize(
    "value", [["a1", "b2"], {"user": "a1", "pin": "b2"}, [["a1"], {"x": ["b2"]}]]
)
def test_a_container_after_a_credential_name_is_hidden_whole_in_text(value):
    for dumped in (json.dumps({"credentials": value}), json.dumps({"token": value}, indent=2)):
        assert "a1" not in redact_text(dumped) and "b2" not in redact_text(dumped)
    assert redact_text("token=(a1, b2) after") == "token=[REDACTED] after"
    assert redact_text("token: [a1, 'b2]' b2") == "token: [REDACTED]"  # unclosed: to the end


def test_an_assignment_inside_a_value_still_hides_its_own_value():
    assert redact_text('token=password:"a b" c') == "token=[REDACTED] c"


def test_a_secret_inside_a_credential_name_does_not_unmask_its_value():
    text = json.dumps({"GITHUB_TOKEN": "v4lue"})
    assert "v4lue" not in redact_text(text, secrets=["TOKEN"])
    assert redact_value({"GITHUB_TOKEN": "v4lue"}, secrets=["TOKEN"]) == {
        "GITHUB_[REDACTED]": REDACTED
    }


_NAME_SEGMENTS = st.sampled_from(
    ["api", "key", "token", "tokens", "secret", "password", "passwd", "access", "private",
     "credentials", "authorization", "id", "prod", "rw", "2", "count", "max", "db", "client",
     "santa", "error", "user", "note"]
)  # fmt: skip


def _join_name(segments: list[str], joiner: str, upper: bool) -> str:
    if joiner == "camel":
        name = segments[0] + "".join(segment.capitalize() for segment in segments[1:])
    else:
        name = joiner.join(segments)
    return name.upper() if upper else name


_NAMES = st.builds(
    _join_name,
    st.lists(_NAME_SEGMENTS, min_size=1, max_size=3),
    st.sampled_from(["_", "-", "__", "camel"]),
    st.booleans(),
)
_LEAF_KINDS = st.sampled_from(
    ["plain", "number", "secret", "with_secret", "bearer", "assignment", "url", "null", "bool"]
)


def _containers(children: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(children, max_size=3) | st.dictionaries(_NAMES, children, max_size=3)


_TREES = st.recursive(_LEAF_KINDS, _containers, max_leaves=12)
# Secrets start with a capital letter and hold no lower-case letter, so none is part of a
# marker, a number or a JSON literal; they may be part of a key written in capitals.
_SECRETS = st.lists(st.from_regex(r"[A-Z][A-Z0-9]{3,7}", fullmatch=True), max_size=2)


def _materialize(tree, secrets: list[str], markers: list[str]):
    """Replace each leaf kind by a value; every marker planted is recorded in ``markers``."""
    if isinstance(tree, list):
        return [_materialize(item, secrets, markers) for item in tree]
    if isinstance(tree, dict):
        return {key: _materialize(item, secrets, markers) for key, item in tree.items()}
    if tree == "null":
        return None
    if tree == "bool":
        return True
    if tree in ("secret", "with_secret") and secrets:
        secret = secrets[len(markers) % len(secrets)]
        return secret if tree == "secret" else f"note {secret} end"
    number = 90_000_000 + len(markers)
    marker = f"mk{len(markers):04d}q"  # same length: no marker is part of another
    markers.append(str(number) if tree == "number" else marker)
    if tree == "number":
        return number
    return {
        "bearer": f"Bearer {marker}",
        "assignment": f"api_key={marker}",
        "url": f"https://user:{marker}@host/x",
    }.get(tree, marker)


@given(tree=_TREES, secrets=_SECRETS, indent=st.sampled_from([None, 2]))
def test_text_and_structured_paths_hide_the_same_values(tree, secrets, indent):
    markers: list[str] = []
    data = _materialize(tree, secrets, markers)
    dumped = json.dumps(data, indent=indent)
    by_text = redact_text(dumped, secrets=secrets)
    structured = redact_value(data, secrets=secrets)
    by_structure = json.dumps(structured)
    assert json.loads(redact_payload(dumped, secrets=secrets)) == json.loads(by_structure)
    for marker in markers:
        assert (marker in by_text) == (marker in by_structure), (marker, by_text, by_structure)
    for secret in secrets:
        assert secret not in by_text and secret not in by_structure


def test_redactor_with_secrets_it_already_scrubs_is_itself():
    redactor = Redactor(("k3y",))
    assert redactor.with_secrets("k3y", "") is redactor
    wider = redactor.with_secrets("k3y", "s3cret")
    assert wider is not redactor and wider.secrets == ("s3cret", "k3y")
    with pytest.raises(TypeError):
        redactor.with_secrets(None)  # type: ignore[arg-type]


def test_credentials_in_the_environment_are_told_by_their_names() -> None:
    environ = {
        "OPENAI_API_KEY": "sk-0123456789",
        "GITHUB_TOKEN": "ghp_abcdefgh",
        "DB_PASSWORD": "hunter2hunter2",
        "APP_SECRET": "s3cr3t-value",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI",
        "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7",
        "GCP_CREDENTIALS": '{"type": "service"}',
        "CI_JOB_TOKEN": "short",  # too short to be scrubbed from everything
        "PATH": "/usr/local/bin:/usr/bin",
        "TOKENIZERS_PARALLELISM": "false-ish-value",
        "MAX_TOKENS": "12345678",  # a count of tokens, no token
        "API_KEY": "no-prefix-value",  # no service named: not the pattern
    }
    assert set(credential_env_values(environ)) == {
        "sk-0123456789", "ghp_abcdefgh", "hunter2hunter2", "s3cr3t-value", "wJalrXUtnFEMI",
        "AKIAIOSFODNN7", '{"type": "service"}',
    }  # fmt: skip
