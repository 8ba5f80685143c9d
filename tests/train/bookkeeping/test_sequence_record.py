"""``sequences/step-NNNN.jsonl``: a step's training sequences as segments of equal loss mask,
decoded and redacted, replaced whole when the step runs again."""

from __future__ import annotations

import json
from pathlib import Path

from osmosis_ai.train.algorithm.sequences import TrainingSequence
from osmosis_ai.train.bookkeeping.sequence_record import mask_runs, write_step_sequences


def _sequence(rollout_id: str, mask: tuple[int, ...], group: str = "g") -> TrainingSequence:
    return TrainingSequence(
        rollout_id=rollout_id,
        group_id=group,
        reward=1.0,
        token_ids=tuple(range(len(mask))),
        loss_mask=mask,
        behaviour_logprobs=tuple(-0.5 * m for m in mask),
    )


def test_mask_runs_split_a_mask_where_it_changes() -> None:
    assert list(mask_runs([0, 0, 1, 1, 1, 0, 1])) == [
        (0, 2, False),
        (2, 5, True),
        (5, 6, False),
        (6, 7, True),
    ]
    assert list(mask_runs([1])) == [(0, 1, True)]
    assert list(mask_runs([])) == []


def test_a_steps_file_has_each_sequence_as_redacted_segments(tmp_path: Path) -> None:
    def decode(ids: list[int]) -> str:
        return "".join(f"<{i}>" for i in ids) + (" sk-secret" if 0 in ids else "")

    def redact(text: str) -> str:
        return text.replace("sk-secret", "[REDACTED]")

    sequences = [_sequence("a", (0, 0, 1, 1, 0, 1)), _sequence("b", (0, 1), group="flat")]
    path = write_step_sequences(
        tmp_path, 3, sequences, zero_gradient={"flat"}, decode=decode, redact=redact
    )
    assert path == tmp_path / "sequences" / "step-0003.jsonl"
    first, second = (json.loads(line) for line in path.read_text().splitlines())
    assert first["segments"] == [
        {"trained": False, "tokens": 2, "text": "<0><1> [REDACTED]"},
        {"trained": True, "tokens": 2, "text": "<2><3>"},
        {"trained": False, "tokens": 1, "text": "<4>"},
        {"trained": True, "tokens": 1, "text": "<5>"},
    ]
    assert (first["trains"], first["tokens"], first["trained_tokens"]) == (True, 6, 3)
    assert (second["rollout_id"], second["trains"]) == ("b", False)
    assert "sk-secret" not in path.read_text()
    # The step run again (after a resume) replaces its file.
    write_step_sequences(tmp_path, 3, sequences[:1], zero_gradient=(), decode=decode, redact=redact)
    assert len(path.read_text().splitlines()) == 1
