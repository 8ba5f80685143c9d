"""The rollout server: ``create_rollout_server(backend=...)`` returns its ASGI app."""

from osmosis_ai._extras import import_optional

import_optional("starlette", extra="server", feature="The rollout server")

from osmosis_ai.rollout.server.app import create_rollout_server  # noqa: E402

__all__ = ["create_rollout_server"]
