"""The logprobs a model gives a micro-batch's policy tokens: the ``logπ`` of the loss.

They are taken as the engine sampled: under the logits divided by the rollouts' temperature,
for tokens generated under a grammar over what its replayed masks allow (``grammar_masks``),
and for tokens sampled with top-k or top-p over what that cut kept (``truncation``). The KL
reference's are the same, without gradients.

TRL's ``selective_log_softmax`` was considered for the logprob gather: ``trl`` 1.16 requires
``accelerate``, ``datasets``, ``pandas`` and ``pyarrow>=21``, and its ``trainer/utils.py``
imports them all, so the few lines are written here instead (same row-wise approach).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from osmosis_ai._extras import import_optional
from osmosis_ai.errors import ConfigError

import_optional("torch", extra="train", feature="Training (osmosis_ai.train)")

import torch  # noqa: E402  (after the check that names the extra to install)

from osmosis_ai.gateway.policies.engines.truncation import cutoffs, truncates  # noqa: E402
from osmosis_ai.train.algorithm.grammar_masks import allowed_logits  # noqa: E402
from osmosis_ai.train.algorithm.micro_batches import (  # noqa: E402
    MicroBatch,
    planned_batches,
)
from osmosis_ai.train.algorithm.sequences import TrainingSequence  # noqa: E402

if TYPE_CHECKING:
    from osmosis_ai.train.algorithm.grammar_masks import TokenMasks

__all__ = [
    "SharedPrefixes",
    "check_head",
    "packs_prefix",
    "policy_logprobs",
    "policy_logprobs_and_entropy",
    "reference_logprobs",
    "sequence_logprobs",
    "shares_prefixes",
]


def policy_logprobs(
    model: torch.nn.Module,
    batch: MicroBatch,
    *,
    bf16: bool = False,
    temperature: float = 1.0,
    prefixes: SharedPrefixes | None = None,
) -> torch.Tensor:
    """Logprobs ``[B, T - 1]`` the model gives tokens 1..T-1 of the batch (with gradients),
    on the loss mask, under its logits divided by ``temperature``, restricted to what the
    batch's grammar masks allow and cut to each token's top-k and top-p (as the engine sampled
    them); 0.0 elsewhere. A token the learner's own cut would drop (a tie or rounding at the
    boundary) is kept, so its logprob stays finite.

    The vocabulary projection and log-softmax run only at the masked positions: a rollout is
    mostly context (system prompt, tools, tool results), and for a small model the projection
    onto a 49k vocabulary is a fifth of the forward pass and most of its memory. The body may
    run under bf16 autocast; the log-softmax is taken in fp32, in chunks of positions to
    bound the vocabulary-sized intermediate, and the backward pass recomputes each chunk's
    logits rather than keeping them (`_HeadLogprobs`).

    A batch whose prefix is its cluster's (`MicroBatch.cluster_prefix`) takes it from
    ``prefixes``, which computes it once for the cluster's batches (without, it is computed
    here, as any other shared prefix).
    """
    scored = _scored(model, batch, bf16=bf16, temperature=temperature, prefixes=prefixes)
    return scored[0]


def policy_logprobs_and_entropy(
    model: torch.nn.Module,
    batch: MicroBatch,
    *,
    bf16: bool = False,
    temperature: float = 1.0,
    prefixes: SharedPrefixes | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`policy_logprobs`, and the entropy ``[B, T - 1]`` (no gradient) of the distribution
    each token was scored under, on the loss mask (0.0 elsewhere)."""
    logprobs, entropy = _scored(
        model, batch, bf16=bf16, temperature=temperature, prefixes=prefixes, entropy=True
    )
    assert entropy is not None
    return logprobs, entropy


