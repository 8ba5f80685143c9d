"""A micro-batch's shared prefix computed once (``[learner] share_prefix``): how sequences are
planned into micro-batches, and that the logprobs, the gradient and a whole step equal the
unshared ones within fp32 rounding, on every attention type the learner runs."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from osmosis_ai.errors import ConfigError
from osmosis_ai.gateway.policies.hf_dir import quiet_peft
from osmosis_ai.train.algorithm.attention import use_learner_attention
from osmosis_ai.train.algorithm.logprobs import packs_prefix, policy_logprobs, sequence_logprobs
from osmosis_ai.train.algorithm.micro_batches import (
    MIN_SHARED_TOKENS,
    PASS_TOKENS_BF16,
    PASS_TOKENS_FP32,
    MicroBatch,
    batch_prefix,
    cluster_prefixes,
    collate,
    pack_micro_batches,
    packed_tokens,
    plan_cost,
    plan_micro_batches,
    row_prefixes,
    shared_prefix,
    tokens_per_pass,
)
from osmosis_ai.train.algorithm.sequences import TrainingSequence
from osmosis_ai.train.algorithm.settings import AlgorithmConfig, UpdateSettings
from osmosis_ai.train.algorithm.update import train_step
from tests.train.conftest import make_sequence, tiny_llama

#: The issue's bounds: |Δ logprob| and ‖Δ gradient‖ / ‖gradient‖. A logprob's bound grows
#: with its size beyond 1: fp32 rounds a logprob of -16 (a random token's under the embedded
#: model) to steps of 2e-6, and 30 layers computed in another order (the prefix as one row,
#: the rests as a batch) moved one by 1.2e-5 on a CPU with AMX.
LOGPROB_TOLERANCE = 1e-5
GRADIENT_TOLERANCE = 1e-4


def test_the_shared_prefix_leaves_every_sequence_a_token_of_its_own() -> None:
    assert shared_prefix([(1, 2, 3, 4), (1, 2, 3, 5, 6), (1, 2, 3, 4, 7)]) == 3
    assert shared_prefix([(1, 2, 3), (1, 2, 3, 4)]) == 2  # not the whole of the shorter
    assert shared_prefix([(1, 2), (3, 4)]) == 0
    assert shared_prefix([(1, 2, 3)]) == 0  # one row: nothing to share


def test_a_group_stays_in_one_micro_batch_and_another_sharing_less_starts_its_own() -> None:
    system = list(range(100, 110))
    group_a = [(*system, 1, 1, 1, 1, 1, 1, n) for n in range(4)]
    group_b = [(*system, 2, 2, 2, 2, 2, 2, n, n) for n in range(4)]
    loners = [(7, 8, 9), (5, 6, 7, 8, 9, 10), (3, 4, 5, 6, 7, 8)]  # nothing in common
    token_ids: list[Sequence[int]] = [*group_b, loners[0], *group_a, *loners[1:]]
    batches = plan_micro_batches(token_ids, token_budget=64, share_prefix=True)
    assert sorted(i for batch in batches for i in batch) == list(range(len(token_ids)))
    as_sets = [set(batch) for batch in batches]
    assert {0, 1, 2, 3} in as_sets and {5, 6, 7, 8} in as_sets  # a group each
    # The loners share nothing and are packed by length, as unshared (3 rows of 6 fit).
    assert {4, 9, 10} in as_sets
    assert plan_micro_batches([token_ids[i] for i in (4, 9, 10)], 64, share_prefix=False) == [
        [1, 2, 0]
    ]
    for batch in batches:
        ids = [token_ids[i] for i in batch]
        prefix = shared_prefix(ids)
        assert prefix + len(ids) * (max(map(len, ids)) - prefix) <= 64
    # Each group fits one micro-batch: each computes its own prefix.
    assert set(cluster_prefixes(token_ids, batches)) == {0}
    # A budget too small for a group whole splits it; each part still shares its prompt,
    # which the parts compute once for both: the group's common beginning.
    split = plan_micro_batches(group_a, token_budget=18, share_prefix=True)
    assert len(split) == 2 and all(shared_prefix([group_a[i] for i in b]) >= 16 for b in split)
    assert cluster_prefixes(group_a, split) == [16, 16]
    # Rows left alone, packed together, share no cluster's prefix.
    mixed = [*group_a, *loners]
    parts = plan_micro_batches(mixed, token_budget=18, share_prefix=True)
    assert parts == [[0, 1], [2, 3], [6, 5, 4]]
    assert cluster_prefixes(mixed, parts) == [16, 16, 0]
    with pytest.raises(ConfigError, match="exceeds micro_batch_tokens=10"):
        plan_micro_batches(group_a, token_budget=10, share_prefix=True)


def test_a_much_longer_row_is_cut_from_its_group_rather_than_padding_every_row() -> None:
    prompt = tuple(range(100, 120))
    short = [(*prompt, n, n) for n in range(3)]
    long = (*prompt, *range(200, 240))
    token_ids = [*short, long]
    # Together: the prompt once, then 4 rests padded to 40 (180 tokens); cut: the three short
    # rows share the prompt (26) and the long one is computed alone (60).
    batches = plan_micro_batches(token_ids, token_budget=256, share_prefix=True)
    assert sorted(map(sorted, batches)) == [[0, 1, 2], [3]]
    # Rows of similar length stay together however many there are.
    similar = [(*prompt, *range(n, n + 10 + n % 3)) for n in range(8)]
    assert plan_micro_batches(similar, token_budget=256, share_prefix=True) == [
        sorted(range(8), key=lambda i: len(similar[i]))
    ]


def test_a_plan_costs_its_tokens_and_a_pass_for_each_micro_batch_and_cluster_prefix() -> None:
    prompt = tuple(range(100, 120))  # 20 tokens
    group = [(*prompt, *range(n + 1)) for n in range(4)]  # rests of 1..4 tokens
    # One micro-batch: the prompt once, 4 rests padded to 4, one pass.
    assert plan_cost(group, [[0, 1, 2, 3]], pass_tokens=10) == 20 + 4 * 4 + 10
    # Cut in two: each part its rests and a pass; the prompt once, in a pass of its own.
    assert cluster_prefixes(group, [[0, 1], [2, 3]]) == [20, 20]
    assert plan_cost(group, [[0, 1], [2, 3]], pass_tokens=10) == (20 + 10) + (2 * 2 + 10) + (
        2 * 4 + 10
    )
    # Rows sharing too little for a prefix pass are computed whole.
    loose = [(*prompt[:8], 1, 2), (*prompt[:8], 3, 4, 5)]
    assert batch_prefix(loose) == 0 < shared_prefix(loose) == 8 < MIN_SHARED_TOKENS
    assert plan_cost(loose, [[0, 1]], pass_tokens=10) == 2 * 11 + 10
    assert (
        collate(
            [
                make_sequence(f"r{n}", "g", 0.0, list(ids), [1] * len(ids))
                for n, ids in enumerate(loose)
            ],
            [0.0, 0.0],
            [1.0, 1.0],
            share_prefix=True,
        ).prefix
        == 0
    )


def test_where_a_pass_costs_more_than_the_tokens_it_saves_micro_batches_are_fewer() -> None:
    # Four GRPO groups of 8, each its own short prompt after a common system prompt of 20
    # tokens (too little to cluster the groups), completions of 4 to 32 tokens: the
    # calculator benchmark's and the TRL comparison's shape.
    generator = torch.Generator().manual_seed(0)
    system = list(range(1000, 1020))
    token_ids: list[Sequence[int]] = []
    for group in range(4):
        task = list(range(2000 + 20 * group, 2000 + 20 * group + 14))
        for _ in range(8):
            length = int(torch.randint(4, 33, (1,), generator=generator))
            token_ids.append(
                (*system, *task, *torch.randint(0, 999, (length,), generator=generator).tolist())
            )
    lengths = [len(ids) for ids in token_ids]
    packed = pack_micro_batches(lengths, 1024)
    # Tokens alone: each group computes its prompt once, and is cut where that saves padding.
    fewest = plan_micro_batches(token_ids, 1024, share_prefix=True, pass_tokens=0)
    assert len(fewest) > len(packed) == 2
    assert plan_cost(token_ids, fewest, pass_tokens=0) < plan_cost(token_ids, packed, pass_tokens=0)
    # Priced as a pass costs in bf16 on a CPU, two full micro-batches (each computing the
    # system prompt once) cost less than a micro-batch or more a group.
    assert tokens_per_pass(bf16=True) == PASS_TOKENS_BF16
    priced = plan_micro_batches(token_ids, 1024, share_prefix=True, pass_tokens=PASS_TOKENS_BF16)
    assert sorted(map(sorted, priced)) == sorted(map(sorted, packed))
    assert plan_cost(token_ids, priced, pass_tokens=PASS_TOKENS_BF16) < plan_cost(
        token_ids, fewest, pass_tokens=PASS_TOKENS_BF16
    )
    assert all(batch_prefix([token_ids[i] for i in batch]) == 20 for batch in priced)
    # Priced as in fp32, in between: fewer micro-batches than by tokens alone, each within
    # one group, so that each computes its group's prompt once.
    middle = plan_micro_batches(token_ids, 1024, share_prefix=True, pass_tokens=PASS_TOKENS_FP32)
    assert len(packed) < len(middle) < len(fewest)
    assert all(len({i // 8 for i in batch}) == 1 for batch in middle)
    assert all(
        batch_prefix([token_ids[i] for i in batch]) == 34 for batch in middle if len(batch) > 1
    )
    # A model that runs a packed row: the whole step in one micro-batch, each group's prompt
    # once and no padding, cheaper than either.
    for pass_tokens in (PASS_TOKENS_FP32, PASS_TOKENS_BF16):
        one = plan_micro_batches(
            token_ids, 1024, share_prefix=True, pass_tokens=pass_tokens, packs=True
        )
        assert [sorted(batch) for batch in one] == [list(range(32))]
    shares = row_prefixes(token_ids)
    assert shares == tuple((8 * (i // 8), 34) for i in range(32))
    assert packed_tokens(token_ids, shares) == sum(lengths) - 34 * 28
    assert packed_tokens(token_ids, shares) + PASS_TOKENS_FP32 < plan_cost(
        token_ids, middle, pass_tokens=PASS_TOKENS_FP32
    )


def test_unshared_planning_is_packing_by_length() -> None:
    token_ids = [(1, 2, 3), (1, 2, 3, 4, 5), (1, 2, 3, 4)]
    assert plan_micro_batches(token_ids, 8, share_prefix=False) == [[1], [2, 0]]


def _group(
    vocab: int, *, prompt: int = 24, seed: int = 1, rollouts: int = 4
) -> list[TrainingSequence]:
    """Rollouts of one prompt, completions of different lengths (two share a turn)."""
    generator = torch.Generator().manual_seed(seed)

    def draw(count: int) -> list[int]:
        return torch.randint(0, vocab, (count,), generator=generator).tolist()

    shared = draw(prompt)
    turn = draw(6)
    completions = [draw(5), draw(11), turn + draw(4), turn + draw(9)][:rollouts]
    completions += [draw(3 + 2 * index) for index in range(rollouts - len(completions))]
    return [
        make_sequence(
            f"r{index}",
            "g",
            float(index),
            tokens=shared + completion,
            mask=[0] * prompt + [1] * len(completion),
        )
        for index, completion in enumerate(completions)
    ]


def _scored(model: torch.nn.Module, batch: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's logprobs and the gradient of their weighted sum."""
    model.zero_grad(set_to_none=True)
    logprobs = policy_logprobs(model, batch)
    (logprobs * batch.weights).sum().backward()  # type: ignore[no-untyped-call]
    gradient = torch.cat(
        [p.grad.flatten() for p in model.parameters() if p.requires_grad and p.grad is not None]
    )
    return logprobs.detach(), gradient


