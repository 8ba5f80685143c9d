"""benchmarks/gpu_check.py on the CPU: the script a maintainer runs on a GPU, proven to work."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import pytest

from tests.subprocesses import communicate_within
from tests.train.conftest import tokenizer_dir  # noqa: F401 -- fixture

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"

pytestmark = pytest.mark.slow


async def run_small_check(*args: str, limit_sec: float) -> tuple[int | None, str]:
    """The script on the CPU with 2 layers, 2 steps of 2 x 4 rollouts of 16 tokens."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(SCRIPT), "--device", "cpu", "--set", "num_hidden_layers=2",
        "--steps", "2", "--prompts", "2", "--group-size", "4", "--max-tokens", "16", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await communicate_within(process, limit_sec)
    return process.returncode, out.decode()


async def test_gpu_check_runs_full_and_lora_steps_through_the_stack_on_the_cpu(
    tokenizer_dir: Path,  # noqa: F811
) -> None:
    """Asynchronously (``--max-staleness 1``): the GPU machine checks that path too."""
    code, out = await run_small_check(
        "--tokenizer", str(tokenizer_dir), "--max-staleness", "1", limit_sec=110
    )
    assert code == 0, out
    assert "all checks passed" in out
    assert "model smollm2-135m" in out and "35.4M parameters" in out  # the shape, 2 layers
    for mode in ("full", "lora"):
        table = out[out.index(f"{mode}: 2 steps of 2 x 4 rollouts") :]
        for figure in ("generation: completion tokens", "update: tokens forwarded", "peak RSS"):
            value = re.search(rf"{figure}[^\n]*?([0-9][0-9,.]*) ", table)
            assert value and float(value.group(1).replace(",", "")) > 0, (mode, figure, out)
        assert re.search(r"fp32: max \|delta\|\s+[0-9.]+ e-6\s+<= 1000 e-6\s+meets target", table)
        # Step 2 trained on step 1's rollouts' version: one step stale, the bound.
        assert re.search(r"staleness: largest \(bound --max-staleness\)\s+1 steps", table), table
        probe = re.search(r"largest median \|engine - learner\| logprob\s+([0-9.]+) e-3", table)
        assert probe and float(probe.group(1)) <= 1.0, table
    # No bars from transformers between the lines.
    assert "Loading weights" not in out and "Writing model shards" not in out


async def test_gpu_check_names_a_missing_gpu_in_one_line(
    tokenizer_dir: Path,  # noqa: F811
) -> None:
    import torch

    process = await asyncio.create_subprocess_exec(
        sys.executable, str(SCRIPT), "--device", "cuda", "--tokenizer", str(tokenizer_dir),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out = (await communicate_within(process, 60))[0].decode()
    assert process.returncode == 2, out
    assert out.strip() == (
        f'error: --device = "cuda" but torch sees no GPU (torch {torch.__version__} is a CPU build)'
    )
