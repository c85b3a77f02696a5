"""Compatibility alias of ``flowlab.distribute`` under OneFlow 0.x's module path:
``import oneflow.python.framework.distribute as distribute_util`` (OneFlow-Benchmark's DCGAN layers) becomes
``import flowlab.python.framework.distribute`` and finds ``split``, ``broadcast``, ``auto`` and the rest here."""
from ...distribute import *  # noqa: F401,F403 - the alias is the whole point
from ...distribute import __all__  # noqa: F401
