"""The convolution kernels' NumPy routes (1x1 products, NCHW batch-folded im2col), each checked to be the route taken
and compared with PyTorch -- forward, input gradient and filter gradient, contiguous and not -- plus finite
differences through the graph; and a tiny ResNet from ``flowlab.examples.resnet`` that learns."""
import os
import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.ops import conv as C
from flowlab.runtime import host_memory
from gradcheck import check_grad

torch = pytest.importorskip("torch")
F = torch.nn.functional


def rnd(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def _torch_conv(x, w, strides, pads, dilations):
    """PyTorch's convolution of NCHW float64 ``x`` with explicit ``((top, bottom), (left, right))`` padding, with
    the gradients of ``sum(y * dy)``; returns a function of ``dy``."""
    (top, bottom), (left, right) = pads
    tx = torch.tensor(x, requires_grad=True)
    tw = torch.tensor(w, requires_grad=True)
    y = F.conv2d(F.pad(tx, (left, right, top, bottom)), tw, stride=strides, dilation=dilations)

    def grads(dy):
        dx, dw = torch.autograd.grad(y, (tx, tw), torch.tensor(dy))
        return y.detach().numpy(), dx.numpy(), dw.numpy()
    return y.shape, grads


def _not_contiguous(a, data_format="NCHW"):
    """The same values as a non-contiguous array (a transposed copy, transposed back)."""
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


ROUTES = ("_pointwise_forward", "_pointwise_input_grad", "_pointwise_filter_grad", "_folded_forward",
          "_folded_input_grad", "_folded_filter_grad")


def _routes(monkeypatch, names=ROUTES):
    """Count calls of each route's kernels (``names``: functions of ``flowlab.ops.conv``)."""
    calls = {}
    for name in names:
        original = getattr(C, name)

        def counted(*a, _name=name, _original=original, **k):
            calls[_name] = calls.get(_name, 0) + 1
            return _original(*a, **k)
        monkeypatch.setattr(C, name, counted)
    return calls


def _kernels(x, w, dy, strides, padding, dilations, data_format):
    attrs = dict(strides=strides, dilations=dilations, padding=padding, groups=1, data_format=data_format)
    y = C.Conv2d.forward(np, x, w, **attrs)
    dx = C.ConvInputGrad.forward(np, dy, w, input_shape=x.shape, **attrs)
    dw = C.ConvFilterGrad.forward(np, x, dy, filter_shape=w.shape, **attrs)
    return y, dx, dw


def _check_against_torch(x_shape, w_shape, strides, padding, dilations, data_format, contiguous):
    x, w = rnd(*x_shape, seed=1), rnd(*w_shape, seed=2)
    kernel, pads, out_hw = C._conv_geometry(x.shape, w.shape, strides, dilations, C._padding(padding, "NCHW", "t"),
                                            "NCHW")
    y_shape, torch_grads = _torch_conv(x, w, strides, pads, dilations)
    dy = rnd(*y_shape, seed=3)
    want_y, want_dx, want_dw = torch_grads(dy)
    if data_format == "NHWC":          # feed NHWC views of the same tensors; compare in NCHW
        to = (0, 2, 3, 1)
        x, w, dy = (np.ascontiguousarray(a.transpose(to)) for a in (x, w, dy))
        if not contiguous:
            x, dy = (np.ascontiguousarray(a.transpose(0, 3, 1, 2)).transpose(0, 2, 3, 1) for a in (x, dy))
    elif not contiguous:
        x, w, dy = (_not_contiguous(a) for a in (x, w, dy))
        assert not x.flags.c_contiguous and not dy.flags.c_contiguous
    y, dx, dw = _kernels(x, w, dy, strides, C._padding(padding, data_format, "t"), dilations, data_format)
    if data_format == "NHWC":
        y, dx, dw = (a.transpose(0, 3, 1, 2) for a in (y, dx, dw))
    for got, want, what in ((y, want_y, "output"), (dx, want_dx, "input gradient"), (dw, want_dw, "filter gradient")):
        assert got.shape == want.shape, what
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10, err_msg=what)


