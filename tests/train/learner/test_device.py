"""The trainer's ``device``: a missing GPU is the config's one-line error, and an
accelerator running out of memory stops the run as the CPU's does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from osmosis_ai.errors import ConfigError
from osmosis_ai.train.config import load_train_config
from osmosis_ai.train.learner.core import out_of_memory
from tests.train.training_project import run as _run
from tests.train.training_project import workspace as _workspace


async def test_a_missing_gpu_stops_the_run_before_anything_loads(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    # On a GPU machine: one more GPU than it has.
    setting = f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"
    config = _workspace(tmp_path / "ws", tiny_model_dir, f'[learner]\ndevice = "{setting}"')
    code, out = await _run(config, limit_sec=60)
    assert code == 2, out
    assert out.strip().count("\n") == 0, out
    assert f'error: [learner] device = "{setting}" but torch sees ' in out
    assert not (tmp_path / "ws" / ".osmosis" / "train" / "tiny" / "events.jsonl").exists()


def test_the_device_setting_is_checked_with_its_line(tmp_path: Path, tiny_model_dir: Path) -> None:
    config = _workspace(tmp_path / "ws", tiny_model_dir, '[learner]\ndevice = "gpu"')
    line = config.read_text().splitlines().index('device = "gpu"') + 1
    with pytest.raises(ConfigError, match=f'line {line}: learner.device must be "auto"'):
        load_train_config(config)
    for good in ("auto", "cpu", "cuda", "cuda:1", "mps"):
        config = _workspace(tmp_path / good, tiny_model_dir, f'[learner]\ndevice = "{good}"')
        assert load_train_config(config).learner.device == good


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 22 GiB"
        ),
        RuntimeError("MPS backend out of memory (MPS allocated: 8 GB, other allocations: 1 GB)"),
        RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 9 GB"),
        MemoryError(),
    ],
)
def test_running_out_of_memory_on_any_device_names_the_step_and_the_budget(
    error: BaseException,
) -> None:
    stopped = out_of_memory(error, step=3, token_budget=4096)
    assert stopped is not None
    assert str(stopped) == (
        "out of memory in the update of step 3; lower [learner] token_budget (now 4096) so "
        "each micro-batch of the update holds fewer tokens"
    )


def test_other_device_errors_are_not_taken_for_memory() -> None:
    assert (
        out_of_memory(RuntimeError("CUDA error: an illegal memory access"), step=1, token_budget=8)
        is None
    )
    assert out_of_memory(ValueError("out of memory"), step=1, token_budget=8) is None
