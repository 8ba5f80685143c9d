"""The environments users already have, as rows and a rollout with no workflow code: an
``[environment]`` section in an eval or training config names a reasoning-gym task, whose
generator makes the rows and whose scorer grades the replies (`reasoning_gym`)."""

from osmosis_ai.environments.config import (
    ENVIRONMENT,
    ENVIRONMENT_ROLLOUT_DIR,
    EnvironmentConfig,
    parse_environment,
)

__all__ = ["ENVIRONMENT", "ENVIRONMENT_ROLLOUT_DIR", "EnvironmentConfig", "parse_environment"]
