"""The GRPO-family loss and its settings, checked against the formulas by hand."""

from __future__ import annotations

import math

import pytest
import torch

from osmosis_ai.errors import ConfigError, SettingError
from osmosis_ai.train.algorithm.advantages import group_advantages, token_weights
from osmosis_ai.train.algorithm.loss import grpo_loss
from osmosis_ai.train.algorithm.micro_batches import collate
from osmosis_ai.train.algorithm.settings import CLIP_DEFAULTS, AlgorithmConfig, UpdateSettings
from tests.train.conftest import make_sequence


def _batch_and_expected(
    config: AlgorithmConfig, reference: list[list[float]] | None = None
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
    config = AlgorithmConfig(normalisation=normalisation, advantage_scale=scale)  # type: ignore[arg-type]
    policy, expected, batch = _batch_and_expected(config)
    loss, parts = grpo_loss(policy, batch, config)  # type: ignore[arg-type]
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert parts.tokens == 5


def test_kl_term_is_the_k3_estimate_to_the_reference() -> None:
    config = AlgorithmConfig(kl_beta=0.3)
    reference = [[-1.0, -0.1, -0.4, -2.0], [-0.2, -1.5, 0.0, 0.0]]
    policy, expected, batch = _batch_and_expected(config, reference)
    loss, parts = grpo_loss(policy, batch, config, torch.tensor(reference))  # type: ignore[arg-type]
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert parts.kl_sum > 0
    same, _ = grpo_loss(policy, batch, config, policy.detach())  # type: ignore[arg-type]
    without, _ = grpo_loss(policy, batch, AlgorithmConfig())  # type: ignore[arg-type]
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
    config = AlgorithmConfig(clip_low=0.2, clip_high=0.28)
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
        ("kl_beta", math.inf),
        ("advantage_scale", "mad"),
        ("advantage", "ppo"),
        ("normalisation", "batch"),
        ("dual_clip", -1.0),
        ("tis_floor", -0.5),
        ("max_grad_norm", -1.0),
    ],
)
def test_bad_config_names_the_field(field: str, value: object) -> None:
    with pytest.raises(SettingError, match=field) as caught:
        AlgorithmConfig(**{field: value})  # type: ignore[arg-type]
    assert caught.value.setting == field


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_tokens", 0), ("token_budget", 1), ("temperature", 0.0)],
)
def test_bad_update_setting_names_the_field(field: str, value: object) -> None:
    with pytest.raises(SettingError, match=field) as caught:
        UpdateSettings(**{field: value})  # type: ignore[arg-type]
    assert caught.value.setting == field


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
    loss, parts = grpo_loss(policy, batch, AlgorithmConfig(clip_low=0.2, clip_high=0.28))  # type: ignore[arg-type]
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
    config = AlgorithmConfig(tis_cap=1.5)
    loss, parts = grpo_loss(policy, batch, config)  # type: ignore[arg-type]
    assert loss.item() == pytest.approx(-(1.5 + math.exp(-0.1)), rel=1e-6)
    loss.backward()  # type: ignore[no-untyped-call]
    assert policy.grad is not None
    # d(-A·w·ρ)/d logπ = -A·w·ρ with ρ = 1: the capped weight of each token.
    assert policy.grad[0].tolist() == pytest.approx([-1.5, -math.exp(-0.1)], rel=1e-6)
    assert parts.tis_capped == 1 and parts.clipped_high == parts.clipped_low == 0


