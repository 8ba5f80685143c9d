"""A running gateway keeps its token and its upstream key out of every log record of the
package, not only out of its own lines."""

from __future__ import annotations

import logging

import pytest

from osmosis_ai._log_redaction import active_redactor
from osmosis_ai.gateway import Gateway, OpenAICompatiblePolicy
from osmosis_ai.testing import ChatStub
from tests.gateway.conftest import PROVIDER_KEY


async def test_gateway_keys_are_scrubbed_from_package_logs_while_it_runs(
    stub: ChatStub, caplog: pytest.LogCaptureFixture
) -> None:
    policy = OpenAICompatiblePolicy(stub.base_url, api_key=PROVIDER_KEY, timeout_sec=5)
    async with Gateway(policy) as gateway:
        # E.g. a workflow's client library logging its configuration through our logger.
        logging.getLogger("osmosis_ai.rollout.integrations").warning(
            "client made with %s, key %s", gateway.token, PROVIDER_KEY
        )
    assert caplog.messages == ["client made with [REDACTED], key [REDACTED]"]
    assert not {gateway.token, PROVIDER_KEY} & set(active_redactor().secrets)
