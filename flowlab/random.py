"""``flow.random``: OneFlow 0.x's random sources for data pipelines (see ``flowlab.data.ops``)."""
from .data.ops import coin_flip

CoinFlip = coin_flip

__all__ = ["CoinFlip", "coin_flip"]
