"""One GRPO update: micro-batching, refused non-finite steps, the KL reference."""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable

import pytest
import torch
from transformers import LlamaForCausalLM

from osmosis_ai.errors import ConfigError
from osmosis_ai.train.algorithm.sequences import TrainingSequence
from osmosis_ai.train.algorithm.settings import AlgorithmConfig, OverlongConfig, UpdateSettings
from osmosis_ai.train.algorithm.update import (
    NonFiniteStepError,
    _mini_batches,
    _weights,
    carries_loss,
    train_step,
)
from tests.train.conftest import VOCAB, make_sequence, on_policy, tiny_llama


def _step_sequences() -> list[TrainingSequence]:
    generator = torch.Generator().manual_seed(3)
    sequences = []
    for i in range(6):
        length = 4 + i % 3
        tokens = torch.randint(0, VOCAB, (length,), generator=generator).tolist()
        mask = [0, 0] + [1] * (length - 2)
        logprobs = [-2.5 * m for m in mask]
        sequences.append(make_sequence(f"r{i}", f"g{i % 2}", float(i % 3), tokens, mask, logprobs))
    return sequences


@pytest.mark.parametrize("share_prefix", [False, True], ids=["unshared", "shared"])
@pytest.mark.parametrize("normalisation", ["token", "sequence"])
def test_micro_batching_gives_the_same_update_as_one_batch(
    normalisation: str, share_prefix: bool
) -> None:
    updated = []
    for budget in (64, 6):
        model = tiny_llama()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        config = UpdateSettings(
            AlgorithmConfig(normalisation=normalisation),  # type: ignore[arg-type]
            token_budget=budget,
            share_prefix=share_prefix,
        )
        metrics = train_step(model, optimizer, _step_sequences(), config, step=1)
        updated.append((metrics, torch.nn.utils.parameters_to_vector(model.parameters())))
    (whole, whole_params), (split, split_params) = updated
    # Shared, rollouts sharing at most a first token are packed as unshared (one batch).
    assert split.micro_batches == 6 and whole.micro_batches == 1
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
    sequences[0] = make_sequence(
        broken.rollout_id,
        broken.group_id,
        broken.reward,
        broken.token_ids,
        broken.loss_mask,
        [*broken.behaviour_logprobs[:-1], math.nan],
    )
    with pytest.raises(NonFiniteStepError, match=r"step 12: the loss is nan; no update"):
        train_step(model, optimizer, sequences, UpdateSettings(token_budget=8), step=12)
    _assert_untouched(model, before, optimizer)


def test_a_non_finite_gradient_is_refused_and_nothing_is_applied(
    model: LlamaForCausalLM,
) -> None:
    before = copy.deepcopy(model.state_dict())
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    # The loss stays finite; one parameter's gradient becomes infinite on its way back.
    model.model.norm.weight.register_hook(lambda grad: grad * math.inf)
    with pytest.raises(NonFiniteStepError, match=r"step 4: the gradient norm is (inf|nan)"):
        train_step(model, optimizer, _step_sequences(), UpdateSettings(), step=4)
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
    config = UpdateSettings(AlgorithmConfig(kl_beta=0.1))
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
        train_step(model, optimizer, [], UpdateSettings(), step=3)


def test_the_update_runs_without_the_models_dropout() -> None:
    """A model whose config asks for attention dropout: the update's forward pass is the
    policy that generated, so on-policy tokens have ratio 1 (with dropout they would not)."""
    model: torch.nn.Module = tiny_llama(attention_dropout=0.5)
    model.eval()  # as the engine generates
    sequences = on_policy(model, _step_sequences())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    metrics = train_step(model, optimizer, sequences, UpdateSettings(), step=1)
    assert metrics.mean_ratio == pytest.approx(1, abs=1e-5)
    assert metrics.max_ratio == pytest.approx(1, abs=1e-5)
    assert metrics.engine_mismatch_kl == pytest.approx(0, abs=1e-6)


