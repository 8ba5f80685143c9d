"""Reaching a gateway on the host's loopback from Harbor's Docker containers on Linux.

Containers cannot reach ``127.0.0.1`` of the host, and Docker on Linux has no
``host.docker.internal`` by default. The backend forwards one port on the Docker bridge's
address (``docker0``, reachable from every container network) to the gateway, adds
``host.docker.internal:host-gateway`` to the task's compose services, and hands agents
``http://host.docker.internal:<port>/...``. The gateway itself stays on loopback.
"""

from __future__ import annotations

import fcntl
import socket
import struct
from urllib.parse import urlsplit, urlunsplit

from osmosis_ai.errors import ConfigError

__all__ = ["COMPOSE_OVERLAY", "bridge_address", "container_url"]

_SIOCGIFADDR = 0x8915

#: Docker Compose overlay giving the task's main service a name for the host.
COMPOSE_OVERLAY = (
    'services:\n  main:\n    extra_hosts:\n      - "host.docker.internal:host-gateway"\n'
)


def bridge_address(interface: str) -> str:
    """The IPv4 address of the host's side of the Docker bridge ``interface``.

    Raises:
        ConfigError: There is no such interface (Docker is not running here).
    """
    request = struct.pack("256s", interface.encode()[:15])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            answer = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)
        except OSError:
            raise ConfigError(
                f"the chat endpoint is on this machine's loopback, which Docker containers "
                f"cannot reach, and there is no {interface!r} bridge to forward it through; "
                "start Docker (or pass docker_bridge= naming its bridge), or serve the "
                "gateway on an address containers can reach"
            ) from None
    return socket.inet_ntoa(answer[20:24])


def container_url(url: str, port: int) -> str:
    """``url`` with its host and port replaced by ``host.docker.internal:<port>``."""
    return urlunsplit(urlsplit(url)._replace(netloc=f"host.docker.internal:{port}"))
