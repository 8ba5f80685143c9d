"""The trainer: model source, training sequences, GRPO, and the training runner."""
