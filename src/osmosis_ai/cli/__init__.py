"""The ``osmosis`` command line: thin shells over the library modules."""

from osmosis_ai.cli.app import app, main

__all__ = ["app", "main"]
