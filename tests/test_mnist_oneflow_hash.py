"""``flow.data.load_mnist`` verifies a download of OneFlow's URL against OneFlow's own sha256 pin (not Keras's file's).
No network: the downloads come from local files through ``file://`` URLs."""
import hashlib
import inspect
import io
import os

import numpy as np
import pytest

import flowlab as flow
from flowlab.data import load_mnist

ONEFLOW_URL = "https://oneflow-public.oss-cn-beijing.aliyuncs.com/datasets/mnist.npz"
ONEFLOW_SHA256 = "63d4344077849053dc3036b247fa012b2b381de53fd055a66b539dffd76cf08e"
KERAS_SHA256 = "731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc48468fc17b673d1"


def mnist_like_file(path, n_train=20, n_test=10):
    rng = np.random.default_rng(0)
    buffer = io.BytesIO()
    np.savez(buffer, x_train=rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
             y_train=rng.integers(0, 10, n_train, dtype=np.uint8),
             x_test=rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
             y_test=rng.integers(0, 10, n_test, dtype=np.uint8))
    path.write_bytes(buffer.getvalue())
    return path.as_uri(), hashlib.sha256(buffer.getvalue()).hexdigest()


def test_defaults_are_oneflows_url_and_its_pin():
    for function in (load_mnist, flow.data.load_mnist):
        parameters = inspect.signature(function).parameters
        assert parameters["url"].default == ONEFLOW_URL
        assert parameters["hash_check"].default == ONEFLOW_SHA256


def test_a_download_is_checked_against_oneflows_pin_by_default(tmp_path):
    url, sha = mnist_like_file(tmp_path / "served.npz")
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="sha256 mismatch") as e:
        load_mnist(10, 10, url=url, out_dir=str(out))
    message = str(e.value)
    assert f"expected {ONEFLOW_SHA256}" in message and f"got {sha}" in message and KERAS_SHA256 not in message
    assert os.listdir(out) == []                            # nothing half-trusted left behind


def test_a_download_matching_the_given_hash_is_kept_and_loaded(tmp_path):
    url, sha = mnist_like_file(tmp_path / "served.npz")
    out = tmp_path / "out"
    (train_x, train_y), (test_x, test_y) = load_mnist(10, 5, url=url, hash_check=sha, out_dir=str(out))
    assert (train_x.shape, train_y.shape, test_x.shape, test_y.shape) == \
        ((2, 10, 1, 28, 28), (2, 10), (2, 5, 1, 28, 28), (2, 5))
    assert (out / "mnist.npz").read_bytes() == (tmp_path / "served.npz").read_bytes()
    # one byte off is refused
    data = bytearray((tmp_path / "served.npz").read_bytes())
    data[-1] ^= 1
    (tmp_path / "bad.npz").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=f"expected {sha}"):
        load_mnist(10, 5, url=(tmp_path / "bad.npz").as_uri(), hash_check=sha, out_dir=str(tmp_path / "other"))
