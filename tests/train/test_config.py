"""The training config (``osmosis_ai.train.config``): its sections, a config of before refused
with one line per moved key (``migration.py``), and ``--print-config``."""

from __future__ import annotations

import asyncio
import shutil
import sys
import tomllib
from pathlib import Path

import pytest

from osmosis_ai.errors import ConfigError
from osmosis_ai.train.config import TRAIN_SECTIONS, load_train_config, resolved_toml
from osmosis_ai.train.migration import new_place
from tests.subprocesses import communicate_within

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "calculator"
OSMOSIS = str(Path(sys.executable).with_name("osmosis"))

#: The calculator's config as it was written before the sections (0.3), with a LoRA
#: adapter, vLLM and credit per turn as such a file had them.
FLAT = """[experiment]
rollout = "calculator"
entrypoint = "main.py"
model = "embedded"
dataset = "data/arithmetic_train.jsonl"

[training]
steps = 12
learning_rate = 5e-5
eval_rows = 40
checkpoint_every = 4
max_tokens = 64
lora_rank = 8
engine = "vllm"
credit = "turn"
overlong = "keep"

[vllm]
dtype = "bfloat16"
"""


def _workspace(root: Path, text: str) -> Path:
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns(".osmosis"))
    config = root / "configs" / "training" / "calculator.toml"
    config.write_text(text)
    return config


def test_a_flat_config_gets_one_line_per_moved_key(tmp_path: Path) -> None:
    config = _workspace(tmp_path / "ws", FLAT)
    with pytest.raises(ConfigError) as info:
        load_train_config(config)
    first, *moved = str(info.value).splitlines()
    assert first == (
        f"{config}: this config has the flat keys of before 0.4; move each "
        "(docs/train/reference.md has every key):"
    )
    assert [line.strip() for line in moved] == [
        "line 18: [vllm] is now [engine.vllm]: rename the table",
        "line 9: training.learning_rate is now [learner] learning_rate",
        "line 10: training.eval_rows is now [eval] rows",
        "line 11: training.checkpoint_every is now [checkpoints] every",
        "line 12: training.max_tokens is now [sampling] max_tokens",
        "line 13: training.lora_rank is now [learner.lora] rank",
        "line 14: training.engine = 'vllm': generate with vLLM by adding an [engine.vllm] table "
        "(its keys are the old [vllm] table's); without one the torch engine generates",
        "line 15: training.credit = 'turn': credit per turn is an [algorithm.turn_credit] table "
        "(discount, weight); without one every token gets its rollout's advantage",
        'line 16: training.overlong = "keep": remove it (no [algorithm.overlong] table keeps them)',
    ]


def test_every_key_of_before_has_a_new_place() -> None:
    """The keys of 0.3's flat ``[training]`` and ``[vllm]``: each is declared's ``formerly``
    (or a table of its own, said by the migration's own lines)."""
    flat = [
        "learning_rate",
        "loss",
        "clip_low",
        "clip_high",
        "dual_clip",
        "normalisation",
        "epochs",
        "mini_batches",
        "turn_discount",
        "turn_weight",
        "overlong_buffer",
        "advantage",
        "advantage_scale",
        "kl_beta",
        "eval_rows",
        "eval_dataset",
        "eval_every",
        "eval_samples",
        "report_to",
        "record_sequences",
        "checkpoint_every",
        "pass_threshold",
        "temperature",
        "max_tokens",
        "eval_temperature",
        "precision",
        "token_budget",
        "max_batch_size",
        "resample_zero_gradient",
        "device",
        "lora_rank",
        "lora_alpha",
        "lora_dropout",
        "lora_target_modules",
        "keep_checkpoints",
        "tool_format",
        "tis_cap",
        "tis_mode",
        "tis_floor",
    ]
    assert all(new_place(f"training.{key}") for key in flat), [
        key for key in flat if not new_place(f"training.{key}")
    ]
    assert new_place("vllm.gpu_memory_utilization") == "[engine.vllm] gpu_memory_utilization"
    assert new_place("training.steps") is None  # it stayed


