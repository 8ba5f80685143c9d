"""The learner: the model being trained with its optimiser and schedule (``core``), its
checkpoints, and the export of a trained run."""
