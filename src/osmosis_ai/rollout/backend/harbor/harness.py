"""The Harbor agent of the workflow track: runs a bundled ``AgentWorkflow`` in the sandbox.

``HarborBackend`` configures it per rollout (``AgentConfig(import_path=HARNESS_AGENT)``):
``install`` uploads the bundle's wheel and unpacks it with ``python -m zipfile`` (no pip or
network needed); ``run`` uploads ``container_input.json`` and runs the bundle's agent
phase. The rollout's endpoint and key arrive as ``AgentConfig.env`` (Harbor scopes them to
the agent's commands and scrubs them from the trial's files), never in a file.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from harbor.agents.installed.base import BaseInstalledAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext

from osmosis_ai import __version__
from osmosis_ai.rollout.container import INPUT_FILE

__all__ = ["HARNESS_AGENT", "OsmosisHarnessAgent"]

HARNESS_AGENT = f"{__name__}:OsmosisHarnessAgent"

_INSTALL_DIR = "/installed-agent"
#: Output of the agent phase in the agent logs (the runner's own log lines, tracebacks).
AGENT_LOG = "osmosis-agent.log"


class OsmosisHarnessAgent(BaseInstalledAgent):
    """Installs a bundle and runs its agent phase (see the module)."""

    def __init__(
        self,
        logs_dir: Path,
        *args: Any,
        bundle_wheel: str,
        bundle_package: str,
        input_file: str,
        python: str = "python3",
        **kwargs: Any,
    ) -> None:
        self._wheel = Path(bundle_wheel)
        self._package = bundle_package
        self._input_file = Path(input_file)
        self._python = python
        super().__init__(logs_dir, *args, **kwargs)

    @staticmethod
    def name() -> str:
        return "osmosis-harness-agent"

    def version(self) -> str | None:
        return __version__

    def get_version_command(self) -> str | None:
        return None

    async def install(self, environment: BaseEnvironment) -> None:
        wheel = f"{_INSTALL_DIR}/{self._wheel.name}"
        await environment.upload_file(self._wheel, wheel)
        await self.exec_as_agent(
            environment,
            f"{shlex.quote(self._python)} -m zipfile -e {shlex.quote(wheel)} "
            f"{_INSTALL_DIR}/osmosis-bundle",
        )

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        await environment.upload_file(self._input_file, f"/logs/agent/{INPUT_FILE}")
        # The runner records success or failure in container_result.json; its exit status
        # only repeats that, so a failed workflow does not look like a broken harness.
        command = (
            f"PYTHONPATH={_INSTALL_DIR}/osmosis-bundle "
            f"{shlex.quote(self._python)} -m {self._package}.agent "
            f"> /logs/agent/{AGENT_LOG} 2>&1; exit 0"
        )
        await self.exec_as_agent(environment, command)