# (x NCHW, w OIHW, strides, padding, dilations): 1x1 with no padding -> the pointwise route
POINTWISE = [
    ((2, 5, 6, 7), (4, 5, 1, 1), (1, 1), "VALID", (1, 1)),      # per-image filter gradient (42 pixels < 256: fold)
    ((2, 3, 17, 16), (6, 3, 1, 1), (1, 1), "SAME", (1, 1)),     # 272 pixels: accumulated per image
    ((3, 4, 7, 6), (5, 4, 1, 1), (2, 2), "SAME", (1, 1)),       # strided: a subsample, odd height
    ((2, 4, 9, 8), (3, 4, 1, 1), (2, 3), "VALID", (2, 2)),      # dilation means nothing at 1x1
]
# groups 1, NCHW, anything but an unpadded 1x1 or a Winograd 3x3 (stride 1 with enough pixels per channel: see
# test_conv_winograd.py) -> the batch-folded im2col route
FOLDED = [
    ((1, 24, 4, 5), (24, 24, 3, 3), (1, 1), "SAME", (1, 1)),    # 3x3 stride 1, 20 pixels < 1 per channel
    ((2, 3, 9, 7), (4, 3, 3, 3), (2, 2), "SAME", (1, 1)),       # odd sizes: the odd pixel padded at the end
    ((1, 2, 11, 10), (3, 2, 7, 7), (2, 2), "SAME", (1, 1)),     # ResNet's stem, small
    ((2, 2, 7, 8), (3, 2, 3, 2), (2, 1), [1, (0, 2)], (2, 1)),  # explicit padding, dilation
    ((1, 32, 4, 4), (32, 32, 3, 3), (1, 1), [(3, 0), (0, 3)], (1, 1)),   # positions that read only padding
    ((2, 3, 6, 6), (2, 3, 1, 1), (1, 1), [1, 1], (1, 1)),       # a padded 1x1 is not pointwise
    ((2, 2, 6, 5), (3, 2, 2, 3), (1, 2), "VALID", (1, 1)),
]


@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", POINTWISE)
def test_pointwise_route_matches_torch(case, data_format, contiguous, monkeypatch):
    calls = _routes(monkeypatch)
    _check_against_torch(*case, data_format, contiguous)
    assert calls == {"_pointwise_forward": 1, "_pointwise_input_grad": 1, "_pointwise_filter_grad": 1}


@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("case", FOLDED)
def test_folded_route_matches_torch(case, contiguous, monkeypatch):
    calls = _routes(monkeypatch)
    _check_against_torch(*case, "NCHW", contiguous)
    assert calls == {"_folded_forward": 1, "_folded_input_grad": 1, "_folded_filter_grad": 1}


def test_nhwc_and_grouped_convolutions_keep_the_nhwc_route(monkeypatch):
    calls = _routes(monkeypatch)
    _check_against_torch((2, 3, 6, 6), (4, 3, 3, 3), (1, 1), "SAME", (1, 1), "NHWC", True)
    x, w = rnd(1, 4, 5, 5), rnd(4, 2, 3, 3)
    attrs = dict(strides=(1, 1), dilations=(1, 1), padding="SAME_UPPER", groups=2, data_format="NCHW")
    want = F.conv2d(F.pad(torch.tensor(x), (1, 1, 1, 1)), torch.tensor(w), groups=2).numpy()
    np.testing.assert_allclose(C.Conv2d.forward(np, x, w, **attrs), want, rtol=1e-10, atol=1e-10)
    assert calls == {}


def test_float32_routes_keep_the_dtype():
    for w_shape in ((4, 3, 1, 1), (4, 3, 3, 3)):
        x, w = rnd(2, 3, 6, 6).astype(np.float32), rnd(*w_shape).astype(np.float32)
        y, dx, dw = _kernels(x, w, np.ones((2, 4, 6, 6), np.float32), (1, 1), "SAME_UPPER", (1, 1), "NCHW")
        assert (y.dtype, dx.dtype, dw.dtype) == (np.float32,) * 3
        assert y.flags.c_contiguous and dx.flags.c_contiguous


