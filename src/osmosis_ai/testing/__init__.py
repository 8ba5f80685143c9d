"""Test doubles shipped with the package, shared by our tests and users' tests."""

from osmosis_ai.testing.chat_stub import ChatStub, StubFailure, StubReply

__all__ = ["ChatStub", "StubFailure", "StubReply"]
