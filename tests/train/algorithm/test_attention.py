"""The learner's attention computes short bf16 queries by matmuls, as the fused
kernel would within bf16 rounding, and leaves every other call to the fused kernel."""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from osmosis_ai.gateway.policies.hf_dir import quiet_peft
from osmosis_ai.train.algorithm.attention import (
    IMPLEMENTATION,
    MATH_QUERIES,
    attends_by_math,
    learner_attention,
    use_learner_attention,
)
from osmosis_ai.train.algorithm.logprobs import policy_logprobs
from osmosis_ai.train.algorithm.micro_batches import collate
from tests.train.conftest import make_sequence, tiny_llama


class _Layer(torch.nn.Module):
    """What the attention interface reads of a layer: its grouped-query factor."""

    num_key_value_groups = 2
    is_causal = True


def _inputs(queries: int, keys: int) -> tuple[torch.Tensor, ...]:
    """Queries ``[2, 4, Q, 8]``, keys and values ``[2, 2, K, 8]`` (bf16, with gradients) and
    a causal mask over a prefix of ``K - Q`` keys whose second row's last two keys are
    padding."""
    generator = torch.Generator().manual_seed(0)

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).to(torch.bfloat16).requires_grad_()

    mask = torch.ones(2, 1, queries, keys, dtype=torch.bool).tril(keys - queries)
    mask[1, :, :, -2:] = False
    return draw(2, 4, queries, 8), draw(2, 2, keys, 8), draw(2, 2, keys, 8), mask


def _run(
    attend: object, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    for tensor in (query, key, value):
        tensor.grad = None
    out, _ = attend(_Layer(), query, key, value, mask, scaling=0.35)  # type: ignore[operator]
    (out.float() * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    assert query.grad is not None and key.grad is not None and value.grad is not None
    return out.detach().float(), query.grad.float(), key.grad.float(), value.grad.float()


def test_short_bf16_queries_with_gradients_are_computed_by_matmuls_as_the_fused_kernel() -> None:
    query, key, value, mask = _inputs(queries=6, keys=14)
    assert attends_by_math(query, mask)
    fused = _run(sdpa_attention_forward, query, key, value, mask)
    math = _run(learner_attention, query, key, value, mask)
    for ours, theirs in zip(math, fused, strict=True):
        assert torch.isfinite(ours).all()
        assert float((ours - theirs).abs().max()) <= 2e-2 * max(1.0, float(theirs.abs().max()))


def test_a_query_with_no_key_to_attend_to_stays_finite() -> None:
    query, key, value, mask = _inputs(queries=4, keys=4)
    mask[0, :, 1] = False  # a padding position's row, every key masked
    assert all(torch.isfinite(t).all() for t in _run(learner_attention, query, key, value, mask))


def test_every_other_call_goes_to_the_fused_kernel() -> None:
    query, key, value, mask = _inputs(queries=6, keys=14)
    with torch.no_grad():  # a pass without gradients rounds as one with them
        assert attends_by_math(query, mask)
    assert not attends_by_math(query.detach().float().requires_grad_(), mask)  # fp32
    assert not attends_by_math(query, None)  # no mask: the fused kernel's causal path
    assert not attends_by_math(query, mask, dropout=0.1)
    assert not attends_by_math(query, mask, softcap=30.0)
    long = torch.zeros(1, 4, MATH_QUERIES + 1, 8, dtype=torch.bfloat16, requires_grad=True)
    assert not attends_by_math(long, torch.ones(1, 1, MATH_QUERIES + 1, 1, dtype=torch.bool))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # rotary embeddings give fp32 queries
        assert attends_by_math(query.detach().float().requires_grad_(), mask)


def test_a_learner_model_scores_as_with_the_fused_kernel_under_bf16() -> None:
    fused = tiny_llama(vocab_size=64)
    assert fused.config._attn_implementation == "sdpa"
    learner = copy.deepcopy(fused)
    assert use_learner_attention(learner)
    assert learner.config._attn_implementation == IMPLEMENTATION
    assert not use_learner_attention(learner)  # once
    prompt = [(7 * index) % 64 for index in range(20)]
    sequences = [
        make_sequence(f"r{n}", "g", 0.0, prompt + completion, [0] * 20 + [1] * len(completion))
        for n, completion in enumerate([[1, 2, 3], [4, 5, 6, 7, 8], [9, 10]])
    ]
    results = []
    for model in (fused, learner):
        batch = collate(sequences, [1.0] * 3, [1.0] * 3, share_prefix=True)
        logprobs = policy_logprobs(model, batch, bf16=True)
        (logprobs * batch.weights).sum().backward()  # type: ignore[no-untyped-call]
        gradient = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results.append((logprobs.detach(), gradient))
    (fused_logprobs, fused_gradient), (logprobs, gradient) = results
    assert float((logprobs - fused_logprobs).abs().max()) < 0.05  # bf16 keeps 8 bits
    assert float((gradient - fused_gradient).norm() / fused_gradient.norm()) < 0.05
    assert not torch.equal(gradient, fused_gradient)  # the matmuls did run


def test_a_model_on_another_attention_is_left_as_it_is() -> None:
    model = tiny_llama(vocab_size=64, attn_implementation="eager")
    assert not use_learner_attention(model)
    assert model.config._attn_implementation == "eager"


def test_a_lora_models_base_takes_the_learner_attention() -> None:
    from peft import LoraConfig, get_peft_model

    with quiet_peft():
        model = get_peft_model(
            tiny_llama(vocab_size=64), LoraConfig(r=2, target_modules=["q_proj"])
        )
    assert use_learner_attention(model)
    base: Any = model.get_base_model()
    assert base.config._attn_implementation == IMPLEMENTATION


def test_the_backward_pass_keeps_the_weights_once_in_bf16() -> None:
    """What the matmuls keep for the backward pass of ``[B, H, Q, K]`` size is the weights
    once, in bf16: autograd through a softmax taken in fp32 would keep its fp32 output as
    well (6 bytes an entry in all, not 2)."""
    query, key, value, mask = _inputs(queries=24, keys=40)
    kept: list[torch.Tensor] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        kept.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        learner_attention(_Layer(), query, key, value, mask, scaling=0.35)
    entries = query.shape[0] * query.shape[1] * query.shape[2] * key.shape[2]
    weights = [tensor for tensor in kept if tensor.numel() == entries]
    assert [tensor.dtype for tensor in weights] == [torch.bfloat16]
