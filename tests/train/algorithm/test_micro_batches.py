"""Packing a step's sequences into micro-batches under the token budget."""

from __future__ import annotations

import dataclasses

import pytest

from osmosis_ai.errors import ConfigError
from osmosis_ai.train.algorithm.micro_batches import collate, pack_micro_batches
from osmosis_ai.train.algorithm.sequences import TruncationSpan
from tests.train.conftest import make_sequence


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


def test_top_k_and_top_p_are_laid_out_on_the_positions_that_predict_their_tokens() -> None:
    """Token t is predicted at position t - 1: a span of tokens 2..3 sets positions 1..2; a
    batch without spans carries none (the learner then cuts nothing)."""
    cut = dataclasses.replace(
        make_sequence("a", "g", 1.0, (1, 2, 3, 4, 5)),
        truncation_spans=(TruncationSpan(2, 4, 20, 0.9),),
    )
    plain = make_sequence("b", "g", 0.0, (1, 2, 3))
    batch = collate([cut, plain], [0.0, 0.0], [1.0, 1.0])
    assert batch.top_k is not None and batch.top_p is not None
    assert batch.top_k.tolist() == [[0, 20, 20, 0], [0, 0, 0, 0]]
    assert batch.top_p.flatten().tolist() == pytest.approx([1, 0.9, 0.9, 1, 1, 1, 1, 1])
    uncut = collate([plain], [0.0], [1.0])
    assert uncut.top_k is None and uncut.top_p is None


def test_per_token_advantages_are_laid_out_on_the_positions_that_predict_their_tokens() -> None:
    """Credit per turn: token t's advantage sits at position t - 1; a sequence given one
    number has it everywhere; without per-token values the tensor stays [B, 1]."""
    long = make_sequence("a", "g", 1.0, (1, 2, 3, 4))
    short = make_sequence("b", "g", 0.0, (1, 2, 3))
    batch = collate([long, short], [(0.0, 0.0, 0.5, -0.5), 2.0], [1.0, 1.0])
    assert batch.advantages.tolist() == [[0.0, 0.5, -0.5], [2.0, 2.0, 2.0]]
    assert collate([long, short], [1.0, 2.0], [1.0, 1.0]).advantages.shape == (2, 1)
