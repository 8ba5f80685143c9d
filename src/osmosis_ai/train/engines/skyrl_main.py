"""SkyRL entry point: a PPO experiment whose generator runs the user's AgentWorkflow.

    python -m osmosis_ai.train.engines.skyrl_main \\
        osmosis.workflow=my_project.main:MyWorkflow osmosis.grader=my_project.main:MyGrader \\
        osmosis.backend=ray generator.step_wise_trajectories=true \\
        generator.merge_stepwise_output=true <SkyRL's usual overrides...>

``osmosis.*`` arguments configure the generator (``workflow``, ``grader``,
``workflow_config``, ``grader_config`` as ``module:name``; ``backend``; ``server_url``;
``agent_timeout_sec``, ``grader_timeout_sec``; ``drift``; ``max_in_flight``; ``prompts``:
``tokens`` or ``chat``; ``tool_format``: ``auto``, ``native`` or ``instruction``); every other
argument is SkyRL's (``SkyRLTrainConfig.from_cli_overrides``). Importing this module imports
SkyRL's trainer (and sets multiprocessing to ``spawn``, as SkyRL does).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import ray
from skyrl.train.config import SkyRLTrainConfig
from skyrl.train.entrypoints.main_base import BasePPOExp
from skyrl.train.utils import validate_cfg
from skyrl.train.utils.utils import initialize_ray

from osmosis_ai.errors import ConfigError
from osmosis_ai.gateway.policies.tool_formats import TOOL_FORMAT_SETTINGS
from osmosis_ai.train.engines.skyrl import OsmosisGenerator

__all__ = ["OsmosisPPOExp", "main", "split_arguments"]

_PREFIX = "osmosis."
_TEXT = ("workflow", "grader", "workflow_config", "grader_config", "backend", "server_url", "drift")
_NUMBERS = ("agent_timeout_sec", "grader_timeout_sec", "max_in_flight")
_CHOICES = {"prompts": ("tokens", "chat"), "tool_format": TOOL_FORMAT_SETTINGS}


def split_arguments(argv: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """``(generator options, SkyRL overrides)`` of the command line (pure).

    Raises:
        ConfigError: An unknown ``osmosis.`` key, a value that is not a number where one
            is needed, or no ``osmosis.workflow`` / ``osmosis.server_url``.
    """
    options: dict[str, Any] = {}
    rest: list[str] = []
    for arg in argv:
        if not arg.startswith(_PREFIX):
            rest.append(arg)
            continue
        key, _, value = arg[len(_PREFIX) :].partition("=")
        if key in _TEXT:
            options[key] = value
        elif key in _CHOICES:
            if value not in _CHOICES[key]:
                raise ConfigError(f"{arg}: {key} must be one of {', '.join(_CHOICES[key])}")
            options[key] = value
        elif key in _NUMBERS:
            try:
                options[key] = int(value) if key == "max_in_flight" else float(value)
            except ValueError:
                raise ConfigError(f"{arg}: {key} must be a number") from None
        else:
            known = ", ".join(_PREFIX + k for k in (*_TEXT, *_CHOICES, *_NUMBERS))
            raise ConfigError(f"unknown argument {arg!r}; the osmosis options are {known}")
    if "workflow" not in options and "server_url" not in options:
        raise ConfigError(
            "name the workflow: osmosis.workflow=module:Class (or osmosis.server_url=URL of a "
            "rollout server that runs it)"
        )
    return options, rest


def _check_step_wise(cfg: Any) -> None:
    if not (cfg.generator.step_wise_trajectories and cfg.generator.merge_stepwise_output):
        raise ConfigError(
            "OsmosisGenerator returns one row per model call: add "
            "generator.step_wise_trajectories=true generator.merge_stepwise_output=true"
        )


class OsmosisPPOExp(BasePPOExp):  # type: ignore[misc]  # untyped without skyrl
    """SkyRL's PPO experiment with ``OsmosisGenerator`` as its generator."""

    def __init__(self, cfg: Any, options: dict[str, Any]) -> None:
        self.osmosis_options = dict(options)
        super().__init__(cfg)

    def get_generator(self, cfg: Any, tokenizer: Any, inference_engine_client: Any) -> Any:
        options = dict(self.osmosis_options)
        workflow = options.pop("workflow", None)
        return OsmosisGenerator.from_engine(inference_engine_client, tokenizer, workflow, **options)


@ray.remote(num_cpus=1)
def _entrypoint(cfg: Any, options: dict[str, Any]) -> None:
    # As SkyRL's own entry point: the training loop runs on a worker, not the head node.
    OsmosisPPOExp(cfg, options).run()


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the command line, check it, start Ray and run the experiment."""
    options, overrides = split_arguments(sys.argv[1:] if argv is None else argv)
    cfg = SkyRLTrainConfig.from_cli_overrides(overrides)
    _check_step_wise(cfg)
    validate_cfg(cfg)
    initialize_ray(cfg)
    ray.get(_entrypoint.remote(cfg, options))


if __name__ == "__main__":
    main()
