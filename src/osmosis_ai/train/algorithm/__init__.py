"""The algorithm: rollouts' call records as masked sequences (``sequences``), group
advantages, micro-batches, logprobs, the loss, one optimiser step (``update``) and the
learning-rate schedule. ``sequences`` and ``advantages`` are pure Python; the rest need
torch and are imported from their modules (``osmosis_ai.train.grpo`` gathers their names)."""
