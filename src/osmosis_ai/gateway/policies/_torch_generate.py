"""Batched generation with a KV cache: the torch policy's compute, run on its worker thread.

Sequences are left-padded into one batch; every step samples each live row from the
distribution the policy reports: logits masked by the row's grammar (if any), divided by the
temperature, cut to top-k and top-p, renormalised. The logprob of each sampled token is taken
from exactly that distribution. At temperature 0 the argmax is taken and its logprob is that
of the unscaled (masked) distribution.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GenerationJob", "Sampling", "generate"]


@dataclass(frozen=True, slots=True)
class Sampling:
    """How one request samples."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 1024
    seed: int | None = None
    stop: tuple[str, ...] = ()
    top_logprobs: int = 0


@dataclass(slots=True)
class GenerationJob:
    """One sequence to generate; the outputs are filled in by `generate`."""

    prompt_ids: list[int]
    sampling: Sampling
    grammar: Any = None
    """A compiled xgrammar grammar constraining the completion, or ``None``."""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str = "length"
    stop_at: int | None = None
    """Character offset of the stop string that ended the text, if one did."""


def generate(
    torch: Any,
    xgrammar: Any,
    model: Any,
    jobs: list[GenerationJob],
    *,
    stop_token_ids: Collection[int],
    pad_id: int,
    decode: Callable[[list[int]], str],
) -> None:
    """Generate every job's completion in one batch (blocking; fills the jobs in place)."""
    rows = len(jobs)
    width = max(len(job.prompt_ids) for job in jobs)
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    mask = torch.zeros((rows, width), dtype=torch.long)
    for row, job in enumerate(jobs):
        input_ids[row, width - len(job.prompt_ids) :] = torch.tensor(job.prompt_ids)
        mask[row, width - len(job.prompt_ids) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    matchers = [xgrammar.GrammarMatcher(job.grammar) if job.grammar else None for job in jobs]
    vocab = model.config.vocab_size
    bitmask = xgrammar.allocate_token_bitmask(rows, vocab) if any(matchers) else None
    generators = [
        torch.Generator().manual_seed(
            job.sampling.seed if job.sampling.seed is not None else random.getrandbits(63)
        )
        for job in jobs
    ]
    live = list(range(rows))
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)  # filled in place by every forward pass
    with torch.inference_mode():
        for _ in range(max(job.sampling.max_tokens for job in jobs)):
            # The cache is the fourth positional parameter in every transformers 5 release
            # (its keyword was renamed); logits_to_keep=1 skips the vocabulary projection of
            # the prompt.
            out = model(input_ids, mask, positions, cache, use_cache=True, logits_to_keep=1)
            logits = out.logits[:, -1, :].float()
            if bitmask is not None:
                constrained = []
                for row in live:
                    matcher = matchers[row]
                    if matcher is not None:
                        matcher.fill_next_token_bitmask(bitmask, row)
                        constrained.append(row)
                if constrained:
                    xgrammar.apply_token_bitmask_inplace(
                        logits, bitmask, vocab_size=vocab, indices=constrained
                    )
            next_ids = torch.full((rows, 1), pad_id, dtype=torch.long)
            for row in list(live):
                job = jobs[row]
                token, logprob, alternatives = _choose(
                    torch, logits[row], job.sampling, generators[row]
                )
                job.token_ids.append(token)
                job.logprobs.append(logprob)
                job.top_logprobs.append(alternatives)
                next_ids[row, 0] = token
                if _finished(job, matchers[row], token, stop_token_ids, decode):
                    live.remove(row)
            if not live:
                break
            input_ids = next_ids
            mask = torch.cat([mask, torch.ones((rows, 1), dtype=torch.long)], dim=1)
            positions = positions[:, -1:] + 1


def _choose(
    torch: Any, logits: Any, sampling: Sampling, generator: Any
) -> tuple[int, float, list[tuple[int, float]]]:
    """The next token, its logprob, and the top alternatives asked for."""
    if sampling.temperature == 0:
        logprobs = torch.log_softmax(logits, dim=-1)
        token = int(torch.argmax(logits))
    else:
        scaled = logits / sampling.temperature
        if 0 < sampling.top_k < scaled.numel():
            kth = torch.topk(scaled, sampling.top_k).values[-1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        if sampling.top_p < 1:
            ordered, order = torch.sort(scaled, descending=True)
            cumulative = torch.softmax(ordered, dim=-1).cumsum(-1)
            # Keep the smallest prefix whose mass reaches top_p (the first token always).
            drop = cumulative - torch.softmax(ordered, dim=-1) >= sampling.top_p
            scaled = scaled.scatter(0, order[drop], float("-inf"))
        logprobs = torch.log_softmax(scaled, dim=-1)
        token = int(torch.multinomial(logprobs.exp(), 1, generator=generator))
    alternatives: list[tuple[int, float]] = []
    if sampling.top_logprobs:
        values, ids = torch.topk(logprobs, sampling.top_logprobs)
        # Tokens masked out (grammar, top-k, top-p) are no alternatives (and -inf is no JSON).
        alternatives = [
            (int(i), float(v)) for i, v in zip(ids, values, strict=True) if math.isfinite(v)
        ]
    return token, float(logprobs[token]), alternatives


def _finished(
    job: GenerationJob,
    matcher: Any,
    token: int,
    stop_token_ids: Collection[int],
    decode: Callable[[list[int]], str],
) -> bool:
    if matcher is not None:
        matcher.accept_token(token)
        if matcher.is_terminated():
            job.finish_reason = "stop"
            return True
    elif token in stop_token_ids:
        job.finish_reason = "stop"
        return True
    if job.sampling.stop:
        text = decode(job.token_ids)
        found = [text.find(stop) for stop in job.sampling.stop if stop and stop in text]
        if found:
            job.finish_reason, job.stop_at = "stop", min(found)
            return True
    if len(job.token_ids) >= job.sampling.max_tokens:
        job.finish_reason = "length"
        return True
    return False
