"""The GRPO family: advantages, loss and step, checked against the formulas by hand."""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import pytest
import torch
from transformers import LlamaForCausalLM

from osmosis_ai.errors import ConfigError
from osmosis_ai.train import TrainingSequence
from osmosis_ai.train.grpo import (
    GrpoConfig,
    NonFiniteStepError,
    collate,
    group_advantages,
    grpo_loss,
    pack_micro_batches,
    policy_logprobs,
    token_weights,
    train_step,
    zero_gradient_groups,
)
from tests.train.conftest import VOCAB, tiny_llama


def _sequence(
    rollout: str,
    group: str,
    reward: float,
    tokens: Sequence[int] = (1, 2, 3, 4),
    mask: Sequence[int] | None = None,
    logprobs: Sequence[float] | None = None,
) -> TrainingSequence:
    mask = mask if mask is not None else [0, 0] + [1] * (len(tokens) - 2)
    behaviour = logprobs if logprobs is not None else [-1.0 * m for m in mask]
    return TrainingSequence(
        rollout_id=rollout,
        group_id=group,
        reward=reward,
        token_ids=tuple(tokens),
        loss_mask=tuple(mask),
        behaviour_logprobs=tuple(behaviour),
    )


def _stdev(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def test_advantages_are_normalised_within_each_group() -> None:
    rewards_a = [1.0, 0.0, 0.5, 0.25]
    rewards_b = [2.0, 4.0]
    sequences = [_sequence(f"a{i}", "a", r) for i, r in enumerate(rewards_a)]
    sequences += [_sequence(f"b{i}", "b", r) for i, r in enumerate(rewards_b)]
    mean_a, mean_b = sum(rewards_a) / 4, sum(rewards_b) / 2
    expected = [(r - mean_a) / (_stdev(rewards_a) + 1e-4) for r in rewards_a]
    expected += [(r - mean_b) / (_stdev(rewards_b) + 1e-4) for r in rewards_b]
    assert group_advantages(sequences) == pytest.approx(expected, rel=1e-12)
    unscaled = [r - mean_a for r in rewards_a] + [r - mean_b for r in rewards_b]
    assert group_advantages(sequences, scale="none") == pytest.approx(unscaled, rel=1e-12)


def test_a_forked_rollout_counts_once_in_its_group() -> None:
    sequences = [
        _sequence("x", "g", 1.0),
        _sequence("x", "g", 1.0, tokens=(5, 6, 7, 8)),
        _sequence("y", "g", 0.0),
    ]
    # Group {x: 1, y: 0}: mean 0.5, not (1 + 1 + 0) / 3.
    advantages = group_advantages(sequences, scale="none")
    assert advantages == pytest.approx([0.5, 0.5, -0.5])


def test_groups_with_equal_rewards_carry_no_gradient() -> None:
    sequences = [
        _sequence("a0", "same", 0.5),
        _sequence("a1", "same", 0.5),
        _sequence("b0", "single", 1.0),
        _sequence("c0", "mixed", 0.0),
        _sequence("c1", "mixed", 1.0),
    ]
    assert zero_gradient_groups(sequences) == {"same", "single"}
    assert group_advantages(sequences)[:3] == [0.0, 0.0, 0.0]
    assert all(a != 0 for a in group_advantages(sequences)[3:])


def _batch_and_expected(
    config: GrpoConfig, reference: list[list[float]] | None = None
) -> tuple[torch.Tensor, float, object]:
    """A two-sequence batch, made-up policy logprobs, and the loss computed by hand."""
    sequences = [
        _sequence("p", "g", 1.0, (1, 2, 3, 4, 5), (0, 1, 0, 1, 1), (0.0, -1.0, 0.0, -0.5, -2.0)),
        _sequence("q", "g", 0.0, (1, 6, 7), (0, 1, 1), (0.0, -0.7, -1.2)),
    ]
    advantages = group_advantages(sequences, scale=config.advantage_scale)
    weights = token_weights(sequences, config.normalisation)
    batch = collate(sequences, advantages, weights)
    # Policy logprobs of tokens 1..T-1 (padded to the longest sequence).
    policy = [[-0.8, -0.3, -0.2, -2.5], [-0.9, -1.0, 0.0, 0.0]]
    expected = 0.0
    for row, sequence in enumerate(sequences):
        for position in range(1, len(sequence)):
            if not sequence.loss_mask[position]:
                continue
            logprob = policy[row][position - 1]
            ratio = math.exp(logprob - sequence.behaviour_logprobs[position])
            clipped = min(max(ratio, 1 - config.clip_low), 1 + config.clip_high)
            advantage = advantages[row]
            term = max(-advantage * ratio, -advantage * clipped)
            if reference is not None:
                delta = reference[row][position - 1] - logprob
                term += config.kl_beta * (math.exp(delta) - delta - 1)
            expected += term * weights[row]
    return torch.tensor(policy, requires_grad=True), expected, batch


@pytest.mark.parametrize("normalisation", ["token", "sequence"])
@pytest.mark.parametrize("scale", ["std", "none"])
def test_loss_matches_the_formula(normalisation: str, scale: str) -> None:
    config = GrpoConfig(normalisation=normalisation, advantage_scale=scale)  # type: ignore[arg-type]
    policy, expected, batch = _batch_and_expected(config)
    loss, parts = grpo_loss(policy, batch, config)  # type: ignore[arg-type]
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert parts.tokens == 5


def test_token_and_sequence_normalisation_weigh_tokens_differently() -> None:
    long = _sequence("a", "g", 1.0, tuple(range(1, 9)), (0, 0, 1, 1, 1, 1, 1, 1))
    short = _sequence("b", "g", 0.0, (1, 2, 3), (0, 0, 1))
    # DAPO: every token of the step weighs 1/7. GRPO: each sequence weighs 1/2 in total.
    assert token_weights([long, short], "token") == pytest.approx([1 / 7, 1 / 7])
    assert token_weights([long, short], "sequence") == pytest.approx([1 / 12, 1 / 2])


def test_kl_term_is_the_k3_estimate_to_the_reference() -> None:
    config = GrpoConfig(kl_beta=0.3)
    reference = [[-1.0, -0.1, -0.4, -2.0], [-0.2, -1.5, 0.0, 0.0]]
    policy, expected, batch = _batch_and_expected(config, reference)
    loss, parts = grpo_loss(policy, batch, config, torch.tensor(reference))  # type: ignore[arg-type]
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert parts.kl_sum > 0
    same, _ = grpo_loss(policy, batch, config, policy.detach())  # type: ignore[arg-type]
    without, _ = grpo_loss(policy, batch, GrpoConfig())  # type: ignore[arg-type]
    assert same.item() == pytest.approx(without.item(), rel=1e-6)
    with pytest.raises(ConfigError, match="reference"):
        grpo_loss(policy, batch, config)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("advantage_sign", "policy_logprob", "clipped_side"),
    [
        (1.0, math.log(1.5), "high"),  # ratio 1.5 > 1 + 0.28 with A > 0: clipped
        (-1.0, math.log(0.5), "low"),  # ratio 0.5 < 1 - 0.2 with A < 0: clipped
        (1.0, math.log(1.1), None),  # inside the band: the gradient flows
        (-1.0, math.log(1.5), None),  # A < 0 above the band: unclipped (pessimistic max)
        (1.0, math.log(0.5), None),  # A > 0 below the band: unclipped
    ],
)
def test_clip_bounds_stop_the_gradient_only_where_ppo_says(
    advantage_sign: float, policy_logprob: float, clipped_side: str | None
) -> None:
    config = GrpoConfig(clip_low=0.2, clip_high=0.28)
    sequences = [_sequence("a", "g", 1.0, (1, 2), (0, 1), (0.0, 0.0))]
    batch = collate(sequences, [advantage_sign], [1.0])
    policy = torch.tensor([[policy_logprob]], requires_grad=True)
    loss, parts = grpo_loss(policy, batch, config)
    loss.backward()  # type: ignore[no-untyped-call]
    assert policy.grad is not None
    gradient = float(policy.grad[0, 0])
    if clipped_side is None:
        # d(-A·ρ)/d logπ = -A·ρ
        assert gradient == pytest.approx(-advantage_sign * math.exp(policy_logprob))
        assert parts.clipped_low == parts.clipped_high == 0
    else:
        assert gradient == 0.0
        assert (parts.clipped_high, parts.clipped_low) == (
            (1, 0) if clipped_side == "high" else (0, 1)
        )


