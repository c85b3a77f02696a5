"""``flow.layers``: dense (and convolution) layers with OneFlow's variable and op names."""
from .ops.layers import conv2d, dense

__all__ = ["conv2d", "dense"]
