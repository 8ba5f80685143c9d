"""The torch engine's sampler: a draw follows the distribution it reports."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from osmosis_ai.gateway.policies.engines._decoder import _choose, _draw, _scaled  # noqa: E402
from osmosis_ai.gateway.policies.engines.base import Sampling  # noqa: E402


def test_draws_follow_the_softmax_and_never_take_a_masked_token() -> None:
    probabilities = [0.5, 0.3, 0.15, 0.05, 0.0]
    scores = torch.tensor([math.log(p) if p else float("-inf") for p in probabilities])
    generator = torch.Generator().manual_seed(7)
    draws = 20_000
    counts = torch.bincount(
        torch.tensor([_draw(torch, scores, generator) for _ in range(draws)]),
        minlength=len(probabilities),
    )
    assert counts[-1] == 0
    for count, p in zip(counts.tolist(), probabilities, strict=True):
        # Four standard deviations of a binomial share, plus a little.
        assert abs(count / draws - p) <= 4 * math.sqrt(p * (1 - p) / draws) + 1e-3, counts


def test_a_seed_gives_the_same_draws() -> None:
    scores = torch.randn(1000, generator=torch.Generator().manual_seed(0))

    def draws(seed: int) -> list[int]:
        generator = torch.Generator().manual_seed(seed)
        return [_draw(torch, scores, generator) for _ in range(20)]

    assert draws(3) == draws(3)
    assert draws(3) != draws(4)


def test_the_reported_logprob_and_alternatives_are_of_the_scaled_distribution() -> None:
    logits = torch.randn(50, generator=torch.Generator().manual_seed(1))
    sampling = Sampling(temperature=0.7, top_k=5, top_logprobs=8)
    scaled = _scaled(torch, logits.unsqueeze(0), [sampling])[0]
    token, logprob, alternatives = _choose(
        torch, scaled, sampling, torch.Generator().manual_seed(2)
    )
    kept = torch.topk(logits / 0.7, 5)
    expected = torch.log_softmax(kept.values, dim=-1)
    assert token in kept.indices.tolist()
    assert logprob == pytest.approx(float(expected[kept.indices.tolist().index(token)]), abs=1e-6)
    # Only the five tokens top-k keeps can be alternatives, best first.
    assert [i for i, _ in alternatives] == kept.indices.tolist()
    assert [v for _, v in alternatives] == pytest.approx(expected.tolist(), abs=1e-6)


def test_each_row_is_scaled_and_cut_by_its_own_sampling() -> None:
    """Rows of one decoding step: top-p keeps the smallest set of the most likely tokens whose
    mass reaches it (after top-k), a greedy row keeps its raw logits, an uncut row is only
    divided by its temperature."""
    probabilities = torch.tensor([0.4, 0.3, 0.2, 0.1])
    logits = probabilities.log().repeat(4, 1)
    samplings = [
        Sampling(top_p=0.6),  # 0.4 < 0.6, 0.4 + 0.3 reaches it: two tokens
        Sampling(top_k=3, top_p=0.75),  # of 4/9, 3/9, 2/9: 4/9 + 3/9 reaches 0.75: two
        Sampling(temperature=0.0, top_k=1),  # greedy: nothing is cut or scaled
        Sampling(temperature=0.5),
    ]
    scaled = _scaled(torch, logits, samplings)
    finite = torch.isfinite(scaled).sum(-1).tolist()
    assert finite == [2, 2, 4, 4]
    assert torch.log_softmax(scaled[0], -1)[:2].exp().tolist() == pytest.approx([4 / 7, 3 / 7])
    assert torch.equal(scaled[2], logits[2])
    assert torch.allclose(scaled[3], logits[3] / 0.5)
