"""``flow.distribute``: placement annotations of the consistent view (``split(axis)``, ``broadcast()``, ``auto()``),
taken by ``flow.get_variable(distribute=)`` and ``flow.parallel_cast``; see ``flowlab.ops.placement`` for what they
mean on flowlab's data-parallel devices. ``mirrored_strategy()`` / ``consistent_strategy()`` are OneFlow 0.2's names
of ``flow.scope.mirrored_view()`` / ``consistent_view()``."""
from .ops.placement import (AutoDistribute, BroadcastDistribute, Distribute, SplitDistribute,
                            assert_is_valid_distribute, auto, broadcast, split)
from .scope import consistent_view as consistent_strategy
from .scope import mirrored_view as mirrored_strategy

__all__ = ["AutoDistribute", "BroadcastDistribute", "Distribute", "SplitDistribute", "assert_is_valid_distribute",
           "auto", "broadcast", "consistent_strategy", "mirrored_strategy", "split"]
