"""Redaction of every log record the package emits: the one install point for all loggers.

Servers, gateways and eval runs register the secrets they know for as long as they run
(`registered_secrets`; the count itself is kept in ``osmosis_ai._secret_registry``). The
first registration installs a log record factory that redacts each record of a logger named
``osmosis_ai`` or ``osmosis_ai.*`` when it is created, before any filter, handler or formatter
sees it (`Redactor.record`: message, traceback, stack), with the registered secrets plus the
key of the rollout running in the current task. Records are only created for enabled levels,
so disabled logging costs nothing; records of other loggers pass through untouched.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from osmosis_ai._secret_registry import add_secrets, registered_redactor, remove_secrets
from osmosis_ai.redact import Redactor, normalize_secrets
from osmosis_ai.rollout.context import get_rollout_context

__all__ = ["active_redactor", "registered_secrets"]

_PACKAGE = "osmosis_ai"
_PACKAGE_PREFIX = _PACKAGE + "."
_WITHHELD = "log record withheld: it could not be redacted"

_install_lock = threading.Lock()
_factory_installed = False


def _install_redacting_factory() -> None:
    """Wrap the log record factory, once per process."""
    global _factory_installed
    with _install_lock:
        if not _factory_installed:
            logging.setLogRecordFactory(_redacting_factory(logging.getLogRecordFactory()))
            _factory_installed = True


def active_redactor() -> Redactor:
    """The registered secrets plus the ambient rollout's key (``get_rollout_context()``)."""
    context = get_rollout_context()
    key = context.api_key if context is not None else None
    registered = registered_redactor()
    return registered.with_secrets(key) if key else registered


@contextmanager
def registered_secrets(secrets: Iterable[str]) -> Iterator[None]:
    """Scrub ``secrets`` from every log record of the package while the block runs.

    Every part that knows secrets (a rollout server, a gateway, an eval run) registers them
    for its lifetime. Registrations nest and overlap; a secret stays registered until every
    block holding it has exited.

    Args:
        secrets: The values to scrub; empty strings are ignored.

    Raises:
        TypeError: ``secrets`` is a single ``str`` or contains a non-string.
    """
    values = normalize_secrets(secrets)
    add_secrets(values)
    _install_redacting_factory()
    try:
        yield
    finally:
        remove_secrets(values)


_Factory = Callable[..., logging.LogRecord]


def _redacting_factory(make: _Factory) -> _Factory:
    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        if record.name.startswith(_PACKAGE_PREFIX) or record.name == _PACKAGE:
            try:
                active_redactor().record(record)
            except Exception:  # a log call must never raise, nor print what it could not redact
                record.msg, record.args = _WITHHELD, None
                record.exc_info = record.exc_text = record.stack_info = None
        return record

    return factory
