"""The secrets registered in this process, below both log redaction and the rollout context.

Servers, gateways and eval runs register the secrets they know for as long as they run
(``osmosis_ai._log_redaction.registered_secrets``, which also installs the log redaction);
a new ``RolloutContext`` starts its redactor from them (`registered_redactor`). Keeping the
count here, under both, spares them importing each other.
"""

from __future__ import annotations

import threading
from collections import Counter

from osmosis_ai.redact import Redactor

__all__ = ["add_secrets", "registered_redactor", "remove_secrets"]


class _Registry:
    """The secrets registered in this process, counted (two servers may share one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        # Rebuilt under the lock, read without it (one reference swap) by logging threads.
        self.redactor = Redactor()

    def add(self, secrets: tuple[str, ...]) -> None:
        with self._lock:
            self._counts.update(secrets)
            self.redactor = Redactor(tuple(self._counts))

    def remove(self, secrets: tuple[str, ...]) -> None:
        with self._lock:
            self._counts.subtract(secrets)
            self._counts = +self._counts  # drop the secrets no one holds any more
            self.redactor = Redactor(tuple(self._counts))


_REGISTRY = _Registry()


def registered_redactor() -> Redactor:
    """The secrets registered in this process now."""
    return _REGISTRY.redactor


def add_secrets(secrets: tuple[str, ...]) -> None:
    """Register ``secrets`` (normalized) once more."""
    _REGISTRY.add(secrets)


def remove_secrets(secrets: tuple[str, ...]) -> None:
    """Undo one `add_secrets` of the same ``secrets``."""
    _REGISTRY.remove(secrets)
