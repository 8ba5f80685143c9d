"""A step's sequences packed into micro-batches under a token budget, and padded into tensors.

The update accumulates gradients over the micro-batches (``update.train_step``); each one's
computed size fits the budget, so the budget bounds the update's memory. Unshared, that size
is its padded one (rows × longest). With ``share_prefix`` the rows of a micro-batch may share
their first tokens (a GRPO group's prompt: system prompt, tools, the task), which the model
then computes once (`MicroBatch.prefix`, see ``logprobs``): its size is the prefix once and
each row's padded rest. A group cut into several micro-batches computes its prefix once for
all of them (`cluster_prefixes`, ``logprobs.SharedPrefixes``). Each micro-batch costs a pass
besides its tokens (`tokens_per_pass`): the plan weighs both (`plan_cost`). For a model that
runs a micro-batch as one packed row (``logprobs.packs_prefix``), a micro-batch may instead
hold several groups, each prefix once and no padding (`row_prefixes`, `_packed_plan`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from osmosis_ai._extras import import_optional
from osmosis_ai.errors import ConfigError
from osmosis_ai.train.algorithm.sequences import TrainingSequence

import_optional("torch", extra="train", feature="Training (osmosis_ai.train)")

import torch  # noqa: E402  (after the check that names the extra to install)

from osmosis_ai.train.algorithm.grammar_masks import TokenMasks, replayed_masks  # noqa: E402

__all__ = [
    "MicroBatch",
    "PASS_TOKENS_BF16",
    "PASS_TOKENS_FP32",
    "batch_prefix",
    "cluster_prefixes",
    "collate",
    "computed_tokens",
    "pack_micro_batches",
    "packed_tokens",
    "plan_cost",
    "plan_micro_batches",
    "planned_batches",
    "row_prefixes",
    "shared_prefix",
    "tokens_per_pass",
]


def pack_micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Indices of sequences grouped so each group's padded size (rows × longest) fits the budget.

    Longest first, each into the current micro-batch while it fits; the order is
    deterministic (ties keep their input order).

    Raises:
        ConfigError: One sequence alone is longer than the budget.
    """
    order = sorted(range(len(lengths)), key=lambda index: -lengths[index])
    batches: list[list[int]] = []
    for index in order:
        _check_length(lengths[index], token_budget)
        # Sorted longest first, so a batch's first row is its longest.
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= token_budget:
            batches[-1].append(index)
        else:
            batches.append([index])
    return batches


def shared_prefix(token_ids: Sequence[Sequence[int]]) -> int:
    """How many first tokens every one of ``token_ids`` has in common, leaving each at least
    one token of its own (0 for fewer than two sequences: nothing to share)."""
    if len(token_ids) < 2:
        return 0
    first, shortest = token_ids[0], min(len(ids) for ids in token_ids)
    length = shortest - 1
    for ids in token_ids[1:]:
        length = min(length, _common(first, ids, length))
    return max(length, 0)


def computed_tokens(token_ids: Sequence[Sequence[int]], prefix: int) -> int:
    """The tokens the model computes for a micro-batch of ``token_ids`` whose first ``prefix``
    tokens are computed once (padding excluded)."""
    return prefix + sum(len(ids) - prefix for ids in token_ids)


#: What one more forward and backward pass costs, in tokens of a pass's own work: a pass
#: reads every weight and writes every gradient once however few its tokens, and under bf16
#: autocast casts both. Measured on a 2-core Xeon with AMX, SmolLM2-135M, the same steps cut
#: into 8 and 30 micro-batches: a pass 0.43 s and a token 1.5 ms in bf16, 0.11 s and 3.1 ms
#: in fp32. Both grow with the model's size, so the ratio holds roughly for larger models.
PASS_TOKENS_BF16 = 288
PASS_TOKENS_FP32 = 32


def tokens_per_pass(*, bf16: bool) -> int:
    """What one more forward and backward pass costs, in tokens, in the update's precision."""
    return PASS_TOKENS_BF16 if bf16 else PASS_TOKENS_FP32


