"""``[environment]``: a task of an environment library as a run's rows and rollout, with no
workflow code. Shared by the eval and the training config, as ``[experiment]`` is."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osmosis_ai.config.schema import parse_section, section_of, setting
from osmosis_ai.config.source import ConfigSource, TOMLTable
from osmosis_ai.errors import SettingError

__all__ = ["ENVIRONMENT", "ENVIRONMENT_ROLLOUT_DIR", "EnvironmentConfig", "parse_environment"]

#: The rollout a config with an ``[environment]`` and no ``[experiment] entrypoint`` serves:
#: the environment's own workflow and grader (a folder holding only its entry point, which
#: leads ``sys.path`` in the server's process).
ENVIRONMENT_ROLLOUT_DIR = Path(__file__).resolve().parent / "rollout"

_TASK_NAME = re.compile(r"[A-Za-z0-9_]+")


def _task_settings(src: ConfigSource, table: TOMLTable, section: str) -> dict[str, Any]:
    value = table["settings"]
    if not isinstance(value, dict):
        raise src.type_error(section, "settings", value, "a table ([environment.settings])")
    return dict(value)


@dataclass(frozen=True)
class EnvironmentConfig:
    """The ``[environment]`` section: which task makes the rows, how many and from which
    seed, and the task's own settings."""

    reasoning_gym: str = setting(
        required=True,
        scaffold="chain_sum",
        comment="a reasoning-gym task (python -c 'import reasoning_gym.factory as f; "
        "print(sorted(f.DATASETS))')",
        docs="a [reasoning-gym](https://github.com/open-thought/reasoning-gym) task by name "
        '(`"chain_sum"`, `"basic_arithmetic"`, …): its generator makes the rows and its '
        "scorer grades them",
    )
    """The reasoning-gym task's registered name."""

    size: int = setting(
        200,
        comment="rows generated, each a different question",
        docs="rows generated: that many different questions (a repeated question is "
        "skipped, so no split of the rows shares one)",
    )
    """Distinct rows to generate."""

    seed: int = setting(
        0,
        bound="non-negative",
        comment="the generator's seed (same seed, same rows)",
        docs="the generator's seed: the same seed and settings give the same rows",
    )
    """The generator's seed."""

    prompt: str = setting(
        "default",
        comment="reasoning-gym's system prompt by name: default, simple, direct, ...",
        docs="the system prompt of each row, one of reasoning-gym's by name (`default`, "
        "`simple`, `direct`, `DeepSeekZero`, `chain_of_draft`): each asks for the answer "
        "in `<answer>` tags",
    )
    """The name of one of reasoning-gym's system prompts."""

    max_tokens: int = setting(
        256,
        comment="each reply's token cap in an eval (training: [sampling] max_tokens)",
        docs="the token cap of each reply in an eval (a training run's is `[sampling] max_tokens`)",
    )
    """The token cap each reply asks for in an eval."""

    settings: dict[str, Any] = setting(
        factory=dict,
        parse=_task_settings,
        docs="the task's own settings (its config's fields, e.g. `min_terms = 2` for "
        "`chain_sum`), as the `[environment.settings]` table",
        docs_default="the task's",
    )
    """Keyword arguments of the task's config class."""

    def __post_init__(self) -> None:
        if not _TASK_NAME.fullmatch(self.reasoning_gym):
            raise SettingError(
                "reasoning_gym",
                f"reasoning_gym {self.reasoning_gym!r} is not a task name (letters, digits "
                "and '_')",
            )


ENVIRONMENT = section_of(EnvironmentConfig, "environment")


def parse_environment(
    src: ConfigSource, data: TOMLTable, table: TOMLTable
) -> EnvironmentConfig | None:
    """The file's ``[environment]`` (``table``; ``data`` is the whole file), checked as far
    as the file can say: that the task exists and takes these settings is checked when its
    rows are made. ``None`` when the file has none."""
    if "environment" not in data:
        return None
    config: EnvironmentConfig = parse_section(src, table, ENVIRONMENT)
    return config
