"""The gateway's APIs served by both kinds of local policy: the embedded model (llama.cpp)
and the torch engine (a tiny random Llama with the embedded model's tokenizer)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from osmosis_ai.gateway import EmbeddedPolicy, Gateway, Policy, TorchPolicy
from tests.train.conftest import tiny_model_dir, tokenizer_dir  # noqa: F401 -- fixtures

#: A calculator tool, as each API declares a function tool.
PARAMETERS = {
    "type": "object",
    "properties": {"expression": {"type": "string"}},
    "required": ["expression"],
}
DESCRIPTION = "Evaluate an arithmetic expression."


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["embedded", "torch"])
async def gateway(
    request: pytest.FixtureRequest,
    tiny_model_dir: Path,  # noqa: F811
) -> AsyncIterator[Gateway]:
    """A running gateway over the embedded model, then over the torch engine."""
    policy: Policy = (
        EmbeddedPolicy() if request.param == "embedded" else TorchPolicy(tiny_model_dir)
    )
    async with Gateway(policy) as running:
        yield running
