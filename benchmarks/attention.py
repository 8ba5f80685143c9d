"""The learner's attention by matmuls against PyTorch's fused kernel, forward and backward,
on the CPU.

Run with ``python benchmarks/attention.py [--repeats 4]`` on an otherwise idle machine. For
micro-batches of about 1,000 tokens cut into rows of Q queries, each attending to a shared
prefix of P keys and to its own, the best of ``--repeats`` forward-and-backward times of one
layer (9 query heads, 3 key/value heads of 64: the embedded model's), in bf16 and fp32: the
fused kernel (transformers' ``sdpa`` attention), `matmul_attention`, and their ratio.
`osmosis_ai.train.algorithm.attention.MATH_QUERIES` is where that ratio crosses 1 in bf16; in
fp32 the learner keeps the fused kernel.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from osmosis_ai.train.algorithm.attention import matmul_attention

HEADS, KV_HEADS, HEAD_DIM, TOKENS = 9, 3, 64, 1000


class _Layer(torch.nn.Module):
    num_key_value_groups = HEADS // KV_HEADS


def _milliseconds(
    attend: Callable[..., tuple[torch.Tensor, None]],
    tensors: list[torch.Tensor],
    mask: torch.Tensor,
    repeats: int,
) -> float:
    best = float("inf")
    for _ in range(repeats):
        for tensor in tensors:
            tensor.grad = None
        start = time.perf_counter()
        out, _ = attend(_Layer(), *tensors, mask, scaling=HEAD_DIM**-0.5)
        out.float().sum().backward()  # type: ignore[no-untyped-call]
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description="matmul attention against the fused kernel")
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ms per layer call")
    print(f"{'dtype':8} {'P':>4} {'Q':>4} {'rows':>4} {'fused':>7} {'matmuls':>8} {'ratio':>6}")
    for dtype in (torch.bfloat16, torch.float32):
        for prefix in (0, 140, 500):
            for queries in (32, 64, 128, 192, 256, 384, 512):
                rows, keys = max(1, TOKENS // queries), queries + prefix
                tensors = [
                    torch.randn(rows, heads, length, HEAD_DIM, dtype=dtype, requires_grad=True)
                    for heads, length in ((HEADS, queries), (KV_HEADS, keys), (KV_HEADS, keys))
                ]
                mask = torch.ones(rows, 1, queries, keys, dtype=torch.bool).tril(prefix)
                fused = _milliseconds(sdpa_attention_forward, tensors, mask, args.repeats)
                math = _milliseconds(matmul_attention, tensors, mask, args.repeats)
                name = str(dtype).removeprefix("torch.")
                print(
                    f"{name:8} {prefix:4} {queries:4} {rows:4} {fused:7.1f} {math:8.1f} "
                    f"{math / fused:6.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