def plan_micro_batches(
    token_ids: Sequence[Sequence[int]],
    token_budget: int,
    *,
    share_prefix: bool,
    pass_tokens: int = PASS_TOKENS_FP32,
    packs: bool = False,
) -> list[list[int]]:
    """Indices of sequences grouped into micro-batches, each of which fits ``token_budget``.

    Without ``share_prefix``, `pack_micro_batches`. With it, the cheaper by `plan_cost` of
    two plans, each micro-batch of which computes its rows' common beginning once:

    - by clusters: sequences taken in the order of their token ids, so that those with a
      common beginning (a group's prompt, a forked rollout's history) are neighbours, and
      gathered into clusters whose common beginning is worth computing once (`_clusters`: a
      group stays together, another group sharing only the system prompt starts its own).
      Each cluster is then cut, its rows in order of length, into the micro-batches that cost
      least (`_cut`): one row much longer than the others would otherwise pad every other
      row's rest to its length. Rows left alone are packed as `pack_micro_batches` does;
    - packed by length (`pack_micro_batches`), sharing what each micro-batch's rows have in
      common: fewer, fuller micro-batches where the groups are small or their prompts short.

    ``pass_tokens`` is what one more forward and backward pass costs, in tokens
    (`tokens_per_pass`; 0: the plan computing the fewest tokens, however many micro-batches).

    ``packs``: the model can run a micro-batch as one packed row (``logprobs.packs_prefix``):
    a third plan, packed (`_packed_plan`), is taken where it costs least.

    Raises:
        ConfigError: One sequence alone is longer than the budget.
    """
    return _plan(
        token_ids, token_budget, share_prefix=share_prefix, pass_tokens=pass_tokens, packs=packs
    )[0]


def _plan(
    token_ids: Sequence[Sequence[int]],
    token_budget: int,
    *,
    share_prefix: bool,
    pass_tokens: int,
    packs: bool,
) -> tuple[list[list[int]], bool]:
    """`plan_micro_batches`, and whether the plan is the packed one."""
    lengths = [len(ids) for ids in token_ids]
    packed = pack_micro_batches(lengths, token_budget)
    if not share_prefix:
        return packed, False
    clusters = _clusters(token_ids)
    clustered: list[list[int]] = []
    alone: list[int] = []
    for indices, prefix in clusters:
        for part in _cut(indices, prefix, lengths, token_budget, pass_tokens):
            if len(part) > 1:
                clustered.append(part)
            else:
                alone.extend(part)
    leftover = pack_micro_batches([lengths[i] for i in alone], token_budget)
    clustered += [[alone[i] for i in batch] for batch in leftover]
    by_cluster, by_length = (
        _cost(token_ids, plan, _batch_clusters(plan, clusters), pass_tokens)
        for plan in (clustered, packed)
    )
    if packs:
        rows, cost = _packed_plan(clusters, lengths, token_budget)
        if cost + len(rows) * pass_tokens < min(by_cluster, by_length):
            return rows, True
    return (clustered if by_cluster <= by_length else packed), False


def _packed_plan(
    clusters: Sequence[tuple[list[int], int]], lengths: Sequence[int], token_budget: int
) -> tuple[list[list[int]], int]:
    """Micro-batches of packed rows (`collate` with ``packed``) and the tokens they compute.

    Each cluster of several rows (`_clusters`) is a unit of its prefix once and its rows'
    rests, cut (its rows shortest first) where it would not fit the budget, each part then
    computing the prefix again; a row of no cluster is a unit of its own. Units are placed
    largest first into the first micro-batch they fit (no padding: a micro-batch's size is
    its units'), so that the step runs in few passes.
    """
    units: list[tuple[list[int], int]] = []
    for indices, prefix in clusters:
        for index in indices:
            _check_length(lengths[index], token_budget)
        if len(indices) < 2:
            units.append((list(indices), lengths[indices[0]]))
            continue
        part: list[int] = []
        size = prefix
        for index in sorted(indices, key=lambda i: lengths[i]):
            if part and size + lengths[index] - prefix > token_budget:
                units.append((part, size))
                part, size = [], prefix
            part.append(index)
            size += lengths[index] - prefix
        units.append((part, size))
    batches: list[tuple[list[int], int]] = []
    for rows, size in sorted(units, key=lambda unit: -unit[1]):
        fits = next((b for b, (_, used) in enumerate(batches) if used + size <= token_budget), None)
        if fits is None:
            batches.append((list(rows), size))
        else:
            batches[fits] = (batches[fits][0] + rows, batches[fits][1] + size)
    return [rows for rows, _ in batches], sum(size for _, size in batches)


