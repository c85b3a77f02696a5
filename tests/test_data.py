"""Tests for flowlab.data: MNIST loading/downloading (no network) and bundled digits."""

import functools
import hashlib
import http.server
import io
import os
import socket
import threading

import numpy as np
import pytest

from flowlab.data import load_digits, load_digits_arrays, load_mnist


def _fake_mnist_bytes(n_train=250, n_test=130, seed=0):
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    np.savez(
        buf,
        x_train=rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        y_train=rng.integers(0, 10, n_train, dtype=np.uint8),
        x_test=rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        y_test=rng.integers(0, 10, n_test, dtype=np.uint8),
    )
    return buf.getvalue()


@pytest.fixture
def fake_npz(tmp_path):
    data = _fake_mnist_bytes()
    (tmp_path / "mnist.npz").write_bytes(data)
    return tmp_path, data


@pytest.fixture
def server(tmp_path_factory):
    """Serve a generated mnist.npz from a local HTTP server on 127.0.0.1."""
    root = tmp_path_factory.mktemp("www")
    data = _fake_mnist_bytes(n_train=100, n_test=50, seed=1)
    (root / "mnist.npz").write_bytes(data)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(root))
    )
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/mnist.npz", data
    finally:
        httpd.shutdown()
        httpd.server_close()


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- load_mnist


def test_load_mnist_nchw(fake_npz):
    out_dir, data = fake_npz
    (xtr, ytr), (xte, yte) = load_mnist(100, 50, out_dir=str(out_dir), hash_check=None)
    # 250 train -> 2 full batches of 100 (50 dropped); 130 test -> 2 of 50.
    assert xtr.shape == (2, 100, 1, 28, 28) and ytr.shape == (2, 100)
    assert xte.shape == (2, 50, 1, 28, 28) and yte.shape == (2, 50)
    assert xtr.dtype == np.float32 and ytr.dtype == np.int32
    with np.load(io.BytesIO(data)) as f:
        np.testing.assert_allclose(xtr.reshape(-1, 28, 28), f["x_train"][:200] / 255.0, rtol=1e-6)
        np.testing.assert_array_equal(ytr.ravel(), f["y_train"][:200])
        np.testing.assert_array_equal(yte.ravel(), f["y_test"][:100])
    assert 0.0 <= xtr.min() and xtr.max() <= 1.0


def test_load_mnist_nhwc(fake_npz):
    out_dir, _ = fake_npz
    (xtr, _), (xte, _) = load_mnist(25, 13, data_format="NHWC", out_dir=str(out_dir))
    assert xtr.shape == (10, 25, 28, 28, 1)
    assert xte.shape == (10, 13, 28, 28, 1)
    nchw = load_mnist(25, 13, out_dir=str(out_dir))[0][0]
    np.testing.assert_array_equal(xtr[..., 0], nchw[:, :, 0])


def test_download_with_correct_hash(server, tmp_path, capfd):
    url, data = server
    sha = hashlib.sha256(data).hexdigest()
    (xtr, ytr), (xte, yte) = load_mnist(50, 50, url=url, hash_check=sha, out_dir=str(tmp_path / "new"))
    assert xtr.shape == (2, 50, 1, 28, 28) and xte.shape == (1, 50, 1, 28, 28)
    assert (tmp_path / "new" / "mnist.npz").read_bytes() == data
    assert os.listdir(tmp_path / "new") == ["mnist.npz"]  # no temp file left
    assert "100%" in capfd.readouterr().err


def test_download_without_hash_check(server, tmp_path):
    url, _ = server
    load_mnist(50, 50, url=url, hash_check=None, out_dir=str(tmp_path))
    assert (tmp_path / "mnist.npz").is_file()


def test_download_wrong_hash_leaves_nothing(server, tmp_path):
    url, data = server
    with pytest.raises(ValueError) as e:
        load_mnist(url=url, hash_check="0" * 64, out_dir=str(tmp_path))
    msg = str(e.value)
    assert url in msg and "0" * 64 in msg and hashlib.sha256(data).hexdigest() in msg
    assert os.listdir(tmp_path) == []


