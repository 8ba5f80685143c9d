"""The rollout of a config with an ``[environment]`` and no workflow of its own: the
environment's workflow and grader, served on the port the runner gives."""

from __future__ import annotations

import os

import uvicorn

from osmosis_ai.environments.served import EnvironmentRewardGrader, served_environment
from osmosis_ai.rollout import AgentWorkflow, Grader, LocalBackend
from osmosis_ai.rollout.server import create_rollout_server


def _played() -> tuple[type[AgentWorkflow], type[Grader]]:
    """The workflow and grader of the library the section names (imported alone: each
    runs in the Python that has its library)."""
    if served_environment()["openenv"] is not None:
        from osmosis_ai.environments.openenv import OpenEnvWorkflow

        return OpenEnvWorkflow, EnvironmentRewardGrader
    if served_environment()["verifiers"] is not None:
        from osmosis_ai.environments.verifiers import VerifiersWorkflow

        return VerifiersWorkflow, EnvironmentRewardGrader
    from osmosis_ai.environments.reasoning_gym import ReasoningGymGrader, ReasoningGymWorkflow

    return ReasoningGymWorkflow, ReasoningGymGrader


workflow, grader = _played()
app = create_rollout_server(backend=LocalBackend(workflow=workflow, grader=grader))

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]))
