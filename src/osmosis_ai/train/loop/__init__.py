"""The training loop of ``osmosis train run``: the entry point (``runner``), the rows each step
samples, rollouts through the rollout stack, the producer of rollout groups, the bounded queue,
the staleness bound that admits them, the consumer that trains on them one step at a time, and
what the caller gets back (``outcome``)."""
