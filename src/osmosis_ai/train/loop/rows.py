"""The rows of a run: which dataset rows train and which are held out, which rows a step
samples, and the rollout ids of a step's groups."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from osmosis_ai.environments.rows import make_rows
from osmosis_ai.errors import ConfigError
from osmosis_ai.eval.datasets import DatasetItem, load_dataset
from osmosis_ai.train.config import TrainConfig

__all__ = ["Rows", "dataset_rows", "group_id", "jobs", "split_rows", "step_rows"]


def dataset_rows(config: TrainConfig) -> tuple[list[DatasetItem], list[int], list[int]]:
    """The rows (training rows, then held-out ones from ``[eval] dataset``), and the indices
    of each part: with no held-out file, a seeded split of ``dataset`` (blocking). An
    ``[environment]``'s rows are made first, unless an earlier run made them."""
    if config.environment is not None:
        make_rows(config.environment, config.experiment.dataset, config.workspace)
    items = load_dataset(config.experiment.dataset).items
    if config.eval_dataset is None:
        return items, *split_rows(len(items), config.eval.split, config.training.seed)
    held = load_dataset(config.eval_dataset).items
    everything = [*items, *held]
    return everything, list(range(len(items))), list(range(len(items), len(everything)))


@dataclass(frozen=True)
class Rows:
    """The dataset's rows (`dataset_rows`) and the indices of the training and held-out ones."""

    items: list[DatasetItem]
    train: list[int]
    held_out: list[int]


def split_rows(count: int, eval_rows: float, seed: int) -> tuple[list[int], list[int]]:
    """``(train, held_out)`` row indices: a seeded shuffle, the held-out part first."""
    held = int(eval_rows) if eval_rows >= 1 else max(1, round(eval_rows * count))
    if held >= count:
        raise ConfigError(
            f"[eval] rows holds out {held} of the dataset's {count} rows, leaving none "
            "to train on; lower rows or add rows to the dataset"
        )
    order = list(range(count))
    random.Random(seed).shuffle(order)
    return sorted(order[held:]), sorted(order[:held])


def step_rows(train_rows: Sequence[int], per_step: int, seed: int, step: int) -> list[int]:
    """The rows of ``step``: a function of the seed and the step only, so resume repeats it."""
    chooser = random.Random(f"{seed}:{step}")
    return chooser.sample(list(train_rows), min(per_step, len(train_rows)))


def group_id(row: int) -> str:
    """The group of ``row``'s rollouts (GRPO compares rewards within it)."""
    return f"row-{row}"


def jobs(prefix: str, rows: list[int], size: int) -> list[tuple[int, str]]:
    """``size`` rollouts of each row, with run-unique rollout ids under ``prefix``."""
    return [(r, f"{prefix}-row-{r}-{k}") for r in rows for k in range(size)]
