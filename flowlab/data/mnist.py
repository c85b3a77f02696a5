"""MNIST loader with OneFlow 0.x semantics (``flow.data.load_mnist``).

Reads ``<out_dir>/mnist.npz`` (the Keras layout: ``x_train, y_train, x_test,
y_test``), downloading it first when absent, and returns the images and labels
pre-split into fixed-size batches.
"""

import hashlib
import http.client
import numbers
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request

import numpy as np

DEFAULT_URL = "https://oneflow-public.oss-cn-beijing.aliyuncs.com/datasets/mnist.npz"
# OneFlow's own pin for the file at its URL (its load_mnist default). Keras's mnist.npz is another file
# (sha256 731c5ac6...): pass that as hash_check along with Keras's URL.
DEFAULT_SHA256 = "63d4344077849053dc3036b247fa012b2b381de53fd055a66b539dffd76cf08e"

_CHUNK = 1 << 16
_PROGRESS_INTERVAL = 0.1  # seconds; keeps the progress line to ~10 updates/s


class DownloadError(ConnectionError):
    """The dataset file could not be fetched (offline, bad URL, HTTP error)."""


def _check_batch_size(name, value):
    # bool is an Integral too, but True as a batch size is surely a mistake.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def _check_data_format(data_format):
    if data_format not in ("NCHW", "NHWC"):
        raise ValueError(f"data_format must be 'NCHW' or 'NHWC', got {data_format!r}")
    return data_format


def _batch(images, labels, batch_size, data_format, scale, name):
    """Scale, add the channel axis, and cut into (num_batches, batch_size, ...).

    Trailing samples that do not fill a whole batch are dropped, as in OneFlow.
    """
    n = len(images) // batch_size
    if n == 0:
        raise ValueError(
            f"{name} must be at most the number of samples ({len(images)}), got {batch_size}"
        )
    h, w = images.shape[1:3]
    x = images[: n * batch_size].astype(np.float32) / np.float32(scale)
    shape = (n, batch_size, 1, h, w) if data_format == "NCHW" else (n, batch_size, h, w, 1)
    y = labels[: n * batch_size].astype(np.int32).reshape(n, batch_size)
    return x.reshape(shape), y


def _format_bytes(n):
    return f"{n / 1e6:.1f} MB"


def _download(url, path, hash_check):
    """Stream ``url`` into a temp file next to ``path``; rename only once verified.

    Writing to a temp file means an interrupted or corrupt download never
    leaves a half-written mnist.npz that later runs would trust.
    """
    out_dir = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".mnist-", suffix=".part", dir=out_dir)
    digest = hashlib.sha256()
    try:
        try:
            with os.fdopen(fd, "wb") as f, urllib.request.urlopen(url, timeout=30) as resp:
                total = int(resp.headers.get("Content-Length") or 0)
                done, last = 0, 0.0
                while True:
                    chunk = resp.read(_CHUNK)
                    if not chunk:
                        break
                    f.write(chunk)
                    digest.update(chunk)
                    done += len(chunk)
                    now = time.monotonic()
                    if now - last >= _PROGRESS_INTERVAL:
                        last = now
                        _progress(done, total)
                _progress(done, total)
                sys.stderr.write("\n")
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
            # URLError covers HTTP errors and refused connections, HTTPException
            # a truncated body; ValueError is urllib's answer to a malformed URL.
            raise DownloadError(
                f"could not download MNIST from {url} ({e}). If this machine is "
                f"offline, place mnist.npz in {os.path.abspath(out_dir)} by hand."
            ) from e
        got = digest.hexdigest()
        if hash_check and got != hash_check:
            raise ValueError(
                f"sha256 mismatch for {url}: expected {hash_check}, got {got}"
            )
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _progress(done, total):
    if total:
        msg = f"\rDownloading mnist.npz: {100 * done // total:3d}% ({_format_bytes(done)} / {_format_bytes(total)})"
    else:
        msg = f"\rDownloading mnist.npz: {_format_bytes(done)}"
    sys.stderr.write(msg)
    sys.stderr.flush()


def get_mnist_file(url=DEFAULT_URL, hash_check=DEFAULT_SHA256, out_dir="."):
    """Return the path of ``<out_dir>/mnist.npz``, downloading it if absent."""
    path = os.path.join(out_dir, "mnist.npz")
    if not os.path.isfile(path):
        os.makedirs(out_dir, exist_ok=True)
        _download(url, path, hash_check)
    return path


def load_mnist(
    train_batch_size=100,
    test_batch_size=100,
    data_format="NCHW",
    url=DEFAULT_URL,
    hash_check=DEFAULT_SHA256,
    out_dir=".",
):
    """Load MNIST as ``((train_images, train_labels), (test_images, test_labels))``.

    Images are float32 in [0, 1] shaped ``(num_batches, bs, 1, 28, 28)`` (NCHW)
    or ``(num_batches, bs, 28, 28, 1)`` (NHWC); labels are int32 ``(num_batches, bs)``.
    ``hash_check=None`` (or False) skips the sha256 check of a fresh download.
    """
    train_batch_size = _check_batch_size("train_batch_size", train_batch_size)
    test_batch_size = _check_batch_size("test_batch_size", test_batch_size)
    data_format = _check_data_format(data_format)
    path = get_mnist_file(url, hash_check, out_dir)
    with np.load(path) as f:
        x_train, y_train = f["x_train"], f["y_train"]
        x_test, y_test = f["x_test"], f["y_test"]
    train = _batch(x_train, y_train, train_batch_size, data_format, 255, "train_batch_size")
    test = _batch(x_test, y_test, test_batch_size, data_format, 255, "test_batch_size")
    return train, test
