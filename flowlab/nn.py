"""``flow.nn``: activations, softmax, cross-entropy losses, dropout, (transposed) convolution and pooling."""
from .ops.conv import avg_pool2d, compat_conv2d, conv2d, conv2d_transpose, max_pool2d
from .ops.math import sigmoid, tanh
from .ops.nn import (bias_add, dropout, leaky_relu, relu, sigmoid_cross_entropy_with_logits, softmax,
                     softmax_cross_entropy_with_logits, sparse_softmax_cross_entropy_with_logits)

__all__ = ["avg_pool2d", "bias_add", "compat_conv2d", "conv2d", "conv2d_transpose", "dropout", "leaky_relu",
           "max_pool2d", "relu", "sigmoid", "sigmoid_cross_entropy_with_logits", "softmax",
           "softmax_cross_entropy_with_logits", "sparse_softmax_cross_entropy_with_logits", "tanh"]
