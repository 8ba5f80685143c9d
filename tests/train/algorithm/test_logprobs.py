"""The policy's logprobs of a padded micro-batch are each sequence's own, under the same
top-k/top-p cut as the engine sampled them; models whose logits are not their head's output
are refused."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import LlamaForCausalLM

from osmosis_ai.errors import ConfigError
from osmosis_ai.train.algorithm.logprobs import check_head, policy_logprobs
from osmosis_ai.train.algorithm.micro_batches import collate
from osmosis_ai.train.algorithm.sequences import TrainingSequence, TruncationSpan
from tests.train.conftest import VOCAB, make_sequence


def test_policy_logprobs_are_those_of_each_unpaddedmake_sequence(model: LlamaForCausalLM) -> None:
    sequences = [
        make_sequence("a", "g", 1.0, (1, 5, 7, 2, 9, 4), mask=(0, 1, 1, 0, 1, 1)),
        make_sequence("b", "g", 0.0, (3, 4, 6), mask=(0, 0, 1)),
    ]
    batch = collate(sequences, [0.0, 0.0], [0.0, 0.0])
    with torch.no_grad():
        batched = policy_logprobs(model, batch)
        sharper = policy_logprobs(model, batch, temperature=0.5)
        for row, sequence in enumerate(sequences):
            ids = torch.tensor([sequence.token_ids])
            logits = model(input_ids=ids).logits[0]
            on = torch.tensor(sequence.loss_mask[1:]) > 0
            for got, temperature in ((batched, 1.0), (sharper, 0.5)):
                scaled = torch.log_softmax(logits[:-1] / temperature, dim=-1)
                alone = scaled.gather(-1, ids[0, 1:, None])[:, 0]
                assert torch.allclose(got[row, : len(sequence) - 1][on], alone[on], atol=1e-5)
            # Off the mask (context, padding) nothing is computed.
            assert not batched[row, : len(sequence) - 1][~on].any()
            assert not batched[row, len(sequence) - 1 :].any()
        bf16 = policy_logprobs(model, batch, bf16=True)
    assert bf16.dtype == torch.float32
    assert torch.allclose(bf16[0], batched[0], atol=0.1)


def _cut_by_hand(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """One position's logits cut as top-k, then top-p, are defined: a loop over the ranks."""
    ranked = sorted(range(len(logits)), key=lambda i: -float(logits[i]))
    kept = ranked[:top_k] if top_k else ranked
    probabilities = torch.softmax(logits[kept], dim=-1).tolist()
    mass, chosen = 0.0, list[int]()
    for token, probability in zip(kept, probabilities, strict=True):
        if chosen and mass >= top_p:
            break
        chosen.append(token)
        mass += probability
    out = torch.full_like(logits, float("-inf"))
    out[chosen] = logits[chosen]
    return out


def test_tokens_sampled_with_top_k_and_top_p_are_scored_under_the_same_cut(
    model: LlamaForCausalLM,
) -> None:
    """A completion's tokens are scored over what its top-k/top-p kept, at the temperature;
    the tokens around it are not cut. A target the learner's cut would drop (here: top_k=1
    and a token that is not the most likely) is kept beside what the cut kept, so its
    logprob stays finite."""
    tokens = (1, 5, 7, 2, 9, 4, 11)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokens])).logits[0, :-1] / 0.7
    least = int(torch.argmin(logits[5]))
    tokens = (*tokens[:6], least)  # position 5 predicts a token top_k=1 would drop
    sequence = TrainingSequence(
        rollout_id="a", group_id="g", reward=1.0, token_ids=tokens,
        loss_mask=(0, 1, 1, 1, 1, 1, 1), behaviour_logprobs=(0.0,) + (-1.0,) * 6,
        truncation_spans=(TruncationSpan(2, 5, 4, 0.6), TruncationSpan(6, 7, 1, 1.0)),
    )  # fmt: skip
    batch = collate([sequence], [0.0], [0.0])
    with torch.no_grad():
        got = policy_logprobs(model, batch, temperature=0.7)[0]
    cuts = {1: (4, 0.6), 2: (4, 0.6), 3: (4, 0.6), 5: (1, 1.0)}  # where spans' tokens are
    for position in range(6):
        target = tokens[position + 1]
        cut = _cut_by_hand(logits[position], *cuts.get(position, (0, 1.0)))
        cut[target] = logits[position, target]  # kept if the cut dropped it (position 5)
        expected = torch.log_softmax(cut, dim=-1)[target]
        assert float(got[position]) == pytest.approx(float(expected), abs=1e-5), position
    assert bool(torch.isfinite(got).all())
    # With the cut, the scores differ from the uncut ones where it removed mass.
    uncut = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(tokens[1:])[:, None])[:, 0]
    assert float(got[5]) > float(uncut[5]) + 1e-3


