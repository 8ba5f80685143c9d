"""A user-style rollout entry point run as a child process by the drain tests.

Usage: python -m tests.rollout.server.serve_main PORT DRAIN_TIMEOUT_SEC
"""

from __future__ import annotations

import sys

import uvicorn

from osmosis_ai.rollout import LocalBackend
from osmosis_ai.rollout.server import create_rollout_server
from tests.rollout.server.workflows import Answer, ExactMatch

backend = LocalBackend(workflow=Answer, grader=ExactMatch)
app = create_rollout_server(backend=backend, drain_timeout_sec=float(sys.argv[2]))

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
