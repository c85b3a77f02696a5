"""Live views for Jupyter: ``WatchPanel`` (histograms, stats and trends of watched tensors),
``TrainingProgress`` (step, loss, speed) and ``HealthPanel`` (per-layer health from ``flow.watch_health``). In a
notebook each is a ``LiveDocument`` (``live``): a Bokeh document from the plot layer, drawn by BokehJS in the page,
that loads what it needs by itself and is updated at most ``refresh_hz`` (at most 20) times a second however fast
values arrive (see ``_live``). Outside a notebook kernel they print status lines instead."""
from .health import HealthPanel
from .live import LiveDocument
from .panel import WatchPanel
from .progress import TrainingProgress

__all__ = ["LiveDocument", "WatchPanel", "TrainingProgress", "HealthPanel"]
