"""What generates a run's rollouts: the engine (torch on the learner's model, or a vLLM server
this package starts), and the probe that checks it serves the learner's weights."""
