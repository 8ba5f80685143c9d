"""The package's log records pass through the secrets registered in this process and the
ambient rollout's key; other loggers' records are left alone."""

from __future__ import annotations

import logging

import pytest

from osmosis_ai._log_redaction import active_redactor, registered_secrets
from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowContext,
    ExecutionRequest,
    LocalBackend,
    RolloutContext,
)

SECRET = "registered-canary-4f1d"
OTHER = "second-canary-9a2c"


def _logged(caplog: pytest.LogCaptureFixture, name: str, *args: object) -> str:
    caplog.clear()
    logging.getLogger(name).warning("seen %s and %s", *args)
    return caplog.text


def test_registered_secrets_are_scrubbed_while_registered(caplog: pytest.LogCaptureFixture):
    with registered_secrets([SECRET]):
        with registered_secrets([SECRET, OTHER]):
            assert SECRET not in _logged(caplog, "osmosis_ai.eval.runner", SECRET, OTHER)
            assert OTHER not in caplog.text
        # Still held by the outer registration; the inner one's own secret is released.
        assert SECRET not in _logged(caplog, "osmosis_ai", SECRET, OTHER)
        assert OTHER in caplog.text
    assert SECRET not in active_redactor().secrets
    assert SECRET in _logged(caplog, "osmosis_ai.gateway", SECRET, OTHER)


def test_other_loggers_are_left_alone(caplog: pytest.LogCaptureFixture):
    with registered_secrets([SECRET]):
        assert SECRET in _logged(caplog, "osmosis_ai_plugin", SECRET, "api_key=x")
        assert "api_key=x" in caplog.text


def test_the_ambient_rollout_key_is_scrubbed(caplog: pytest.LogCaptureFixture):
    with registered_secrets([]), RolloutContext(api_key="rollout-key-77", rollout_id="r1"):
        text = _logged(caplog, "osmosis_ai.rollout.backend.local", "rollout-key-77", "x")
    assert "rollout-key-77" not in text and "seen [REDACTED] and x" in text


def test_tracebacks_and_stacks_are_redacted(caplog: pytest.LogCaptureFixture):
    with registered_secrets([SECRET]):
        try:
            raise ValueError(f"broken near {SECRET}")
        except ValueError:
            logging.getLogger("osmosis_ai.rollout").exception("failed", stack_info=True)
    assert "ValueError: broken near [REDACTED]" in caplog.text
    assert SECRET not in caplog.text
    assert all(record.exc_info is None for record in caplog.records)


def test_disabled_records_are_never_built(caplog: pytest.LogCaptureFixture):
    class Costly:
        def __str__(self) -> str:
            raise AssertionError("a disabled record was formatted")

    caplog.set_level(logging.INFO, logger="osmosis_ai")
    with registered_secrets([SECRET]):
        logging.getLogger("osmosis_ai.rollout").debug("%s", Costly())
    assert caplog.records == []


def test_a_record_that_cannot_be_redacted_is_withheld(caplog: pytest.LogCaptureFixture):
    class Broken:
        def __str__(self) -> str:
            raise RuntimeError(SECRET)

    with registered_secrets([SECRET]):
        logging.getLogger("osmosis_ai.rollout").warning(Broken())
    assert caplog.messages == ["log record withheld: it could not be redacted"]


def test_a_bare_string_is_refused():
    with pytest.raises(TypeError, match="not a str"), registered_secrets("abc"):
        pass


class QuotesTheSecret(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> None:
        raise RuntimeError(f"db rejected {SECRET}")


async def test_a_backend_failure_is_redacted_with_the_registered_secrets(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # What runs a rollout (here a custom harness's LocalBackend) redacts with the secrets of
    # the server or run it serves, not only with the rollout's key.
    backend = LocalBackend(workflow=QuotesTheSecret)
    with registered_secrets([SECRET]):
        result = await backend.run_workflow(ExecutionRequest(id="r1", prompt=[]))
    assert result.err_message == "workflow raised RuntimeError: db rejected [REDACTED]"
    assert result.extra_fields is not None
    assert "RuntimeError: db rejected [REDACTED]" in result.extra_fields["traceback"]
    assert SECRET not in caplog.text