def test_each_loss_has_its_own_default_clip_band_and_a_set_one_wins() -> None:
    assert AlgorithmConfig().clip == CLIP_DEFAULTS["ppo_clip"] == (0.2, 0.28)
    assert AlgorithmConfig(loss="gspo").clip == (3e-4, 4e-4)
    assert AlgorithmConfig(loss="cispo").clip == (1.0, 3.0)  # no floor; the weight is at most 4
    assert AlgorithmConfig(loss="gspo", clip_high=0.01).clip == (3e-4, 0.01)
    with pytest.raises(ConfigError, match="clip_low must be below 1"):
        AlgorithmConfig(loss="gspo", clip_low=1.0)
    with pytest.raises(ConfigError, match="clip_low must be at most 1"):
        AlgorithmConfig(loss="cispo", clip_low=1.5)


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
    narrow = AlgorithmConfig(loss="gspo", clip_low=0.01, clip_high=0.01)
    loss, parts = grpo_loss(policy, batch, narrow)  # type: ignore[arg-type]
    # a: 2 tokens × -1·1.01; b: 1 token × 0.5·0.99.
    assert loss.item() == pytest.approx(2 * -1.01 + 0.5 * 0.99, rel=1e-6)
    loss.backward()  # type: ignore[no-untyped-call]
    assert policy.grad is not None and not policy.grad.any()
    assert (parts.clipped_high, parts.clipped_low) == (2, 1)
    policy, batch, _ = _two_sequences(later=True)
    narrow = AlgorithmConfig(loss="gspo", clip_low=0.5, clip_high=0.5)
    loss, parts = grpo_loss(policy, batch, narrow)  # type: ignore[arg-type]
    s_a, s_b = math.exp(0.05), math.exp(-0.2)
    assert loss.item() == pytest.approx(-2 * s_a + 0.5 * s_b, rel=1e-6)
    loss.backward()  # type: ignore[no-untyped-call]
    assert policy.grad is not None
    assert policy.grad.flatten().tolist() == pytest.approx([-s_a, -s_a, 0.5 * s_b, 0.0], rel=1e-6)
    assert parts.clipped_high == parts.clipped_low == 0


def test_gspo_starts_each_step_at_ratio_one_and_weights_by_the_engines_sequence_ratio() -> None:
    """The first update of a step: the learner's logprobs differ from the engine's (-0.8 vs
    -1.0...), far beyond GSPO's band, yet s = 1 for both sequences: nothing is clipped. Each
    sequence is weighted by its geometric-mean ratio to the engine, w_a = exp(mean(0.2,
    -0.1)) = e^0.05 and w_b = e^-0.2 (under the default cap of 2): each token's gradient is
    -A·w."""
    policy, batch, _ = _two_sequences()
    loss, parts = grpo_loss(policy, batch, AlgorithmConfig(loss="gspo"))  # type: ignore[arg-type]
    w_a, w_b = math.exp(0.05), math.exp(-0.2)
    assert loss.item() == pytest.approx(-2 * w_a + 0.5 * w_b, rel=1e-6)
    loss.backward()  # type: ignore[no-untyped-call]
    assert policy.grad is not None
    assert policy.grad.flatten().tolist() == pytest.approx([-w_a, -w_a, 0.5 * w_b, 0.0], rel=1e-6)
    assert parts.clipped_high == parts.clipped_low == parts.tis_capped == 0
    assert parts.ratio_max == pytest.approx(math.exp(0.2), rel=1e-6)


def _stale_by(gap: float) -> tuple[torch.Tensor, object]:
    """One sequence of three policy tokens (advantage +1, one weight each) whose behaviour
    logprobs are ``gap`` nats below the learner's: tokens one version stale."""
    learner = [-0.5, -1.0, -2.0]
    sequences = [
        make_sequence("a", "g", 1.0, (1, 2, 3, 4), (0, 1, 1, 1), (0.0, *(x - gap for x in learner)))
    ]
    return torch.tensor([learner], requires_grad=True), collate(sequences, [1.0], [1.0])


def test_gspo_corrects_a_stale_sequence_where_it_once_took_the_on_policy_gradient() -> None:
    """max_staleness = 1 with a behaviour gap of 1 nat a token: the sequence's weight is
    min(e, 2) = 2, so each token's gradient is -2, not the on-policy -1 (which GSPO anchored
    at the step's start gave it, clip fraction 0); tis_cap = 5 lets e through."""
    gradients = {}
    for gap, config in ((0.0, AlgorithmConfig(loss="gspo")), (1.0, AlgorithmConfig(loss="gspo")),
                        (1.0, AlgorithmConfig(loss="gspo", tis_cap=5.0))):  # fmt: skip
        policy, batch = _stale_by(gap)
        loss, parts = grpo_loss(policy, batch, config)  # type: ignore[arg-type]
        loss.backward()  # type: ignore[no-untyped-call]
        assert policy.grad is not None
        gradients[(gap, config.tis_cap)] = policy.grad[0].tolist()
    assert gradients[(0.0, None)] == pytest.approx([-1.0] * 3, rel=1e-6)
    assert gradients[(1.0, None)] == pytest.approx([-2.0] * 3, rel=1e-6)
    assert gradients[(1.0, 5.0)] == pytest.approx([-math.e] * 3, rel=1e-6)


