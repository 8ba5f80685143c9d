"""The bubblewrap sandbox around a cold child: what it sees, what it may write, its network."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from osmosis_ai.errors import ConfigError

__all__ = ["Network", "bwrap_command", "check_bwrap"]

#: ``gateway``: no network except a relay to the rollout's model endpoint; ``none``: no
#: network at all; ``host``: the host's network.
Network = Literal["gateway", "none", "host"]

_PRIVATE_TMP = Path("/tmp")


def check_bwrap(executable: str = "bwrap") -> str:
    """The path of a working ``bwrap``.

    Raises:
        ConfigError: bubblewrap is missing or cannot create namespaces here.
    """
    path = shutil.which(executable)
    if path is None:
        raise ConfigError(
            "sandbox=True needs bubblewrap, which is not installed; on Debian/Ubuntu run "
            "`apt-get install bubblewrap` (or pass sandbox=False)"
        )
    probe = subprocess.run(
        [path, "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net", "true"],
        capture_output=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        detail = probe.stderr.decode(errors="replace").strip()
        raise ConfigError(
            f"bubblewrap cannot create a sandbox on this machine ({detail}); enable "
            "unprivileged user namespaces or run as root, or pass sandbox=False"
        )
    return path


def bwrap_command(
    bwrap: str,
    argv: list[str],
    *,
    writable: Iterable[Path],
    readable: Iterable[Path],
    network: Network,
) -> list[str]:
    """``argv`` inside a sandbox: read-only host userland, private ``/tmp``, ``/dev``,
    ``/proc``, PID/IPC/UTS namespaces, and only ``writable`` writable.

    ``readable`` paths under ``/tmp`` (the spec, user code in a temporary project) are
    bound read-only into the private ``/tmp``; elsewhere the host root is already visible.
    """
    command = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    command += ["--tmpfs", str(_PRIVATE_TMP)]
    command += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent"]
    if network != "host":
        command.append("--unshare-net")
    for path in readable:
        if path.is_relative_to(_PRIVATE_TMP) and path.exists():
            command += ["--ro-bind", str(path), str(path)]
    for path in writable:
        command += ["--bind", str(path), str(path)]
    return [*command, "--", *argv]