def _scored(
    model: torch.nn.Module,
    batch: MicroBatch,
    *,
    bf16: bool,
    temperature: float,
    prefixes: SharedPrefixes | None,
    entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    on = batch.loss_mask > 0  # position t predicts token t + 1
    targets = batch.input_ids[:, 1:][on]
    device = batch.input_ids.device
    masks = batch.grammar_masks[on] if batch.grammar_masks is not None else None
    top_k = batch.top_k[on] if batch.top_k is not None else None
    top_p = batch.top_p[on] if batch.top_p is not None else None
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16):
        chosen = _hidden(model, batch, prefixes, on)
        head: torch.nn.Module = model.get_output_embeddings()  # type: ignore[operator]
        chunks, entropies = [], []
        for index, (part, part_targets) in enumerate(
            zip(torch.split(chosen, _LOGIT_CHUNK), torch.split(targets, _LOGIT_CHUNK), strict=True)
        ):
            rows = slice(index * _LOGIT_CHUNK, index * _LOGIT_CHUNK + len(part))
            scorer = _Scorer(
                head=head,
                temperature=temperature,
                masks=masks[rows] if masks is not None else None,
                cut=(top_k[rows], top_p[rows]) if top_k is not None and top_p is not None else None,
                targets=part_targets,
                entropy=entropy,
                dtype=torch.bfloat16 if bf16 else None,
            )
            values, spread = scorer.logprobs(part)
            chunks.append(values)
            if spread is not None:
                entropies.append(spread)
    zeros = torch.zeros(on.shape, dtype=torch.float32, device=device)
    empty = chosen.new_zeros(0, dtype=torch.float32)
    values = torch.cat(chunks) if chunks else empty
    spread = (
        zeros.masked_scatter(on, torch.cat(entropies) if entropies else empty) if entropy else None
    )
    return zeros.masked_scatter(on, values), spread


def _hidden(
    model: torch.nn.Module, batch: MicroBatch, prefixes: SharedPrefixes | None, on: torch.Tensor
) -> torch.Tensor:
    """The decoder's last hidden states ``[N, H]`` at the batch's positions ``on`` selects
    (``[B, T - 1]``: those that predict a scored token).

    A shared prefix (`MicroBatch.prefix`) is computed once. Where the attention takes a
    given mask (`packs_prefix`), the prefix and every row's rest run as one packed row
    (`_packed_hidden`). Otherwise (or for a cluster's prefix, taken from ``prefixes``) it is
    run as one row whose keys and values are repeated along the batch as a cache, which every
    row's rest attends to, at the positions after it, and its hidden states, repeated, start
    every row's. Either way autograd sums the rows' gradients on the prefix, so its gradient
    is the sum the unshared pass computes, and each position sees the same keys and values as
    unshared: equal within rounding.
    """
    body = _body(model)
    prefix, rows = batch.prefix, batch.input_ids.shape[0]
    if batch.row_prefixes and packs_prefix(model):
        return _packed_hidden(body, batch, batch.row_prefixes, on)
    if not prefix:  # (a packed batch on a model that cannot pack: its rows whole)
        hidden: torch.Tensor = body(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask
        ).last_hidden_state
        return hidden[:, :-1][on]
    if batch.cluster_prefix and prefixes is not None:
        cache, start = prefixes.taken(body, batch.input_ids[0, :prefix])
    elif packs_prefix(model):
        return _packed_hidden(body, batch, ((0, prefix),) * rows, on)
    else:
        cache, start = _prefix_pass(body, batch.input_ids[0, :prefix])
    cache.batch_repeat_interleave(rows)
    rest = body(
        input_ids=batch.input_ids[:, prefix:],
        attention_mask=batch.attention_mask,
        use_cache=True,
        **{_cache_keyword(body): cache},
    ).last_hidden_state
    return torch.cat([start.expand(rows, -1, -1), rest], dim=1)[:, :-1][on]


def packs_prefix(model: torch.nn.Module) -> bool:
    """Whether ``model`` can run a micro-batch as one packed row under a 4D boolean mask
    (`_packed_hidden`: shared prefixes once, no padding): transformers passes such a mask as
    it is to PyTorch's fused attention (``sdpa``, and the learner's, which builds its masks
    alike), and every layer attends to the whole sequence (a sliding window would not be in
    the mask)."""
    from transformers.cache_utils import DynamicLayer

    from osmosis_ai.train.algorithm.attention import IMPLEMENTATION

    attention = getattr(_body(model).config, "_attn_implementation", None)
    return attention in ("sdpa", IMPLEMENTATION) and _layer_kinds(model) == {DynamicLayer}


