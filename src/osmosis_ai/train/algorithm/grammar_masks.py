"""The grammar masks policy tokens were sampled under, replayed for the learner.

An engine that generates under a grammar (tool calls, ``response_format``) samples each token
from the model's distribution restricted to what the grammar allows there, and records that
token's logprob under the restricted distribution. The learner must score the token the same
way, or the ratio of π_learner to π_behaviour measures the mask instead of the policy change
(on the calculator, the mean k3 mismatch was 0.76 with the torch engine and 1.26 with vLLM,
almost all of it the mask). So the learner replays each `GrammarSpan` with the grammar's text
(`replayed_masks`) and takes its log-softmax over the allowed tokens only (`allowed_logits`):
the gradient is then that of the constrained policy, and a token the grammar forced carries
none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from osmosis_ai.gateway.policies.engines.grammar import ALL_ALLOWED, allowed_logits
from osmosis_ai.train.algorithm.sequences import TrainingSequence

__all__ = ["TokenMasks", "allowed_logits", "replayed_masks"]


class TokenMasks(Protocol):
    """Replays a grammar over tokens (`GrammarCompiler` of the gateway's engines)."""

    vocab_size: int

    def token_masks(self, text: str, token_ids: Sequence[int]) -> tuple[Any, int]:
        """Packed int32 masks of the accepted prefix of ``token_ids``, and its length."""
        ...


def replayed_masks(
    sequences: Sequence[TrainingSequence], width: int, masks: TokenMasks
) -> tuple[torch.Tensor, int]:
    """The packed masks ``[B, width - 1, ceil(vocab / 32)]`` (int32; position ``p`` predicts
    token ``p + 1``, as a micro-batch's shifted tensors), every bit set where no grammar
    applied, and how many constrained tokens the grammar did not accept (scored unmasked).
    """
    words = (masks.vocab_size + 31) // 32
    packed = torch.full((len(sequences), max(width - 1, 0), words), ALL_ALLOWED, dtype=torch.int32)
    unreplayed = 0
    for row, sequence in enumerate(sequences):
        for span in sequence.grammar_spans:
            tokens = sequence.token_ids[span.start : span.end]
            rows, accepted = masks.token_masks(span.grammar, tokens)
            # Token t is predicted at position t - 1 (a completion never starts a sequence).
            packed[row, span.start - 1 : span.start - 1 + accepted] = rows
            unreplayed += len(tokens) - accepted
    return packed, unreplayed