async def test_a_flat_config_is_one_error_on_the_cli_and_print_config_shows_the_resolved_one(
    tmp_path: Path,
) -> None:
    config = _workspace(tmp_path / "flat", FLAT)
    code, out = await _osmosis(config.parents[2], "train", "run", str(config))
    assert code == 2 and "Traceback" not in out, out
    assert out.startswith("error: ") and "training.lora_rank is now [learner.lora] rank" in out
    # The example as shipped, resolved with a recipe and flags, trains nothing.
    shipped = EXAMPLE / "configs" / "training" / "calculator.toml"
    config = _workspace(tmp_path / "ws", shipped.read_text())
    flags = ("--set", "algorithm.recipe=dapo", "--set", "learner.lora.rank=8")
    code, out = await _osmosis(config.parents[2], "train", "run", str(config), *flags,
                               "--print-config")  # fmt: skip
    assert code == 0, out
    printed = tomllib.loads(out)
    assert printed["algorithm"]["recipe"] == "dapo" and printed["algorithm"]["overlong"]
    assert printed["learner"]["lora"]["rank"] == 8 and printed["training"]["steps"] == 12
    assert [name for name in printed if name not in ("experiment",)] == [
        section.name for section in TRAIN_SECTIONS
    ]
    assert not (config.parents[2] / ".osmosis").exists(), "nothing trained, nothing written"
    loaded = load_train_config(config, ["algorithm.recipe=dapo", "learner.lora.rank=8"])
    assert out == resolved_toml(loaded)


async def _osmosis(cwd: Path, *args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        OSMOSIS, *args, cwd=cwd,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out = (await communicate_within(process, 120))[0].decode()
    assert process.returncode is not None
    return process.returncode, out


def test_a_distillation_teacher_is_a_directory_of_the_workspace(tmp_path: Path) -> None:
    shipped = EXAMPLE / "configs" / "training" / "calculator.toml"
    text = shipped.read_text() + '\n[algorithm.distill]\nteacher = "teachers/t1"\nweight = 0.5\n'
    config = _workspace(tmp_path / "ws", text)
    with pytest.raises(ConfigError, match=r"line \d+.*algorithm.distill.teacher 'teachers/t1'"):
        load_train_config(config)
    (tmp_path / "ws" / "teachers" / "t1").mkdir(parents=True)
    distill = load_train_config(config).algorithm.distill
    assert distill is not None and distill.weight == 0.5 and distill.reward_weight == 0
    assert distill.teacher == str(tmp_path / "ws" / "teachers" / "t1")


def test_a_judge_section_is_read_and_checked(tmp_path: Path) -> None:
    shipped = EXAMPLE / "configs" / "training" / "calculator.toml"
    config = _workspace(tmp_path / "ws", shipped.read_text() + '\n[judge]\nmodel = "embedded"\n')
    judge = load_train_config(config).judge
    assert judge is not None and (judge.concurrency, judge.retries, judge.group_rubric) == (
        4,
        2,
        None,
    )
    assert '[judge]\nmodel = "embedded"' in resolved_toml(load_train_config(config))
    config.write_text(shipped.read_text() + '\n[judge]\nmodel = "openai:nope"\n')
    with pytest.raises(ConfigError, match=r"judge.model: .*openai:"):
        load_train_config(config)
    config.write_text(shipped.read_text() + '\n[judge]\nmodel = "embedded"\nmin_score = 2\n')
    with pytest.raises(ConfigError, match="max_score must be above min_score"):
        load_train_config(config)
    config.write_text(shipped.read_text() + '\n[judge]\nmodel = "embedded"\nscores = [5, 1, 3]\n')
    judge = load_train_config(config).judge
    assert judge is not None and (judge.scores, judge.low, judge.high) == ((1, 3, 5), 1, 5)
    config.write_text(shipped.read_text() + '\n[judge]\nmodel = "embedded"\nscores = [1]\n')
    with pytest.raises(ConfigError, match="judge.scores.*two or more different numbers"):
        load_train_config(config)
