"""``[judge]``: the model a run's judges ask, apart from the policy. Shared by the eval and
the training config, as ``[experiment]`` is."""

from __future__ import annotations

import math
from dataclasses import dataclass

from osmosis_ai.config.schema import parse_section, section_of, setting
from osmosis_ai.config.source import ConfigSource, TOMLTable
from osmosis_ai.errors import ConfigError, SettingError
from osmosis_ai.rollout.judge import score_range

__all__ = ["JUDGE", "JudgeConfig", "parse_judge"]


def _policy_spec(src: ConfigSource, table: TOMLTable, section: str) -> str:
    model = src.string(table, section, "model")
    # Imported here: the gateway package loads its server stack, which config parsing
    # should not pay for at import time.
    from osmosis_ai.gateway.policies.spec import parse_policy_spec

    try:
        parse_policy_spec(model)
    except ConfigError as exc:
        raise src.error((section, "model"), f"{section}.model: {exc}") from exc
    return model


def _scores(src: ConfigSource, table: TOMLTable, section: str) -> tuple[float, ...]:
    value = table["scores"]
    numbers = isinstance(value, list) and all(
        isinstance(item, int | float) and not isinstance(item, bool) and math.isfinite(item)
        for item in value
    )
    if not numbers or len(set(value)) < 2:
        raise src.type_error(section, "scores", value, "a list of two or more different numbers")
    return tuple(sorted({float(item) for item in value}))


@dataclass(frozen=True)
class JudgeConfig:
    """The ``[judge]`` section: which model judges, with which limits, and the group judge."""

    model: str = setting(
        required=True,
        parse=_policy_spec,
        scaffold="embedded",
        comment="the judge: embedded, openai:<base_url>[:<model>], provider/model, torch:<dir>",
        docs='the judge\'s model, any policy the gateway serves (`"embedded"`, '
        '`"openai:<base_url>[:<model>]"`, a LiteLLM id, `"torch:<dir>"`), apart from the '
        "policy: a `JudgeGrader` asks it at its rollout's judge endpoint, which records "
        "nothing for training",
    )
    """The judge's policy spec."""

    api_key_env: str | None = setting(
        None,
        docs="the environment variable holding the judge's key (an `openai:` judge; a LiteLLM "
        "judge reads its provider's own variable); it never reaches the rollout server, a "
        "log or a file",
        docs_default="none",
    )
    """The variable with the judge's key."""

    concurrency: int = setting(4, docs="judge calls in flight at most")
    """Calls in flight at most."""

    timeout_s: float = setting(
        45.0,
        docs="seconds one judge call may take; with its retries it must fit the grader's own "
        "deadline (eval's `grader_timeout_s`, 150 s by default), or that deadline fails the "
        "rollout first, as a `timeout`",
    )
    """Bound of one call."""

    retries: int = setting(
        2,
        bound="non-negative",
        docs="further tries of a call that timed out or failed upstream (a refused request "
        "is not tried again); then the rollout fails with `judge_error`",
    )
    """Further tries after a timeout or an upstream failure."""

    max_tokens: int = setting(400, docs="tokens a judge's answer may take")
    """The token cap of an answer whose request names none."""

    group_rubric: str | None = setting(
        None,
        docs="turns on the group judge: one call scores each group's rollouts against each "
        "other by this rubric, and the scores become their rewards (training: a row's "
        "`group_size` rollouts; eval: a row's `n` runs)",
        docs_default="off",
    )
    """The group judge's rubric; ``None``: no group judge."""

    group_reference: bool = setting(
        True, docs="give the group judge the row's label as the reference answer"
    )
    """Whether the group judge sees the row's label."""

    min_score: float = setting(0.0, bound="any", docs="the group judge's worst score")
    """The group judge's worst score."""

    max_score: float = setting(1.0, bound="any", docs="the group judge's best score")
    """The group judge's best score."""

    scores: tuple[float, ...] | None = setting(
        None,
        parse=_scores,
        docs="the only scores the group judge may give (`[1, 2, 3, 4, 5]`), asked as an enum, "
        "which every structured-output engine enforces; they replace `min_score` and "
        "`max_score`",
        docs_default="any number in the range",
    )
    """The group judge's allowed scores; ``None``: any number in its range."""

    @property
    def low(self) -> float:
        """The group judge's worst score."""
        return score_range(self.scores, self.min_score, self.max_score)[0]

    @property
    def high(self) -> float:
        """The group judge's best score."""
        return score_range(self.scores, self.min_score, self.max_score)[1]

    def __post_init__(self) -> None:
        if self.min_score >= self.max_score:
            raise SettingError("max_score", "max_score must be above min_score")
        if self.group_rubric is not None and not self.group_rubric.strip():
            raise SettingError("group_rubric", "group_rubric is empty; remove it or write one")


JUDGE = section_of(JudgeConfig, "judge")


def parse_judge(src: ConfigSource, data: TOMLTable, table: TOMLTable) -> JudgeConfig | None:
    """The file's ``[judge]`` (``table``; ``data`` is the whole file); ``None`` when it has
    none."""
    if "judge" not in data:
        return None
    config: JudgeConfig = parse_section(src, table, JUDGE)
    return config
