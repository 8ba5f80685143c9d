"""A user's own ``uvicorn.run(app)`` closes connections that never finish their headers."""

from __future__ import annotations

import asyncio
import signal

import httpx2
import pytest

from osmosis_ai._serving import HEADER_TIMEOUT_SEC
from tests.rollout.server.conftest import start_server_process
from tests.test_serving import seconds_until_closed_after_partial_headers


@pytest.mark.slow
async def test_user_served_rollout_server_closes_a_connection_slow_to_send_headers() -> None:
    process, url = await start_server_process(drain_timeout_sec=1.0)
    try:
        port = int(url.rsplit(":", 1)[1])
        elapsed = await seconds_until_closed_after_partial_headers(port)
        assert HEADER_TIMEOUT_SEC - 1 <= elapsed <= HEADER_TIMEOUT_SEC + 5
        async with httpx2.AsyncClient(base_url=url) as http:
            assert (await http.get("/health")).status_code == 200
    finally:
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            await process.wait()
