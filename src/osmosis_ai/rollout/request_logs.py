"""Per-request log lines: an HTTP client's ``HTTP Request: POST ...`` (one per model call of
an agent framework's client) and the server's access log (one per result poll).

A run's ``logs.txt`` keeps what a user reads, so ``osmosis eval run`` and ``osmosis train
run`` start the rollout server with these off (``--verbose`` keeps them). A server started
by hand keeps its logging as its owner configured it.
"""

from __future__ import annotations

import logging
import os

__all__ = ["REQUEST_LOGGERS", "REQUEST_LOGS_ENV", "quiet_request_logs", "request_logs_wanted"]

#: Loggers that write one INFO line per HTTP request.
REQUEST_LOGGERS = ("httpx2", "httpcore2", "httpx", "httpcore", "uvicorn.access", "aiohttp.access")
#: ``0``: the rollout server quiets `REQUEST_LOGGERS` once it has started (set by the CLI).
REQUEST_LOGS_ENV = "_OSMOSIS_ROLLOUT_REQUEST_LOGS"


def quiet_request_logs() -> None:
    """Raise `REQUEST_LOGGERS` to WARNING: their errors still show, their requests do not."""
    for name in REQUEST_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def request_logs_wanted() -> bool:
    """Whether this server keeps per-request lines (``$_OSMOSIS_ROLLOUT_REQUEST_LOGS`` is not
    ``0``; unset: yes, the owner's logging stands)."""
    return os.environ.get(REQUEST_LOGS_ENV, "").strip() != "0"