def test_gspo_without_importance_sampling_is_refused_on_one_line() -> None:
    with pytest.raises(ConfigError, match=r'loss = "gspo" needs tis_cap > 0') as caught:
        AlgorithmConfig(loss="gspo", tis_cap=0.0)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("dual_clip", "policy_logprob", "gradient"),
    [
        (3.0, 1.5, 0.0),  # ρ = e^1.5 ≈ 4.48 > 3 with A < 0: the loss is bounded at 3·|A|
        (3.0, math.log(2.0), 2.0),  # ρ = 2 < 3: unclipped, gradient ρ·|A|
        (0.0, 1.5, math.exp(1.5)),  # off: the gradient grows with ρ, as before
    ],
)
def test_the_dual_clip_bounds_a_negative_advantage_whose_ratio_rose_far(
    dual_clip: float, policy_logprob: float, gradient: float
) -> None:
    """A stale token with A = -1 that the learner now finds far likelier than the engine
    did (behaviour logprob 0): PPO's pessimistic max takes the unclipped branch, -A·ρ;
    the dual clip caps it at -A·c."""
    sequences = [make_sequence("a", "g", 0.0, (1, 2), (0, 1), (0.0, 0.0))]
    batch = collate(sequences, [-1.0], [1.0])
    policy = torch.tensor([[policy_logprob]], requires_grad=True)
    loss, parts = grpo_loss(policy, batch, AlgorithmConfig(dual_clip=dual_clip))
    loss.backward()  # type: ignore[no-untyped-call]
    assert policy.grad is not None
    assert float(policy.grad[0, 0]) == pytest.approx(gradient, rel=1e-6)
    bound = dual_clip and math.exp(policy_logprob) > dual_clip
    assert loss.item() == pytest.approx(dual_clip if bound else math.exp(policy_logprob))
    assert parts.dual_clipped == int(bool(bound))


def test_a_dual_clip_inside_the_band_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"dual_clip must be 0 \(off\) or above 1 \+ clip_high"):
        AlgorithmConfig(dual_clip=1.2)
    assert AlgorithmConfig(loss="cispo").dual == 0.0  # CISPO's weight is capped already
    # A band that reaches past 3 leaves the default off; a bound set inside it is refused.
    assert (AlgorithmConfig().dual, AlgorithmConfig(clip_high=50.0).dual) == (3.0, 0.0)
    with pytest.raises(ConfigError, match=r"above 1 \+ clip_high \(51\), not 3.0"):
        AlgorithmConfig(clip_high=50.0, dual_clip=3.0)


def _three_stale_tokens() -> tuple[torch.Tensor, object]:
    """One sequence (advantage -1, one weight each) whose learner logprobs are 0.5, -0.1 and
    1.0 nats above the behaviour's: token ratios e^0.5 ≈ 1.649, e^-0.1 ≈ 0.905, e ≈ 2.718;
    the sequence's geometric mean is e^(1.4 / 3) ≈ 1.595."""
    learner = [-1.0, -2.0, -0.5]
    behaviour = [-1.5, -1.9, -1.5]
    sequences = [make_sequence("a", "g", 0.0, (1, 2, 3, 4), (0, 1, 1, 1), (0.0, *behaviour))]
    return torch.tensor([learner], requires_grad=True), collate(sequences, [-1.0], [1.0])


