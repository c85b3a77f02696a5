"""``flow.nn``: activations, softmax, cross-entropy losses, dropout, convolution and pooling."""
from .ops.conv import avg_pool2d, conv2d, max_pool2d
from .ops.math import sigmoid, tanh
from .ops.nn import (bias_add, dropout, relu, softmax, softmax_cross_entropy_with_logits,
                     sparse_softmax_cross_entropy_with_logits)

__all__ = ["avg_pool2d", "bias_add", "conv2d", "dropout", "max_pool2d", "relu", "sigmoid", "softmax",
           "softmax_cross_entropy_with_logits", "sparse_softmax_cross_entropy_with_logits", "tanh"]
