"""The environments' fixtures: the training tests' tiny model."""

from tests.train.conftest import tiny_model_dir, tokenizer_dir  # noqa: F401 -- fixtures
