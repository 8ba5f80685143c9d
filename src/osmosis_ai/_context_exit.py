"""Bases of context managers whose exit does the same however the block ended.

Most context managers of the package release what they hold whether or not the block
raised, and let its exception propagate. These bases write the exit protocol once and call a
hook without the exception's details.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType

__all__ = ["AsyncUnconditionalExit", "UnconditionalExit"]


class UnconditionalExit(ABC):
    """A context manager whose ``__exit__`` is `_exit`, whatever the block raised."""

    __slots__ = ()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit()

    @abstractmethod
    def _exit(self) -> None:
        """Leave the context; an exception of the block propagates afterwards."""


class AsyncUnconditionalExit(ABC):
    """An async context manager whose ``__aexit__`` is `_aexit`, whatever the block raised."""

    __slots__ = ()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._aexit()

    @abstractmethod
    async def _aexit(self) -> None:
        """Leave the context; an exception of the block propagates afterwards."""