def row_prefixes(token_ids: Sequence[Sequence[int]]) -> tuple[tuple[int, int], ...]:
    """For each of ``token_ids`` (a packed micro-batch's rows), the first row of its cluster
    (`_clusters`) and the cluster's common beginning, computed once for them; the row itself
    and 0 for a row in no cluster of several."""
    shares = [(row, 0) for row in range(len(token_ids))]
    for indices, prefix in _clusters(token_ids):
        if len(indices) > 1:
            for row in indices:
                shares[row] = (min(indices), prefix)
    return tuple(shares)


def packed_tokens(token_ids: Sequence[Sequence[int]], shares: Sequence[tuple[int, int]]) -> int:
    """The tokens a packed micro-batch computes (`row_prefixes`): each prefix once, each
    row's rest."""
    prefixes = sum(prefix for row, (leader, prefix) in enumerate(shares) if row == leader)
    return prefixes + sum(
        len(ids) - prefix for ids, (_, prefix) in zip(token_ids, shares, strict=True)
    )


def plan_cost(
    token_ids: Sequence[Sequence[int]], batches: Sequence[Sequence[int]], *, pass_tokens: int
) -> int:
    """What the micro-batches ``batches`` of ``token_ids`` cost with ``share_prefix``, in
    tokens: the tokens each computes, padding included (its prefix once, a cluster's prefix
    once for all its micro-batches), and ``pass_tokens`` for each forward and backward pass
    (one per micro-batch, one more for each cluster prefix computed apart)."""
    found = _batch_clusters(batches, _clusters(token_ids))
    return _cost(token_ids, batches, found, pass_tokens)


def _cost(
    token_ids: Sequence[Sequence[int]],
    batches: Sequence[Sequence[int]],
    found: Sequence[tuple[int, int] | None],
    pass_tokens: int,
) -> int:
    """`plan_cost`, each batch's cluster ``found`` already (`_batch_clusters`)."""
    total = 0
    clusters: set[int] = set()
    for batch, cluster in zip(batches, found, strict=True):
        rows = [token_ids[i] for i in batch]
        if cluster is not None:
            number, prefix = cluster
            if number not in clusters:
                clusters.add(number)
                total += prefix + pass_tokens
        else:
            prefix = batch_prefix(rows)
            total += prefix
        total += len(rows) * (max(map(len, rows)) - prefix) + pass_tokens
    return total


def cluster_prefixes(
    token_ids: Sequence[Sequence[int]], batches: Sequence[Sequence[int]]
) -> list[int]:
    """For each of ``batches`` (`plan_micro_batches` of ``token_ids`` with ``share_prefix``),
    the common beginning of its rows' cluster where that cluster was cut into several
    micro-batches of several rows, which then compute it once for all of them (``logprobs.
    SharedPrefixes``); 0 for any other batch (it shares its own prefix, or nothing)."""
    found = _batch_clusters(batches, _clusters(token_ids))
    return [cluster[1] if cluster else 0 for cluster in found]


def _batch_clusters(
    batches: Sequence[Sequence[int]], clusters: Sequence[tuple[list[int], int]]
) -> list[tuple[int, int] | None]:
    """Each batch's cluster (its number and common beginning, of ``clusters``: `_clusters`)
    where its rows, several, are all of one cluster cut into several such batches; else
    ``None``."""
    cluster_of: dict[int, tuple[int, int]] = {}
    for number, (indices, prefix) in enumerate(clusters):
        cluster_of.update((index, (number, prefix)) for index in indices)
    found = [
        cluster_of[batch[0]] if len({cluster_of[i] for i in batch}) == 1 < len(batch) else None
        for batch in batches
    ]
    parts = Counter(cluster for cluster in found if cluster is not None)
    return [cluster if cluster is not None and parts[cluster] > 1 else None for cluster in found]


#: The fewest common first tokens worth a prefix pass of their own (two forward calls for
#: one): a chat template's opening tokens alone are not.
MIN_SHARED_TOKENS = 16


def batch_prefix(token_ids: Sequence[Sequence[int]]) -> int:
    """The first tokens a micro-batch of ``token_ids`` computes once: their `shared_prefix`,
    where it is worth a prefix pass (at least `MIN_SHARED_TOKENS`), else 0."""
    prefix = shared_prefix(token_ids)
    return prefix if prefix >= MIN_SHARED_TOKENS else 0


