"""Top-k and top-p cutoffs, as the torch engine samples and the learner scores."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from osmosis_ai.gateway.policies.engines.truncation import cutoffs, truncates  # noqa: E402


def _kept(logits: list[float], top_k: int, top_p: float) -> int:
    row = torch.tensor([logits])
    limit = cutoffs(row, torch.tensor([top_k]), torch.tensor([top_p]))
    return int((row >= limit.unsqueeze(-1)).sum())


def test_top_k_keeps_the_k_largest_and_every_token_tied_with_the_kth() -> None:
    assert _kept([3.0, 2.0, 1.0, 0.0], 2, 1.0) == 2
    assert _kept([3.0, 2.0, 2.0, 0.0], 2, 1.0) == 3  # a tie at the boundary stays whole
    assert _kept([3.0, 2.0, 1.0, 0.0], 0, 1.0) == 4  # 0: no top-k
    assert _kept([3.0, 2.0, 1.0, 0.0], 9, 1.0) == 4  # more than the vocabulary: none


def test_top_p_keeps_the_fewest_most_likely_tokens_that_reach_it() -> None:
    logits = torch.tensor([0.5, 0.25, 0.15, 0.1]).log().tolist()
    assert _kept(logits, 0, 0.5) == 1  # 0.5 reaches 0.5
    assert _kept(logits, 0, 0.6) == 2
    assert _kept(logits, 0, 0.9) == 3
    assert _kept(logits, 0, 0.01) == 1  # the most likely token always stays
    # After top-k the mass is renormalised: of 0.5, 0.25 (2/3, 1/3) 0.6 needs the first only.
    assert _kept(logits, 2, 0.6) == 1
    # top_p = 1 keeps what top-k kept, however the cumulative sum rounds.
    flat = [0.0] * 1000
    flat[:3] = [1.0, 1.0, 1.0]
    assert _kept(flat, 3, 1.0) == 3


def test_a_grammar_masked_token_stays_out_and_rows_are_cut_independently() -> None:
    inf = float("-inf")
    rows = torch.tensor([[2.0, inf, 1.0, 0.0], [0.0, 0.0, 0.0, 5.0]])
    limits = cutoffs(rows, torch.tensor([2, 0]), torch.tensor([1.0, 0.5]))
    assert (rows >= limits.unsqueeze(-1)).tolist() == [
        [True, False, True, False],
        [False, False, False, True],
    ]


def test_many_rows_are_cut_in_parts_with_the_same_result() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(600, 50, generator=generator)
    top_k = torch.randint(0, 60, (600,), generator=generator)
    top_p = torch.rand(600, generator=generator)
    together = cutoffs(logits, top_k, top_p)
    one_by_one = torch.cat(
        [cutoffs(logits[i : i + 1], top_k[i : i + 1], top_p[i : i + 1]) for i in range(600)]
    )
    assert torch.equal(together, one_by_one)


def test_truncates_says_whether_a_cut_may_remove_a_token() -> None:
    assert not truncates(0, 1.0, 10) and not truncates(10, 1.0, 10)
    assert truncates(3, 1.0, 10) and truncates(0, 0.9, 10)
    assert truncates(torch.tensor([0, 3]), torch.tensor([1.0, 1.0]), 10).tolist() == [False, True]
