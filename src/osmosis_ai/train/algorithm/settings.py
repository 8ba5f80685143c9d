"""The ``[algorithm]`` section of a training config: what the update takes (`AlgorithmConfig`,
with its optional ``[algorithm.overlong]``, ``[algorithm.turn_credit]`` and
``[algorithm.distill]``), the defaults each
loss brings, and `UpdateSettings`, the section with what the update needs from the others.

Pure Python (no torch), so the config's loader checks a file against the same rules the
update runs under: every rule lives here once, and a bad value is refused when the file is
read, with its line, not when the learner starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

from osmosis_ai.config.schema import setting, subsection
from osmosis_ai.errors import SettingError
from osmosis_ai.train.algorithm.advantages import Baseline, Normalisation, Scale, baseline_scale

__all__ = [
    "ADVANTAGE_EPS",
    "CLIP_DEFAULTS",
    "DUAL_CLIP_DEFAULT",
    "RECIPE_NAMES",
    "TIS_DEFAULTS",
    "TIS_MODES",
    "AlgorithmConfig",
    "DistillConfig",
    "Loss",
    "OverlongConfig",
    "Recipe",
    "TisMode",
    "TurnCreditConfig",
    "UpdateSettings",
]

Loss = Literal["ppo_clip", "gspo", "cispo"]

#: The named presets of `AlgorithmConfig` (``osmosis_ai.train.recipes``).
Recipe = Literal["grpo", "dr_grpo", "dapo", "gspo", "cispo", "rloo"]
RECIPE_NAMES: tuple[Recipe, ...] = get_args(Recipe)

#: How the importance weight between the learner at the start of the step and the policy that
#: generated is applied: per token or per sequence, truncated at the cap or masked outside
#: ``[tis_floor, tis_cap]``.
TisMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
TIS_MODES: tuple[TisMode, ...] = get_args(TisMode)

#: ``(clip_low, clip_high)`` of each loss when the config sets none. GSPO's ratio is a
#: per-token geometric mean, so its band is three orders narrower (the paper's 3e-4, 4e-4);
#: CISPO's weight has no floor and a cap of 4, as Tinker's default (MiniMax-M1 tuned only the
#: cap).
CLIP_DEFAULTS: dict[Loss, tuple[float, float]] = {
    "ppo_clip": (0.2, 0.28),
    "gspo": (3e-4, 4e-4),
    "cispo": (1.0, 3.0),
}

#: The dual clip's bound when the config sets none (verl's ``clip_ratio_c``).
DUAL_CLIP_DEFAULT = 3.0

#: ``(tis_mode, tis_cap)`` of each loss when the config sets none (a cap of 0 is off). GSPO
#: takes its ratio from the learner at the start of the step, so the weight to the policy that
#: generated is its only off-policy correction: on by default, per sequence like its ratio,
#: truncated at 2 (verl's default threshold).
TIS_DEFAULTS: dict[Loss, tuple[TisMode, float]] = {
    "ppo_clip": ("token_truncate", 0.0),
    "gspo": ("sequence_truncate", 2.0),
    "cispo": ("token_truncate", 0.0),
}

#: Added to a group's reward std before dividing by it.
ADVANTAGE_EPS = 1e-4


@dataclass(frozen=True, slots=True)
class OverlongConfig:
    """``[algorithm.overlong]``: what happens to a rollout a call of which stopped at
    ``[sampling] max_tokens`` (absent: it trains as it is)."""

    mode: Literal["mask", "penalty"] = setting(
        "penalty",
        comment='"mask": no loss; "penalty": rewarded less near the limit (DAPO)',
        docs='left out of the loss but not of its group (`"mask"`, DAPO\'s overlong '
        'filtering), or rewarded less as its reply nears the limit (`"penalty"`, DAPO\'s soft '
        "overlong punishment); see [overlong replies](objective.md#overlong-replies)",
        formerly="training.overlong",
    )
    buffer: int = setting(
        0,
        bound="non-negative",
        comment='with "penalty": it grows from 0 to -1 over the last N tokens',
        docs='with `"penalty"`: the last tokens before `max_tokens` over which it grows from '
        "0 to -1",
        docs_default="`max_tokens` / 5",
        formerly="training.overlong_buffer",
    )
    """0: a fifth of ``max_tokens``."""


@dataclass(frozen=True, slots=True)
class TurnCreditConfig:
    """``[algorithm.turn_credit]``: a turn's tokens also get credit from the turn rewards a
    workflow or grader set (`advantages.turn_advantages`); absent, every token gets its
    rollout's advantage."""

    discount: float = setting(
        0.5,
        bound="non-negative",
        comment="a turn's return is its reward + discount x the next turn's",
        docs="γ of a turn's return (its reward plus γ × the next turn's) and λ, the weight of "
        "a turn's advantage beside the outcome's",
        formerly="training.turn_discount",
    )
    weight: float = setting(
        0.5,
        bound="non-negative",
        comment="the weight of a turn's advantage beside the outcome's",
        joins_row=True,
        formerly="training.turn_weight",
    )

    def __post_init__(self) -> None:
        if not 0 <= self.discount <= 1:
            raise SettingError(
                "discount",
                f"discount must be between 0 and 1 (a turn's return discounts the ones after "
                f"it), not {self.discount!r}",
            )


