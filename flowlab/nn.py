"""``flow.nn``: activations, softmax, cross-entropy losses, dropout, convolution and pooling."""
from .ops.math import sigmoid, tanh
from .ops.nn import (bias_add, dropout, relu, softmax, softmax_cross_entropy_with_logits,
                     sparse_softmax_cross_entropy_with_logits)

__all__ = ["bias_add", "dropout", "relu", "sigmoid", "softmax", "softmax_cross_entropy_with_logits",
           "sparse_softmax_cross_entropy_with_logits", "tanh"]