def test_a_lora_adapters_own_dropout_stays_on_in_the_update() -> None:
    from peft import LoraConfig, get_peft_model

    from osmosis_ai.gateway.policies.hf_dir import quiet_peft

    with quiet_peft():
        model = get_peft_model(
            tiny_llama(attention_dropout=0.5),
            LoraConfig(r=2, lora_alpha=4, lora_dropout=0.5, target_modules=["q_proj"]),
        )
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    train_step(model, optimizer, _step_sequences(), UpdateSettings(), step=1)
    training = {name for name, m in model.named_modules() if m.training}
    assert training and all(".lora_dropout" in name for name in training), training


def test_two_epochs_of_two_mini_batches_are_four_updates_whose_later_ones_clip() -> None:
    """On-policy rollouts: the first update starts at ratio 1 (nothing to clip); once the
    policy moved, later mini-batches see ratios outside the band against the behaviour
    logprobs, and the step reports how far it moved (approx-KL) and its entropy."""
    model = tiny_llama()
    sequences = on_policy(model, _step_sequences())
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    config = UpdateSettings(AlgorithmConfig(epochs=2, mini_batches=2))
    metrics = train_step(model, optimizer, sequences, config, step=1)
    assert metrics.updates == 4 and len(metrics.clip_fraction_by_update) == 4
    assert metrics.clip_fraction_by_update[0] == 0
    assert max(metrics.clip_fraction_by_update[1:]) > 0, metrics
    assert metrics.approx_kl > 0 and 0 < metrics.entropy < math.log(VOCAB) + 1e-6
    # Start-of-step figures count each token once, at the step's start.
    assert metrics.policy_tokens == sum(s.policy_tokens for s in sequences)
    assert metrics.mean_ratio == pytest.approx(1.0, abs=1e-4)
    assert metrics.micro_batches == 4


def test_one_update_moves_nothing_before_it_and_clips_nothing_on_policy() -> None:
    model = tiny_llama()
    sequences = on_policy(model, _step_sequences())
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    metrics = train_step(model, optimizer, sequences, UpdateSettings(), step=1)
    assert (metrics.updates, metrics.clip_fraction_by_update) == (1, (0.0,))
    assert metrics.approx_kl == 0 and metrics.entropy > 0


def test_a_later_update_that_is_not_finite_restores_the_step_start(
    model: LlamaForCausalLM,
) -> None:
    """A step is applied whole or not at all: with a learning rate that blows the weights up
    in the first update, the second one's loss is not finite, and the weights and optimiser
    state the step started with come back."""
    before = copy.deepcopy(model.state_dict())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e30)
    config = UpdateSettings(AlgorithmConfig(epochs=2, max_grad_norm=0.0))
    with pytest.raises(NonFiniteStepError, match="step 5: the (loss|gradient norm) is"):
        train_step(model, optimizer, on_policy(model, _step_sequences()), config, step=5)
    _assert_untouched(model, before, optimizer)


def test_mini_batches_hold_whole_rollouts_dealt_in_an_order_drawn_from_the_step() -> None:
    sequences = _step_sequences() + [make_sequence("r0", "g0", 0.0)]  # r0 forked in two
    batches = _mini_batches(sequences, 2, step=7)
    assert sorted(i for batch in batches for i in batch) == list(range(len(sequences)))
    holding_r0 = [batch for batch in batches if 0 in batch]
    assert len(holding_r0) == 1 and 6 in holding_r0[0]
    assert _mini_batches(sequences, 2, step=7) == batches
    assert len(_mini_batches(sequences[:1], 4, step=7)) == 1  # fewer rollouts than batches
    assert _mini_batches(sequences, 1, step=7) == [list(range(len(sequences)))]


