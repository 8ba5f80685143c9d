"""The learner's replay of the grammars tokens were generated under, and its masked logits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from osmosis_ai.gateway.policies.engines.base import JsonGrammar
from osmosis_ai.gateway.policies.engines.grammar import GrammarCompiler, grammar_text
from osmosis_ai.train.algorithm.grammar_masks import allowed_logits, replayed_masks
from osmosis_ai.train.algorithm.sequences import GrammarSpan, TrainingSequence
from tests.train.conftest import tokenizer_dir  # noqa: F401 -- fixture

ANSWER = JsonGrammar(
    json.dumps(
        {
            "type": "object",
            "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
            "required": ["answer"],
            "additionalProperties": False,
        }
    ),
    max_whitespace=None,
)


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path) -> Any:  # noqa: F811
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)


@pytest.fixture(scope="module")
def compiler(tokenizer: Any) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, vocab_size=len(tokenizer), stop_ids={tokenizer.eos_token_id})


def _packed(allowed: list[list[int]], vocab: int) -> torch.Tensor:
    """Bitmask rows allowing exactly ``allowed[i]`` in row ``i`` (``[]``: every token)."""
    words = (vocab + 31) // 32
    rows = torch.full((len(allowed), words), -1, dtype=torch.int32)
    for row, tokens in enumerate(allowed):
        if not tokens:
            continue
        bits = [0] * words
        for token in tokens:
            bits[token // 32] |= 1 << (token % 32)
        # As signed int32 words, which llguidance's packed masks are.
        rows[row] = torch.tensor([b - (1 << 32) if b >= 1 << 31 else b for b in bits])
    return rows


def test_allowed_logits_keep_the_allowed_tokens_and_their_gradient_only() -> None:
    vocab = 70
    logits = torch.randn(3, vocab, requires_grad=True)
    packed = _packed([[1, 31, 32, 69], [5], []], vocab)
    masked = allowed_logits(logits, packed)
    assert torch.isfinite(masked[0]).tolist() == [t in (1, 31, 32, 69) for t in range(vocab)]
    # A forced token has logprob 0 and no gradient; an unconstrained row is untouched.
    logprobs = torch.log_softmax(masked, dim=-1)
    assert logprobs[1, 5].item() == 0.0
    assert torch.equal(masked[2], logits[2])
    logprobs[0, 31].backward()  # type: ignore[no-untyped-call]
    grad = logits.grad
    assert grad is not None
    assert set(grad[0].nonzero().flatten().tolist()) <= {1, 31, 32, 69}
    assert not grad[1].any()


def test_rows_for_another_vocabulary_are_refused() -> None:
    with pytest.raises(ValueError, match="masks were made for another vocabulary"):
        allowed_logits(torch.zeros(1, 100), _packed([[3]], 64))


def test_a_span_is_replayed_at_the_positions_that_predict_its_tokens(
    compiler: GrammarCompiler, tokenizer: Any
) -> None:
    text = grammar_text(ANSWER)
    reply = tokenizer.encode('{"answer": "no"}', add_special_tokens=False)
    completion = [*reply, tokenizer.eos_token_id]
    prompt = [1, 2, 3, 4]
    sequence = TrainingSequence(
        rollout_id="r",
        group_id="g",
        reward=1.0,
        token_ids=(*prompt, *completion),
        loss_mask=(0,) * len(prompt) + (1,) * len(completion),
        behaviour_logprobs=(0.0,) * (len(prompt) + len(completion)),
        grammar_spans=(GrammarSpan(len(prompt), len(prompt) + len(completion), text),),
    )
    packed, unreplayed = replayed_masks([sequence], len(sequence), compiler)
    assert unreplayed == 0
    assert packed.shape == (1, len(sequence) - 1, (len(tokenizer) + 31) // 32)
    # The prompt's positions are unconstrained; each completion token's position allows it.
    assert (packed[0, : len(prompt) - 1] == -1).all()
    for offset, token in enumerate(completion):
        row = packed[0, len(prompt) - 1 + offset]
        assert (row != -1).any() and bool((row[token // 32] >> (token % 32)) & 1)
    # Text the grammar forces ('{"answer": "') allows its own tokens only; after it, the
    # enum's words (more than one token, not all); after the JSON, only EOS.
    logits = allowed_logits(torch.zeros(len(completion), len(tokenizer)), packed[0, 3:])
    allowed = [torch.isfinite(row).nonzero().flatten().tolist() for row in logits]
    assert allowed[0] == [completion[0]]
    choice = reply.index(tokenizer.encode("no", add_special_tokens=False)[0])
    assert 1 < len(allowed[choice]) < len(tokenizer)
    assert allowed[-1] == [tokenizer.eos_token_id]


def test_a_token_the_grammar_rejects_ends_the_replay_and_is_counted(
    compiler: GrammarCompiler, tokenizer: Any
) -> None:
    text = grammar_text(ANSWER)
    completion = tokenizer.encode('{"answer": "maybe"}', add_special_tokens=False)
    sequence = TrainingSequence(
        rollout_id="r",
        group_id="g",
        reward=1.0,
        token_ids=(9, *completion),
        loss_mask=(0,) + (1,) * len(completion),
        behaviour_logprobs=(0.0,) * (1 + len(completion)),
        grammar_spans=(GrammarSpan(1, 1 + len(completion), text),),
    )
    _, accepted = compiler.token_masks(text, completion)
    assert 0 < accepted < len(completion)
    packed, unreplayed = replayed_masks([sequence], len(sequence), compiler)
    assert unreplayed == len(completion) - accepted
    assert (packed[0, accepted:] == -1).all() and (packed[0, :accepted] != -1).any(dim=-1).all()


def test_a_batch_under_a_grammar_needs_the_compiler_that_replays_it() -> None:
    from osmosis_ai.errors import ConfigError
    from osmosis_ai.train.algorithm.micro_batches import collate

    sequence = TrainingSequence(
        rollout_id="r",
        group_id="g",
        reward=1.0,
        token_ids=(1, 2, 3),
        loss_mask=(0, 1, 1),
        behaviour_logprobs=(0.0, -0.1, -0.2),
        grammar_spans=(GrammarSpan(1, 3, "start: /[a-z]+/"),),
    )
    with pytest.raises(ConfigError, match="need the model's grammar compiler"):
        collate([sequence], [1.0], [1.0])


def test_objects_with_properties_are_closed_and_data_is_left_alone() -> None:
    schema = {
        "type": "object",
        "properties": {
            "properties": {"type": "object", "properties": {"a": {"type": "string"}}},
            "free": {"type": "object"},
            "open": {"type": "object", "properties": {}, "additionalProperties": True},
        },
        "default": {"properties": {"x": 1}},
    }
    text = grammar_text(JsonGrammar(json.dumps(schema)))
    rendered = json.loads(text.split("%json ", 1)[1])
    assert rendered["additionalProperties"] is False
    inner = rendered["properties"]
    assert inner["properties"]["additionalProperties"] is False  # a property named so
    assert "additionalProperties" not in inner  # the name map itself is no schema
    assert "additionalProperties" not in inner["free"]  # no properties listed: free-form
    assert inner["open"]["additionalProperties"] is True  # stated: kept
    assert rendered["default"] == {"properties": {"x": 1}}  # data, not a schema