def _assert_exact(
    model: torch.nn.Module, sequences: list[TrainingSequence], *, packed: bool = False
) -> MicroBatch:
    """The shared (``packed``: packed) batch's logprobs and gradient against the unshared
    one's; returns the shared batch."""
    model.eval()
    ones = [1.0] * len(sequences)
    unshared = collate(sequences, ones, ones)
    shared = collate(sequences, ones, ones, share_prefix=True, packed=packed)
    assert unshared.prefix == 0 and (shared.prefix > 0 or shared.row_prefixes)
    unshared_logprobs, unshared_gradient = _scored(model, unshared)
    logprobs, gradient = _scored(model, shared)
    bound = LOGPROB_TOLERANCE * unshared_logprobs.abs().clamp(min=1.0)
    assert bool(((logprobs - unshared_logprobs).abs() <= bound).all())
    difference = (gradient - unshared_gradient).norm() / unshared_gradient.norm()
    assert float(difference) <= GRADIENT_TOLERANCE
    return shared


def _tiny(family: str, **config: Any) -> Callable[[str], torch.nn.Module]:
    """A builder of a random 2-layer model of ``family`` with an attention implementation."""

    def build(attention: str) -> torch.nn.Module:
        import transformers

        configs = {
            "llama": transformers.LlamaConfig,
            "qwen2": transformers.Qwen2Config,
            "qwen3": transformers.Qwen3Config,
            "mistral": transformers.MistralConfig,
            "gemma3": transformers.Gemma3TextConfig,
            "phi3": transformers.Phi3Config,
            "gpt_neox": transformers.GPTNeoXConfig,
        }
        torch.manual_seed(0)
        settings = configs[family](
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
            attn_implementation=attention, **config,
        )  # fmt: skip
        model: torch.nn.Module = transformers.AutoModelForCausalLM.from_config(settings)  # type: ignore[no-untyped-call]
        return model

    return build