def _packed_hidden(
    body: torch.nn.Module, batch: MicroBatch, shares: Sequence[tuple[int, int]], on: torch.Tensor
) -> torch.Tensor:
    """`_hidden` of a batch from one forward pass over one packed row, padding left out:
    each prefix once (``shares[row]``: the row whose first tokens it shares, and how many;
    ``(row, 0)``: none), followed by the rests of the rows sharing it, each token at the
    position it has in its own row. A rest attends to its prefix and, causally, to itself.
    The states of the positions ``on`` selects are gathered from it (never the batch's
    padded ``[B, T, H]``, which for several groups may be many times the packed row); a
    prefix position's gradient is the sum over its rows, as through the cache.

    One pass where the cache takes two (the prefix's, then the rests') and one micro-batch
    may hold several groups: each pass reads every weight and writes every weight's gradient
    however few its tokens, which on a CPU costs as much as tens of tokens.
    """
    device, rows = batch.input_ids.device, batch.input_ids.shape[0]
    lengths = batch.attention_mask.sum(dim=1).tolist()  # rows are right-padded
    members: dict[int, list[int]] = {}
    for row, (leader, _) in enumerate(shares):
        members.setdefault(leader, []).append(row)
    pieces: list[torch.Tensor] = []
    positions, owners, seen = [], [], []
    layout = torch.zeros(batch.input_ids.shape, dtype=torch.long)
    start = 0

    def append(tokens: torch.Tensor, first: int, owner: int, sees: int) -> None:
        nonlocal start
        pieces.append(tokens)
        positions.append(torch.arange(first, first + len(tokens)))
        owners.append(torch.full((len(tokens),), owner))
        seen.append(torch.full((len(tokens),), sees))
        start += len(tokens)

    for leader, group in members.items():
        prefix = shares[leader][1]
        if prefix:  # owned by rows + leader, which no row's own tokens are
            layout[group, :prefix] = torch.arange(start, start + prefix)
            append(batch.input_ids[leader, :prefix], 0, rows + leader, rows + leader)
        for row in group:
            layout[row, prefix : lengths[row]] = torch.arange(start, start + lengths[row] - prefix)
            append(
                batch.input_ids[row, prefix : lengths[row]],
                prefix, row, rows + leader if prefix else row,
            )  # fmt: skip
    owner, sees = torch.cat(owners).to(device), torch.cat(seen).to(device)
    order = torch.arange(start, device=device)
    # [query, key]: a key of the query's own tokens or of its prefix, not after it.
    mask = (owner.unsqueeze(0) == owner.unsqueeze(1)) | (owner.unsqueeze(0) == sees.unsqueeze(1))
    mask &= order.unsqueeze(0) <= order.unsqueeze(1)
    hidden: torch.Tensor = body(
        input_ids=torch.cat(pieces).unsqueeze(0),
        attention_mask=mask[None, None],
        position_ids=torch.cat(positions).to(device).unsqueeze(0),
    ).last_hidden_state[0]
    return hidden[layout[:, :-1].to(device)[on]]


