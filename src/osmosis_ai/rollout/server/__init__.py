"""The rollout server: ``create_rollout_server(backend=...)`` returns its ASGI app.

Serve the app with any ASGI server, e.g. ``uvicorn.run(app, port=8000)``
(``pip install 'osmosis-ai[server]'``).
"""

from osmosis_ai.rollout.server.app import create_rollout_server

__all__ = ["create_rollout_server"]