#: Every attention the learner runs: grouped-query (Llama), with biases (Qwen2), with q/k
#: norms (Qwen3), a sliding window narrower than the prompt on every layer (Mistral) or on
#: some (Qwen2's lower layers, Gemma 3's interleaved local and global layers), fused qkv
#: (Phi-3), partial rotary (GPT-NeoX).
ARCHITECTURES = {
    "llama": _tiny("llama"),
    "qwen2": _tiny("qwen2"),
    "qwen3": _tiny("qwen3", head_dim=8),
    "mistral-sliding-window": _tiny("mistral", sliding_window=8),
    "qwen2-sliding-window-layers": _tiny(
        "qwen2", use_sliding_window=True, sliding_window=8, max_window_layers=1
    ),
    "gemma3-local-and-global": _tiny(
        "gemma3", sliding_window=8, head_dim=8, final_logit_softcapping=None
    ),
    "phi3": _tiny("phi3", pad_token_id=0, eos_token_id=1, bos_token_id=2),
    "gpt-neox": _tiny("gpt_neox", rotary_pct=0.5),
}


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_shared_logprobs_and_gradient_equal_the_unshared_ones(
    architecture: str, attention: str
) -> None:
    model = ARCHITECTURES[architecture](attention)
    _assert_exact(model, _group(vocab=64))


