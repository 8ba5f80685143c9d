"""A later call's prompt prefilled from a finished call's keys and values (`PrefixStore`):
what the store keeps and finds, that an agent's next turn computes only its new tokens and
records the logprobs a whole prefill gives, and that new weights empty it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from osmosis_ai.gateway.policies.engines import TorchEngine  # noqa: E402
from osmosis_ai.gateway.policies.engines._decoder import Decoder, GenerationJob  # noqa: E402
from osmosis_ai.gateway.policies.engines._prefix_store import (  # noqa: E402
    MIN_REUSED_TOKENS,
    PrefixStore,
)
from osmosis_ai.gateway.policies.engines.base import GenerationRequest, Sampling  # noqa: E402
from osmosis_ai.gateway.policies.hf_dir import load_model_dir  # noqa: E402
from tests.train.conftest import tiny_llama, tiny_model_dir, tokenizer_dir  # noqa: E402,F401


def _layers(length: int, *, layers: int = 2) -> list[tuple[Any, Any]]:
    """Keys and values of ``length`` tokens (1 head of size 2), 16 bytes a token a layer."""
    return [(torch.zeros(1, 1, length, 2), torch.zeros(1, 1, length, 2)) for _ in range(layers)]


def test_the_longest_shared_beginning_is_found_leaving_the_last_token_to_compute() -> None:
    store = PrefixStore(max_bytes=100_000)
    system = list(range(100, 100 + MIN_REUSED_TOKENS))
    store.put([*system, 1, 2, 3], _layers(MIN_REUSED_TOKENS + 3))
    store.put([*system, 9], _layers(MIN_REUSED_TOKENS + 1))
    hit = store.lookup([*system, 1, 2, 3, 4, 5])
    assert hit is not None and hit.length == MIN_REUSED_TOKENS + 3
    # One token left to compute, whose logits the prefill needs.
    assert store.lookup([*system, 1, 2, 3]).length == MIN_REUSED_TOKENS + 2  # type: ignore[union-attr]
    assert store.lookup([*system, 9, 9]).length == MIN_REUSED_TOKENS + 1  # type: ignore[union-attr]
    assert store.lookup([7, *system]) is None
    assert store.lookup([*system[:-1], 0, 0]) is None  # too short a beginning to be worth it
    assert (store.hits, store.reused_tokens) == (3, 3 * MIN_REUSED_TOKENS + 6)


def test_an_extended_entry_replaces_the_one_it_extends_and_the_oldest_go_over_the_bytes() -> None:
    store = PrefixStore(max_bytes=2 * 128)  # room for 2 entries of 4 tokens (32 bytes each)
    store.put([1, 2], _layers(2))
    store.put([1, 2, 3, 4], _layers(4))  # the next turn: the first is dropped
    assert len(store) == 1 and store.bytes == 128
    store.put([5, 6, 7, 8], _layers(4))
    store.lookup([1, 2, 3, 4, 0])  # the first is now the most recently used
    store.put([9, 9, 9, 9], _layers(4))
    assert len(store) == 2 and store.lookup([5, 6, 7, 8, 0]) is None
    store.put(list(range(100)), _layers(100))  # larger than the whole store: not kept
    assert len(store) == 2
    store.clear()
    assert len(store) == 0 and store.bytes == 0


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path) -> tuple[Any, Any]:  # noqa: F811
    return load_model_dir(tiny_model_dir, feature="test")


def _turns(
    model: Any, tokenizer: Any, store: PrefixStore | None
) -> tuple[GenerationJob, list[int]]:
    """An agent's two turns: the first call, then one whose prompt is its prompt, its
    completion and a tool result; returns the second job and each prefill's width."""
    widths: list[int] = []
    hook = model.register_forward_pre_hook(
        lambda _, args: widths.append(args[0].shape[1]) if args[0].shape[1] > 1 else None
    )
    try:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Add 17 and 25 with the calculator."}],
            add_generation_prompt=True,
            return_dict=False,
        )
        first = GenerationJob(list(prompt), Sampling(temperature=1.0, max_tokens=10, seed=1))
        _decode(model, tokenizer, [first], store)
        tool = tokenizer.encode("<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n")
        second = GenerationJob(
            [*first.prompt_ids, *first.token_ids, *tool],
            Sampling(temperature=1.0, max_tokens=10, seed=2),
        )
        _decode(model, tokenizer, [second], store)
    finally:
        hook.remove()
    return second, widths


def _decode(model: Any, tokenizer: Any, jobs: list[GenerationJob], store: Any) -> None:
    decoder = Decoder(
        torch, model, stop_token_ids=(), pad_id=0, decode=tokenizer.decode, prefixes=store
    )
    decoder.admit(jobs)
    while decoder.size:
        decoder.step()


def test_a_next_turn_computes_only_its_new_tokens_and_records_the_same_logprobs(
    loaded: tuple[Any, Any],
) -> None:
    model, tokenizer = loaded
    whole, whole_widths = _turns(model, tokenizer, None)
    store = PrefixStore(max_bytes=1 << 30)
    reused, widths = _turns(model, tokenizer, store)
    assert store.hits == 1
    # Stored: the first call's prompt and its completion but the last token (never fed).
    assert store.reused_tokens == whole_widths[0] + 10 - 1
    assert widths[0] == whole_widths[0] and widths[1] == len(whole.prompt_ids) - store.reused_tokens
    assert reused.token_ids == whole.token_ids
    gap = max(abs(a - b) for a, b in zip(reused.logprobs, whole.logprobs, strict=True))
    assert gap <= 1e-5


def test_the_engine_empties_its_store_when_the_weights_change(loaded: tuple[Any, Any]) -> None:
    import asyncio

    model, tokenizer = loaded

    async def run() -> tuple[int, int]:
        engine = TorchEngine(model, tokenizer)
        await engine.start()
        try:
            prompt = tokenizer.encode("Hello there, engine.")
            sampling = Sampling(temperature=1.0, max_tokens=4, seed=0)
            async with asyncio.timeout(60):
                await engine.generate(GenerationRequest(prompt, sampling))
            assert engine.prefixes is not None
            kept = len(engine.prefixes)
            async with engine.updating() as update:
                await update.push(model)
            return kept, len(engine.prefixes)
        finally:
            await engine.aclose()

    assert asyncio.run(run()) == (1, 0)


def test_no_store_for_a_model_with_sliding_window_layers(loaded: tuple[Any, Any]) -> None:
    import asyncio

    from transformers import MistralConfig, MistralForCausalLM

    tokenizer = loaded[1]
    windowed = MistralForCausalLM(
        MistralConfig(
            vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, sliding_window=16,
        )
    )  # fmt: skip
    engines = [TorchEngine(windowed, tokenizer), TorchEngine(tiny_llama(), tokenizer)]

    async def started() -> list[bool]:
        for engine in engines:
            await engine.start()
            await engine.aclose()
        return [engine.prefixes is not None for engine in engines]

    assert asyncio.run(started()) == [False, True]
    assert not TorchEngine(tiny_llama(), tokenizer, prefix_cache=False).prefix_cache
