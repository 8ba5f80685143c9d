"""Local evaluation: eval configs, datasets and the runner that drives rollouts over them."""

from osmosis_ai.eval.config import (
    EvalConfig,
    EvaluationConfig,
    ExperimentConfig,
    load_eval_config,
)
from osmosis_ai.eval.datasets import (
    DATASET_FORMATS,
    Dataset,
    DatasetItem,
    format_rows,
    load_dataset,
    parse_rows,
)

__all__ = [
    "DATASET_FORMATS",
    "Dataset",
    "DatasetItem",
    "EvalConfig",
    "EvaluationConfig",
    "ExperimentConfig",
    "format_rows",
    "load_dataset",
    "load_eval_config",
    "parse_rows",
]
