"""``flow.losses.add_loss``: OneFlow's oldest training style, configured through the job's function_config."""
from .job import add_loss

__all__ = ["add_loss"]