def _prefix_pass(body: torch.nn.Module, tokens: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """The KV cache and last hidden states ``[1, P, H]`` of ``tokens`` run as one row."""
    from transformers import DynamicCache

    config: Any = body.config
    cache = DynamicCache(config=config)  # filled by the forward pass
    keyword = _cache_keyword(body)
    out = body(input_ids=tokens.unsqueeze(0), use_cache=True, **{keyword: cache})
    return cache, out.last_hidden_state


class SharedPrefixes:
    """A cluster's prefix computed once for all the micro-batches it was cut into (a group
    too large for one; `MicroBatch.cluster_prefix`).

    The first batch of a cluster runs the prefix (`_prefix_pass`); each batch then starts from
    detached copies of its keys, values and last hidden states, fp32 leaves on which the
    batches' gradients add up (in fp32 under bf16 autocast too), and `release` sends their sum
    back through the prefix's one pass: the gradient the unshared pass computes, summed in
    another order. A batch of another prefix releases the one before, so one prefix's
    activations are alive at a time, as when every batch computed its own; the caller releases
    the last before it reads the gradients. Without gradients, a release only drops the prefix.
    """

    def __init__(self) -> None:
        self._tokens: torch.Tensor | None = None
        self._cache: Any = None
        self._leaves: list[tuple[torch.Tensor, torch.Tensor]] = []
        """(output of the prefix's pass, its detached fp32 copy) for each key, value and the
        hidden states, in the order `taken` reads them."""
        self.computed_tokens = 0
        """Tokens of the prefixes this computed (each once)."""

    def taken(self, body: torch.nn.Module, tokens: torch.Tensor) -> tuple[Any, torch.Tensor]:
        """A KV cache of the prefix ``tokens`` (one row: the caller repeats it) for a batch to
        attend to, and their last hidden states ``[1, P, H]``, computed for the first batch of
        a cluster and reused by the next."""
        if self._tokens is None or not torch.equal(self._tokens, tokens):
            self.release()
            cache, hidden = _prefix_pass(body, tokens)
            outputs = [t for layer in cache.layers for t in (layer.keys, layer.values)]
            self._leaves = [
                (t, t.detach().float().requires_grad_(t.requires_grad)) for t in [*outputs, hidden]
            ]
            self._tokens, self._cache = tokens, cache
            self.computed_tokens += len(tokens)
        copies = iter(leaf.to(output.dtype) for output, leaf in self._leaves)
        cache = copy.copy(self._cache)
        cache.layers = [copy.copy(layer) for layer in self._cache.layers]
        for layer in cache.layers:
            layer.keys, layer.values = next(copies), next(copies)
        return cache, next(copies)

    def release(self) -> None:
        """Send the gradients the batches left on the prefix back through its pass, and drop
        it."""
        pending = [
            (output, leaf.grad.to(output.dtype))
            for output, leaf in self._leaves
            if leaf.grad is not None
        ]
        self._tokens, self._cache, self._leaves = None, None, []
        if pending:
            torch.autograd.backward(
                [output for output, _ in pending], [grad for _, grad in pending]
            )


def shares_prefixes(model: torch.nn.Module) -> bool:
    """Whether a micro-batch's shared prefix can be computed once for ``model``: its decoder
    takes a KV cache, and every layer of it is attention (full or a sliding window), whose
    keys and values repeat along the batch. A model with recurrent or linear-attention layers
    (Mamba, hybrid models) runs every rollout whole."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    body = _body(model)
    if not {"cache", "past_key_values"} & set(inspect.signature(body.forward).parameters):
        return False
    return _layer_kinds(model) <= {DynamicLayer, DynamicSlidingWindowLayer}


def _layer_kinds(model: torch.nn.Module) -> set[type]:
    """The kinds of KV-cache layer ``model``'s decoder keeps (full attention, a sliding
    window, recurrent state, ...)."""
    from transformers import DynamicCache

    config: Any = _body(model).config
    return {type(layer) for layer in DynamicCache(config=config).layers}


def _cache_keyword(body: torch.nn.Module) -> str:
    """The keyword a decoder's forward takes its KV cache by: ``cache`` in the newer
    transformers 5 releases, ``past_key_values`` in the older ones and some architectures."""
    parameters = inspect.signature(body.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def reference_logprobs(
    reference_model: torch.nn.Module,
    batch: MicroBatch,
    *,
    bf16: bool = False,
    temperature: float = 1.0,
    prefixes: SharedPrefixes | None = None,
) -> torch.Tensor:
    """The KL reference's `policy_logprobs` (no gradients); a peft model's are its base
    model's, with the adapter disabled. ``prefixes`` must be the reference's own."""
    disabled = getattr(reference_model, "disable_adapter", None)
    with torch.no_grad(), disabled() if disabled is not None else contextlib.nullcontext():
        return policy_logprobs(
            reference_model, batch, bf16=bf16, temperature=temperature, prefixes=prefixes
        )


def sequence_logprobs(
    model: torch.nn.Module,
    sequences: Sequence[TrainingSequence],
    *,
    token_budget: int,
    device: torch.device,
    grammars: TokenMasks | None,
    bf16: bool = False,
    temperature: float = 1.0,
    share_prefix: bool = False,
) -> list[tuple[float, ...]]:
    """`reference_logprobs` of whole sequences (a distillation teacher's), in micro-batches of
    at most ``token_budget`` tokens: each sequence's logprob per token, aligned with its token
    ids (0.0 at its first token and off its loss mask); with ``share_prefix`` a shared
    prefix is computed once (for all the micro-batches of its cluster)."""
    out: list[tuple[float, ...]] = [()] * len(sequences)
    prefixes = SharedPrefixes()
    for indices, batch in planned_batches(
        sequences,
        token_budget=token_budget,
        share_prefix=share_prefix,
        grammars=grammars,
        bf16=bf16,
    ):
        scored = reference_logprobs(
            model, batch.to(device), bf16=bf16, temperature=temperature, prefixes=prefixes
        )
        for row, index in enumerate(indices):
            out[index] = (0.0, *scored[row, : len(sequences[index]) - 1].tolist())
    prefixes.release()
    return out


#: Positions whose vocabulary logits are held at once in `policy_logprobs`.
_LOGIT_CHUNK = 1024


class _Scorer:
    """How a chunk of positions' hidden states ``[N, H]`` become their targets' logprobs: the
    output head's logits in fp32 (its matmul in ``dtype`` where bf16 autocast is on), divided
    by the temperature, cut to the grammar masks and top-k/top-p, log-softmaxed.

    For an ``nn.Linear`` head (every transformers causal LM's, LoRA's included, whose head is
    not adapted) the backward pass recomputes the logits from the
    hidden states (`_HeadLogprobs`) instead of keeping the chunk's ``[N, V]`` log-softmax
    until then, so a micro-batch's vocabulary-sized tensors live one chunk at a time; any
    other head is differentiated by autograd through its logits.
    """

    def __init__(
        self,
        *,
        head: torch.nn.Module,
        temperature: float,
        masks: torch.Tensor | None,
        cut: tuple[torch.Tensor, torch.Tensor] | None,
        targets: torch.Tensor,
        entropy: bool,
        dtype: torch.dtype | None,
    ) -> None:
        self.head, self.temperature, self.masks, self.cut = head, temperature, masks, cut
        self.targets, self.entropy, self.dtype = targets, entropy, dtype

    def logprobs(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The targets' logprobs ``[N]`` (differentiable) and, when asked, the entropy ``[N]``
        of each position's distribution (no gradient)."""
        head = self.head
        if type(head) is torch.nn.Linear:
            values, spread = _HeadLogprobs.apply(  # type: ignore[no-untyped-call]
                hidden, head.weight, head.bias, self
            )
            return values, spread if self.entropy else None
        logits = self.restricted(head(hidden).float())
        logprobs = torch.log_softmax(logits, dim=-1)
        values = logprobs.gather(-1, self.targets.unsqueeze(-1)).squeeze(-1)
        return values, self.spread(logprobs.detach()) if self.entropy else None

    def projected(
        self, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """The restricted fp32 logits ``[N, V]`` of a linear head, its matmul as autocast
        would run it."""
        dtype = self.matmul_dtype(weight)
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            logits = torch.nn.functional.linear(
                hidden.to(dtype), weight.to(dtype), bias.to(dtype) if bias is not None else None
            )
        return self.restricted(logits.float())

    def matmul_dtype(self, weight: torch.Tensor) -> torch.dtype:
        """The dtype the head's matmul runs in: autocast's, else the weight's own."""
        return self.dtype or weight.dtype

    def restricted(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` divided by the temperature, cut to the masks and top-k/top-p."""
        logits = logits / self.temperature
        if self.masks is not None:
            logits = allowed_logits(logits, self.masks)
        if self.cut is not None:
            logits = _truncated(logits, self.targets, *self.cut)
        return logits

    @staticmethod
    def spread(logprobs: torch.Tensor) -> torch.Tensor:
        """-Σ p·log p of each row, over the tokens the distribution allows (p = 0 elsewhere)."""
        terms = torch.where(logprobs > -math.inf, logprobs.exp() * logprobs, 0.0)
        return -terms.sum(dim=-1)


class _HeadLogprobs(torch.autograd.Function):
    """A linear head's logprobs of the targets, keeping for the backward pass only the
    hidden states and each row's log-sum-exp: the gradient of ``z_t - logsumexp(z)`` with
    respect to the logits ``z`` is ``onehot(t) - softmax(z)``, recomputed from them (one more
    matmul of the head per chunk), 0 at the tokens the masks or cuts removed."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        scorer: _Scorer,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = scorer.projected(hidden, weight, bias)
        norm = torch.logsumexp(logits, dim=-1)
        values = logits.gather(-1, scorer.targets.unsqueeze(-1)).squeeze(-1) - norm
        spread = (
            scorer.spread(logits.sub_(norm.unsqueeze(-1))) if scorer.entropy else norm.new_zeros(0)
        )
        ctx.save_for_backward(hidden, weight, bias, norm)
        ctx.scorer = scorer
        ctx.mark_non_differentiable(spread)
        return values, spread

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, norm = ctx.saved_tensors
        scorer: _Scorer = ctx.scorer
        # In place, one [N, V] buffer: softmax, times -grad, plus grad at the target, / T.
        logits = scorer.projected(hidden, weight, bias)
        outer = logits.sub_(norm.unsqueeze(-1)).exp_().mul_(-grad.unsqueeze(-1))
        outer.scatter_add_(-1, scorer.targets.unsqueeze(-1), grad.unsqueeze(-1))
        outer.div_(scorer.temperature)
        dtype = scorer.matmul_dtype(weight)
        outer = outer.to(dtype)
        wants_hidden, wants_weight, wants_bias, _ = ctx.needs_input_grad
        grad_hidden = (outer @ weight.to(dtype)).to(hidden.dtype) if wants_hidden else None
        grad_weight = (outer.T @ hidden.to(dtype)).to(weight.dtype) if wants_weight else None
        grad_bias = outer.sum(0).to(bias.dtype) if wants_bias and bias is not None else None
        return grad_hidden, grad_weight, grad_bias, None


def _truncated(
    logits: torch.Tensor, targets: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """``logits`` ``[N, V]`` with each row cut to its top-k and top-p (``-inf`` outside), the
    row's target always kept; rows without a cut are left as they are."""
    cut = truncates(top_k, top_p, logits.shape[-1])
    if not bool(cut.any()):
        return logits
    rows = cut.nonzero().squeeze(-1)
    part = logits[rows].detach()
    dropped = torch.zeros_like(logits, dtype=torch.bool)
    dropped[rows] = part < cutoffs(part, top_k[rows], top_p[rows]).unsqueeze(-1)
    dropped[rows, targets[rows]] = False
    return logits.masked_fill(dropped, float("-inf"))


def check_head(model: torch.nn.Module) -> None:
    """Refuse a model whose logits are not its output head applied to its decoder's last
    hidden states, which `policy_logprobs` computes: a logit scale, multiplier or soft cap in
    the model's forward (Granite's ``logits_scaling``, FalconH1's ``lm_head_multiplier``,
    Gemma 2's ``final_logit_softcapping``...) would make the learner's logprobs differ from the
    ones the model samples with. Found by comparing the two on a few tokens once, so a field
    of any name is caught.

    Raises:
        ConfigError: The two differ; the message names the config fields that look like it.
    """
    head: torch.nn.Module = model.get_output_embeddings()  # type: ignore[operator]
    weight = next(head.parameters())  # [vocabulary, hidden]
    ids = (torch.arange(4, device=weight.device) % weight.shape[0]).unsqueeze(0)
    with torch.no_grad():
        full = model(input_ids=ids).logits.float()
        projected = head(_body(model)(input_ids=ids).last_hidden_state).float()
    if torch.allclose(full, projected, rtol=1e-2, atol=1e-3):
        return
    settings = getattr(model, "config", None)
    fields = sorted(
        name
        for name, value in (settings.to_dict() if settings is not None else {}).items()
        if any(word in name for word in ("logit", "lm_head", "multiplier", "softcap", "scale"))
        and isinstance(value, int | float)
        and value not in (False, 0, 1)
    )
    hint = f" (its config sets {', '.join(fields)})" if fields else ""
    raise ConfigError(
        f"the model's logits are not its output head's output{hint}: the trainer's logprobs "
        "would not be the ones it samples with; train a model without a logit scale or cap"
    )


def _body(model: torch.nn.Module) -> torch.nn.Module:
    """The transformer under the vocabulary head of a transformers causal LM."""
    body: torch.nn.Module = model.get_decoder()  # type: ignore[operator]
    return body
