"""The torch engine's sampler: a draw follows the distribution it reports."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from osmosis_ai.gateway.policies.engines._decoder import _choose, _draw  # noqa: E402
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
    token, logprob, alternatives = _choose(
        torch, logits, sampling, torch.Generator().manual_seed(2)
    )
    kept = torch.topk(logits / 0.7, 5)
    expected = torch.log_softmax(kept.values, dim=-1)
    assert token in kept.indices.tolist()
    assert logprob == pytest.approx(float(expected[kept.indices.tolist().index(token)]), abs=1e-6)
    # Only the five tokens top-k keeps can be alternatives, best first.
    assert [i for i, _ in alternatives] == kept.indices.tolist()
    assert [v for _, v in alternatives] == pytest.approx(expected.tolist(), abs=1e-6)
