"""``sequences/step-NNNN.jsonl``: what the learner was given in a step, readable, for the
first ``record_sequences`` steps of a run.

One line per training sequence: its rollout, group, reward, whether its group trains (not a
zero-gradient group), and its tokens as segments of equal loss mask, decoded with the chat
template's special tokens kept, so a user sees exactly which text carries loss (the policy's
replies) and which is context (prompt, tool results, template). Text is redacted; token ids
are not written (they would spell a secret back).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

from osmosis_ai.rollout.storage import atomic_write_bytes
from osmosis_ai.train.algorithm.sequences import TrainingSequence
from osmosis_ai.train.run_files import RUN_FILES

__all__ = ["mask_runs", "sequence_line", "write_step_sequences"]


def mask_runs(loss_mask: Sequence[int]) -> Iterator[tuple[int, int, bool]]:
    """``(start, end, trained)`` of each run of equal mask values, in order."""
    start = 0
    for index in range(1, len(loss_mask) + 1):
        if index == len(loss_mask) or loss_mask[index] != loss_mask[start]:
            yield start, index, bool(loss_mask[start])
            start = index


def sequence_line(
    sequence: TrainingSequence,
    *,
    trains: bool,
    decode: Callable[[list[int]], str],
    redact: Callable[[str], str],
) -> dict[str, Any]:
    """One sequence as its line of the step's file."""
    ids = sequence.token_ids
    segments = [
        {"trained": trained, "tokens": end - start, "text": redact(decode(list(ids[start:end])))}
        for start, end, trained in mask_runs(sequence.loss_mask)
    ]
    return {
        "rollout_id": sequence.rollout_id,
        "group_id": sequence.group_id,
        "reward": sequence.reward,
        "trains": trains,
        "tokens": len(sequence),
        "trained_tokens": sequence.policy_tokens,
        "segments": segments,
    }


def write_step_sequences(
    run_dir: Path,
    step: int,
    sequences: Sequence[TrainingSequence],
    *,
    zero_gradient: Collection[str],
    decode: Callable[[list[int]], str],
    redact: Callable[[str], str],
) -> Path:
    """Write (replace: a step run again after a resume rewrites it) the step's file."""
    lines = (
        sequence_line(s, trains=s.group_id not in zero_gradient, decode=decode, redact=redact)
        for s in sequences
    )
    path = run_dir / RUN_FILES.sequences / f"step-{step:04d}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
    atomic_write_bytes(path, text.encode("utf-8"), durable=False)
    return path
