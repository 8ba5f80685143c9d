"""The torch engine's batching, on a tiny random Llama with the embedded model's tokenizer:
calls that start together share one prefill (and calls with one prompt one prefill row), a
batch holds what its cache has room for, the recorded logprobs stay exact in a wide
batch, and a bf16 copy's weights are released while an update runs."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from osmosis_ai.errors import PolicyError
from osmosis_ai.gateway.policies.engines import TorchEngine
from osmosis_ai.gateway.policies.engines._batch_budget import (
    CACHE_SHARE,
    BatchBudget,
    kv_bytes_per_token,
)
from osmosis_ai.gateway.policies.engines.base import Generation, GenerationRequest, Sampling
from osmosis_ai.gateway.policies.hf_dir import load_model_dir
from osmosis_ai.gateway.policies.torch_device import free_memory_bytes
from tests.train.conftest import tiny_llama, tiny_model_dir, tokenizer_dir  # noqa: F401 -- fixtures

in_module_loop = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path) -> tuple[Any, Any]:  # noqa: F811
    return load_model_dir(tiny_model_dir, feature="test")


@pytest_asyncio.fixture(loop_scope="module")
async def engine(loaded: tuple[Any, Any]) -> AsyncIterator[TorchEngine]:
    model, tokenizer = loaded
    engine = TorchEngine(model, tokenizer)
    await engine.start()
    try:
        yield engine
    finally:
        await engine.aclose()


def _request(tokenizer: Any, text: str, *, max_tokens: int = 6, seed: int = 0) -> GenerationRequest:
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, return_dict=False
    )
    return GenerationRequest(list(ids), Sampling(temperature=1.0, max_tokens=max_tokens, seed=seed))


async def _started_together(engine: TorchEngine, requests: list[GenerationRequest]) -> list[Any]:
    """Generate ``requests`` as rollouts that start together do: each call a few
    milliseconds after the one before, not in the same instant."""

    async def call(index: int, request: GenerationRequest) -> Generation:
        await asyncio.sleep(0.004 * index)
        return await engine.generate(request)

    async with asyncio.timeout(120):
        return await asyncio.gather(*(call(i, r) for i, r in enumerate(requests)))


@in_module_loop
async def test_calls_that_start_together_share_one_prefill(
    engine: TorchEngine, loaded: tuple[Any, Any]
) -> None:
    tokenizer = loaded[1]
    prompts = [
        f"Question {index}: what is {index} + {index * 7}?" * (1 + index % 3) for index in range(24)
    ]
    generations = await _started_together(engine, [_request(tokenizer, p) for p in prompts])
    assert all(g.token_ids for g in generations)
    # More than the old fixed batch of 8, with prompts of several lengths: one padded prefill.
    assert engine.batch_sizes == {24: 1}, engine.batch_sizes
    assert engine.largest_batch == 24


@in_module_loop
async def test_a_batch_holds_only_the_calls_its_cache_has_room_for(
    loaded: tuple[Any, Any],
) -> None:
    model, tokenizer = loaded
    requests = [_request(tokenizer, f"Count to {index}.", max_tokens=8) for index in range(7)]
    reach = max(len(r.prompt_ids) for r in requests) + 8
    per_token = kv_bytes_per_token(model.config, 4)
    engine = TorchEngine(model, tokenizer, cache_bytes=3 * reach * per_token)
    await engine.start()
    try:
        generations = await _started_together(engine, requests)
        # A call alone beyond the budget still runs (it would otherwise never start).
        (alone,) = await _started_together(
            engine, [_request(tokenizer, "Hi.", max_tokens=3 * reach)]
        )
    finally:
        await engine.aclose()
    assert engine.budget == BatchBudget(64, 3 * reach * per_token, per_token)
    assert all(g.token_ids for g in generations) and alone.token_ids
    assert engine.largest_batch == 3, engine.batch_sizes
    assert sum(size * count for size, count in engine.batch_sizes.items()) == 8


@in_module_loop
async def test_logprobs_in_a_wide_batch_match_teacher_forcing(
    engine: TorchEngine, loaded: tuple[Any, Any]
) -> None:

    model, tokenizer = loaded
    prompts = [
        "Hi." if index % 2 else "Tell me about the sea and its ships." for index in range(16)
    ]
    requests = [_request(tokenizer, p, max_tokens=12, seed=i) for i, p in enumerate(prompts)]
    generations = await _started_together(engine, requests)
    assert engine.largest_batch >= 16
    worst = max(
        _logprob_gap(model, r.prompt_ids, g.token_ids, g.logprobs)
        for r, g in zip(requests, generations, strict=True)
    )
    assert worst <= 1e-3


def _logprob_gap(
    model: Any, prompt: list[int], completion: list[int], logprobs: list[float]
) -> float:
    """The largest difference between ``logprobs`` and the teacher-forced ones."""
    import torch

    with torch.inference_mode():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    steps = logits[len(prompt) - 1 : len(prompt) + len(completion) - 1]
    expected = torch.log_softmax(steps, dim=-1).gather(1, torch.tensor([completion]).T)
    return float((expected.flatten() - torch.tensor(logprobs)).abs().max())


def _prefill_rows(model: Any) -> tuple[list[int], Any]:
    """The rows of each prefill pass (a forward of more than one position) of ``model``,
    as they happen, and the hook to remove."""
    passes: list[int] = []
    hook = model.register_forward_pre_hook(
        lambda _, args: passes.append(args[0].shape[0]) if args[0].shape[1] > 1 else None
    )
    return passes, hook


def _decode_all(model: Any, tokenizer: Any, jobs: list[Any], **options: Any) -> None:
    import torch

    from osmosis_ai.gateway.policies.engines._decoder import Decoder

    decoder = Decoder(torch, model, stop_token_ids=(), pad_id=0, decode=tokenizer.decode, **options)
    decoder.admit(jobs)
    while decoder.size:
        decoder.step()


def test_jobs_with_one_prompt_share_its_prefill(loaded: tuple[Any, Any]) -> None:
    from osmosis_ai.gateway.policies.engines._decoder import GenerationJob

    model, tokenizer = loaded
    prompts = ["Hi.", "Tell me about the sea.", "What is 2 + 2?"]
    # Four samples of each prompt, interleaved as a group's calls arrive, each its own seed.
    requests = [_request(tokenizer, prompts[i % 3], max_tokens=8, seed=i) for i in range(12)]
    jobs = [GenerationJob(r.prompt_ids, r.sampling) for r in requests]
    passes, hook = _prefill_rows(model)
    try:
        _decode_all(model, tokenizer, jobs)
        alone = GenerationJob(requests[4].prompt_ids, requests[4].sampling)
        _decode_all(model, tokenizer, [alone])
    finally:
        hook.remove()
    assert passes == [3, 1]  # one row a prompt, then the job alone
    for job in jobs:
        assert _logprob_gap(model, job.prompt_ids, job.token_ids, job.logprobs) <= 1e-3
    # A shared prefill samples as a prefill of its own would, and the samples of one
    # prompt are still drawn apart.
    assert alone.token_ids == jobs[4].token_ids
    assert len({tuple(job.token_ids) for job in jobs[1::3]}) > 1


def test_the_budget_counts_every_row_at_the_longest_reach() -> None:
    budget = BatchBudget(max_calls=4, cache_bytes=1000, bytes_per_token=10)
    assert budget.fits([50, 50])  # 2 × 50 × 10 = 1000
    assert not budget.fits([10, 10, 60])  # padded to 60: 3 × 60 × 10
    assert budget.fits([25, 25, 25, 25]) and not budget.fits([1] * 5)  # max_calls


def test_kv_bytes_per_token_follow_the_models_shape() -> None:
    config = tiny_llama(hidden_size=32).config  # 2 layers, 2 of 4 heads for keys and values
    assert kv_bytes_per_token(config, 4) == 2 * 2 * 2 * (32 // 4) * 4


def test_the_default_budget_is_a_share_of_the_free_memory(tmp_path: Path) -> None:
    import torch

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:    8000000 kB\n")
    free = free_memory_bytes(torch.device("cpu"), meminfo)
    assert free == 8_000_000 * 1024
    budget = BatchBudget.of(tiny_llama().config, 4, max_calls=64, free_bytes=free)
    assert budget.cache_bytes == int(free * CACHE_SHARE)
    assert free_memory_bytes(torch.device("cpu"), tmp_path / "absent") is None


def test_a_wide_admission_is_prefilled_in_bounded_passes(loaded: tuple[Any, Any]) -> None:
    from osmosis_ai.gateway.policies.engines._decoder import GenerationJob

    model, tokenizer = loaded
    requests = [_request(tokenizer, "Hi." * (1 + i), max_tokens=5, seed=i) for i in range(5)]
    longest = max(len(r.prompt_ids) for r in requests)
    jobs = [GenerationJob(r.prompt_ids, r.sampling) for r in requests]
    passes, hook = _prefill_rows(model)
    try:
        _decode_all(model, tokenizer, jobs, prefill_tokens=2 * longest)
    finally:
        hook.remove()
    assert passes == [2, 2, 1]  # prefills of at most 2 × the longest prompt
    for job in jobs:
        assert _logprob_gap(model, job.prompt_ids, job.token_ids, job.logprobs) <= 1e-3


@in_module_loop
async def test_a_bf16_copy_holds_no_weights_while_an_update_runs(
    loaded: tuple[Any, Any],
) -> None:
    """Its weights are released for the update (the update's peak memory does not hold
    them); the push fills them with the trained model's, as a copy made from it would hold
    them; an update that raises gives them back from the model; one that pushes nothing
    leaves the engine without weights, and its calls fail saying so."""
    import torch

    trained = copy.deepcopy(loaded[0])
    tokenizer = loaded[1]
    request = _request(tokenizer, "Tell me about the sea.", max_tokens=8, seed=3)
    engine = TorchEngine(trained, tokenizer, precision="bf16")
    await engine.start()
    try:
        before = await engine.generate(request)
        async with engine.updating(version=1) as update:
            waiting = asyncio.create_task(engine.generate(request))  # waits for the push
            assert engine.released
            assert all(p.numel() == 0 for p in engine.model.parameters())
            with torch.no_grad():
                for parameter in trained.parameters():
                    parameter.mul_(1.5)
            await update.push(trained)
        assert not engine.released and engine.version == 1
        pushed = await engine.generate(request)
        assert (await waiting).logprobs == pushed.logprobs and (await waiting).version == 1
        with pytest.raises(RuntimeError, match="update failed"):
            async with engine.updating(version=2):
                raise RuntimeError("update failed")
        assert not engine.released and engine.version == 1
        assert (await engine.generate(request)).logprobs == pushed.logprobs
        async with engine.updating(version=2):
            pass  # a push that never arrived
        with pytest.raises(PolicyError, match="no weights: an update released") as caught:
            await engine.generate(request)
        assert caught.value.status_code == 500
    finally:
        await engine.aclose()
    fresh = TorchEngine(trained, tokenizer, precision="bf16")
    await fresh.start()
    try:
        assert (await fresh.generate(request)).logprobs == pushed.logprobs
    finally:
        await fresh.aclose()
    assert pushed.logprobs != before.logprobs


@in_module_loop
async def test_scoring_gives_the_logprobs_generation_recorded(
    engine: TorchEngine, loaded: tuple[Any, Any]
) -> None:
    """`TorchEngine.score` (the weight probe's call) is one forward pass between batches: a
    scoring that arrives while calls generate waits for their batch, and the logprobs it
    gives for a generation's tokens are the ones generation recorded."""
    tokenizer = loaded[1]
    requests = [_request(tokenizer, f"Name {n} rivers.", max_tokens=10, seed=n) for n in range(4)]
    first = await engine.generate(requests[0])
    generating = asyncio.ensure_future(_started_together(engine, requests[1:]))
    await asyncio.sleep(0.05)
    async with asyncio.timeout(60):
        scores = await engine.score(requests[0].prompt_ids, first.token_ids)
        generations = await generating
    assert scores.version == engine.version == first.version
    assert len(scores.logprobs) == len(first.token_ids)
    assert max(abs(a - b) for a, b in zip(scores.logprobs, first.logprobs, strict=True)) <= 1e-4
    assert all(g.token_ids for g in generations)
