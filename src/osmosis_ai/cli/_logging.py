"""Logging set-up for CLI commands (the library itself never configures logging)."""

from __future__ import annotations

import logging

from osmosis_ai.rollout.request_logs import quiet_request_logs

__all__ = ["configure_logging", "quiet_logging_errors"]


def quiet_logging_errors() -> None:
    """Never print ``--- Logging error ---`` tracebacks (a full disk under ``logs.txt``...).

    A log line that cannot be written is dropped; what the command stores matters is
    checked where it is written, and reported there in one line.
    """
    # Handler.handleError prints a traceback to stderr only while this is true.
    logging.raiseExceptions = False


def configure_logging(level: int = logging.INFO) -> None:
    """Log ``level`` and above to stderr with timestamps; quiet per-request library logs."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_request_logs()