def test_masked_overlong_rollouts_weigh_nothing_and_are_not_counted() -> None:
    """``overlong = "mask"``: a truncated rollout's tokens get weight 0, and the others are
    averaged as if it were not there (its reward still sat in its group's baseline)."""
    sequences = _step_sequences()[:3]
    sequences[1] = dataclasses.replace(sequences[1], truncated=True)
    kept = [sequences[0], sequences[2]]
    total = sum(s.policy_tokens for s in kept)
    masked = _weights(
        sequences, UpdateSettings(AlgorithmConfig(overlong=OverlongConfig(mode="mask")))
    )
    assert masked == pytest.approx([1 / total, 0.0, 1 / total])
    every = sum(s.policy_tokens for s in sequences)
    assert _weights(sequences, UpdateSettings()) == pytest.approx([1 / every] * 3)


@pytest.mark.parametrize(
    ("config", "make_unlearnable"),
    [
        # overlong = "mask" and every rollout cut at max_tokens: no token weighs anything.
        (
            UpdateSettings(AlgorithmConfig(overlong=OverlongConfig(mode="mask"))),
            lambda s: dataclasses.replace(s, truncated=True),
        ),
        # A narrow mask band and tokens half a nat off: the importance weight masks each one.
        (
            UpdateSettings(AlgorithmConfig(tis_cap=1.01, tis_mode="token_mask", tis_floor=0.99)),
            lambda s: dataclasses.replace(
                s,
                behaviour_logprobs=tuple(
                    x - 0.5 * m for x, m in zip(s.behaviour_logprobs, s.loss_mask, strict=True)
                ),  # fmt: skip
            ),
        ),
    ],
    ids=["overlong-mask", "tis-mask"],
)
def test_an_update_whose_every_token_is_masked_is_not_applied(
    config: UpdateSettings, make_unlearnable: Callable[[TrainingSequence], TrainingSequence]
) -> None:
    """A first step leaves Adam with momentum; a second whose tokens all carry no loss must
    not step the optimiser, which would move every weight on a zero gradient, nor the
    schedule, and says it made no update."""
    model = tiny_llama()
    sequences = on_policy(model, _step_sequences())
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    first = train_step(model, optimizer, sequences, config, step=1, scheduler=scheduler)
    assert first.updates == 1
    before = torch.nn.utils.parameters_to_vector(model.parameters()).clone()
    unlearnable = [make_unlearnable(s) for s in on_policy(model, sequences)]
    masks_overlong = config.algorithm.overlong is not None
    assert carries_loss(unlearnable, config) is not masks_overlong
    metrics = train_step(model, optimizer, unlearnable, config, step=2, scheduler=scheduler)
    assert torch.equal(torch.nn.utils.parameters_to_vector(model.parameters()), before)
    assert scheduler.last_epoch == 1
    assert (metrics.updates, metrics.skipped_updates, metrics.grad_norm) == (0, 1, 0.0)
    if masks_overlong:
        assert metrics.policy_tokens == 0
    else:
        assert metrics.tis_masked_fraction == 1.0


def test_step_figures_count_only_the_tokens_with_loss() -> None:
    """overlong = "mask": the truncated rollout's tokens (advantage < 0 and 3 nats off-policy,
    so the clip would cut them all) are in no figure: not the policy tokens, the clip
    fraction or the mean ratio."""
    model = tiny_llama()
    sequences = on_policy(model, _step_sequences())
    far = [
        x + 3.0 * m
        for x, m in zip(sequences[0].behaviour_logprobs, sequences[0].loss_mask, strict=True)
    ]
    sequences[0] = dataclasses.replace(sequences[0], truncated=True, behaviour_logprobs=tuple(far))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    kept = sum(s.policy_tokens for s in sequences if not s.truncated)
    metrics = train_step(
        model,
        optimizer,
        sequences,
        UpdateSettings(AlgorithmConfig(overlong=OverlongConfig(mode="mask"))),
        step=1,
    )
    assert metrics.policy_tokens == kept
    assert metrics.clip_fraction == 0 and metrics.mean_ratio == pytest.approx(1.0, abs=1e-4)
    every = train_step(model, optimizer, sequences, UpdateSettings(), step=1)
    assert every.policy_tokens == kept + sequences[0].policy_tokens and every.clip_fraction > 0
