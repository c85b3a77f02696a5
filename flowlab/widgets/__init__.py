"""Live views for Jupyter: ``WatchPanel`` (histograms, stats and trends of watched tensors) and
``TrainingProgress`` (steps, loss, speed). Both fall back to terminal output outside a notebook kernel and never
send more than ``refresh_hz`` (at most 20) updates a second, however fast values arrive (see ``_live``)."""
from .panel import WatchPanel
from .progress import TrainingProgress

__all__ = ["WatchPanel", "TrainingProgress"]
