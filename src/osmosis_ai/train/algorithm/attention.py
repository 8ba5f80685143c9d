"""The learner's attention on a CPU under bf16 autocast: plain matmuls for short queries.

PyTorch's fused CPU attention (``scaled_dot_product_attention``'s flash kernel) is fast
forward, but its bf16 backward pass has a large cost per row: 1,000 tokens as 31 rows of 32
took it longer than as one row of 512. A micro-batch of many short rows (a group's
continuations after their shared prompt, or short rollouts) paid it in every layer. For up to
`MATH_QUERIES` queries, the attention is computed here as ``softmax(QKᵀ)V`` by
batched matmuls in bf16 (the softmax and its gradient in fp32), in about half the fused
kernel's time at 32–128 queries (`benchmarks/attention.py`). Unlike the fused kernel it keeps
its ``[B, H, Q, K]`` weights for the backward pass, in bf16 only (2 bytes an entry, where
autograd through transformers' eager attention keeps 6). Longer queries, single-token
decoding and fp32 keep the fused kernel. Passes without gradients take the same path as
passes with them, so that the learner's logprobs round alike in both.
"""

from __future__ import annotations

from typing import Any

from osmosis_ai._extras import import_optional

import_optional("torch", extra="train", feature="Training (osmosis_ai.train)")

import torch  # noqa: E402  (after the check that names the extra to install)

__all__ = [
    "IMPLEMENTATION",
    "MATH_QUERIES",
    "attends_by_math",
    "learner_attention",
    "matmul_attention",
    "use_learner_attention",
]

#: The name the learner's attention is registered under with transformers.
IMPLEMENTATION = "osmosis_learner"
#: The longest query computed by matmuls (`benchmarks/attention.py`, bf16: at 128 queries a
#: row 0.57–0.97 of the fused kernel's time, at 192 1.12–1.37).
MATH_QUERIES = 128


def use_learner_attention(model: torch.nn.Module) -> bool:
    """Make ``model`` (a transformers model, or a peft model around one) attend with
    `learner_attention` where it uses PyTorch's fused attention (``sdpa``): its masks are
    built as for ``sdpa``, and the choice is made per call (`attends_by_math`). Returns
    whether it was changed; not saved with the model (transformers does not write its
    attention implementation into ``config.json``)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    unwrap = getattr(model, "get_base_model", None)
    base: Any = unwrap() if callable(unwrap) else model
    if getattr(base.config, "_attn_implementation", None) != "sdpa":
        return False
    AttentionInterface.register(IMPLEMENTATION, learner_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
    base.set_attn_implementation(IMPLEMENTATION)
    return bool(base.config._attn_implementation == IMPLEMENTATION)


def attends_by_math(query: torch.Tensor, attention_mask: torch.Tensor | None, **rest: Any) -> bool:
    """Whether `learner_attention` computes this call by matmuls: a query on the CPU in bf16
    (or under bf16 autocast) of more than one and at most `MATH_QUERIES` positions, a boolean
    mask, and nothing the plain formula does not cover (dropout, a soft cap, attention
    sinks, a position bias). With or without gradients alike: the learner's passes without
    (the KL reference, the start-of-step logprobs) must round as its passes with them, or
    the KL to an unchanged reference and the first update's ratios would not start at 0
    and 1."""
    unusual = rest.get("dropout", 0.0) != 0.0 or any(
        rest.get(name) is not None for name in ("softcap", "sinks", "s_aux", "position_bias")
    )
    return (
        query.device.type == "cpu"
        and _matmul_dtype(query) == torch.bfloat16
        and 1 < query.shape[2] <= MATH_QUERIES
        and attention_mask is not None
        and attention_mask.dtype == torch.bool
        and not unusual
    )


def learner_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    **rest: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: ``[B, H, Q, D]`` queries against ``[B, H_kv, K, D]``
    keys and values, returning ``[B, Q, H, D]``; by `matmul_attention` where
    `attends_by_math`, else through transformers' ``sdpa`` attention."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if attention_mask is None or not attends_by_math(query, attention_mask, **rest):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, **rest
        )
    return matmul_attention(module, query, key, value, attention_mask, scaling=scaling)


def matmul_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    scaling: float | None = None,
) -> tuple[torch.Tensor, None]:
    """``softmax(QKᵀ · scaling)V`` under a boolean mask, by matmuls (`_Attention`), in bf16
    under bf16 autocast, else in the query's dtype."""
    from transformers.integrations.sdpa_attention import repeat_kv

    groups = getattr(module, "num_key_value_groups", 1)
    dtype = _matmul_dtype(query)
    keys, values = repeat_kv(key, groups).to(dtype), repeat_kv(value, groups).to(dtype)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = _Attention.apply(query.to(dtype), keys, values, attention_mask, scale)  # type: ignore[no-untyped-call]
    return out.transpose(1, 2).contiguous(), None


def _matmul_dtype(query: torch.Tensor) -> torch.dtype:
    """The dtype attention's matmuls run in: autocast's where it is on (the query may be fp32
    there, rotary embeddings promote it), else the query's."""
    if torch.is_autocast_enabled(query.device.type):
        return torch.get_autocast_dtype(query.device.type)
    return query.dtype


class _Attention(torch.autograd.Function):
    """Attention by matmuls that keeps for its backward pass the weights ``[B, H, Q, K]`` in
    the matmuls' dtype only, not autograd's fp32 softmax output beside them (a third of the
    memory in bf16); the softmax and its gradient are taken in fp32."""

    @staticmethod
    def forward(
        ctx: Any,
        query: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        with torch.autocast(query.device.type, enabled=False):
            scores = torch.matmul(query, keys.transpose(2, 3)).mul_(scale)
            # The dtype's lowest, not -inf: a query with no key to attend to (a padding
            # position) stays finite, where -inf would give NaN, which 0 weights downstream
            # do not cancel.
            scores.masked_fill_(~mask, torch.finfo(scores.dtype).min)
            weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
            out = torch.matmul(weights, values)
        ctx.save_for_backward(query, keys, values, weights, out)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        query, keys, values, weights, out = ctx.saved_tensors
        dtype = query.dtype
        with torch.autocast(query.device.type, enabled=False):
            grad = grad.to(dtype)
            grad_values = torch.matmul(weights.transpose(2, 3), grad)
            # d score = w · (dw - Σ_k w dw), and Σ_k w dw = Σ_d out · d out (as a fused
            # kernel computes it); masked scores have w = 0, hence no gradient.
            spread = (grad.float() * out.float()).sum(dim=-1, keepdim=True)
            grad_weights = torch.matmul(grad, values.transpose(2, 3)).float()
            grad_scores = grad_weights.sub_(spread).mul_(weights).mul_(ctx.scale).to(dtype)
            grad_query = torch.matmul(grad_scores, keys)
            grad_keys = torch.matmul(grad_scores.transpose(2, 3), query)
        return grad_query, grad_keys, grad_values, None, None
