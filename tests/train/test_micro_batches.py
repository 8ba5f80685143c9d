"""Packing a step's sequences into micro-batches under the token budget."""

from __future__ import annotations

import pytest

from osmosis_ai.errors import ConfigError
from osmosis_ai.train.algorithm.micro_batches import pack_micro_batches


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
