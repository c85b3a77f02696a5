"""Datasets in OneFlow 0.x's batched layout: MNIST (downloaded) and 8x8 digits (bundled)."""

from .digits import load_digits, load_digits_arrays
from .mnist import load_mnist

__all__ = ["load_mnist", "load_digits", "load_digits_arrays"]