@pytest.mark.parametrize("x_shape, w_shape, strides, padding", [
    ((2, 3, 5, 4), (4, 3, 1, 1), 1, "VALID"),
    ((2, 3, 5, 5), (2, 3, 1, 1), 2, "SAME"),
    ((2, 2, 6, 5), (3, 2, 3, 3), 2, "SAME"),
])
def test_route_gradients_by_finite_differences(x_shape, w_shape, strides, padding):
    check_grad(lambda x, w: flow.nn.conv2d(x, w, strides, padding, "NCHW"), rnd(*x_shape, seed=7),
               rnd(*w_shape, seed=8), max_points=30)


# ------------------------------------------------------------------------------------------------------ host memory

def test_large_host_plans_retain_freed_blocks(monkeypatch):
    assert not host_memory.wants_retained_blocks(100 * 4)
    assert host_memory.wants_retained_blocks(host_memory.LARGE_TENSOR_BYTES)
    monkeypatch.setattr(host_memory, "_state", {"done": False, "applied": False})
    monkeypatch.setenv("FLOWLAB_RETAIN_HEAP", "0")
    assert host_memory.retain_freed_blocks() is False       # turned off: nothing changed
    monkeypatch.setattr(host_memory, "_state", {"done": False, "applied": False})
    monkeypatch.delenv("FLOWLAB_RETAIN_HEAP")
    assert host_memory.retain_freed_blocks() is (host_memory._glibc() is not None)


_THREAD_SCRATCH = """
import resource, threading, numpy as np
from flowlab.runtime import host_memory
host_memory.retain_freed_blocks()
faults = []
def step():                                 # a pool thread's scratch: four 28 MiB blocks from its own arena
    for k in range(23):
        if k == 3:
            start = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        blocks = [np.ones(7 << 20, np.float32) for _ in range(4)]
        del blocks
    faults.append((resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - start) / 20)
worker = threading.Thread(target=step)
worker.start()
worker.join()
print(faults[0])
"""


@pytest.mark.skipif(host_memory._glibc() is None, reason="glibc's malloc tuning")
def test_retained_blocks_keep_a_threads_scratch_mapped():
    """A thread that frees the blocks at the top of its arena keeps them mapped (``M_TOP_PAD``) instead of faulting
    them in again on its next step (measured: ~1,100 faults an iteration without, ~100 with)."""
    import subprocess
    import sys

    def faults(retain):
        env = dict(os.environ, FLOWLAB_RETAIN_HEAP=retain)
        out = subprocess.run([sys.executable, "-c", _THREAD_SCRATCH], env=env, capture_output=True, text=True,
                             check=True)
        return float(out.stdout.split()[-1])

    kept, dropped = faults("1"), faults("0")
    assert kept < 0.25 * dropped, (kept, dropped)


@pytest.mark.parametrize("rows, retains", [(8, False), (1024, True)])
def test_host_plans_retain_blocks_only_with_large_tensors(rows, retains, monkeypatch):
    asked = []
    monkeypatch.setattr(host_memory, "retain_freed_blocks", lambda: asked.append(True) or True)

    @flow.global_function()
    def double(x: tp.Numpy.Placeholder((rows, 256))) -> tp.Numpy:     # 1024 x 256 float32: exactly 1 MiB
        return x * 2

    np.testing.assert_array_equal(double(np.ones((rows, 256), np.float32)), 2)
    assert bool(asked) is retains


# ------------------------------------------------------------------------------------------------------- tiny ResNet

