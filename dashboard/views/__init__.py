"""The registry of dashboard tabs: ``(name, View subclass)`` in tab order.

To add a tab, write ``dashboard/views/<name>.py`` with a ``View`` subclass (see ``base.py``) and append one entry
here. Every browser session builds one instance of each view over the server's shared store.
"""
from .scalars import ScalarsView
from .histograms import HistogramsView
from .distributions import DistributionsView
from .images import ImagesView
from .text import TextView
from .anomalies import AnomaliesView
from .health import HealthView
from .hparams import HParamsView
from .projector import ProjectorView
from .graph import GraphView

VIEWS = [
    ("scalars", ScalarsView),
    ("histograms", HistogramsView),
    ("distributions", DistributionsView),
    ("images", ImagesView),
    ("text", TextView),
    ("anomalies", AnomaliesView),
    ("health", HealthView),
    ("hparams", HParamsView),
    ("projector", ProjectorView),
    ("graph", GraphView),
]