@dataclass(frozen=True, slots=True)
class DistillConfig:
    """``[algorithm.distill]``: on-policy distillation. A teacher scores every token the
    student sampled, in the context the student saw, and the per-token reverse KL (the
    student's logprob minus the teacher's) becomes a per-token advantage, alone or beside the
    reward's (`distill.distill_advantages`)."""

    teacher: str = setting(
        required=True,
        scaffold=".osmosis/train/calculator/checkpoints/latest",
        comment="a model or checkpoint directory, or openai:<vLLM url>[:<model>]",
        docs="the teacher: a local HuggingFace-format directory (a model, or a checkpoint of "
        "a run, full or LoRA; relative to the workspace), scored on the learner's device, or "
        '`"openai:<base_url>[:<model>]"`, a vLLM server\'s prompt logprobs; it must share '
        "the student's tokenizer (refused otherwise)",
    )
    """The teacher's directory (absolute once loaded), or an ``openai:`` server spec."""

    weight: float = setting(
        1.0,
        bound="non-negative",
        comment="the per-token reverse KL's weight in each token's advantage",
        docs="the weight of each token's distillation advantage, `teacher logprob − student "
        "logprob`",
    )
    reward_weight: float = setting(
        0.0,
        bound="non-negative",
        comment="the reward's advantage beside it (0: distillation alone)",
        docs="the weight of the reward's group advantage added to it (0: distillation alone, "
        "as in the on-policy distillation write-ups; the rollouts are still graded, for the "
        "step's reward metrics)",
    )


