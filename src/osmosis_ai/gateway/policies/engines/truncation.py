"""Top-k and top-p truncation of a distribution, shared by the torch engine (which samples
from it) and the learner (which must score each token under the same distribution).

Both cut by value: a row keeps every token whose logit reaches its cutoff, so tokens tied at
the boundary are kept or dropped together, whatever order a sort gave them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["cutoffs", "truncates"]

#: Rows whose cutoff is computed at once: the sort holds rows × vocabulary values and ids.
_ROWS_AT_ONCE = 256


def truncates(top_k: Any, top_p: Any, vocab: int) -> Any:
    """Whether top-k ``top_k`` (0: off) or top-p ``top_p`` (1: off) may remove a token from a
    vocabulary of ``vocab``: numbers give a bool, tensors a tensor of them."""
    return ((top_k > 0) & (top_k < vocab)) | (top_p < 1)


def cutoffs(logits: Any, top_k: Any, top_p: Any) -> Any:
    """The smallest logit each row keeps, ``[N]`` (no gradient), for ``logits`` ``[N, V]``
    already divided by the temperature (tokens a grammar forbids at ``-inf``).

    Top-k first (``top_k`` ``[N]`` integers, 0 for none: the ``k`` largest, ties included),
    then top-p on what is left (``top_p`` ``[N]``, 1 for none: the smallest set of the most
    likely tokens whose probability reaches ``top_p``; the most likely token always stays),
    as vLLM orders them. A row keeps the tokens whose logit is at least its cutoff.
    """
    import torch

    parts = []
    with torch.no_grad():
        for start in range(0, logits.shape[0], _ROWS_AT_ONCE):
            rows = slice(start, start + _ROWS_AT_ONCE)
            parts.append(_cutoffs(torch, logits[rows].detach(), top_k[rows], top_p[rows]))
    return torch.cat(parts) if parts else logits.new_zeros(0)


def _cutoffs(torch: Any, logits: Any, top_k: Any, top_p: Any) -> Any:
    vocab = logits.shape[-1]
    ordered = torch.sort(logits, dim=-1, descending=True).values
    k = torch.where((top_k > 0) & (top_k < vocab), top_k, vocab).to(ordered.device)
    kth = ordered.gather(-1, (k - 1).unsqueeze(-1))
    ordered = ordered.masked_fill(ordered < kth, float("-inf"))
    probabilities = torch.softmax(ordered, dim=-1)
    # The mass of the tokens ranked above each one: it is kept while that is below top_p.
    above = probabilities.cumsum(-1) - probabilities
    keep = above < top_p.to(ordered.device, ordered.dtype).unsqueeze(-1)
    keep[:, 0] = True
    kept = keep.sum(-1, keepdim=True)
    # Rounding may leave the mass above a token cut by top-k just under top_p: never below kth.
    return torch.maximum(ordered.gather(-1, kept - 1), kth).squeeze(-1)
