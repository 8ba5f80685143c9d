"""``osmosis view``: a local web page over eval runs, trajectories and live previews.

Needs the ``viewer`` extra. Serves only 127.0.0.1 by default, ships its page inside the
package (no CDN, no network) and never reads outside the directory it was given.
"""

from __future__ import annotations

from pathlib import Path

from osmosis_ai._serving import ServedApp
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

    def __init__(self, path: Path | str, *, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(create_viewer_app(path, host=host), host=host, port=port)

    @property
    def url(self) -> str:
        """The page's address while serving."""
        return f"{self.served_url}/"
