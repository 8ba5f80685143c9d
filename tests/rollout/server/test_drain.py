"""Shutdown: a SIGTERM'd server finishes or cancels every rollout and delivers every result."""

from __future__ import annotations

import asyncio
import signal

import httpx2

from osmosis_ai.rollout import RolloutStatus
from osmosis_ai.rollout.client import RolloutClient
from tests.rollout.server.conftest import CHAT_URL, PROMPT, start_server_process

# uvicorn re-raises the signal it shut down for once it is done, so the exit status of a
# graceful SIGTERM shutdown is "terminated by SIGTERM".
_GRACEFUL = (0, -signal.SIGTERM)


async def test_sigterm_with_fifty_rollouts_in_flight_ends_every_one_terminal() -> None:
    process, url = await start_server_process(drain_timeout_sec=1.0)
    try:
        async with RolloutClient(url=url) as client:
            # Half finish within the drain window, half would take far longer.
            handles = [
                await client.run_rollout(
                    PROMPT, CHAT_URL, f"r{i}", label="42", metadata={"delay": 0.3 if i % 2 else 60}
                )
                for i in range(50)
            ]
            for handle in handles:
                await handle.wait_for_running()
            process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.1)
            async with httpx2.AsyncClient() as http:
                refused = await http.post(
                    f"{url}/rollout",
                    json={
                        "rollout_id": "late",
                        "initial_messages": PROMPT,
                        "chat_completions_url": CHAT_URL,
                    },
                )
            async with asyncio.timeout(30):
                results = await asyncio.gather(*handles)
        async with asyncio.timeout(30):
            code = await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
    assert refused.status_code == 503
    statuses = [result.status for result in results]
    assert statuses[1::2] == [RolloutStatus.SUCCESS] * 25
    assert statuses[0::2] == [RolloutStatus.CANCELLED] * 25
    assert results[0].err_message == "cancelled: the rollout server is shutting down"
    assert code in _GRACEFUL


async def test_sigterm_on_an_idle_server_exits_promptly() -> None:
    process, _ = await start_server_process(drain_timeout_sec=10)
    process.send_signal(signal.SIGTERM)
    async with asyncio.timeout(10):
        assert await process.wait() in _GRACEFUL
