"""Agent-integration figures: added latency per LLM call, and import time.

Run with ``python benchmarks/integrations.py``. An instant OpenAI-compatible stub runs in its
own process on 127.0.0.1. Each integration answers the same one-message prompt with one LLM
call per iteration (no tools), and its per-call latency is compared with a raw ``openai`` SDK
call to the same stub: the difference is what the integration and its framework add. Import
times are measured in fresh interpreters.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import Figure, print_table

HERE = Path(__file__).resolve().parent
PROMPT: list[Any] = [{"role": "user", "content": "What is 6*7?"}]
WARMUP = 50
CALLS = 500
IMPORT_RUNS = 5
TARGET_ADDED_MS = 2.0


async def _latencies(call: Callable[[], Awaitable[object]]) -> list[float]:
    for _ in range(WARMUP):
        await call()
    samples = []
    for _ in range(CALLS):
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def _measure(base_url: str) -> dict[str, float]:
    import openai
    from agents import Runner

    from osmosis_ai.rollout import RolloutContext
    from osmosis_ai.rollout.integrations.agents import openai_agents

    p50: dict[str, float] = {}
    async with openai.AsyncOpenAI(base_url=base_url, api_key="bench") as raw:

        async def raw_call() -> object:
            return await raw.chat.completions.create(model="stub-model", messages=PROMPT)

        async def raw_streamed_call() -> object:
            chunks = await raw.chat.completions.create(
                model="stub-model", messages=PROMPT, stream=True
            )
            return [chunk async for chunk in chunks]

        p50["raw"] = statistics.median(await _latencies(raw_call))
        p50["raw-stream"] = statistics.median(await _latencies(raw_streamed_call))

    for stream in (True, False):
        p50[f"strands-{'stream' if stream else 'plain'}"] = await _strands_p50(base_url, stream)

    with RolloutContext(chat_completions_url=base_url, api_key="bench", rollout_id="oa") as ctx:
        oa_agent = openai_agents.OsmosisAgent(
            name="bench", model=openai_agents.OsmosisRolloutModel()
        )
        session = openai_agents.OsmosisMemorySession()

        async def openai_agents_call() -> object:
            await session.clear_session()
            return await Runner.run(oa_agent, PROMPT, session=session)

        p50["openai-agents"] = statistics.median(await _latencies(openai_agents_call))
        await ctx.run_cleanups()
    return p50


async def _strands_p50(base_url: str, stream: bool) -> float:
    from osmosis_ai.rollout import RolloutContext
    from osmosis_ai.rollout.integrations.agents import strands

    with RolloutContext(chat_completions_url=base_url, api_key="bench", rollout_id="s") as ctx:
        agent = strands.OsmosisStrandsAgent(
            model=strands.OsmosisRolloutModel(stream=stream), callback_handler=None
        )

        async def strands_call() -> object:
            agent.messages = [{"role": "user", "content": [{"text": "What is 6*7?"}]}]
            return await agent.invoke_async()

        p50 = statistics.median(await _latencies(strands_call))
        await ctx.run_cleanups()
    return p50


def _import_ms(module: str) -> float:
    code = (
        "import time; t = time.perf_counter(); "
        f"import {module}; print((time.perf_counter() - t) * 1000)"
    )
    runs = []
    for _ in range(IMPORT_RUNS):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
        )
        runs.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(runs)


def main() -> None:
    stub = subprocess.Popen(
        [sys.executable, str(HERE / "_stub_process.py")],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(HERE.parent / "src")},
    )
    try:
        assert stub.stdout is not None
        base_url = stub.stdout.readline().strip()
        p50 = asyncio.run(_measure(base_url))
    finally:
        stub.terminate()
        stub.wait(timeout=20)
    raw = {"plain": p50.pop("raw"), "stream": p50.pop("raw-stream")}
    figures = [
        Figure("raw openai SDK call, p50", raw["plain"], "ms"),
        Figure("raw openai SDK streamed call, p50", raw["stream"], "ms"),
    ]
    for name, value in p50.items():
        # Each integration is compared with the raw call of the same kind.
        baseline = raw["stream"] if name == "strands-stream" else raw["plain"]
        figures.append(Figure(f"{name} call, p50", value, "ms"))
        figures.append(Figure(f"  added by {name}", value - baseline, "ms", TARGET_ADDED_MS))
    print_table(f"Per LLM call to an instant stub ({CALLS} sequential calls)", figures)
    modules = [
        ("osmosis_ai.rollout.integrations.agents.strands", "strands integration"),
        ("strands", "  of which strands itself"),
        ("osmosis_ai.rollout.integrations.agents.openai_agents", "openai-agents integration"),
        ("agents", "  of which agents itself"),
    ]
    print_table(
        f"Import time in a fresh interpreter (median of {IMPORT_RUNS})",
        [Figure(label, _import_ms(module), "ms") for module, label in modules],
    )


if __name__ == "__main__":
    main()
