"""The torch engine's decoder: the grammar mask kernel it uses off the CPU, run on the CPU."""

from __future__ import annotations

import torch
import xgrammar

from osmosis_ai.gateway.policies.engines._decoder import mask_kernel

VOCAB = 100


def test_the_gpu_mask_kernel_masks_exactly_as_the_cpu_one() -> None:
    assert mask_kernel("cpu") == "cpu"
    gpu_kernel = mask_kernel("cuda")
    assert gpu_kernel == mask_kernel("mps") != "cpu"
    generator = torch.Generator().manual_seed(0)
    bitmask = xgrammar.allocate_token_bitmask(3, VOCAB)
    bitmask.copy_(torch.randint(-(2**31), 2**31 - 1, bitmask.shape, generator=generator))
    logits = torch.randn(3, VOCAB, generator=generator)
    masked = {}
    for kernel in ("cpu", gpu_kernel):
        out = logits.clone()
        xgrammar.apply_token_bitmask_inplace(
            out, bitmask, vocab_size=VOCAB, indices=[0, 2], backend=kernel
        )
        masked[kernel] = out
    assert torch.equal(masked["cpu"], masked[gpu_kernel])
    allowed = (bitmask[0].view(-1, 1) >> torch.arange(32)) & 1  # bit j of word i: token 32i+j
    expected = torch.where(allowed.flatten()[:VOCAB].bool(), logits[0], float("-inf"))
    assert torch.equal(masked[gpu_kernel][0], expected)
    assert torch.equal(masked[gpu_kernel][1], logits[1])  # not in indices: untouched