def test_a_model_whose_logits_are_its_heads_passes_the_check(model: LlamaForCausalLM) -> None:
    check_head(model)


def _granite() -> torch.nn.Module:
    from transformers import GraniteConfig, GraniteForCausalLM

    return GraniteForCausalLM(
        GraniteConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, logits_scaling=4.0)
    )  # fmt: skip


def _falcon_h1() -> torch.nn.Module:
    from transformers import FalconH1Config, FalconH1ForCausalLM

    return FalconH1ForCausalLM(
        FalconH1Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2, mamba_d_ssm=32,
                       mamba_n_heads=4, mamba_d_head=8, mamba_d_state=8, mamba_n_groups=1,
                       mamba_chunk_size=4, lm_head_multiplier=0.5)
    )  # fmt: skip


@pytest.mark.parametrize(
    ("build", "field"), [(_granite, "logits_scaling"), (_falcon_h1, "lm_head_multiplier")]
)
def test_a_model_that_scales_its_logits_is_refused_naming_its_config_field(
    build: Any, field: str
) -> None:
    """Granite divides its head's output by ``logits_scaling``, FalconH1 multiplies it by
    ``lm_head_multiplier``: the learner's logprobs would not be the sampler's, so the model
    is refused in one line that names the field (found by comparing logits, not by name)."""
    torch.manual_seed(0)
    with pytest.raises(ConfigError, match=rf"^the model's logits .*config sets {field}\)"):
        check_head(build().eval())


def _packed(allowed: torch.Tensor) -> torch.Tensor:
    """``allowed`` ``[N, V]`` as the grammar's int32 words (token ``32w + i`` is bit ``i``)."""
    rows, vocab = allowed.shape
    bits = torch.zeros(rows, -(-vocab // 32) * 32, dtype=torch.int64)
    bits[:, :vocab] = allowed.long()
    words = (bits.view(rows, -1, 32) << torch.arange(32)).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-autocast"])
def test_a_linear_heads_recomputed_backward_is_autograds(bias: bool, bf16: bool) -> None:
    """The linear head's logprobs, which keep only the log-sum-exp for the backward pass and
    recompute the logits there, give the values, entropies and gradients (hidden states,
    weight, bias) that autograd gives through the logits: at a temperature, under grammar
    masks (two rows unconstrained) and top-k/top-p cuts (two rows uncut)."""
    from osmosis_ai.train.algorithm.logprobs import _Scorer

    generator = torch.Generator().manual_seed(0)
    rows, width, vocab = 6, 16, 70
    head = torch.nn.Linear(width, vocab, bias=bias)
    hidden = torch.randn(rows, width, generator=generator)
    targets = torch.randint(0, vocab, (rows,), generator=generator)
    allowed = torch.rand(rows, vocab, generator=generator) < 0.5
    allowed[torch.arange(rows), targets] = True
    allowed[:2] = True
    cut = (torch.tensor([0, 5, 3, 0, 40, 1]), torch.tensor([1.0, 0.9, 1.0, 0.5, 0.8, 1.0]))
    weights = torch.randn(rows, generator=generator)

    def scored(module: torch.nn.Module) -> tuple[torch.Tensor, ...]:
        head.zero_grad()
        states = hidden.clone().requires_grad_(True)
        scorer = _Scorer(
            head=module, temperature=0.7, masks=_packed(allowed), cut=cut, targets=targets,
            entropy=True, dtype=torch.bfloat16 if bf16 else None,
        )  # fmt: skip
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            values, spread = scorer.logprobs(states)
        (values * weights).sum().backward()  # type: ignore[no-untyped-call]
        assert spread is not None and states.grad is not None and head.weight.grad is not None
        extra = (head.bias.grad,) if head.bias is not None and head.bias.grad is not None else ()
        return values.detach(), spread, states.grad, head.weight.grad, *extra

    recomputed = scored(head)  # the nn.Linear path
    by_autograd = scored(torch.nn.Sequential(head))  # any other head: autograd
    assert len(recomputed) == len(by_autograd) == (5 if bias else 4)
    tolerance = 1e-2 if bf16 else 1e-5
    for got, expected in zip(recomputed, by_autograd, strict=True):
        assert got.dtype == expected.dtype
        scale = max(1.0, float(expected.abs().max()))
        assert float((got - expected).abs().max()) <= tolerance * scale, (got, expected)
    assert bool(torch.isfinite(recomputed[0]).all())
