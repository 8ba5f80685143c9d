"""``osmosis view``: a local web page over eval and training runs, trajectories and previews.

Needs the ``viewer`` extra. Serves only 127.0.0.1 by default, ships its page inside the
package (no CDN, no network) and never reads outside the directory it was given. Off
loopback every request must show a token (random unless given).
"""

from __future__ import annotations

from pathlib import Path

from osmosis_ai._serving import ServedApp, is_loopback_host, new_token
from osmosis_ai.viewer.app import create_viewer_app

__all__ = ["Viewer", "create_viewer_app"]


class Viewer(ServedApp):
    """The viewer served on ``host:port`` while used as an async context manager.

    Example:
        ```python
        async with Viewer(".osmosis/evals") as viewer:
            print(viewer.url)
        ```
    """

    def __init__(
        self,
        path: Path | str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
    ) -> None:
        """Args:
            path: A run directory, or a folder of them.
            host: Address to bind; off loopback a token is required.
            port: Port to bind; 0 picks a free one.
            token: The token every request must show; random when omitted off loopback,
                none on loopback unless given.

        Raises:
            ConfigError: ``token`` is not 16 to 256 URL-safe characters.
        """
        #: The token requests must show, or ``None`` when the viewer is open (loopback).
        self.token = token if token is not None or is_loopback_host(host) else new_token()
        app = create_viewer_app(path, host=host, token=self.token)
        super().__init__(app, host=host, port=port)

    @property
    def url(self) -> str:
        """The page's address while serving; with the token, a link that lets a browser in."""
        base = f"{self.served_url}/"
        return base if self.token is None else f"{base}?token={self.token}"