@dataclass(frozen=True, slots=True)
class AlgorithmConfig:
    """The ``[algorithm]`` section: the objective, its advantages and its update passes.

    Raises:
        SettingError: A value out of its range, or two that do not go together; the error's
            ``setting`` names the field.
    """

    recipe: Recipe | None = setting(
        None,
        commented=True,
        scaffold="dapo",
        comment="a named preset of these keys, which the file's own keys override",
        docs="a named preset of this section (`grpo`, `dr_grpo`, `dapo`, `gspo`, `cispo`, "
        "`rloo`), each citing its paper, over which the file's own `[algorithm]` keys apply; "
        "see [recipes](recipes.md)",
    )
    loss: Loss = setting(
        "ppo_clip",
        comment='"ppo_clip" (token ratio), "gspo" (sequence ratio), "cispo" (IS weight)',
        docs="the objective: PPO's clipped token ratio (`\"ppo_clip\"`), GSPO's clipped "
        'sequence ratio (`"gspo"`) or CISPO\'s clipped importance weight on the '
        'log-likelihood (`"cispo"`); see [the loss](objective.md#the-loss)',
        formerly="training.loss",
    )
    """The objective: PPO's clipped token ratio, GSPO's clipped sequence ratio, or CISPO's
    clipped, gradient-free importance weight on the log-likelihood."""
    clip_low: float | None = setting(
        None,
        bound="non-negative",
        commented=True,
        scaffold=0.2,
        comment="the ratio is clipped to [1 - clip_low, 1 + clip_high]; default per loss",
        docs="clip bounds of the ratio (CISPO: of its weight)",
        docs_default="0.2 (`gspo`: 3e-4, `cispo`: 1)",
        formerly="training.clip_low",
    )
    """The ratio (CISPO: the weight) is clipped below at ``1 - clip_low``; ``None``: the
    loss's default (`CLIP_DEFAULTS`)."""
    clip_high: float | None = setting(
        None,
        bound="non-negative",
        commented=True,
        scaffold=0.28,
        comment="a higher upper bound lets rare good tokens grow (DAPO)",
        joins_row=True,
        docs_default="0.28 (`gspo`: 4e-4, `cispo`: 3)",
        formerly="training.clip_high",
    )
    """... and above at ``1 + clip_high`` (DAPO's clip-higher when above ``clip_low``)."""
    dual_clip: float | None = setting(
        None,
        bound="non-negative",
        commented=True,
        scaffold=3.0,
        docs_default="3 (0 where `1 + clip_high` ≥ 3)",
        comment="a token with advantage A < 0 loses at most -A x this (0: off)",
        docs="dual clip (`ppo_clip`, `gspo`): the loss of a token with a negative advantage "
        "`A` is at most `-A × dual_clip` however far its ratio rose, so a stale or mismatched "
        "token cannot dominate the update (0: off); see [off-policy "
        "correction](objective.md#off-policy-correction)",
        formerly="training.dual_clip",
    )
    """Dual clip (Ye et al. 2020; verl's ``clip_ratio_c``): a token with a negative advantage
    loses at most ``dual_clip × |A|`` however far its ratio rose (0: off; ``None``: see
    `dual`). ``ppo_clip`` and ``gspo``; CISPO's weight is capped already."""
    normalisation: Normalisation = setting(
        "token",
        comment='loss over all tokens ("token"), per rollout ("sequence"), or "constant"',
        docs='`"token"` (DAPO), `"sequence"` (GRPO) or `"constant"` (Dr. GRPO: each '
        "rollout's tokens summed and divided by `[sampling] max_tokens`)",
        formerly="training.normalisation",
    )
    """Average over every policy token of the step (DAPO), per rollout then over rollouts
    (GRPO), or sum each rollout's tokens and divide by ``max_tokens`` (Dr. GRPO)."""
    advantage: Baseline = setting(
        "grpo",
        comment='baseline: the group\'s mean ("grpo") or the mean of the others ("rloo")',
        docs='the baseline a reward is compared with: the mean of its group (`"grpo"`) or the '
        'mean of the group\'s other rollouts (`"rloo"`, leave-one-out)',
        formerly="training.advantage",
    )
    advantage_scale: Scale | None = setting(
        None,
        commented=True,
        scaffold="std",
        comment='divide by the row\'s reward std ("std") or not ("none"); default per baseline',
        docs='`"std"` (GRPO) or `"none"` (Dr. GRPO; RLOO\'s reference estimator)',
        docs_default='`"std"` (`rloo`: `"none"`)',
        formerly="training.advantage_scale",
    )
    """``None``: the baseline's own (``std`` for ``grpo``, ``none`` for ``rloo``: `scale`)."""
    kl_beta: float = setting(
        0.0,
        aliases=("beta", "kl_coef", "kl_loss_coef", "init_kl_coef"),
        bound="non-negative",
        comment="KL penalty to the initial model (> 0 loads a second copy)",
        docs="KL to the initial policy (loads a second copy of the model)",
        formerly="training.kl_beta",
    )
    """Weight of the k3 KL estimate to the reference policy (0 turns it off)."""
    epochs: int = setting(
        1,
        aliases=("ppo_epochs", "num_iterations", "num_train_epochs"),
        comment="passes over a step's rollouts",
        docs="passes over a step's rollouts, each in `mini_batches` optimiser steps (see "
        "[epochs and mini-batches](objective.md#epochs-and-mini-batches))",
        formerly="training.epochs",
    )
    mini_batches: int = setting(
        1,
        comment="optimiser steps per pass, each over a share of the rollouts",
        joins_row=True,
        formerly="training.mini_batches",
    )
    tis_cap: float | None = setting(
        None,
        bound="non-negative",
        commented=True,
        scaffold=2.0,
        comment="> 0: weight tokens by the learner/engine ratio, capped (gspo: 2)",
        docs="importance sampling against the policy that generated: weight each policy "
        "token's loss by `π_learner / π_engine`, truncated at `tis_cap` or masked outside "
        "`[tis_floor, tis_cap]` (0: off); see [off-policy "
        "correction](objective.md#off-policy-correction)",
        docs_default="0 (`gspo`: 2)",
        formerly="training.tis_cap",
    )
    """Importance sampling against the policy that generated (0: off; ``None``: the loss's
    default, `TIS_DEFAULTS`). When on, the ratio is taken against the learner's own logprobs
    at the start of the step, and each token's loss is weighted by ``π_learner /
    π_behaviour`` (per token or per sequence, ``tis_mode``) truncated at this cap, or masked
    outside ``[tis_floor, tis_cap]``: the engine's logprobs (vLLM in bf16) and stale tokens'
    need not match the learner's for the gradient to be the learner's policy gradient."""
    tis_mode: TisMode | None = setting(
        None,
        commented=True,
        scaffold="token_truncate",
        comment="per token or sequence, truncated or masked (gspo: sequence_truncate)",
        docs="with `tis_cap`: the ratio per token or per sequence (its geometric mean), "
        'truncated at the cap (`"*_truncate"`) or masked outside the band (`"*_mask"`, '
        "IcePop)",
        docs_default='`"token_truncate"` (`gspo`: `"sequence_truncate"`)',
        formerly="training.tis_mode",
    )
    tis_floor: float = setting(
        0.0,
        bound="non-negative",
        commented=True,
        scaffold=0.5,
        comment='with a "*_mask" tis_mode: a ratio below this is masked too',
        docs='with a `"*_mask"` `tis_mode`: the band\'s lower bound (IcePop: 0.5, with '
        "`tis_cap = 5`; 0: none)",
        formerly="training.tis_floor",
    )
    max_grad_norm: float = setting(
        1.0,
        bound="non-negative",
        comment="gradients are clipped to this global norm (0: not clipped)",
        docs="the global norm each update's gradient is clipped to (0: measured, not clipped); "
        "`grad_norm` in `metrics.jsonl` is the norm before clipping",
    )
    resample_zero_gradient: int = setting(
        0,
        bound="non-negative",
        comment="rerun a row whose rollouts all got one reward, up to N times",
        docs="dynamic sampling (DAPO): run a group whose rewards are all equal again within "
        "the step, up to N times (0: leave it out of the update)",
        formerly="training.resample_zero_gradient",
    )
    overlong: OverlongConfig | None = subsection(
        comment="replies cut at max_tokens: no loss, or a penalty",
        docs="rollouts a call of which stopped at `[sampling] max_tokens` (absent: trained "
        "as they are)",
    )
    turn_credit: TurnCreditConfig | None = subsection(
        comment="credit per turn from the turn rewards set",
        docs="credit per turn: a turn's tokens also get an advantage from the turn rewards a "
        "workflow or grader set ([credit per turn](objective.md#credit-per-turn)); "
        "absent, every token gets its rollout's",
    )
    distill: DistillConfig | None = subsection(
        comment="on-policy distillation from a teacher model",
        docs="on-policy distillation: a teacher's logprobs of the sampled tokens give each "
        "token an advantage ([on-policy distillation](objective.md#on-policy-distillation)); "
        "absent, none",
    )

    @property
    def clip(self) -> tuple[float, float]:
        """``(clip_low, clip_high)`` as set, or the loss's defaults (`CLIP_DEFAULTS`)."""
        low, high = CLIP_DEFAULTS[self.loss]
        return (
            low if self.clip_low is None else self.clip_low,
            high if self.clip_high is None else self.clip_high,
        )

    @property
    def dual(self) -> float:
        """The dual clip's bound (0: off): ``dual_clip`` as set, else `DUAL_CLIP_DEFAULT`
        where the band's top ``1 + clip_high`` is below it (a band that reaches past it asks
        for no cut there); never for CISPO, whose weight is capped already."""
        if self.loss == "cispo":
            return 0.0
        if self.dual_clip is not None:
            return self.dual_clip
        return DUAL_CLIP_DEFAULT if 1 + self.clip[1] < DUAL_CLIP_DEFAULT else 0.0

    @property
    def scale(self) -> Scale:
        """``advantage_scale`` as set, or the baseline's own (`baseline_scale`: ``std`` for
        GRPO, ``none`` for RLOO)."""
        return self.advantage_scale or baseline_scale(self.advantage)

    @property
    def tis(self) -> tuple[TisMode, float]:
        """``(tis_mode, tis_cap)`` as set, or the loss's defaults (`TIS_DEFAULTS`); a cap of 0
        is off."""
        mode, cap = TIS_DEFAULTS[self.loss]
        return (
            mode if self.tis_mode is None else self.tis_mode,
            cap if self.tis_cap is None else self.tis_cap,
        )

    @property
    def credit(self) -> Literal["outcome", "turn"]:
        """Whose advantage a token gets: its rollout's, or with ``turn_credit`` its turn's too."""
        return "outcome" if self.turn_credit is None else "turn"

    def __post_init__(self) -> None:
        from osmosis_ai.config.schema import section_of  # the declaration of this class

        for key in section_of(AlgorithmConfig, "algorithm").keys:
            value = getattr(self, key.attribute)
            if key.kind == "choice" and value is not None and value not in key.choices:
                raise SettingError(
                    key.name, f"{key.name} must be one of {key.choices}, not {value!r}"
                )
        self._check_numbers()
        self._check_clip()
        self._check_tis()

    def _check_numbers(self) -> None:
        low, high = self.clip
        bounded = {
            "clip_low": low,
            "clip_high": high,
            "dual_clip": self.dual,
            "kl_beta": self.kl_beta,
            "tis_cap": self.tis[1],
            "tis_floor": self.tis_floor,
            "max_grad_norm": self.max_grad_norm,
        }
        for name, value in bounded.items():
            if not (math.isfinite(value) and value >= 0):
                raise SettingError(name, f"{name} must be a finite number >= 0, not {value!r}")
        for name in ("epochs", "mini_batches"):
            if getattr(self, name) < 1:
                raise SettingError(name, f"{name} must be at least 1, not {getattr(self, name)!r}")

    def _check_clip(self) -> None:
        low, high = self.clip
        # CISPO's weight may have no floor (clip_low = 1); a PPO or GSPO ratio floor of 0 or
        # below would clip nothing and read as a setting error.
        if low > 1 or (low == 1 and self.loss != "cispo"):
            bound = "at most 1" if self.loss == "cispo" else 'below 1 (loss = "cispo" takes 1)'
            raise SettingError(
                "clip_low",
                f"clip_low must be {bound}: the ratio's floor is 1 - clip_low; not {low!r}",
            )
        # Inside the band the dual clip would cut the gradient the clip leaves.
        if self.dual and self.dual <= 1 + high:
            raise SettingError(
                "dual_clip",
                f"dual_clip must be 0 (off) or above 1 + clip_high ({1 + high:g}), "
                f"not {self.dual_clip!r}",
            )

    def _check_tis(self) -> None:
        mode, cap = self.tis
        if self.loss == "gspo" and cap == 0:
            raise SettingError(
                "tis_cap",
                'loss = "gspo" needs tis_cap > 0: its ratio is taken from the step\'s start, '
                "and the importance weight is what corrects for the policy that generated "
                "(leave tis_cap unset for 2.0)",
            )
        if cap == 0:
            for name in ("tis_mode", "tis_floor"):
                if getattr(self, name):
                    raise SettingError(
                        name,
                        f"{name} is set but tis_cap is 0 (importance sampling off); set "
                        "tis_cap, e.g. 2.0 to truncate or 5.0 with tis_floor = 0.5 to mask",
                    )
            return
        if cap < 1:
            raise SettingError(
                "tis_cap",
                f"tis_cap must be 0 (off) or at least 1 (a cap below 1 would weigh down even "
                f"on-policy tokens), not {cap!r}",
            )
        if self.tis_floor and not mode.endswith("_mask"):
            raise SettingError(
                "tis_floor",
                f'tis_floor is the lower bound of the mask modes; tis_mode is "{mode}" '
                '(set "token_mask" or "sequence_mask", or remove tis_floor)',
            )
        if self.tis_floor >= 1:
            raise SettingError(
                "tis_floor",
                f"tis_floor must be below 1 (the band [tis_floor, tis_cap] must hold an "
                f"on-policy ratio of 1), not {self.tis_floor!r}",
            )


