"""The settings of a GRPO-family step (`GrpoConfig`), and the defaults each loss brings.

Pure Python (no torch), so the training config's loader checks a file against the same rules
the update runs under: every rule lives here once, and a bad value is refused when the file is
read, with its line, not when the learner starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

from osmosis_ai.errors import SettingError
from osmosis_ai.train.algorithm.advantages import Scale, baseline_scale

__all__ = [
    "CLIP_DEFAULTS",
    "DUAL_CLIP_DEFAULT",
    "TIS_DEFAULTS",
    "TIS_MODES",
    "GrpoConfig",
    "Loss",
    "TisMode",
]

Loss = Literal["ppo_clip", "gspo", "cispo"]

#: How the importance weight between the learner at the start of the step and the policy that
#: generated is applied: per token or per sequence, truncated at the cap or masked outside
#: ``[tis_floor, tis_cap]``.
TisMode = Literal["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
TIS_MODES: tuple[TisMode, ...] = get_args(TisMode)

#: ``(clip_low, clip_high)`` of each loss when the config sets none. GSPO's ratio is a
#: per-token geometric mean, so its band is three orders narrower (the paper's 3e-4, 4e-4);
#: CISPO's weight has no floor and a cap of 4, as Tinker's default (MiniMax-M1 tuned only the
#: cap).
CLIP_DEFAULTS: dict[str, tuple[float, float]] = {
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
TIS_DEFAULTS: dict[str, tuple[TisMode, float]] = {
    "ppo_clip": ("token_truncate", 0.0),
    "gspo": ("sequence_truncate", 2.0),
    "cispo": ("token_truncate", 0.0),
}

_CHOICES: dict[str, tuple[object, ...]] = {
    "loss": tuple(CLIP_DEFAULTS),
    "advantage": ("grpo", "rloo"),
    "advantage_scale": ("std", "none", None),
    "normalisation": ("token", "sequence", "constant"),
    "overlong": ("keep", "mask", "penalty"),
    "credit": ("outcome", "turn"),
    "tis_mode": (*TIS_MODES, None),
}


@dataclass(frozen=True, slots=True)
class GrpoConfig:
    """Loss and update settings of a GRPO-family step.

    Raises:
        SettingError: A value out of its range, or two that do not go together; the error's
            ``setting`` names the field.
    """

    loss: Loss = "ppo_clip"
    """The objective: PPO's clipped token ratio, GSPO's clipped sequence ratio, or CISPO's
    clipped, gradient-free importance weight on the log-likelihood."""
    clip_low: float | None = None
    """The ratio (CISPO: the weight) is clipped below at ``1 - clip_low``; ``None``: the
    loss's default (`CLIP_DEFAULTS`)."""
    clip_high: float | None = None
    """... and above at ``1 + clip_high`` (DAPO's clip-higher when above ``clip_low``)."""
    dual_clip: float | None = None
    """Dual clip (Ye et al. 2020; verl's ``clip_ratio_c``): a token with a negative advantage
    loses at most ``dual_clip × |A|`` however far its ratio rose (0: off; ``None``: see
    `dual`). ``ppo_clip`` and ``gspo``; CISPO's weight is capped already."""
    advantage: Literal["grpo", "rloo"] = "grpo"
    """The baseline a reward is compared with: the mean of its group (GRPO), or the mean of
    the group's other rollouts (RLOO, leave-one-out)."""
    advantage_scale: Literal["std", "none"] | None = None
    """Divide by the group's reward std (GRPO) or not (Dr. GRPO, RLOO); ``None``: the
    baseline's own (``std`` for ``grpo``, ``none`` for ``rloo``: see `scale`)."""
    normalisation: Literal["token", "sequence", "constant"] = "token"
    """Average over every policy token of the step (DAPO), per rollout then over rollouts
    (GRPO), or sum each rollout's tokens and divide by ``max_tokens`` (Dr. GRPO)."""
    max_tokens: int = 1024
    """The rollouts' completion limit per call: the constant of ``normalisation="constant"``
    and the length ``overlong`` measures against."""
    overlong: Literal["keep", "mask", "penalty"] = "keep"
    """Rollouts a call of which stopped at ``max_tokens``: trained as they are, left out of
    the loss (``mask``, DAPO's overlong filtering; they still count in their group's
    baseline), or ``penalty``: see ``advantages.overlong_penalty``."""
    overlong_buffer: int = 0
    """The last tokens before ``max_tokens`` over which ``penalty`` grows from 0 to -1
    (0: a fifth of ``max_tokens``)."""
    kl_beta: float = 0.0
    """Weight of the k3 KL estimate to the reference policy (0 turns it off)."""
    credit: Literal["outcome", "turn"] = "outcome"
    """Every token gets its rollout's advantage (``outcome``), or a turn's tokens get it plus
    ``turn_weight`` × the turn's advantage from the turn rewards
    (``advantages.turn_advantages``)."""
    turn_discount: float = 0.5
    """γ of a turn's return: its reward, plus γ × the next turn's return."""
    turn_weight: float = 0.5
    """λ: how much a turn's advantage adds to the outcome's."""
    epochs: int = 1
    """Passes over the step's sequences."""
    mini_batches: int = 1
    """Optimiser steps per pass, each over a share of the step's rollouts."""
    micro_batch_tokens: int = 1024
    """Token budget of one micro-batch, padding included (lower it when memory runs out)."""
    max_grad_norm: float | None = 1.0
    """Gradients are clipped to this global norm (``None``: measured, not clipped)."""
    bf16: bool = False
    """Run the forward pass under bf16 autocast (logprobs are still taken in fp32)."""
    tis_cap: float | None = None
    """Importance sampling against the policy that generated (0: off; ``None``: the loss's
    default, `TIS_DEFAULTS`). When on, the ratio is taken against the learner's own logprobs
    at the start of the step, and each token's loss is weighted by ``π_learner /
    π_behaviour`` (per token or per sequence, ``tis_mode``) truncated at this cap, or masked
    outside ``[tis_floor, tis_cap]``: the engine's logprobs (vLLM in bf16) and stale tokens'
    need not match the learner's for the gradient to be the learner's policy gradient."""
    tis_mode: TisMode | None = None
    """``token_truncate``, ``token_mask``, ``sequence_truncate`` or ``sequence_mask``
    (``None``: the loss's default, `TIS_DEFAULTS`). A sequence's ratio is the geometric mean
    of its tokens' (GSPO's kind of ratio)."""
    tis_floor: float = 0.0
    """The mask modes' lower bound: a token or sequence whose ratio is below it gets no loss
    (IcePop's 0.5; 0: no lower bound)."""
    temperature: float = 1.0
    """The rollouts' sampling temperature: the learner divides its logits by it, so that its
    logprobs are of the distribution the engine sampled from (the behaviour logprobs')."""
    advantage_eps: float = 1e-4

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

    def __post_init__(self) -> None:
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                shown = tuple(choice for choice in allowed if choice is not None)
                raise SettingError(
                    name, f"{name} must be one of {shown}, not {getattr(self, name)!r}"
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
            "turn_weight": self.turn_weight,
        }
        for name, value in bounded.items():
            if not (math.isfinite(value) and value >= 0):
                raise SettingError(name, f"{name} must be a finite number >= 0, not {value!r}")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise SettingError(
                "temperature", f"temperature must be a finite number > 0, not {self.temperature!r}"
            )
        if not 0 <= self.turn_discount <= 1:
            raise SettingError(
                "turn_discount",
                f"turn_discount must be between 0 and 1 (a turn's return discounts the ones "
                f"after it), not {self.turn_discount!r}",
            )
        for name in ("epochs", "mini_batches", "max_tokens"):
            if getattr(self, name) < 1:
                raise SettingError(name, f"{name} must be at least 1, not {getattr(self, name)!r}")
        if not 0 <= self.overlong_buffer <= self.max_tokens:
            raise SettingError(
                "overlong_buffer",
                f"overlong_buffer ({self.overlong_buffer}) must be between 0 and max_tokens "
                f"({self.max_tokens}): the penalty grows over the last tokens before it",
            )
        if self.micro_batch_tokens < 2:
            raise SettingError(
                "micro_batch_tokens",
                f"micro_batch_tokens must be at least 2, not {self.micro_batch_tokens!r}",
            )
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise SettingError(
                "max_grad_norm", f"max_grad_norm must be > 0 or None, not {self.max_grad_norm!r}"
            )
        if not self.advantage_eps > 0:
            raise SettingError(
                "advantage_eps", f"advantage_eps must be > 0, not {self.advantage_eps!r}"
            )

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