def test_micro_batches_fit_the_budget_and_cover_every_sequence_once() -> None:
    lengths = [5, 9, 3, 9, 2, 7, 4]
    batches = pack_micro_batches(lengths, token_budget=18)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) * max(lengths[i] for i in batch) <= 18
    assert batches[0] == [1, 3]  # the longest first, input order on ties
    assert len(batches) < len(lengths)
    with pytest.raises(ConfigError, match="micro_batch_tokens=8"):
        pack_micro_batches(lengths, token_budget=8)


def test_policy_logprobs_are_those_of_each_unpadded_sequence(model: LlamaForCausalLM) -> None:
    sequences = [
        _sequence("a", "g", 1.0, (1, 5, 7, 2, 9, 4), mask=(0, 1, 1, 0, 1, 1)),
        _sequence("b", "g", 0.0, (3, 4, 6), mask=(0, 0, 1)),
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


def _step_sequences() -> list[TrainingSequence]:
    generator = torch.Generator().manual_seed(3)
    sequences = []
    for i in range(6):
        length = 4 + i % 3
        tokens = torch.randint(0, VOCAB, (length,), generator=generator).tolist()
        mask = [0, 0] + [1] * (length - 2)
        logprobs = [-2.5 * m for m in mask]
        sequences.append(_sequence(f"r{i}", f"g{i % 2}", float(i % 3), tokens, mask, logprobs))
    return sequences


@pytest.mark.parametrize("normalisation", ["token", "sequence"])
def test_micro_batching_gives_the_same_update_as_one_batch(normalisation: str) -> None:
    updated = []
    for budget in (64, 6):
        model = tiny_llama()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        config = GrpoConfig(micro_batch_tokens=budget, normalisation=normalisation)  # type: ignore[arg-type]
        metrics = train_step(model, optimizer, _step_sequences(), config, step=1)
        updated.append((metrics, torch.nn.utils.parameters_to_vector(model.parameters())))
    (whole, whole_params), (split, split_params) = updated
    assert (whole.micro_batches, split.micro_batches) == (1, 6)
    assert split.loss == pytest.approx(whole.loss, rel=1e-5)
    assert split.grad_norm == pytest.approx(whole.grad_norm, rel=1e-4)
    assert torch.allclose(whole_params, split_params, atol=1e-6)
    assert not torch.equal(
        whole_params, torch.nn.utils.parameters_to_vector(tiny_llama().parameters())
    )
    assert whole.tokens == sum(len(s) for s in _step_sequences())
    assert whole.policy_tokens == sum(s.policy_tokens for s in _step_sequences())


def test_a_non_finite_loss_is_refused_and_nothing_is_applied(model: LlamaForCausalLM) -> None:
    before = copy.deepcopy(model.state_dict())
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    sequences = _step_sequences()
    broken = sequences[0]
    sequences[0] = _sequence(
        broken.rollout_id,
        broken.group_id,
        broken.reward,
        broken.token_ids,
        broken.loss_mask,
        [*broken.behaviour_logprobs[:-1], math.nan],
    )
    with pytest.raises(NonFiniteStepError, match=r"step 12: the loss is nan; no update"):
        train_step(model, optimizer, sequences, GrpoConfig(micro_batch_tokens=8), step=12)
    _assert_untouched(model, before, optimizer)


def test_a_non_finite_gradient_is_refused_and_nothing_is_applied(
    model: LlamaForCausalLM,
) -> None:
    before = copy.deepcopy(model.state_dict())
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    # The loss stays finite; one parameter's gradient becomes infinite on its way back.
    model.model.norm.weight.register_hook(lambda grad: grad * math.inf)
    with pytest.raises(NonFiniteStepError, match=r"step 4: the gradient norm is (inf|nan)"):
        train_step(model, optimizer, _step_sequences(), GrpoConfig(), step=4)
    _assert_untouched(model, before, optimizer)


def _assert_untouched(
    model: LlamaForCausalLM, before: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer
) -> None:
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert not optimizer.state
    assert all(p.grad is None for p in model.parameters())


def test_kl_needs_a_reference_model_and_starts_at_zero(model: LlamaForCausalLM) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    config = GrpoConfig(kl_beta=0.1)
    with pytest.raises(ConfigError, match="reference_model"):
        train_step(model, optimizer, _step_sequences(), config, step=0)
    reference = copy.deepcopy(model)
    first = train_step(
        model, optimizer, _step_sequences(), config, step=0, reference_model=reference
    )
    second = train_step(
        model, optimizer, _step_sequences(), config, step=1, reference_model=reference
    )
    assert first.kl == pytest.approx(0.0, abs=1e-7)
    assert second.kl > 0


def test_an_empty_step_is_refused(model: LlamaForCausalLM) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ConfigError, match="step 3: no training sequences"):
        train_step(model, optimizer, [], GrpoConfig(), step=3)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("clip_low", 1.0),
        ("clip_high", -0.1),
        ("kl_beta", math.inf),
        ("advantage_scale", "mad"),
        ("normalisation", "batch"),
        ("micro_batch_tokens", 1),
        ("max_grad_norm", 0.0),
        ("temperature", 0.0),
    ],
)
def test_bad_config_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        GrpoConfig(**{field: value})  # type: ignore[arg-type]