@dataclass(frozen=True, slots=True)
class UpdateSettings:
    """What an update takes: the ``[algorithm]`` section, and the few values of the other
    sections it needs (each named as its section has it).

    Raises:
        SettingError: A value out of its range, or one that does not go with ``algorithm``.
    """

    algorithm: AlgorithmConfig = AlgorithmConfig()
    max_tokens: int = 1024
    """``[sampling] max_tokens``, each call's completion limit: the length ``overlong``
    measures against and Dr. GRPO's constant (``normalisation = "constant"``)."""
    temperature: float = 1.0
    """``[sampling] temperature``: the learner divides its logits by it, so that its
    logprobs are of the distribution the engine sampled from (the behaviour logprobs')."""
    token_budget: int = 1024
    """``[learner] token_budget``: tokens of one micro-batch, padding included."""
    bf16: bool = False
    """``[learner] precision`` as the device resolved it: the forward pass under bf16
    autocast (logprobs are still taken in fp32)."""
    share_prefix: bool = True
    """``[learner] share_prefix``: the first tokens the rows of a micro-batch have in common
    (a group's prompt) are computed once (`micro_batches.plan_micro_batches`)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise SettingError(
                "temperature", f"temperature must be a finite number > 0, not {self.temperature!r}"
            )
        if self.max_tokens < 1:
            raise SettingError(
                "max_tokens", f"max_tokens must be at least 1, not {self.max_tokens!r}"
            )
        overlong = self.algorithm.overlong
        if overlong is not None and overlong.buffer > self.max_tokens:
            raise SettingError(
                "overlong.buffer",
                f"overlong.buffer ({overlong.buffer}) must be at most [sampling] max_tokens "
                f"({self.max_tokens}): the penalty grows over the last tokens before it",
            )
        if self.token_budget < 2:
            raise SettingError(
                "token_budget", f"token_budget must be at least 2, not {self.token_budget!r}"
            )