def _clusters(token_ids: Sequence[Sequence[int]]) -> list[tuple[list[int], int]]:
    """Sequences in token order gathered into clusters with the length of each one's common
    beginning (at most its shortest row's length but one).

    A sequence joins the cluster before it when computing that cluster's common beginning
    once then saves at least as many tokens as before: with ``n`` rows sharing ``P`` tokens
    the cluster saves ``(n - 1) · P``; with the new row, sharing ``P' ≤ P``, ``n · P'``.
    """
    clusters: list[tuple[list[int], int]] = []
    for index in sorted(range(len(token_ids)), key=lambda i: tuple(token_ids[i])):
        ids = token_ids[index]
        if clusters:
            indices, prefix = clusters[-1]
            last = token_ids[indices[-1]]
            joined = min(prefix, _common(last, ids, len(ids) - 1))
            if joined >= MIN_SHARED_TOKENS and len(indices) * joined >= (len(indices) - 1) * prefix:
                clusters[-1] = ([*indices, index], joined)
                continue
        clusters.append(([index], len(ids) - 1))
    return clusters


def _cut(
    indices: Sequence[int], prefix: int, lengths: Sequence[int], token_budget: int, pass_tokens: int
) -> list[list[int]]:
    """A cluster's rows, shortest first, cut into consecutive parts that fit the budget and
    cost least in all, as `plan_cost` counts: a part of several rows, each row's rest padded
    to its longest and a pass; the prefix once, and where several parts have several rows, a
    pass more that computes it for them all; a row alone, its length and its share of a pass
    (it is packed with other rows later). Of equal cuts, the one whose last part is longest."""
    rows = sorted(indices, key=lambda index: lengths[index])
    # cost[j][s]: the least cost of the first j rows in parts of which s (0, 1, or 2 for two
    # or more) have several rows; start[j][s]: where its last part starts and the state
    # before it (dynamic programming over the parts' ends: a cluster is a group, tens of rows).
    cost = [[math.inf] * 3 for _ in range(len(rows) + 1)]
    start = [[(0, 0)] * 3 for _ in range(len(rows) + 1)]
    cost[0][0] = 0.0
    for end in range(1, len(rows) + 1):
        longest = lengths[rows[end - 1]]
        for first in range(end):
            several = end - first > 1
            if several and prefix + (end - first) * (longest - prefix) > token_budget:
                continue
            size = (
                (end - first) * (longest - prefix) + pass_tokens
                if several
                else longest + pass_tokens * longest / token_budget
            )
            for state in range(3):
                after = min(2, state + several)
                if cost[first][state] + size < cost[end][after]:
                    cost[end][after], start[end][after] = cost[first][state] + size, (first, state)
    once = (0, prefix, prefix + pass_tokens)  # the prefix, by the parts of several rows
    state = min(range(3), key=lambda s: cost[-1][s] + once[s])
    assert cost[-1][state] < math.inf  # rows alone fit: `_check_length`
    parts: list[list[int]] = []
    end = len(rows)
    while end:
        first, before = start[end][state]
        parts.append(rows[first:end])
        end, state = first, before
    return parts[::-1]


def _common(first: Sequence[int], other: Sequence[int], limit: int) -> int:
    """The length of the common beginning of two sequences, at most ``limit``."""
    end = min(limit, len(first), len(other))
    for position in range(end):
        if first[position] != other[position]:
            return position
    return max(end, 0)


def _check_length(length: int, token_budget: int) -> None:
    if length > token_budget:
        raise ConfigError(
            f"a sequence of {length} tokens exceeds micro_batch_tokens={token_budget}: "
            "raise micro_batch_tokens or lower the rollouts' max_tokens"
        )