def test_tiny_resnet_learns():
    """A ResNet from the example builder (two single-block stages, width 1/8, 32 px) fits a learnable synthetic
    problem: the class is which quadrant holds a bright square."""
    from flowlab.examples import resnet
    flow.clear_default_session()
    batch, size = 16, 32
    rng = np.random.default_rng(0)
    images = rng.standard_normal((batch, 3, size, size)).astype(np.float32) * 0.1
    labels = rng.integers(0, 4, batch).astype(np.int32)
    for i, label in enumerate(labels):
        r, c = divmod(int(label), 2)
        images[i, :, r * 16 + 4:r * 16 + 12, c * 16 + 4:c * 16 + 12] += 1.0
    job = resnet.train_job(batch_size=batch, image_size=size, depth=(1, 1), width=0.125, classes=4, lr=0.05)
    losses = [float(job(images, labels)) for _ in range(25)]
    assert np.all(np.isfinite(losses))
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:3]), losses


def test_resnet50_structure_and_names():
    from flowlab.examples import resnet
    flow.clear_default_session()

    @flow.global_function()
    def logits_job(images: tp.Numpy.Placeholder((2, 3, 64, 64))) -> tp.Numpy:
        return resnet.resnet(images, training=False)

    out = logits_job(np.zeros((2, 3, 64, 64), np.float32))
    assert out.shape == (2, 1000)
    names = set(flow.get_all_variables())
    convs = {n for n in names if n.endswith("-weight") and "fc1001" not in n}
    assert len(convs) == 53                                  # 1 stem + 16 blocks x 3 + 4 projections
    for name in ("Resnet-conv1-weight", "Resnet-res2_0_branch1-weight", "Resnet-res5_2_branch2c-weight",
                 "Resnet-res3_0_branch2b_bn_relu-gamma", "Resnet-res4_5_branch2c_bn_add_relu-moving_variance",
                 "Resnet-res2_0_branch1_bn-beta", "Resnet-fc1001-weight", "Resnet-fc1001-bias"):
        assert name in names, name
    assert "Resnet-res2_1_branch1-weight" not in names      # identity shortcuts where the shape stays
    with pytest.raises(ValueError, match="depth must be one of"):
        resnet._blocks_per_stage(34)


# ------------------------------------------------------------------------------------------ max pooling in blocks

@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
@pytest.mark.parametrize("contiguous", [True, False])
def test_blocked_max_pool_gradient_matches_torch_and_one_block(data_format, contiguous, monkeypatch):
    """The NumPy gradient runs in blocks of channels (NCHW) or images (NHWC): several blocks here, against PyTorch
    (distinct values) and against the whole tensor at once (ties and a NaN window, where PyTorch differs)."""
    monkeypatch.setattr(C, "_POOL_BLOCK", 40)
    rng = np.random.default_rng(4)
    x = rng.permutation(3 * 5 * 9 * 8).reshape(3, 5, 9, 8).astype(np.float64)
    tx = torch.tensor(x, requires_grad=True)
    y = F.max_pool2d(F.pad(tx, (0, 1, 1, 1), value=-np.inf), 3, 2)       # SAME: the odd pixel at the end
    dy = rng.standard_normal(tuple(y.shape))
    want = torch.autograd.grad(y, tx, torch.tensor(dy))[0].numpy()
    ties = np.round(x / 40)                                                # many equal maxima
    ties[1, 2, :3, :3] = np.nan
    for values, reference in ((x, want), (ties, None)):
        feed, grad = values, dy
        if data_format == "NHWC":
            feed, grad = (np.ascontiguousarray(a.transpose(0, 2, 3, 1)) for a in (feed, grad))
        if not contiguous:
            feed = np.asfortranarray(feed)
        attrs = dict(ksize=(3, 3), strides=(2, 2), padding="SAME_UPPER", data_format=data_format)
        got = C.MaxPoolGrad.forward(np, feed, grad, **attrs)
        whole = C._max_pool_grad(np, feed, grad, **attrs)
        np.testing.assert_array_equal(got, whole)
        if reference is not None:
            np.testing.assert_allclose(got if data_format == "NCHW" else got.transpose(0, 3, 1, 2), reference,
                                       rtol=1e-12, atol=1e-12)