@pytest.mark.parametrize(
    ("mode", "cap", "floor", "weights", "capped", "masked"),
    [
        ("token_truncate", 2.0, 0.0, [math.exp(0.5), math.exp(-0.1), 2.0], 1, 0),
        ("token_mask", 2.0, 0.95, [math.exp(0.5), 0.0, 0.0], 0, 2),
        ("sequence_truncate", 1.5, 0.0, [1.5] * 3, 3, 0),
        ("sequence_truncate", 2.0, 0.0, [math.exp(1.4 / 3)] * 3, 0, 0),
        ("sequence_mask", 1.5, 0.5, [0.0] * 3, 0, 3),
        ("sequence_mask", 5.0, 0.5, [math.exp(1.4 / 3)] * 3, 0, 0),
    ],
)
def test_importance_sampling_truncates_or_masks_by_token_or_by_sequence(
    mode: str, cap: float, floor: float, weights: list[float], capped: int, masked: int
) -> None:
    """With importance sampling the ratio is to the step's start (1: nothing clipped), so
    each token's loss is -A·w and its gradient -A·w = w: w the token's ratio or the
    sequence's geometric mean, truncated at the cap, or kept inside [floor, cap] and 0
    outside (IcePop)."""
    policy, batch = _three_stale_tokens()
    config = AlgorithmConfig(tis_cap=cap, tis_mode=mode, tis_floor=floor)  # type: ignore[arg-type]
    loss, parts = grpo_loss(policy, batch, config)  # type: ignore[arg-type]
    assert loss.item() == pytest.approx(sum(weights), rel=1e-6)
    loss.backward()  # type: ignore[no-untyped-call]
    assert policy.grad is not None
    assert policy.grad[0].tolist() == pytest.approx(weights, rel=1e-6)
    assert (parts.tis_capped, parts.tis_masked) == (capped, masked)
    assert parts.carrying == 3 - masked


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"tis_mode": "token_mask"}, "tis_mode is set but tis_cap is 0"),
        ({"tis_cap": 2.0, "tis_floor": 0.5}, "tis_floor is the lower bound of the mask modes"),
        ({"tis_cap": 0.5}, "tis_cap must be 0 .off. or at least 1"),
        ({"tis_cap": 2.0, "tis_mode": "token_mask", "tis_floor": 1.0}, "tis_floor must be below 1"),
        ({"tis_cap": 2.0, "tis_mode": "sequence"}, "tis_mode must be one of"),
    ],
)
def test_bad_importance_sampling_settings_name_the_field(
    settings: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        AlgorithmConfig(**settings)  # type: ignore[arg-type]


def test_the_loss_counts_no_token_of_a_rollout_left_out() -> None:
    """overlong = "mask" gives a truncated rollout weight 0: its tokens carry no loss, so no
    figure counts them. Here the left-out sequence b's ratio (e^1, A > 0) would be clipped,
    and it made every clipped token, the largest ratio and the KL of the micro-batch."""
    sequences = [
        make_sequence("a", "g", 1.0, (1, 2, 3), (0, 1, 1), (0.0, -1.0, -1.0)),
        make_sequence("b", "g", 1.0, (1, 2, 3), (0, 1, 1), (0.0, -2.0, -2.0)),
    ]
    batch = collate(sequences, [1.0, 1.0], [0.5, 0.0])
    policy = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]], requires_grad=True)
    loss, parts = grpo_loss(policy, batch, AlgorithmConfig())
    assert loss.item() == pytest.approx(-1.0, rel=1e-6)
    assert (parts.tokens, parts.clipped_high, parts.carrying) == (2, 0, 2)
    assert parts.ratio_max == pytest.approx(1.0) and parts.mismatch_kl_sum == pytest.approx(0)


def test_cispo_weights_each_tokens_log_likelihood_by_its_clipped_ratio_without_cutting_it() -> None:
    """CISPO: ℓ = -A·sg(clip(ρ))·logπ. Ratios: a e^0.2, e^-0.1; b e^-0.2. With the cap
    1 + 0.1, a's first weight is 1.1 (clipped, its gradient kept: -A·1.1), the others' their
    ratio; no floor (clip_low = 1)."""
    policy, batch, _ = _two_sequences()
    capped = AlgorithmConfig(loss="cispo", clip_low=1.0, clip_high=0.1)
    loss, parts = grpo_loss(policy, batch, capped)  # type: ignore[arg-type]
    weights = [[1.1, math.exp(-0.1)], [math.exp(-0.2), 0.0]]
    expected = -1.0 * (1.1 * -0.8 + math.exp(-0.1) * -2.1) + 0.5 * math.exp(-0.2) * -0.7
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    loss.backward()  # type: ignore[no-untyped-call]
    assert policy.grad is not None
    assert policy.grad.flatten().tolist() == pytest.approx(
        [-weights[0][0], -weights[0][1], 0.5 * weights[1][0], 0.0], rel=1e-6
    )
    assert (parts.clipped_high, parts.clipped_low) == (1, 0)
