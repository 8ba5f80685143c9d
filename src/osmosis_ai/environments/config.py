"""``[environment]``: a task of an environment library as a run's rows and rollout, with no
workflow code. Shared by the eval and the training config, as ``[experiment]`` is."""

from __future__ import annotations

import dataclasses
import json
import os
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
_CLASS_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
#: The keys that name an environment, one of which a section sets.
_KINDS = ("reasoning_gym", "openenv", "verifiers")


def _task_settings(src: ConfigSource, table: TOMLTable, section: str) -> dict[str, Any]:
    value = table["settings"]
    if not isinstance(value, dict):
        raise src.type_error(section, "settings", value, "a table ([environment.settings])")
    try:  # they travel as JSON (to the rollout server, into the rows' metadata)
        json.dumps(value)
    except TypeError:
        raise src.error(
            (section, "settings"),
            f"{section}.settings: a date or time cannot be passed on; write it as a string",
        ) from None
    return dict(value)


@dataclass(frozen=True)
class EnvironmentConfig:
    """The ``[environment]`` section: which task makes the rows, how many and from which
    seed, and the task's own settings."""

    reasoning_gym: str | None = setting(
        None,
        scaffold="chain_sum",
        comment="a reasoning-gym task (python -c 'import reasoning_gym.factory as f; "
        "print(sorted(f.DATASETS))')",
        docs="a [reasoning-gym](https://github.com/open-thought/reasoning-gym) task by name "
        '(`"chain_sum"`, `"basic_arithmetic"`, …): its generator makes the rows and its '
        "scorer grades them",
    )
    """The reasoning-gym task's registered name."""

    openenv: str | None = setting(
        None,
        docs="or an [OpenEnv](https://github.com/meta-pytorch/OpenEnv) environment class, "
        '`"package.module:Class"` (served locally, played through reset and step; its '
        "rewards are the grade)",
    )
    """An OpenEnv ``Environment`` subclass, as ``module:Class``."""

    verifiers: str | None = setting(
        None,
        docs="or a [verifiers](https://github.com/PrimeIntellect-ai/verifiers) environment: "
        'the module of its `v1` taskset (`"my_taskset"`), played by its own agent loop '
        "with its tools; its rubric's reward is the grade",
    )
    """A verifiers taskset id: an importable module exporting one ``Taskset``."""

    python: str | None = setting(
        None,
        docs="the Python that serves the environment's rollout, when its library lives in an "
        "environment of its own (`.venv-openenv/bin/python`; relative to the workspace)",
        docs_default="this one",
    )
    """The interpreter of the rollout server (an absolute path once loaded)."""

    size: int = setting(
        200,
        comment="rows generated, each a different question",
        docs="rows generated: that many different questions (a repeated question is "
        "skipped, so no split of the rows shares one); OpenEnv: that many episodes; "
        "verifiers: the taskset's first that many tasks",
    )
    """Distinct rows to generate (OpenEnv: episodes)."""

    seed: int = setting(
        0,
        bound="non-negative",
        comment="the generator's seed (same seed, same rows)",
        docs="the generator's seed: the same seed and settings give the same rows "
        "(OpenEnv: episode *i* is reset with `seed + i`)",
    )
    """The generator's seed (OpenEnv: of the first episode)."""

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

    max_turns: int = setting(
        8,
        docs="OpenEnv and verifiers: the steps (model calls) an episode may take before it "
        "is cut off",
    )
    """OpenEnv and verifiers: steps per episode at most."""

    settings: dict[str, Any] = setting(
        factory=dict,
        parse=_task_settings,
        docs="the task's own settings (its config's fields, e.g. `min_terms = 2` for "
        "`chain_sum`), as the `[environment.settings]` table; OpenEnv: keyword arguments "
        "of each `reset`",
        docs_default="the task's",
    )
    """Keyword arguments of the task's config class."""

    def __post_init__(self) -> None:
        named = [key for key in _KINDS if getattr(self, key) is not None]
        if len(named) != 1:
            raise SettingError(
                (named or ["reasoning_gym"])[-1],
                'names one environment: reasoning_gym = "<task>", openenv = "<module>:<Class>" '
                'or verifiers = "<taskset>"' + (f", not {' and '.join(named)}" if named else ""),
            )
        if self.python is not None and self.reasoning_gym is not None:
            raise SettingError(
                "python",
                "python: reasoning-gym runs in this Python (its rows are made here, and graded "
                "from the same generator); remove it",
            )
        if self.openenv is not None and {"seed", "episode_id"} & set(self.settings):
            raise SettingError(
                "settings", "settings: each episode's seed is [environment] seed + its row"
            )
        if self.reasoning_gym is not None and not _TASK_NAME.fullmatch(self.reasoning_gym):
            raise SettingError(
                "reasoning_gym",
                f"reasoning_gym {self.reasoning_gym!r} is not a task name (letters, digits "
                "and '_')",
            )
        if self.prompt != "default" and self.reasoning_gym is None:
            raise SettingError("prompt", "prompt names a reasoning-gym system prompt; remove it")
        if self.settings and self.verifiers is not None:
            raise SettingError(
                "settings", "settings: a verifiers taskset takes none here; remove the table"
            )
        if self.openenv is not None and not _CLASS_PATH.fullmatch(self.openenv):
            raise SettingError(
                "openenv",
                f"openenv {self.openenv!r} must name a class as module:Class "
                '("my_envs.guess:GuessEnvironment")',
            )

    @property
    def kind(self) -> str:
        """``reasoning_gym``, ``openenv`` or ``verifiers``: the library the section names."""
        return next(key for key in _KINDS if getattr(self, key) is not None)


ENVIRONMENT = section_of(EnvironmentConfig, "environment")


def parse_environment(
    src: ConfigSource, data: TOMLTable, table: TOMLTable, workspace: Path
) -> EnvironmentConfig | None:
    """The file's ``[environment]`` (``table``; ``data`` is the whole file), checked as far
    as the file can say (whether the task exists and takes these settings is checked with
    its library), ``python`` made absolute against ``workspace``. ``None`` when the file
    has none."""
    if "environment" not in data:
        return None
    config: EnvironmentConfig = parse_section(src, table, ENVIRONMENT)
    if config.python is None:
        return config
    python = Path(os.path.normpath(workspace / Path(config.python).expanduser()))
    if not python.is_file():
        raise src.error(
            ("environment", "python"),
            f"environment.python {config.python!r}: there is no file {python}; name the "
            "interpreter of the environment's own venv (docs/environments.md)",
        )
    return dataclasses.replace(config, python=str(python))
