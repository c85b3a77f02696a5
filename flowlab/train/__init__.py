"""``flow.train``: checkpoints."""
from .checkpoint import CheckPoint

__all__ = ["CheckPoint"]
