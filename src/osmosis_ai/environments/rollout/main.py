"""The rollout of a config with an ``[environment]`` and no workflow of its own: the
environment's workflow and grader, served on the port the runner gives."""

from __future__ import annotations

import os

import uvicorn

from osmosis_ai.environments.reasoning_gym import ReasoningGymGrader, ReasoningGymWorkflow
from osmosis_ai.rollout import LocalBackend
from osmosis_ai.rollout.server import create_rollout_server

app = create_rollout_server(
    backend=LocalBackend(workflow=ReasoningGymWorkflow, grader=ReasoningGymGrader)
)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]))