#: The architectures whose attention takes a packed row's mask (full attention, fused).
PACKING = ["gpt-neox", "llama", "phi3", "qwen2", "qwen3"]


@pytest.mark.parametrize("architecture", PACKING)
def test_a_packed_batch_of_two_groups_and_a_lone_row_is_exact(architecture: str) -> None:
    """Each group's prompt once, the lone row whole, no padding, in one pass: the logprobs
    and the gradient equal the unshared batch's."""
    lone = make_sequence("lone", "l", 0.0, tokens=list(range(7, 40)), mask=[0] * 20 + [1] * 13)
    sequences = [*_group(vocab=64, seed=1), lone, *_group(vocab=64, seed=2, rollouts=3)]
    batch = _assert_exact(ARCHITECTURES[architecture]("sdpa"), sequences, packed=True)
    assert batch.row_prefixes == ((0, 24),) * 4 + ((4, 0),) + ((5, 24),) * 3
    assert batch.computed_tokens == sum(len(s) for s in sequences) - 24 * 5


def test_a_prefix_and_its_rests_run_as_one_pass_where_the_mask_allows() -> None:
    """Fused attention on full-attention layers: one packed pass a micro-batch (exact: the
    test above); eager attention, or a sliding window the mask would drop: the prefix's pass,
    then the rests' against its cache."""
    sequences = _group(vocab=64)
    batch = collate(sequences, [1.0] * 4, [1.0] * 4, share_prefix=True)
    passes = {}
    kinds = [("llama", "sdpa"), ("llama", "eager"), ("mistral-sliding-window", "sdpa")]
    for name, attention in kinds:
        model = ARCHITECTURES[name](attention)
        body = model.get_decoder()  # type: ignore[operator]
        calls = _counted_calls(body)
        with torch.no_grad():
            policy_logprobs(model, batch)
        passes[name, attention] = len(calls)
        assert packs_prefix(model) == (len(calls) == 1)
    assert passes == {
        ("llama", "sdpa"): 1,
        ("llama", "eager"): 2,
        ("mistral-sliding-window", "sdpa"): 2,
    }


def _counted_calls(module: torch.nn.Module) -> list[int]:
    """A list that grows by one at each forward call of ``module``."""
    calls: list[int] = []
    module.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


def test_sharing_is_exact_on_the_embedded_model(embedded_hf_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(embedded_hf_dir), dtype=torch.float32)
    _assert_exact(model, _group(vocab=model.config.vocab_size, prompt=40))


def test_sharing_is_exact_through_a_lora_adapter() -> None:
    from peft import LoraConfig, get_peft_model

    adapter = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    with quiet_peft():
        model = get_peft_model(tiny_llama(vocab_size=64), adapter)
    _assert_exact(model, _group(vocab=64))


