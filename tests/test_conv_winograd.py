"""Winograd F(4x4, 3x3) and F(2x2, 3x3) convolutions (``flowlab.ops.conv``, NCHW 3x3 stride-1 on NumPy): the
transform matrices, which convolutions take which route, forward and both gradients against PyTorch and the
batch-folded im2col route in float64 (1e-10) and float32 (within the documented ~1e-5 of the output's scale), split
over host threads, and finite differences through a job."""
import numpy as np
import pytest

import flowlab as flow
from flowlab.ops import conv as C
from flowlab.runtime import host_threads
from gradcheck import check_grad
from test_conv_routes import _routes as count_routes

torch = pytest.importorskip("torch")
F = torch.nn.functional


def rnd(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


@pytest.mark.parametrize("algo", [C.F43, C.F23], ids=["F43", "F23"])
def test_transform_matrices_compute_a_one_dimensional_correlation(algo):
    """``A^T [(G g) * (B^T d)]`` is the m-output correlation of an (m + 2)-sample ``d`` with a 3-tap ``g``: the
    identity the 2-D transforms (its tensor square) rest on."""
    rng = np.random.default_rng(0)
    for _ in range(5):
        g, d = rng.standard_normal(3), rng.standard_normal(algo.t)
        want = np.array([d[u:u + 3] @ g for u in range(algo.m)])
        np.testing.assert_allclose(algo.at @ ((algo.g @ g) * (algo.bt @ d)), want, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("algo", [C.F43, C.F23], ids=["F43", "F23"])
def test_filter_map_is_g_g_transposed_at_each_position(algo):
    """Row ``t b + a`` of the filter map applied to a filter's 9 taps is entry ``(a, b)`` of ``G g G^T``."""
    g = rnd(5, 3, 3, seed=9)
    u = (algo.filter_map(np.float64) @ g.reshape(5, 9).T).reshape(algo.t, algo.t, 5)     # (b, a, filter)
    want = np.einsum("ap,fpq,bq->baf", algo.g, g, algo.g)
    np.testing.assert_allclose(u, want, rtol=1e-13, atol=1e-13)


ATTRS = dict(strides=(1, 1), dilations=(1, 1), groups=1, data_format="NCHW")


@pytest.mark.parametrize("x_shape, w_shape, strides, dilations, groups, data_format, taken", [
    ((4, 64, 56, 56), (64, 64, 3, 3), (1, 1), (1, 1), 1, "NCHW", C.F43),      # ResNet-50's res2
    ((4, 128, 28, 28), (128, 128, 3, 3), (1, 1), (1, 1), 1, "NCHW", C.F43),   # res3
    ((4, 256, 14, 14), (256, 256, 3, 3), (1, 1), (1, 1), 1, "NCHW", C.F23),   # res4: 784 pixels < 8 x 256, >= 256
    ((4, 512, 7, 7), (512, 512, 3, 3), (1, 1), (1, 1), 1, "NCHW", None),      # res5: 196 pixels < 512
    ((4, 128, 56, 56), (128, 128, 3, 3), (2, 2), (1, 1), 1, "NCHW", None),    # strided
    ((2, 8, 20, 20), (8, 8, 3, 3), (1, 1), (2, 2), 1, "NCHW", None),          # dilated
    ((2, 8, 20, 20), (8, 4, 3, 3), (1, 1), (1, 1), 2, "NCHW", None),          # grouped
    ((2, 20, 20, 8), (8, 3, 3, 8), (1, 1), (1, 1), 1, "NHWC", None),
    ((2, 8, 20, 20), (8, 8, 5, 5), (1, 1), (1, 1), 1, "NCHW", None),
])
def test_which_convolutions_take_the_winograd_route(x_shape, w_shape, strides, dilations, groups, data_format, taken):
    kernel, _, out_hw = C._conv_geometry(x_shape, w_shape, strides, dilations, "SAME_UPPER", data_format)
    assert C._winograd(np, np.float32, x_shape, w_shape, kernel, strides, dilations, groups, data_format,
                       out_hw) is taken
    assert C._is_winograd(np, np.float32, x_shape, w_shape, kernel, strides, dilations, groups, data_format,
                          out_hw) is (taken is not None)
    assert not C._is_winograd(np, np.float16, x_shape, w_shape, kernel, strides, dilations, groups, data_format,
                              out_hw)         # its transforms would lose ~10% in float16


def _routes(monkeypatch):
    return count_routes(monkeypatch, ("_winograd_forward", "_winograd_input_grad", "_winograd_filter_grad",
                                      "_folded_forward", "_folded_input_grad", "_folded_filter_grad"))


def _kernels(x, w, dy, padding):
    y = C.Conv2d.forward(np, x, w, padding=padding, **ATTRS)
    dx = C.ConvInputGrad.forward(np, dy, w, input_shape=x.shape, padding=padding, **ATTRS)
    dw = C.ConvFilterGrad.forward(np, x, dy, filter_shape=w.shape, padding=padding, **ATTRS)
    return y, dx, dw


def _torch(x, w, dy, pads):
    (top, bottom), (left, right) = pads
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    y = F.conv2d(F.pad(tx, (left, right, top, bottom)), tw)
    y.backward(torch.tensor(dy))
    return y.detach().numpy(), tx.grad.numpy(), tw.grad.numpy()


def _force(monkeypatch, algo):
    """Make every eligible convolution take ``algo`` (F43: no minimum of pixels; F23: F43 never)."""
    monkeypatch.setattr(C, "_WINOGRAD_PIXELS", 0 if algo is C.F43 else float("inf"))
    monkeypatch.setattr(C, "_WINOGRAD2_PIXELS", 0)


ALGOS = pytest.mark.parametrize("algo", [C.F43, C.F23], ids=["F43", "F23"])

# (x, w, padding): SAME over sizes that are and are not multiples of the 4- and 2-pixel tiles, VALID, explicit
# uneven padding, and padding so wide that some windows read only padding
CASES = [((2, 3, 8, 8), (4, 3, 3, 3), "SAME_UPPER"),
         ((2, 3, 9, 11), (5, 3, 3, 3), "SAME_UPPER"),
         ((1, 2, 10, 7), (3, 2, 3, 3), "VALID"),
         ((2, 2, 6, 5), (3, 2, 3, 3), ((2, 0), (0, 3))),
         ((1, 2, 3, 3), (2, 2, 3, 3), ((6, 1), (1, 6)))]


@ALGOS
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("x_shape, w_shape, padding", CASES)
def test_winograd_matches_torch_and_the_direct_route_in_float64(monkeypatch, x_shape, w_shape, padding, contiguous,
                                                                threads, algo):
    monkeypatch.setattr(host_threads, "SPLIT_ELEMENTS", 1)
    monkeypatch.setattr(host_threads, "SPLIT_MACS", 1)
    _force(monkeypatch, algo)
    calls = _routes(monkeypatch)
    x, w = rnd(*x_shape, seed=1), rnd(*w_shape, seed=2)
    kernel, pads, out_hw = C._conv_geometry(x.shape, w.shape, (1, 1), (1, 1), padding, "NCHW")
    assert C._winograd(np, x.dtype, x.shape, w.shape, kernel, (1, 1), (1, 1), 1, "NCHW", out_hw) is algo
    dy = rnd(x_shape[0], w_shape[0], *out_hw, seed=3)
    want = _torch(x, w, dy, pads)
    direct = (C._folded_forward(np, x, w, kernel, (1, 1), (1, 1), pads, out_hw),
              C._folded_input_grad(np, dy, w, x.shape, kernel, (1, 1), (1, 1), pads, out_hw),
              C._folded_filter_grad(np, x, dy, w.shape, kernel, (1, 1), (1, 1), pads, out_hw))
    if not contiguous:
        x, w, dy = (np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2) for a in (x, w, dy))
    with host_threads.using(threads):
        got = _kernels(x, w, dy, padding)
    assert calls["_winograd_forward"] == calls["_winograd_input_grad"] == calls["_winograd_filter_grad"] == 1
    for g, t, d, what in zip(got, want, direct, ("output", "input gradient", "filter gradient")):
        assert g.shape == t.shape and g.flags.c_contiguous, what
        np.testing.assert_allclose(g, t, rtol=1e-10, atol=1e-10, err_msg=what)
        np.testing.assert_allclose(g, d, rtol=1e-10, atol=1e-10, err_msg=what)


@ALGOS
def test_winograd_in_float32_stays_within_its_documented_rounding(monkeypatch, algo):
    """A ResNet-like layer in float32: within 1e-4 of the output's (gradient's) largest magnitude of the float64
    result (measured ~1e-5; the direct route ~1e-6), and float32 throughout."""
    _force(monkeypatch, algo)
    calls = _routes(monkeypatch)
    x, w = rnd(2, 32, 20, 20, seed=4), rnd(32, 32, 3, 3, seed=5) * 0.1
    dy = rnd(2, 32, 20, 20, seed=6)
    want = _kernels(x, w, dy, "SAME_UPPER")
    got = _kernels(x.astype(np.float32), w.astype(np.float32), dy.astype(np.float32), "SAME_UPPER")
    assert calls["_winograd_forward"] == calls["_winograd_input_grad"] == calls["_winograd_filter_grad"] == 2
    for g, t in zip(got, want):
        assert g.dtype == np.float32
        assert np.max(np.abs(g - t)) <= 1e-4 * np.max(np.abs(t))


@ALGOS
def test_winograd_gradients_by_finite_differences(monkeypatch, algo):
    _force(monkeypatch, algo)
    x, w = rnd(2, 3, 6, 5, seed=7), rnd(4, 3, 3, 3, seed=8)
    kernel, _, out_hw = C._conv_geometry(x.shape, w.shape, (1, 1), (1, 1), "SAME_UPPER", "NCHW")
    assert C._winograd(np, x.dtype, x.shape, w.shape, kernel, (1, 1), (1, 1), 1, "NCHW", out_hw) is algo
    check_grad(lambda x, w: flow.nn.conv2d(x, w, 1, "SAME", "NCHW"), x, w, max_points=30)
    check_grad(lambda x, w: flow.nn.conv2d(x, w, 1, [(2, 0), (1, 3)], "NCHW"), x, w, max_points=30)


@ALGOS
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("channels_per_chunk", [1, 2, 5])
def test_input_transform_in_chunks_of_channels_matches_one_pass(monkeypatch, algo, threads, channels_per_chunk):
    """The input transform works through the channels in cache-sized chunks (the last one shorter where the count
    does not divide them), on host threads: the same ``V`` as one pass over all channels, and as ``B^T d B`` of each
    window computed directly."""
    monkeypatch.setattr(host_threads, "SPLIT_ELEMENTS", 1)
    x = rnd(2, 5, 9, 11, seed=10)
    pads, out_hw = ((1, 1), (2, 0)), (9, 11)
    tiles = C._wino_tiles(out_hw, algo.m)
    whole = C._wino_input(np, x, pads, tiles, algo)
    per_channel = algo.t * x.shape[0] * tiles[0] * (tiles[1] * algo.m + 2)
    monkeypatch.setattr(C, "_WINO_CHUNK", channels_per_chunk * per_channel)
    with host_threads.using(threads):
        chunked = C._wino_input(np, x, pads, tiles, algo)
    np.testing.assert_allclose(chunked, whole, rtol=1e-13, atol=1e-13)
    t, m = algo.t, algo.m
    padded = np.zeros((2, 5, tiles[0] * m + 2, tiles[1] * m + 2))
    padded[:, :, 1:10, 2:13] = x[:, :, :, :min(11, tiles[1] * m + 2 - 2)]
    for i, j in ((0, 0), (1, 2), (tiles[0] - 1, tiles[1] - 1)):
        d = padded[:, :, m * i:m * i + t, m * j:m * j + t]                     # (N, C, t, t): rows p, columns q
        want = np.einsum("ap,ncpq,bq->banc", algo.bt, d, algo.bt).reshape(t * t, 2, 5)
        got = chunked.reshape(t * t, 5, 2, tiles[0], tiles[1])[:, :, :, i, j].transpose(0, 2, 1)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
