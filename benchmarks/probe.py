"""The weight probe's engine call: its tokens generated (16 decoding steps, as a vLLM server
is probed) against the same tokens scored in one forward pass (`TokenEngine.score`, as the
torch engine is probed), on the torch engine in fp32 and in bf16.

Run with ``python benchmarks/probe.py [--repeats 7]`` on an otherwise idle machine: the
embedded model, the probe's prompt and seed; the median seconds of each call, and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from osmosis_ai.gateway.policies.engines.base import GenerationRequest, Sampling
from osmosis_ai.gateway.policies.engines.torch import TorchEngine
from osmosis_ai.gateway.policies.hf_dir import load_model_dir
from osmosis_ai.train.generation.probe import PROBE_SEED, PROBE_TEXT, PROBE_TOKENS
from osmosis_ai.train.model import resolve_model


async def _median(call: Callable[[], Awaitable[Any]], repeats: int) -> float:
    await call()  # warm-up
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        await call()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


async def _probe_calls(engine: TorchEngine, request: GenerationRequest, repeats: int) -> str:
    """The table's line for ``engine``: generating the probe's tokens, and scoring them."""
    await engine.start()
    try:
        tokens = (await engine.generate(request)).token_ids
        generate = await _median(lambda: engine.generate(request), repeats)
        score = await _median(lambda: engine.score(request.prompt_ids, tokens), repeats)
    finally:
        await engine.aclose()
    return f"{engine.precision:>8}  {generate:12.3f}  {score:9.3f}  {score / generate:14.2f}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    repeats = parser.parse_args().repeats
    model, tokenizer = load_model_dir(resolve_model("embedded"), feature="benchmark")
    prompt = [int(i) for i in tokenizer(PROBE_TEXT)["input_ids"]]
    sampling = Sampling(temperature=1.0, max_tokens=PROBE_TOKENS, seed=PROBE_SEED)
    request = GenerationRequest(prompt, sampling)
    print(f"the probe's call, median of {repeats}: {len(prompt)} prompt tokens")
    print(f"{'engine':>8}  {'generate (s)':>12}  {'score (s)':>9}  {'score/generate':>14}")
    for precision in ("fp32", "bf16"):
        engine = TorchEngine(model, tokenizer, precision=precision)
        print(await _probe_calls(engine, request, repeats))


if __name__ == "__main__":
    asyncio.run(main())
