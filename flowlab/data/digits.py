"""Bundled 8x8 handwritten digits, usable offline with the same API as load_mnist.

Data: UCI "Optical Recognition of Handwritten Digits" by E. Alpaydin and C. Kaynak (1998), https://archive.ics.uci.edu/dataset/80, CC BY 4.0.
1797 samples, pixel values 0..16, labels 0..9; stored in ``digits.npz``.
"""

from importlib import resources

import numpy as np

from .mnist import _batch, _check_batch_size, _check_data_format


def load_digits_arrays():
    """Return the raw ``(images, labels)``: uint8 ``(1797, 8, 8)`` and uint8 ``(1797,)``."""
    with resources.files(__package__).joinpath("digits.npz").open("rb") as fp:
        with np.load(fp) as f:
            return f["images"], f["labels"]


def load_digits(
    train_batch_size=100,
    test_batch_size=100,
    data_format="NCHW",
    test_fraction=0.2,
    seed=0,
):
    """Load the digits as ``((train_images, train_labels), (test_images, test_labels))``.

    Same layout as :func:`load_mnist` with 8x8 images scaled to [0, 1] (/16).
    The train/test split is a shuffle by ``np.random.default_rng(seed)``, so it
    is the same on every run for a given seed.
    """
    train_batch_size = _check_batch_size("train_batch_size", train_batch_size)
    test_batch_size = _check_batch_size("test_batch_size", test_batch_size)
    data_format = _check_data_format(data_format)
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    images, labels = load_digits_arrays()
    order = np.random.default_rng(seed).permutation(len(images))
    n_test = int(round(len(images) * test_fraction))
    test_idx, train_idx = order[:n_test], order[n_test:]
    train = _batch(images[train_idx], labels[train_idx], train_batch_size, data_format, 16, "train_batch_size")
    test = _batch(images[test_idx], labels[test_idx], test_batch_size, data_format, 16, "test_batch_size")
    return train, test
