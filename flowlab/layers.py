"""``flow.layers``: dense, convolution, batch and layer normalization layers with OneFlow's variable and op names."""
from .ops.layers import conv2d, dense
from .ops.normalization import (batch_normalization, batch_normalization_add_relu, batch_normalization_relu,
                                layer_norm)

__all__ = ["batch_normalization", "batch_normalization_add_relu", "batch_normalization_relu", "conv2d", "dense",
           "layer_norm"]
