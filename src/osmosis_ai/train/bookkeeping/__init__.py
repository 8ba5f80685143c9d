"""A run's records: the journal and metrics lines of the run directory, and the experiment
trackers that get the same numbers."""
