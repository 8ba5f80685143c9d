"""Configured secrets and the rollout's key: the server's own log records are redacted like
its answers, in messages and in tracebacks."""

from __future__ import annotations

import logging
import secrets

import pytest

from osmosis_ai._log_redaction import active_redactor
from osmosis_ai.rollout import LocalBackend, RolloutStatus
from osmosis_ai.rollout.backend.base import CancelDisposition
from osmosis_ai.rollout.server import create_rollout_server
from tests.rollout.server.conftest import CHAT_URL, PROMPT, ServeFactory
from tests.rollout.server.workflows import Behaviours

PASSED = "passed-canary-" + secrets.token_hex(6)
FROM_ENV = "env-canary-" + secrets.token_hex(6)
ROLLOUT_KEY = "rollout-canary-" + secrets.token_hex(6)
CANARIES = (PASSED, FROM_ENV, ROLLOUT_KEY)


@pytest.fixture
def configured_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROBE_DB_PASSWORD", FROM_ENV)
    monkeypatch.setenv("OSMOSIS_ROLLOUT_SECRET_ENV_NAMES", "PROBE_DB_PASSWORD")


def _emitted(caplog: pytest.LogCaptureFixture) -> str:
    """Every record as a handler would print it, traceback included."""
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    return caplog.text + "\n".join(formatter.format(record) for record in caplog.records)


@pytest.mark.usefixtures("configured_env")
async def test_a_raised_error_quoting_the_secrets_is_logged_redacted(
    serve: ServeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="osmosis_ai")
    async with serve(LocalBackend(workflow=Behaviours), secrets=[PASSED]) as server:
        handle = await server.client.run_rollout(
            PROMPT,
            CHAT_URL,
            "r-leak",
            llm_api_key=ROLLOUT_KEY,
            metadata={"do": "leak_secrets", "secret": PASSED, "secret_env": "PROBE_DB_PASSWORD"},
        )
        result = await handle
    assert result.status is RolloutStatus.FAILURE
    assert "db rejected [REDACTED] and [REDACTED]" in (result.err_message or "")
    emitted = _emitted(caplog)
    # The failure was logged, with its traceback, so finding no canary below means something.
    assert "db rejected [REDACTED] and [REDACTED] (key [REDACTED])" in emitted
    assert "Traceback" in emitted
    assert [canary for canary in CANARIES if canary in emitted] == []
    # Registered for the server's lifetime only.
    assert not set(CANARIES) & set(active_redactor().secrets)


class CancelFails(LocalBackend):
    def cancel_rollouts(
        self, ids: list[str] | None = None, prefix: str | None = None, all: bool = False
    ) -> dict[str, CancelDisposition]:
        raise RuntimeError(f"cancel broke near {PASSED} and {FROM_ENV}")


@pytest.mark.usefixtures("configured_env")
async def test_a_logged_backend_traceback_is_redacted(
    serve: ServeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="osmosis_ai")
    async with serve(CancelFails(workflow=Behaviours), secrets=[PASSED]) as server:
        handle = await server.client.run_rollout(
            PROMPT, CHAT_URL, "r-hang", llm_api_key=ROLLOUT_KEY, metadata={"do": "hang"}
        )
        answer = await server.http.post("/rollout/cancel", json={"ids": ["r-hang"]})
        assert answer.status_code == 200
        assert (await handle).status is RolloutStatus.CANCELLED
    emitted = _emitted(caplog)
    assert "cancel broke near [REDACTED] and [REDACTED]" in emitted
    assert [canary for canary in CANARIES if canary in emitted] == []


def test_a_bare_string_as_secrets_is_refused() -> None:
    # Iterated, it would scrub every single letter of it from every answer.
    with pytest.raises(TypeError, match="not a str"):
        create_rollout_server(backend=LocalBackend(workflow=Behaviours), secrets="hunter2")
