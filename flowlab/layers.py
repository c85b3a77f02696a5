"""``flow.layers``: dense (and convolution) layers with OneFlow's variable and op names."""
from .ops.layers import dense

__all__ = ["dense"]