def test_download_unreachable(tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}/mnist.npz"
    with pytest.raises(ConnectionError) as e:
        load_mnist(url=url, out_dir=str(tmp_path))
    msg = str(e.value)
    assert url in msg and "mnist.npz" in msg and "by hand" in msg
    assert os.listdir(tmp_path) == []


def test_download_http_404(server, tmp_path):
    url, _ = server
    with pytest.raises(ConnectionError, match="could not download"):
        load_mnist(url=url.replace("mnist.npz", "missing.npz"), out_dir=str(tmp_path))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"train_batch_size": 0}, "train_batch_size"),
        ({"train_batch_size": 2.5}, "train_batch_size"),
        ({"test_batch_size": -1}, "test_batch_size"),
        ({"test_batch_size": True}, "test_batch_size"),
        ({"data_format": "nchw"}, "data_format"),
        ({"train_batch_size": 10_000}, "train_batch_size"),  # larger than the data
    ],
)
def test_load_mnist_bad_args(fake_npz, kwargs, name):
    out_dir, _ = fake_npz
    with pytest.raises(ValueError, match=name):
        load_mnist(out_dir=str(out_dir), **kwargs)


# ---------------------------------------------------------------- load_digits


def test_digits_arrays():
    x, y = load_digits_arrays()
    assert x.shape == (1797, 8, 8) and x.dtype == np.uint8
    assert y.shape == (1797,) and y.dtype == np.uint8
    assert x.max() == 16 and set(np.unique(y)) == set(range(10))


def test_load_digits_shapes():
    (xtr, ytr), (xte, yte) = load_digits()
    # 1797 * 0.2 -> 359 test, 1438 train; remainders dropped.
    assert xtr.shape == (14, 100, 1, 8, 8) and ytr.shape == (14, 100)
    assert xte.shape == (3, 100, 1, 8, 8) and yte.shape == (3, 100)
    assert xtr.dtype == np.float32 and ytr.dtype == np.int32
    assert xtr.min() >= 0.0 and xtr.max() == 1.0
    assert ytr.min() >= 0 and ytr.max() <= 9
    (xn, _), _ = load_digits(data_format="NHWC")
    assert xn.shape == (14, 100, 8, 8, 1)
    np.testing.assert_array_equal(xn[..., 0], xtr[:, :, 0])


def _rows(x, y):
    """Samples as sortable byte strings (image + label) for multiset comparison."""
    if x.dtype == np.float32:  # undo the /16 scaling of load_digits
        x = (x * 16).round()
    x = x.reshape(-1, 64).astype(np.uint8)
    return sorted(a.tobytes() + bytes([int(b)]) for a, b in zip(x, y.ravel()))


def test_load_digits_split_disjoint_and_covering():
    (xtr, ytr), (xte, yte) = load_digits(1, 1, test_fraction=0.25)
    assert len(ytr.ravel()) + len(yte.ravel()) == 1797
    x, y = load_digits_arrays()
    # The union of the splits is exactly the data set, each sample once.
    both = sorted(_rows(xtr, ytr) + _rows(xte, yte))
    assert both == _rows(x, y)
    assert len(yte.ravel()) == round(1797 * 0.25)


def test_load_digits_deterministic():
    a = load_digits(seed=3)
    b = load_digits(seed=3)
    c = load_digits(seed=4)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u[0], v[0])
        np.testing.assert_array_equal(u[1], v[1])
    assert not np.array_equal(a[0][1], c[0][1])


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"train_batch_size": 0}, "train_batch_size"),
        ({"test_batch_size": "8"}, "test_batch_size"),
        ({"data_format": "NCWH"}, "data_format"),
        ({"test_fraction": 1.0}, "test_fraction"),
    ],
)
def test_load_digits_bad_args(kwargs, name):
    with pytest.raises(ValueError, match=name):
        load_digits(**kwargs)
