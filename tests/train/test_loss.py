"""The GRPO-family loss and its settings, checked against the formulas by hand."""

from __future__ import annotations

import math

import pytest
import torch

from osmosis_ai.errors import ConfigError
from osmosis_ai.train.algorithm.advantages import group_advantages, token_weights
from osmosis_ai.train.algorithm.loss import CLIP_DEFAULTS, GrpoConfig, grpo_loss
from osmosis_ai.train.algorithm.micro_batches import collate
from tests.train.conftest import make_sequence


def _batch_and_expected(
    config: GrpoConfig, reference: list[list[float]] | None = None
) -> tuple[torch.Tensor, float, object]:
    """A two-sequence batch, made-up policy logprobs, and the loss computed by hand."""
    sequences = [
        make_sequence(
            "p", "g", 1.0, (1, 2, 3, 4, 5), (0, 1, 0, 1, 1), (0.0, -1.0, 0.0, -0.5, -2.0)
        ),
        make_sequence("q", "g", 0.0, (1, 6, 7), (0, 1, 1), (0.0, -0.7, -1.2)),
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
            low, high = config.clip
            clipped = min(max(ratio, 1 - low), 1 + high)
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
    sequences = [make_sequence("a", "g", 1.0, (1, 2), (0, 1), (0.0, 0.0))]
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


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("clip_low", 1.0),
        ("clip_high", -0.1),
        ("loss", "ppo"),
        ("epochs", 0),
        ("mini_batches", 0),
        ("max_tokens", 0),
        ("kl_beta", math.inf),
        ("advantage_scale", "mad"),
        ("advantage", "ppo"),
        ("normalisation", "batch"),
        ("micro_batch_tokens", 1),
        ("max_grad_norm", 0.0),
        ("temperature", 0.0),
    ],
)
def test_bad_config_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        GrpoConfig(**{field: value})  # type: ignore[arg-type]


def _stale_batch() -> tuple[torch.Tensor, object]:
    """Two policy tokens generated by older weights: the behaviour logprobs are -1.0 and -2.0,
    the learner now gives them -0.5 and -2.1 (ratios e^0.5 ≈ 1.649 and e^-0.1 ≈ 0.905);
    advantage +1, one weight each."""
    sequences = [make_sequence("a", "g", 1.0, (1, 2, 3), (0, 1, 1), (0.0, -1.0, -2.0))]
    batch = collate(sequences, [1.0], [1.0])
    return torch.tensor([[-0.5, -2.1]], requires_grad=True), batch


def test_stale_tokens_are_clipped_against_the_behaviour_policy() -> None:
    """Asynchronous training's correction without ``tis_cap``: the ratio is to the logprobs
    the engine recorded, so a stale token whose ratio left the clip range gets no gradient,
    and the step reports the largest ratio."""
    policy, batch = _stale_batch()
    loss, parts = grpo_loss(policy, batch, GrpoConfig(clip_low=0.2, clip_high=0.28))  # type: ignore[arg-type]
    # Token 1: ρ = e^0.5 > 1.28 with A > 0, clipped: -A·1.28. Token 2: -A·e^-0.1.
    assert loss.item() == pytest.approx(-1.28 - math.exp(-0.1), rel=1e-6)
    loss.backward()  # type: ignore[no-untyped-call]
    assert policy.grad is not None
    assert policy.grad[0].tolist() == pytest.approx([0.0, -math.exp(-0.1)], rel=1e-6)
    assert parts.clipped_high == 1 and parts.clipped_low == 0
    assert parts.ratio_max == pytest.approx(math.exp(0.5), rel=1e-6)
    assert parts.ratio_sum == pytest.approx(math.exp(0.5) + math.exp(-0.1), rel=1e-6)


def test_the_decoupled_objective_weights_by_the_capped_behaviour_ratio() -> None:
    """With ``tis_cap`` the ratio is to the learner's own logprobs at the start of the step
    (1, so nothing is clipped) and each token's loss is weighted by min(π/μ, cap)."""
    policy, batch = _stale_batch()
    config = GrpoConfig(tis_cap=1.5)
    loss, parts = grpo_loss(policy, batch, config)  # type: ignore[arg-type]
    assert loss.item() == pytest.approx(-(1.5 + math.exp(-0.1)), rel=1e-6)
    loss.backward()  # type: ignore[no-untyped-call]
    assert policy.grad is not None
    # d(-A·w·ρ)/d logπ = -A·w·ρ with ρ = 1: the capped weight of each token.
    assert policy.grad[0].tolist() == pytest.approx([-1.5, -math.exp(-0.1)], rel=1e-6)
    assert parts.tis_capped == 1 and parts.clipped_high == parts.clipped_low == 0


def test_each_loss_has_its_own_default_clip_band_and_a_set_one_wins() -> None:
    assert GrpoConfig().clip == CLIP_DEFAULTS["ppo_clip"] == (0.2, 0.28)
    assert GrpoConfig(loss="gspo").clip == (3e-4, 4e-4)
    assert GrpoConfig(loss="cispo").clip == (1.0, 3.0)  # no floor; the weight is at most 4
    assert GrpoConfig(loss="gspo", clip_high=0.01).clip == (3e-4, 0.01)
    with pytest.raises(ConfigError, match="clip_low must be below 1"):
        GrpoConfig(loss="gspo", clip_low=1.0)
    with pytest.raises(ConfigError, match="clip_low must be at most 1"):
        GrpoConfig(loss="cispo", clip_low=1.5)