@pytest.mark.parametrize("learners", [False, True], ids=["sdpa", "learner-attention"])
def test_under_bf16_autocast_sharing_is_as_close_as_bf16_rounding(learners: bool) -> None:
    """Packed (SDPA), also with the learner's own attention (matmuls for short queries),
    which takes the packed row's boolean mask as it takes the cache's."""
    model = tiny_llama(vocab_size=64)
    assert not learners or use_learner_attention(model)
    assert packs_prefix(model)
    model.train(False)
    sequences = _group(vocab=64)
    out = []
    for share in (False, True):
        batch = collate(sequences, [1.0] * 4, [1.0] * 4, share_prefix=share)
        with torch.no_grad():
            out.append(policy_logprobs(model, batch, bf16=True))
    assert float((out[0] - out[1]).abs().max()) < 0.05  # bf16 keeps 8 bits of mantissa


def test_a_teachers_sequence_logprobs_are_the_same_shared() -> None:
    model = tiny_llama(vocab_size=64)
    model.train(False)
    sequences = _group(vocab=64)
    kwargs: dict[str, Any] = {"token_budget": 256, "device": torch.device("cpu"), "grammars": None}
    with torch.no_grad():
        unshared = sequence_logprobs(model, sequences, share_prefix=False, **kwargs)
        shared = sequence_logprobs(model, sequences, share_prefix=True, **kwargs)
    pairs = [
        (x, y) for a, b in zip(unshared, shared, strict=True) for x, y in zip(a, b, strict=True)
    ]
    assert pairs and max(abs(x - y) for x, y in pairs) <= LOGPROB_TOLERANCE


@pytest.mark.parametrize(
    ("algorithm", "lora"),
    [
        pytest.param(AlgorithmConfig(), False, id="grpo"),
        pytest.param(
            AlgorithmConfig(loss="gspo", epochs=2, mini_batches=2, kl_beta=0.05),
            False,
            id="gspo-epochs-mini-batches-kl",
        ),
        pytest.param(
            AlgorithmConfig(loss="cispo", normalisation="constant"), False, id="cispo-constant"
        ),
        pytest.param(AlgorithmConfig(epochs=2, kl_beta=0.05), False, id="grpo-epochs-kl"),
        pytest.param(AlgorithmConfig(epochs=2, kl_beta=0.05), True, id="lora-epochs-kl"),
    ],
)
@pytest.mark.parametrize("budget", [96, 512], ids=["cut", "packed"])
def test_a_whole_step_shared_moves_the_weights_as_unshared(
    algorithm: AlgorithmConfig, lora: bool, budget: int
) -> None:
    """Two groups, a budget that cuts the larger into two micro-batches, which compute its
    prompt once for both, or one that packs both groups into one micro-batch, each prompt
    once: the weights after the step (Adam, clipping, every loss term) and its figures match;
    only the tokens computed drop, by every rollout's prompt but one a group. Through a LoRA
    adapter the KL reference is the same model with its adapter disabled."""
    from peft import LoraConfig, get_peft_model

    sequences = _group(vocab=64, seed=1, rollouts=8) + [
        make_sequence(s.rollout_id + "b", "h", s.reward, s.token_ids, s.loss_mask)
        for s in _group(vocab=64, seed=2)
    ]
    results = []
    for share in (False, True):
        model: torch.nn.Module = tiny_llama(vocab_size=64)
        reference = copy.deepcopy(model)
        if lora:
            adapter = LoraConfig(
                r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
            )
            with quiet_peft():
                model = reference = get_peft_model(model, adapter)
        reference.train(False)
        trained = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.SGD(trained, lr=0.1)  # linear in the gradient
        settings = UpdateSettings(
            algorithm=algorithm, max_tokens=16, token_budget=budget, share_prefix=share
        )
        metrics = train_step(
            model, optimizer, sequences, settings, step=1, reference_model=reference
        )
        weights = torch.cat([p.detach().flatten() for p in trained])
        results.append((metrics, weights))
    (unshared, before), (shared, after) = results
    assert float((after - before).abs().max()) <= 1e-5
    assert shared.loss == pytest.approx(unshared.loss, abs=1e-5)
    assert shared.grad_norm == pytest.approx(unshared.grad_norm, rel=1e-4)
    assert shared.tokens == unshared.tokens == unshared.computed_tokens
    if algorithm.mini_batches == 1:
        assert shared.computed_tokens == shared.tokens - 24 * (len(sequences) - 2)
        assert shared.micro_batches == algorithm.epochs * (1 if budget == 512 else 2)
    else:  # each mini-batch holds part of each group
        assert shared.computed_tokens < unshared.tokens
