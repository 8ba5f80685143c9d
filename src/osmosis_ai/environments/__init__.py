"""The environments users already have, as rows and a rollout with no workflow code: an
``[environment]`` section in an eval or training config names a reasoning-gym task (its
generator makes the rows, its scorer grades the replies: `reasoning_gym`), an OpenEnv
environment class (played through reset and step: `openenv`) or a verifiers taskset (played
by its own agent loop: `verifiers`); `rows` makes the rows, `rollout/main.py` serves them."""

from osmosis_ai.environments.config import (
    ENVIRONMENT,
    ENVIRONMENT_ROLLOUT_DIR,
    EnvironmentConfig,
    parse_environment,
)

__all__ = ["ENVIRONMENT", "ENVIRONMENT_ROLLOUT_DIR", "EnvironmentConfig", "parse_environment"]