def _two_sequences(*, later: bool = False) -> tuple[torch.Tensor, object, list[float]]:
    """Sequence a (advantage +1): behaviour -1.0, -2.0 and the learner's -0.8, -2.1; b (-0.5):
    behaviour -0.5 and the learner's -0.7. One weight per token (sum, not a mean). ``later``:
    a later update of the step, which started where the behaviour policy was."""
    sequences = [
        make_sequence("a", "g", 1.0, (1, 2, 3), (0, 1, 1), (0.0, -1.0, -2.0)),
        make_sequence("b", "g", 0.0, (1, 4), (0, 1), (0.0, -0.5)),
    ]
    advantages = [1.0, -0.5]
    start = [torch.tensor([-1.0, -2.0]), torch.tensor([-0.5])] if later else None
    batch = collate(sequences, advantages, [1.0, 1.0], old_logprobs=start)
    policy = torch.tensor([[-0.8, -2.1], [-0.7, 0.0]], requires_grad=True)
    return policy, batch, advantages


def test_gspo_clips_the_sequences_geometric_mean_ratio_and_spreads_its_gradient() -> None:
    """GSPO in a later update, its ratio to the step's start: s_a = exp(mean(0.2, -0.1)) =
    e^0.05, s_b = e^-0.2. With the band (0.01, 0.01) both leave it: a's (A > 0, s > 1.01)
    is clipped, so its tokens get no gradient; b's (A < 0, s < 0.99) too. With a wide band
    each token's gradient is -A·s (its own logπ's)."""
    policy, batch, _ = _two_sequences(later=True)
    narrow = GrpoConfig(loss="gspo", clip_low=0.01, clip_high=0.01)
    loss, parts = grpo_loss(policy, batch, narrow)  # type: ignore[arg-type]
    # a: 2 tokens × -1·1.01; b: 1 token × 0.5·0.99.
    assert loss.item() == pytest.approx(2 * -1.01 + 0.5 * 0.99, rel=1e-6)
    loss.backward()  # type: ignore[no-untyped-call]
    assert policy.grad is not None and not policy.grad.any()
    assert (parts.clipped_high, parts.clipped_low) == (2, 1)
    policy, batch, _ = _two_sequences(later=True)
    loss, parts = grpo_loss(policy, batch, GrpoConfig(loss="gspo", clip_low=0.5, clip_high=0.5))  # type: ignore[arg-type]
    s_a, s_b = math.exp(0.05), math.exp(-0.2)
    assert loss.item() == pytest.approx(-2 * s_a + 0.5 * s_b, rel=1e-6)
    loss.backward()  # type: ignore[no-untyped-call]
    assert policy.grad is not None
    assert policy.grad.flatten().tolist() == pytest.approx([-s_a, -s_a, 0.5 * s_b, 0.0], rel=1e-6)
    assert parts.clipped_high == parts.clipped_low == 0


def test_gspo_starts_each_step_at_ratio_one_whatever_the_engine_recorded() -> None:
    """The first update of a step: the learner's logprobs differ from the engine's (-0.8 vs
    -1.0...), far beyond GSPO's band, yet s = 1 for both sequences: nothing is clipped and
    each token's gradient is -A (the step starts on-policy for the learner)."""
    policy, batch, _ = _two_sequences()
    loss, parts = grpo_loss(policy, batch, GrpoConfig(loss="gspo"))  # type: ignore[arg-type]
    assert loss.item() == pytest.approx(-2 * 1.0 + 0.5 * 1.0, rel=1e-6)
    loss.backward()  # type: ignore[no-untyped-call]
    assert policy.grad is not None
    assert policy.grad.flatten().tolist() == pytest.approx([-1.0, -1.0, 0.5, 0.0], rel=1e-6)
    assert parts.clipped_high == parts.clipped_low == 0
    # The engine's difference is still reported (and tis_cap would weight by it).
    assert parts.ratio_max == pytest.approx(math.exp(0.2), rel=1e-6)


def test_cispo_weights_each_tokens_log_likelihood_by_its_clipped_ratio_without_cutting_it() -> None:
    """CISPO: ℓ = -A·sg(clip(ρ))·logπ. Ratios: a e^0.2, e^-0.1; b e^-0.2. With the cap
    1 + 0.1, a's first weight is 1.1 (clipped, its gradient kept: -A·1.1), the others' their
    ratio; no floor (clip_low = 1)."""
    policy, batch, _ = _two_sequences()
    loss, parts = grpo_loss(policy, batch, GrpoConfig(loss="cispo", clip_low=1.0, clip_high=0.1))  # type: ignore[arg-type]
    weights = [[1.1, math.exp(-0.1)], [math.exp(-0.2), 0.0]]
    expected = -1.0 * (1.1 * -0.8 + math.exp(-0.1) * -2.1) + 0.5 * math.exp(-0.2) * -0.7
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    loss.backward()  # type: ignore[no-untyped-call]
    assert policy.grad is not None
    assert policy.grad.flatten().tolist() == pytest.approx(
        [-weights[0][0], -weights[0][1], 0.5 * weights[1][0], 0.0], rel=1e-6
    )
    assert (parts.clipped_high, parts.clipped_low) == (1, 0)
