"""Per-LLM-call cost of an SDK's Strands integration: ``python _compare_strands.py STUB_URL``.

Runs under either SDK (same API). Prints JSON: the median latency of a raw streamed
``openai`` call and of one ``OsmosisStrandsAgent`` call (construction in a fresh rollout
context, one streamed model call, cleanup) against the same instant stub.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from typing import Any

import openai

from osmosis_ai.rollout import RolloutContext
from osmosis_ai.rollout.integrations.agents.strands import (
    OsmosisRolloutModel,
    OsmosisStrandsAgent,
)

PROMPT: list[Any] = [{"role": "user", "content": "What is 6*7?"}]
WARMUP = 30
CALLS = 300


async def _median_ms(call: Any) -> float:
    for index in range(WARMUP):
        await call(index)
    samples = []
    for index in range(CALLS):
        started = time.perf_counter()
        await call(index)
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


async def main(url: str) -> None:
    raw = openai.AsyncOpenAI(base_url=url, api_key="bench")

    async def raw_call(index: int) -> None:
        stream = await raw.chat.completions.create(model="stub-model", messages=PROMPT, stream=True)
        async for _ in stream:
            pass

    async def strands_call(index: int) -> None:
        context = RolloutContext(chat_completions_url=url, api_key="bench", rollout_id=f"s{index}")
        with context:
            agent = OsmosisStrandsAgent(
                model=OsmosisRolloutModel(), messages=list(PROMPT), callback_handler=None
            )
            await agent.invoke_async()
            cleanups = getattr(context, "run_cleanups", None)  # ours closes its client here
            if cleanups is not None:
                await cleanups()

    result = {"raw_ms": await _median_ms(raw_call), "strands_ms": await _median_ms(strands_call)}
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
