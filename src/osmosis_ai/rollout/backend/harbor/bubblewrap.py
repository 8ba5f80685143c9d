"""A Harbor environment for Linux without Docker: bubblewrap over the host's userland.

Select it with ``EnvironmentConfig(import_path=BUBBLEWRAP_ENVIRONMENT)``. The host's
userland stands in for the task image (its ``environment/Dockerfile`` is not built):
every command runs in a fresh ``bwrap`` sandbox with the host root read-only, a private
``/tmp``, ``$HOME`` (``/root``), working directory, ``/tests``, ``/solution`` and
``/installed-agent`` that live for the trial, and Harbor's log and artifact directories
bound to the trial's host directories. PID, IPC and UTS namespaces are private; the network
is the host's unless the task asks for ``no-network``. Meant for developing and testing
tasks and rollouts on Linux, and for CI; it is not a security boundary against hostile
code that expects the host root to be secret.

`HostMiniSweAgent` runs Harbor's ``mini-swe-agent`` from the host installation instead of
downloading it (no internet needed).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from harbor.agents.installed.mini_swe_agent import MiniSweAgent
from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities

from osmosis_ai.errors import ConfigError

__all__ = ["BUBBLEWRAP_ENVIRONMENT", "BubblewrapEnvironment", "HostMiniSweAgent"]

#: The import path Harbor's ``EnvironmentConfig(import_path=...)`` takes for this module.
BUBBLEWRAP_ENVIRONMENT = f"{__name__}:BubblewrapEnvironment"

_PRIVATE = ("/tmp", "/root", "/tests", "/solution", "/installed-agent")
_HOST_ONLY = frozenset({"proc", "dev", "logs"})
_KILL_WAIT_SEC = 5.0


class BubblewrapEnvironment(BaseEnvironment):
    """Harbor environment: each ``exec`` in a fresh bubblewrap sandbox (see the module).

    Args:
        readable_paths: Host paths to keep visible read-only although a private directory
            hides them (e.g. a virtual environment under ``/tmp`` or ``/root``). The
            running interpreter's prefixes and import path are always kept.
        bwrap: The bubblewrap program.
        *args, **kwargs: Harbor's environment arguments.
    """

    def __init__(
        self,
        *args: Any,
        readable_paths: list[str] | None = None,
        bwrap: str = "bwrap",
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("auto_mounting", True)
        super().__init__(*args, **kwargs)
        found = shutil.which(bwrap)
        if found is None:
            raise ConfigError(
                "BubblewrapEnvironment needs bubblewrap; on Debian/Ubuntu run "
                "`apt-get install bubblewrap`"
            )
        self._bwrap = found
        self._workdir = self.task_env_config.workdir or "/app"
        self._scratch = Path(tempfile.mkdtemp(prefix="osmosis-bwrap-"))
        self._private = {
            PurePosixPath(target): self._scratch / target.strip("/").replace("/", "_")
            for target in (*_PRIVATE, self._workdir)
        }
        # This interpreter and its import path (an editable osmosis-ai under /tmp, say) stay
        # visible, so `container_python=sys.executable` works inside the sandbox.
        host_python = [sys.prefix, sys.base_prefix, *(p for p in sys.path if p)]
        self._readable = [Path(p) for p in dict.fromkeys([*(readable_paths or []), *host_python])]

    @staticmethod
    def type() -> str:
        return "bubblewrap"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(mounted=True, disable_internet=True)

    def _validate_definition(self) -> None:
        return None  # the host's userland is the image; there is nothing to build

    # -- paths -------------------------------------------------------------------------

    def _binds(self) -> dict[PurePosixPath, Path]:
        binds = dict(self._private)
        for mount in self._mounts:
            binds[PurePosixPath(mount["target"])] = Path(mount["source"])
        return binds

    def _host_path(self, path: str) -> Path:
        """Where the sandbox path ``path`` lives on the host (it must be a writable bind)."""
        target = PurePosixPath(path)
        binds = self._binds()
        covering = [t for t in binds if target == t or target.is_relative_to(t)]
        if not covering:
            raise ValueError(
                f"{path} is outside every writable directory of the bubblewrap sandbox "
                f"({', '.join(sorted(map(str, binds)))})"
            )
        best = max(covering, key=lambda t: len(t.parts))
        return binds[best].joinpath(*target.relative_to(best).parts)

    def _command(self, command: str, cwd: str | None, env: dict[str, str]) -> list[str]:
        argv = [self._bwrap]
        hidden = {PurePosixPath(t).parts[1] for t in (*_PRIVATE, self._workdir)} | _HOST_ONLY
        for entry in sorted(os.listdir("/")):
            if entry in hidden:
                continue
            host = f"/{entry}"
            if os.path.islink(host):
                argv += ["--symlink", os.readlink(host), host]
            elif os.path.isdir(host):
                argv += ["--ro-bind", host, host]
        argv += ["--dev", "/dev", "--proc", "/proc"]
        argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts"]
        argv += ["--die-with-parent", "--new-session"]
        if self._network_disabled:
            argv.append("--unshare-net")
        for target, source in sorted(self._binds().items(), key=lambda b: len(b[0].parts)):
            argv += ["--bind", str(source), str(target)]
        for path in self._readable:
            if any(path.is_relative_to(p) for p in self._private) and path.exists():
                argv += ["--ro-bind", str(path), str(path)]
        argv += ["--chdir", cwd or self._workdir, "--setenv", "HOME", "/root"]
        for key, value in env.items():
            argv += ["--setenv", key, value]
        return [*argv, "bash", "-c", command]

    # -- lifecycle and I/O -------------------------------------------------------------

    async def start(self, force_build: bool) -> None:
        def make() -> None:
            for directory in self._private.values():
                directory.mkdir(parents=True, exist_ok=True)
            for mount in self._mounts:
                Path(mount["source"]).mkdir(parents=True, exist_ok=True)

        await asyncio.to_thread(make)

    async def stop(self, delete: bool) -> None:
        await asyncio.to_thread(shutil.rmtree, self._scratch, True)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        def copy() -> None:
            target = self._host_path(target_path)
            if target.is_dir():
                target = target / Path(source_path).name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source_path, target)

        await asyncio.to_thread(copy)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        target = self._host_path(target_dir)
        await asyncio.to_thread(shutil.copytree, source_dir, target, dirs_exist_ok=True)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        def copy() -> None:
            source = self._host_path(source_path)
            Path(target_path).parent.mkdir(parents=True, exist_ok=True)
            if source.resolve() != Path(target_path).resolve():
                shutil.copy2(source, target_path)

        await asyncio.to_thread(copy)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        def copy() -> None:
            source = self._host_path(source_dir)
            if source.resolve() != Path(target_dir).resolve():
                shutil.copytree(source, target_dir, dirs_exist_ok=True, symlinks=True)

        await asyncio.to_thread(copy)

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """Run ``command`` with bash in a fresh sandbox; output merged as Docker's is.

        ``user`` is ignored: inside the sandbox everything runs as the calling user.
        """
        argv = self._command(command, cwd, self._merge_env(env) or {})
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            async with asyncio.timeout(timeout_sec):
                output, _ = await process.communicate()
        except BaseException as exc:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_KILL_WAIT_SEC):
                    await process.wait()
            if isinstance(exc, TimeoutError):
                raise RuntimeError(f"Command timed out after {timeout_sec} seconds") from None
            raise
        assert process.returncode is not None
        text = output.decode(errors="replace")
        return ExecResult(stdout=text or None, stderr=None, return_code=process.returncode)


class HostMiniSweAgent(MiniSweAgent):
    """Harbor's ``mini-swe-agent``, run from this host's installation (no download).

    For `BubblewrapEnvironment`: the sandbox sees the host's userland, so the program
    installed next to this interpreter (``pip install mini-swe-agent``) is linked where the
    agent looks for it.
    """

    async def install(self, environment: BaseEnvironment) -> None:
        program = Path(sys.prefix) / "bin" / "mini-swe-agent"
        if not program.exists():
            raise ConfigError(
                f"mini-swe-agent is not installed at {program}; `pip install mini-swe-agent` "
                "into the environment that runs Harbor"
            )
        await self.exec_as_agent(
            environment,
            f'mkdir -p "$HOME/.local/bin" && ln -sf {program} "$HOME/.local/bin/mini-swe-agent"',
        )