@dataclass(frozen=True, slots=True)
class MicroBatch:
    """Right-padded tensors of some sequences; the per-token ones are shifted by one.

    ``input_ids`` and ``attention_mask`` are ``[B, T]``; ``loss_mask``, ``behaviour_logprobs``
    and ``weights`` are ``[B, T - 1]`` and describe tokens 1..T-1 (the ones a position predicts).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor
    """``[B, 1]``: one per sequence; ``[B, T - 1]`` under credit per turn (one per token)."""
    weights: torch.Tensor
    """Loss weight of each token (0 off the mask)."""
    grammar_masks: torch.Tensor | None = None
    """``[B, T - 1, W]`` packed masks of the tokens each position's grammar allowed (every
    bit set where none applied; see ``grammar_masks``), or ``None``: no grammar at all."""
    unreplayed_tokens: int = 0
    """Constrained tokens whose grammar could not be replayed (scored unmasked)."""
    top_k: torch.Tensor | None = None
    """``[B, T - 1]`` the top-k each token was sampled under (0: none), or ``None``: no
    token of the batch was sampled with top-k or top-p."""
    top_p: torch.Tensor | None = None
    """``[B, T - 1]`` the top-p each token was sampled under (1: none), or ``None`` (as
    ``top_k``)."""
    old_logprobs: torch.Tensor | None = None
    """``[B, T - 1]`` the learner's logprobs at the start of the step, when the step makes
    several updates (``None``: one update, whose own logprobs are the start's)."""
    prefix: int = 0
    """How many first tokens every row has in common and the model computes once (one row's
    forward pass, whose keys and values the rows' rests attend to); 0: none shared."""
    computed_tokens: int = 0
    """Tokens the model computes for the batch: the prefix once (not at all when it is its
    cluster's), each row's rest (padding excluded)."""
    cluster_prefix: bool = False
    """The prefix is the one its cluster's other micro-batches share too, computed once for
    them all (``logprobs.SharedPrefixes``), so not counted in ``computed_tokens``."""
    row_prefixes: tuple[tuple[int, int], ...] = ()
    """A packed batch (``collate(packed=True)``): for each row, the row whose first tokens it
    shares and how many (itself and 0: none), each such prefix computed once in one packed
    pass of all the rows (``logprobs``); empty: the batch's one ``prefix`` is shared."""

    def to(self, device: torch.device) -> MicroBatch:
        """The same batch on ``device``."""
        masks, top_k, top_p, old = self.grammar_masks, self.top_k, self.top_p, self.old_logprobs
        return MicroBatch(
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            loss_mask=self.loss_mask.to(device),
            behaviour_logprobs=self.behaviour_logprobs.to(device),
            advantages=self.advantages.to(device),
            weights=self.weights.to(device),
            grammar_masks=masks.to(device) if masks is not None else None,
            unreplayed_tokens=self.unreplayed_tokens,
            top_k=top_k.to(device) if top_k is not None else None,
            top_p=top_p.to(device) if top_p is not None else None,
            old_logprobs=old.to(device) if old is not None else None,
            prefix=self.prefix,
            computed_tokens=self.computed_tokens,
            cluster_prefix=self.cluster_prefix,
            row_prefixes=self.row_prefixes,
        )


def collate(
    sequences: Sequence[TrainingSequence],
    advantages: Sequence[float | Sequence[float]],
    weights: Sequence[float],
    grammars: TokenMasks | None = None,
    old_logprobs: Sequence[torch.Tensor] | None = None,
    *,
    share_prefix: bool = False,
    cluster_prefix: int = 0,
    packed: bool = False,
) -> MicroBatch:
    """Pad ``sequences`` into one micro-batch on the CPU (`MicroBatch.to` moves it), with
    their advantages (one per sequence, or one per token of it) and per-token weights beside,
    their grammar spans replayed by ``grammars`` and their truncation spans' top-k and top-p
    laid out per token. ``old_logprobs`` are each sequence's logprobs at the start of the
    step (``[len - 1]``, as `policy_logprobs` gives them), padded beside. With
    ``share_prefix`` the rows' common first tokens are the batch's ``prefix``; a
    ``cluster_prefix`` (`cluster_prefixes`) is its prefix instead, computed elsewhere. With
    ``share_prefix`` and ``packed``, each cluster of rows (`_clusters`) shares its own
    prefix (`MicroBatch.row_prefixes`), all computed in one packed pass.

    Raises:
        ConfigError: A sequence has grammar spans and no ``grammars`` replays them.
    """
    width = max(len(sequence) for sequence in sequences)
    rows = len(sequences)
    input_ids = torch.zeros(rows, width, dtype=torch.long)
    attention = torch.zeros(rows, width, dtype=torch.long)
    mask = torch.zeros(rows, width, dtype=torch.float32)
    behaviour = torch.zeros(rows, width, dtype=torch.float32)
    for row, sequence in enumerate(sequences):
        length = len(sequence)
        input_ids[row, :length] = torch.tensor(sequence.token_ids, dtype=torch.long)
        attention[row, :length] = 1
        mask[row, :length] = torch.tensor(sequence.loss_mask, dtype=torch.float32)
        behaviour[row, :length] = torch.tensor(sequence.behaviour_logprobs, dtype=torch.float32)
    loss_mask = mask[:, 1:]
    grammar_masks, unreplayed = None, 0
    if any(sequence.grammar_spans for sequence in sequences):
        if grammars is None:
            raise ConfigError(
                "sequences generated under a grammar need the model's grammar compiler to be "
                "scored (pass grammars=)"
            )
        grammar_masks, unreplayed = replayed_masks(sequences, width, grammars)
    top_k = top_p = None
    if any(sequence.truncation_spans for sequence in sequences):
        top_k = torch.zeros(rows, width - 1, dtype=torch.long)
        top_p = torch.ones(rows, width - 1, dtype=torch.float32)
        for row, sequence in enumerate(sequences):
            for span in sequence.truncation_spans:
                # Token t is predicted at position t - 1 (a completion never starts a sequence).
                top_k[row, span.start - 1 : span.end - 1] = span.top_k
                top_p[row, span.start - 1 : span.end - 1] = span.top_p
    old = None
    if old_logprobs is not None:
        old = torch.zeros(rows, width - 1, dtype=torch.float32)
        for row, values in enumerate(old_logprobs):
            old[row, : len(values)] = values
    ids = [sequence.token_ids for sequence in sequences]
    shares = row_prefixes(ids) if share_prefix and packed else ()
    prefix = 0 if shares else cluster_prefix or (batch_prefix(ids) if share_prefix else 0)
    computed = (
        packed_tokens(ids, shares) if shares else computed_tokens(ids, prefix) - cluster_prefix
    )
    return MicroBatch(
        input_ids=input_ids,
        attention_mask=attention,
        loss_mask=loss_mask,
        behaviour_logprobs=behaviour[:, 1:],
        advantages=_advantages(advantages, width),
        weights=loss_mask * torch.tensor(weights, dtype=torch.float32).unsqueeze(1),
        grammar_masks=grammar_masks,
        unreplayed_tokens=unreplayed,
        top_k=top_k,
        top_p=top_p,
        old_logprobs=old,
        prefix=prefix,
        computed_tokens=computed,
        cluster_prefix=cluster_prefix > 0,
        row_prefixes=shares,
    )


def planned_batches(
    sequences: Sequence[TrainingSequence],
    *,
    token_budget: int,
    share_prefix: bool,
    grammars: TokenMasks | None,
    bf16: bool = False,
    advantages: Sequence[float | tuple[float, ...]] | None = None,
    weights: Sequence[float] | None = None,
    old_logprobs: Sequence[torch.Tensor] | None = None,
    packs: bool = False,
) -> Iterator[tuple[list[int], MicroBatch]]:
    """``sequences`` in micro-batches (`plan_micro_batches`, a pass priced in the passes'
    precision, ``bf16``: `pass_tokens`), each with its indices and collated on the CPU: with
    ``share_prefix``, a cluster cut into several micro-batches marks its prefix as theirs
    (`cluster_prefixes`), to be computed once by a ``logprobs.SharedPrefixes``. Advantages
    and weights are 0 where not given (no loss is taken). ``packs``: the model can run a
    micro-batch as one packed row (``logprobs.packs_prefix``), so the plan may be packed."""
    token_ids = [s.token_ids for s in sequences]
    batches, packed = _plan(
        token_ids, token_budget, share_prefix=share_prefix,
        pass_tokens=tokens_per_pass(bf16=bf16), packs=packs,
    )  # fmt: skip
    shared = share_prefix and not packed
    clusters = cluster_prefixes(token_ids, batches) if shared else [0] * len(batches)
    for indices, cluster_prefix in zip(batches, clusters, strict=True):
        zeros = [0.0] * len(indices)
        batch = collate(
            [sequences[i] for i in indices],
            [advantages[i] for i in indices] if advantages is not None else zeros,
            [weights[i] for i in indices] if weights is not None else zeros,
            grammars,
            [old_logprobs[i] for i in indices] if old_logprobs is not None else None,
            share_prefix=share_prefix,
            cluster_prefix=cluster_prefix,
            packed=packed,
        )
        yield indices, batch


def _advantages(advantages: Sequence[float | Sequence[float]], width: int) -> torch.Tensor:
    """``[B, 1]`` of one advantage per sequence, or ``[B, width - 1]`` of one per token (token
    ``t``'s at position ``t - 1``, as the batch's other shifted tensors)."""
    if all(isinstance(value, int | float) for value in advantages):
        return torch.tensor(advantages, dtype=torch.float32).unsqueeze(1)
    out = torch.zeros(len(advantages), max(width - 1, 0), dtype=torch.float32)
    for row, values in enumerate(advantages):
        if isinstance(values, int | float):
            out[row] = float(values)
        else:
            out[row, : len(values) - 1] = torch.tensor(list(values[1:]), dtype=torch.float32)
    return out
