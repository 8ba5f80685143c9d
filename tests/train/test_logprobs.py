"""The policy's logprobs of a padded micro-batch are each sequence's own."""

from __future__ import annotations

import torch
from transformers import LlamaForCausalLM

from osmosis_ai.train.algorithm.logprobs import policy_logprobs
from osmosis_ai.train.algorithm.micro_batches import collate
from tests.train.conftest import make_sequence


def test_policy_logprobs_are_those_of_each_unpaddedmake_sequence(model: LlamaForCausalLM) -> None:
    sequences = [
        make_sequence("a", "g", 1.0, (1, 5, 7, 2, 9, 4), mask=(0, 1, 1, 0, 1, 1)),
        make_sequence("b", "g", 0.0, (3, 4, 6), mask=(0, 0, 1)),
    ]
    batch = collate(sequences, [0.0, 0.0], [0.0, 0.0])
    with torch.no_grad():
        batched = policy_logprobs(model, batch)
        sharper = policy_logprobs(model, batch, temperature=0.5)
        for row, sequence in enumerate(sequences):
            ids = torch.tensor([sequence.token_ids])
            logits = model(input_ids=ids).logits[0]
            on = torch.tensor(sequence.loss_mask[1:]) > 0
            for got, temperature in ((batched, 1.0), (sharper, 0.5)):
                scaled = torch.log_softmax(logits[:-1] / temperature, dim=-1)
                alone = scaled.gather(-1, ids[0, 1:, None])[:, 0]
                assert torch.allclose(got[row, : len(sequence) - 1][on], alone[on], atol=1e-5)
            # Off the mask (context, padding) nothing is computed.
            assert not batched[row, : len(sequence) - 1][~on].any()
            assert not batched[row, len(sequence) - 1 :].any()
        bf16 = policy_logprobs(model, batch, bf16=True)
    assert bf16.dtype == torch.float32
    assert torch.allclose(bf16[0], batched[0], atol=0.1)
