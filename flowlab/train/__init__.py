"""``flow.train``: checkpoints."""
