"""TRL's side of ``make bench-trl``, run with the benchmark's TRL environment (no osmosis_ai
there): ``train`` runs ``GRPOTrainer`` with the settings ``trl_compare.py`` gives it and times
each step's phases; ``eval`` is the held-out evaluation every checkpoint gets, osmosis's too.

``train`` writes one JSON line per optimiser step: ``generation_sec`` (the time spent in
``_generate_and_score_completions``: tokenising, generating, decoding, rewards and
advantages), ``update_sec`` (the rest of the step, from the callback's ``on_step_begin`` to
its ``on_step_end``: forward, backward, clipping, optimiser and scheduler), ``total_sec``,
``generated_tokens`` (completion tokens, up to and with the end-of-sequence token),
``forwarded_tokens`` (prompt + completion tokens, padding left out) and ``reward_mean``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

TASK = Path(__file__).resolve().parent / "trl_task"
REWARD_FILE = TASK / "rollouts" / "arith" / "arith_reward.py"
EVAL_BATCH = 8

Score = Callable[[str, str], float]


def load_reward() -> tuple[Score, float]:
    """The task's ``score`` and ``PASS``, from the rollout folder osmosis serves."""
    spec = importlib.util.spec_from_file_location("arith_reward", REWARD_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return cast(Score, module.score), float(module.PASS)


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def messages(row: dict[str, Any]) -> list[dict[str, str]]:
    """A dataset row's prompt as chat messages (the rollout's ``ctx.prompt``)."""
    return [
        {"role": "system", "content": row["system_prompt"]},
        {"role": "user", "content": row["user_prompt"]},
    ]


# -- train -----------------------------------------------------------------------------------


class StepClock:
    """The phases of the current optimiser step, written as one line when it ends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.write_text("")
        self.started = 0.0
        self.generation_sec = 0.0
        self.generated_tokens = 0
        self.forwarded_tokens = 0
        self.rewards: list[float] = []
        self.learning_rate = 0.0
        self.generating = False
        self.autocast: dict[str, set[bool]] = {"generation": set(), "update": set()}

    def begin(self, learning_rate: float) -> None:
        self.learning_rate = learning_rate
        self.started = time.perf_counter()
        self.generation_sec = 0.0
        self.generated_tokens = self.forwarded_tokens = 0
        self.rewards = []

    def end(self) -> None:
        total = time.perf_counter() - self.started
        line = {
            "generation_sec": round(self.generation_sec, 3),
            "update_sec": round(total - self.generation_sec, 3),
            "total_sec": round(total, 3),
            "generated_tokens": self.generated_tokens,
            "forwarded_tokens": self.forwarded_tokens,
            "reward_mean": sum(self.rewards) / len(self.rewards) if self.rewards else 0.0,
            "learning_rate": self.learning_rate,
        }
        with self.path.open("a") as file:
            file.write(json.dumps(line) + "\n")


def train(args: argparse.Namespace) -> None:
    import torch
    from datasets import Dataset  # type: ignore[import-not-found,unused-ignore]
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer  # type: ignore[import-not-found,unused-ignore]

    settings = json.loads(Path(args.settings).read_text())
    score, _ = load_reward()
    clock = StepClock(Path(args.timings))

    def arith_reward(completions: list[Any], ground_truth: list[str], **_: Any) -> list[float]:
        rewards = [
            score(completion[-1]["content"], answer)
            for completion, answer in zip(completions, ground_truth, strict=True)
        ]
        clock.rewards += rewards
        return rewards

    class Clocked(TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            clock.begin(optimizer.param_groups[0]["lr"])

        def on_step_end(self, *_: Any, **__: Any) -> None:
            clock.end()

    class TimedGRPOTrainer(GRPOTrainer):  # type: ignore[misc]
        """GRPOTrainer whose generation phase is timed (one call per optimiser step here)."""

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            started = time.perf_counter()
            clock.generating = True
            try:
                output = super()._generate_and_score_completions(inputs)
            finally:
                clock.generating = False
            clock.generation_sec += time.perf_counter() - started
            completion = int(output["completion_mask"].sum())
            clock.generated_tokens += completion
            clock.forwarded_tokens += completion + int(output["prompt_mask"].sum())
            return output

    rows = read_rows(Path(args.rows))
    dataset = Dataset.from_list(
        [{"prompt": messages(row), "ground_truth": str(row["ground_truth"])} for row in rows]
    )
    per_step = settings["prompts_per_step"] * settings["group_size"]
    config = GRPOConfig(
        output_dir=str(Path(args.out).parent / "trl-output"),
        max_steps=settings["steps"],
        seed=settings["seed"],
        per_device_train_batch_size=per_step,
        gradient_accumulation_steps=1,
        num_generations=settings["group_size"],
        num_iterations=1,
        shuffle_dataset=False,
        max_completion_length=settings["max_tokens"],
        temperature=settings["temperature"],
        top_p=1.0,
        top_k=0,
        learning_rate=settings["learning_rate"],
        beta=settings["kl_beta"],
        loss_type="dapo",
        epsilon=settings["clip_low"],
        epsilon_high=settings["clip_high"],
        scale_rewards="group",
        mask_truncated_completions=False,
        max_grad_norm=settings["max_grad_norm"],
        bf16=settings["bf16"],
        use_cpu=True,
        activation_checkpointing=False,  # TRL's default is on (gradient_checkpointing)
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_pin_memory=False,
    )
    model: Any = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    # osmosis's optimiser and schedule (osmosis_ai.train.algorithm.schedule): fused AdamW
    # without weight decay; the factor (k + 1) / warm-up during the warm-up (transformers'
    # constant_with_warmup starts at 0), then 1.
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=settings["learning_rate"], weight_decay=0.0, fused=True
    )
    warmup = settings["warmup_steps"]
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: (step + 1) / warmup if step < warmup else 1.0
    )
    trainer = TimedGRPOTrainer(
        model=model,
        reward_funcs=arith_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        optimizers=(optimizer, scheduler),
        callbacks=[Clocked()],
    )

    def note_autocast(*_: Any) -> None:
        phase = "generation" if clock.generating else "update"
        clock.autocast[phase].add(torch.is_autocast_enabled("cpu"))

    # Whether each phase's forward passes run under autocast, as the run goes: the backbone
    # runs in every forward pass (TRL's update projects through the head's weight directly).
    model.base_model.register_forward_pre_hook(note_autocast)
    trainer.train()
    trainer.save_model(args.out)
    tokenizer.save_pretrained(args.out)
    facts = {
        "autocast": {phase: sorted(seen) for phase, seen in clock.autocast.items()},
        "activation_checkpointing": bool(trainer.args.activation_checkpointing),
        "optimizer": type(optimizer).__name__,
        "loss_type": trainer.args.loss_type,
    }
    Path(args.facts).write_text(json.dumps(facts))


# -- eval ------------------------------------------------------------------------------------


def evaluate(args: argparse.Namespace) -> None:
    """Greedy replies to every held-out row, scored; prints one JSON line."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    score, passing = load_reward()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model: Any = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.eval()
    pad = tokenizer.pad_token_id
    rows = read_rows(Path(args.rows))
    rewards: list[float] = []
    examples: list[str] = []
    for start in range(0, len(rows), EVAL_BATCH):
        batch = rows[start : start + EVAL_BATCH]
        prompts = [
            list(tokenizer.apply_chat_template(messages(row), add_generation_prompt=True,
                                               tokenize=True, return_dict=False))
            for row in batch
        ]  # fmt: skip
        longest = max(len(ids) for ids in prompts)
        # Left padding, so that every reply starts at the same position.
        ids = torch.tensor([[pad] * (longest - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=args.max_tokens,
                pad_token_id=pad,
            )
        replies = tokenizer.batch_decode(out[:, longest:], skip_special_tokens=True)
        for row, reply in zip(batch, replies, strict=True):
            reward = score(reply, str(row["ground_truth"]))
            rewards.append(reward)
            if len(examples) < 3:
                examples.append(f"{row['user_prompt']} -> {reply!r} ({reward:g})")
    print(
        json.dumps(
            {
                "rows": len(rewards),
                "mean_reward": sum(rewards) / len(rewards),
                "pass_rate": sum(r >= passing for r in rewards) / len(rewards),
                "examples": examples,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    training = commands.add_parser("train")
    training.add_argument("--model", required=True)
    training.add_argument("--rows", required=True)
    training.add_argument("--settings", required=True)
    training.add_argument("--out", required=True)
    training.add_argument("--timings", required=True)
    training.add_argument("--facts", required=True)
    evaluation = commands.add_parser("eval")
    evaluation.add_argument("--model", required=True)
    evaluation.add_argument("--rows", required=True)
    evaluation.add_argument("--max-tokens", type=int, required=True)
    args = parser.parse_args()
    train(args) if args.command == "train" else evaluate(args)


if __name__ == "__main__":
    main()
