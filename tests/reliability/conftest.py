"""Reliability fixtures: the eval workspace of tests/eval."""

from tests.eval.conftest import workspace

__all__ = ["workspace"]
