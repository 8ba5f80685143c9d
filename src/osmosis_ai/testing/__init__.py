"""Test doubles shipped with the package, shared by our tests and users' tests."""

from osmosis_ai.testing.chat_stub import ChatStub, StubFailure, StubReply
from osmosis_ai.testing.history import HistorySource

__all__ = ["ChatStub", "HistorySource", "StubFailure", "StubReply"]
