"""Kernels that split their work over host threads (``flowlab.runtime.host_threads``): the helpers themselves, every
kernel that splits giving what it gives on one thread (and PyTorch's values) however many threads take part, finite
differences through a job with the work split, and host plans switching BLAS to one thread while kernels split."""
import threading

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.ops import conv as C
from flowlab.ops import nn, normalization
from flowlab.optim.optimizers import SGDUpdate
from flowlab.runtime import host_threads
from flowlab.runtime.backend import one_blas_thread
from gradcheck import check_grad


def rnd(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


@pytest.fixture
def split_everything(monkeypatch):
    """Thresholds at their minimum, so that even tiny arrays are split, into two tasks per thread where long enough."""
    monkeypatch.setattr(host_threads, "SPLIT_ELEMENTS", 1)
    monkeypatch.setattr(host_threads, "SPLIT_MACS", 1)
    monkeypatch.setattr(host_threads, "CHUNK_ELEMENTS", 1)


# -------------------------------------------------------------------------------------------------------- helpers

def test_outside_a_spread_block_everything_runs_inline():
    assert host_threads.width() == 1
    seen = []
    assert host_threads.run([lambda: seen.append(threading.get_ident()) or 1,
                             lambda: seen.append(threading.get_ident()) or 2]) == [1, 2]
    assert set(seen) == {threading.get_ident()}
    assert host_threads.parts(10) == [slice(0, 10)]


def test_run_spreads_tasks_keeps_their_order_and_raises_after_all_have_ended():
    with host_threads.using(3):
        barrier = threading.Barrier(3, timeout=10)      # all three at once, or the barrier breaks
        assert host_threads.run([lambda k=k: barrier.wait() is not None and k for k in range(3)]) == [0, 1, 2]
        finished = []

        def slow():
            threading.Event().wait(0.2)
            finished.append(True)

        def failing():
            raise KeyError("task")

        with pytest.raises(KeyError, match="task"):
            host_threads.run([failing, slow])
        assert finished == [True]       # the error waited for the other task
    assert host_threads.width() == 1


def test_the_caller_runs_the_tasks_no_pool_thread_has_claimed(monkeypatch):
    """A pool thread that never wakes (another process holds the core) costs nothing: the caller claims every task
    itself, and waits only for tasks a pool thread began."""
    class Asleep:
        size = 8

        class jobs:
            @staticmethod
            def put(job):
                pass            # never run

    monkeypatch.setattr(host_threads, "_executor", lambda workers: Asleep)
    seen = []
    done = []
    caller = threading.Thread(target=lambda: done.append(_run_wide(seen)))
    caller.start()
    caller.join(timeout=30)
    assert done == [[0, 1, 2, 3]]
    assert set(seen) == {caller.ident}


def _run_wide(seen):
    with host_threads.using(2):
        return host_threads.run([lambda k=k: seen.append(threading.get_ident()) or k for k in range(4)])


def test_a_free_thread_claims_what_a_busy_one_has_not_begun():
    """Tasks are claimed in order by whichever thread is free: while one thread is held up in the first task, the
    other runs all the rest."""
    release, ran_by = threading.Event(), {}

    def task(k):
        if k == 0:
            assert release.wait(10)     # held until the other thread has run every other task
        ran_by[k] = threading.get_ident()
        if len(ran_by) == 4 and k != 0:
            release.set()
        return k

    with host_threads.using(2):
        assert host_threads.run([lambda k=k: task(k) for k in range(5)]) == [0, 1, 2, 3, 4]
    others = {ran_by[k] for k in range(1, 5)}
    assert len(others) == 1 and others != {ran_by[0]}


@pytest.mark.parametrize("total, minimum, work, count", [(10, 1, None, 3), (10, 4, None, 2), (5, 3, None, 1),
                                                          (2, 1, None, 2), (100, 1, 10, 1),
                                                          (100, 1, 6 << 18, 6),       # two per thread
                                                          (100, 1, (6 << 18) - 1, 3),  # one chunk too little
                                                          (4, 1, 6 << 18, 4)])        # as many as rows
def test_parts_cover_the_range_in_order(total, minimum, work, count):
    with host_threads.using(3):
        got = host_threads.parts(total, minimum, work)
    assert len(got) == count
    assert [i for s in got for i in range(total)[s]] == list(range(total))
    assert all(s.stop - s.start >= min(minimum, total) for s in got)


def test_products_keep_one_block_per_thread():
    """A product's blocks each pack their own copy of the shared operand: however large, one block per thread."""
    with host_threads.using(3):
        assert len(host_threads.parts(100, 1, 6 << 18, per_thread=1)) == 3
        assert len(host_threads.parts(100, 1, 6 << 18)) == 6
        blocks = []
        original = np.matmul

        def recording(a, b, out=None):
            blocks.append(a.shape[-2])
            return original(a, b, out=out)

        a, b = rnd(600, 300, seed=5), rnd(300, 200, seed=6)       # 36M multiply-adds
        try:
            np.matmul = recording                       # host_threads calls np.matmul for each block
            got = host_threads.matmul(a, b)
        finally:
            np.matmul = original
    assert sorted(blocks) == [200, 200, 200]
    np.testing.assert_allclose(got, a @ b, rtol=1e-13, atol=1e-12)


@pytest.mark.parametrize("a_shape, b_shape", [((9, 7), (7, 4)), ((3, 12), (12, 11)), ((5, 6), (3, 6, 8)),
                                              ((3, 9, 6), (6, 2)), ((2, 4, 5), (2, 5, 10))])
@pytest.mark.parametrize("threads", [2, 3])
def test_matmul_splits_rows_or_columns_and_matches_numpy(split_everything, a_shape, b_shape, threads):
    a, b = rnd(*a_shape, seed=1), rnd(*b_shape, seed=2)
    with host_threads.using(threads):
        np.testing.assert_allclose(host_threads.matmul(a, b), np.matmul(a, b), rtol=1e-13, atol=1e-13)
        at = np.ascontiguousarray(np.swapaxes(a, -1, -2))
        np.testing.assert_allclose(host_threads.matmul(np.swapaxes(at, -1, -2), b), np.matmul(a, b), rtol=1e-13,
                                   atol=1e-13)       # a transposed view
        out = np.full(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]), np.nan)
        assert host_threads.matmul(a, b, out=out) is out
        np.testing.assert_allclose(out, np.matmul(a, b), rtol=1e-13, atol=1e-13)


# -------------------------------------------------------------------------------------------------------- kernels

def _conv_kernels(x, w, strides, padding):
    attrs = dict(strides=strides, dilations=(1, 1), padding=padding, groups=1, data_format="NCHW")
    y = C.Conv2d.forward(np, x, w, **attrs)
    dy = np.cos(3 * y)
    return [y, C.ConvInputGrad.forward(np, dy, w, input_shape=x.shape, **attrs),
            C.ConvFilterGrad.forward(np, x, dy, filter_shape=w.shape, **attrs)]


CONVS = [((3, 5, 9, 8), (4, 5, 3, 3), (1, 1), "SAME_UPPER"),      # folded im2col
         ((2, 3, 11, 10), (6, 3, 7, 7), (2, 2), "SAME_UPPER"),    # ResNet's stem, small
         ((3, 5, 6, 7), (4, 5, 1, 1), (1, 1), "VALID"),           # 1x1: one product over the batch
         ((2, 5, 17, 16), (4, 5, 1, 1), (1, 1), "VALID"),         # 1x1: accumulated per image
         ((3, 5, 9, 8), (4, 5, 1, 1), (2, 2), "VALID")]           # strided 1x1


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("x_shape, w_shape, strides, padding", CONVS)
def test_convolutions_split_over_threads_match_one_thread_and_torch(split_everything, x_shape, w_shape, strides,
                                                                    padding, threads):
    torch = pytest.importorskip("torch")
    x, w = rnd(*x_shape, seed=3), rnd(*w_shape, seed=4)
    one = _conv_kernels(x, w, strides, padding)
    with host_threads.using(threads):
        split = _conv_kernels(x, w, strides, padding)
    for a, b in zip(split, one):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    kernel, pads, _ = C._conv_geometry(x.shape, w.shape, strides, (1, 1), padding, "NCHW")
    (top, bottom), (left, right) = pads
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ty = torch.nn.functional.conv2d(torch.nn.functional.pad(tx, (left, right, top, bottom)), tw, stride=strides)
    ty.backward(torch.tensor(np.cos(3 * ty.detach().numpy())))
    for got, want in zip(split, (ty.detach(), tx.grad, tw.grad)):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-10, atol=1e-10)


def _bn_kernels(x, axis, relu, addend):
    c = x.shape[axis]
    gamma, beta = np.linspace(0.5, 2, c), np.linspace(-1, 1, c)
    outputs = normalization.BatchNormTrain.forward(np, x, gamma, beta, *addend, axis=axis, epsilon=1e-5, relu=relu)
    dy = np.sin(x)
    grads = normalization.BatchNormGrad.forward(np, x, dy, gamma, outputs[1], outputs[2], axis=axis, epsilon=1e-5,
                                                training=True)
    frozen = normalization.BatchNormGrad.forward(np, x, dy, gamma, outputs[1], np.abs(outputs[4]) + 0.5, axis=axis,
                                                 epsilon=1e-5, training=False)
    return list(outputs) + list(grads) + list(frozen)


@pytest.mark.parametrize("block", [7, 1 << 18])
@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("shape, axis", [((4, 6, 5, 5), 1),     # regions of rows (images)
                                         ((1, 6, 5, 5), 1),     # one image: regions of channels
                                         ((2, 5, 4, 6), 3),     # NHWC
                                         ((40, 3), 1)])
def test_batch_norm_split_over_threads_matches_one_thread(split_everything, monkeypatch, shape, axis, threads, block):
    """Regions of rows combine their moments as blocks do (float32 far from zero keeps its precision); regions of
    channels need no combining; with tiny blocks each region is cut further."""
    monkeypatch.setattr(normalization, "_BLOCK", block)
    x = rnd(*shape, seed=5) + 3.0
    addend = rnd(*shape, seed=6)
    for relu, extra in ((False, ()), (True, (addend,))):
        one = _bn_kernels(x, axis, relu, extra)
        with host_threads.using(threads):
            split = _bn_kernels(x, axis, relu, extra)
        for a, b in zip(split, one):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    far = (rnd(*shape, seed=7) + 1000.0).astype(np.float32)
    with host_threads.using(threads):
        y = normalization.BatchNormTrain.forward(np, far, np.ones(shape[axis], np.float32),
                                                 np.zeros(shape[axis], np.float32), axis=axis, epsilon=1e-5,
                                                 relu=False)[0]
    x64 = np.moveaxis(far.astype(np.float64), axis, -1)
    want = (x64 - x64.mean(axis=tuple(range(x64.ndim - 1)))) / np.sqrt(x64.var(axis=tuple(range(x64.ndim - 1))) + 1e-5)
    np.testing.assert_allclose(np.moveaxis(y, axis, -1), want, rtol=1e-3, atol=2e-3)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
def test_max_pool_relu_grad_and_sgd_split_over_threads_match_one_thread(split_everything, monkeypatch, data_format,
                                                                       threads):
    monkeypatch.setattr(C, "_POOL_BLOCK", 8)       # several blocks for each thread
    x = rnd(3, 4, 9, 8, seed=8)
    x[0, 0, :3, :3] = 1.0                           # ties: the first maximum takes the gradient

    def kernels():
        y = C.MaxPool2D.forward(np, x, (3, 3), (2, 2), "SAME_UPPER", data_format)
        dx = C.MaxPoolGrad.forward(np, x, np.cos(y), (3, 3), (2, 2), "SAME_UPPER", data_format)
        relu = nn.ReluGrad.forward(np, x, np.cos(x))
        inplace = np.cos(x)
        nn.ReluGrad.forward(np, x, inplace, out=inplace)
        w, m = np.linspace(-1, 1, 5000).reshape(50, 100), np.linspace(0, 1, 5000).reshape(50, 100)
        SGDUpdate.forward(np, w, np.cos(w), m, momentum=0.875, clipped=False, grad_scale=1.0, schedule=None, lr=0.1)
        w2 = np.linspace(-1, 1, 5000)
        SGDUpdate.forward(np, w2, np.sin(w2), momentum=0.0, clipped=False, grad_scale=1.0, schedule=None, lr=0.1)
        return [y, dx, relu, inplace, w, m, w2]

    one = kernels()
    with host_threads.using(threads):
        split = kernels()
    for a, b in zip(split, one):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)
    np.testing.assert_array_equal(one[2], np.cos(x) * (x > 0))


@pytest.mark.parametrize("threads", [2, 3])
def test_matmul_op_in_every_orientation_split_over_threads_matches_numpy(split_everything, threads):
    """``MatMul``'s NumPy kernel goes through ``host_threads.matmul`` (BLAS is on one thread inside a host plan):
    plain, transposed operands, a batch, ``out=`` and the swapped ``(b @ aᵀ)ᵀ`` orientation."""
    from flowlab.ops.math import MatMul
    a, b = rnd(6, 5, seed=11).astype(np.float32), rnd(5, 7, seed=12).astype(np.float32)
    cases = [(a, b, False, False), (a.T.copy(), b, True, False), (a, b.T.copy(), False, True),
             (a.T.copy(), b.T.copy(), True, True), (rnd(3, 6, 5, seed=13), rnd(3, 5, 4, seed=14), False, False),
             (rnd(4, 300, seed=15).astype(np.float32), rnd(9, 300, seed=16).astype(np.float32), False, True)]
    with host_threads.using(threads):
        for x, y, ta, tb in cases:
            want = np.matmul(x.swapaxes(-1, -2) if ta else x, y.swapaxes(-1, -2) if tb else y)
            np.testing.assert_allclose(MatMul.forward(np, x, y, ta, tb, 1.0), want, rtol=1e-5, atol=1e-5)
            out = np.full(want.shape, np.nan, want.dtype)
            assert MatMul.forward(np, x, y, ta, tb, 0.5, out=out) is out
            np.testing.assert_allclose(out, 0.5 * want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_and_its_gradient_in_blocks_split_over_threads_match_one_thread(split_everything, monkeypatch, threads,
                                                                            dtype):
    """The GELU kernels' blocks (``ops.math._blockwise``), shared among threads, give what one thread gives: a
    shorter last block, an exact 0 in a later block (the gradient's Φ(0) = 1/2 branch), a transposed input and a
    transposed ``out``."""
    from flowlab.ops import math as M
    monkeypatch.setattr(M, "_BLOCK", 16)
    x = (rnd(7, 13, seed=17) * 3).astype(dtype)         # 91 elements: 5 blocks of 16 and one of 11
    x[5, 2] = 0.0
    dy = rnd(7, 13, seed=18).astype(dtype)

    def kernels():
        y = M.Gelu.forward(np, x)
        out = np.empty((13, 7), dtype).T                # not C-contiguous
        M.Gelu.forward(np, x.T.copy().T, out=out)
        return [y, out, M.GeluGrad.forward(np, x, y, dy), M.GeluGrad.forward(np, x.T.copy().T, y, dy)]

    one = kernels()
    with host_threads.using(threads):
        split = kernels()
    for a, b in zip(split, one):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(one[0], one[1])
    assert one[2][5, 2] == pytest.approx(0.5 * dy[5, 2])


def test_gradients_through_a_job_split_over_threads_by_finite_differences(split_everything):
    def block(x, w):
        y = flow.nn.conv2d(x, w, 1, "SAME", "NCHW")
        y = flow.layers.batch_normalization_relu(y, axis=1, name="bn_threads", trainable=True, training=True)
        return flow.nn.max_pool2d(y, 3, 2, "SAME", "NCHW")

    with host_threads.using(2):
        check_grad(block, rnd(2, 3, 7, 6, seed=9), rnd(4, 3, 3, 3, seed=10), max_points=25)


# -------------------------------------------------------------------------------------------------- host plans

def _blas_threads():
    return max((lib.num_threads for lib in one_blas_thread.controllers()), default=None)


def test_spread_kernels_takes_blas_threads_for_the_kernels(monkeypatch):
    from threadpoolctl import threadpool_limits
    if not one_blas_thread.controllers():
        pytest.skip("NumPy's BLAS cannot be controlled here")
    monkeypatch.setattr(host_threads, "_usable_cores", lambda: 4)
    with threadpool_limits(3, user_api="blas"):
        with host_threads.spread_kernels:
            assert (host_threads.width(), _blas_threads()) == (3, 1)
            with host_threads.spread_kernels:             # a nested plan call changes nothing
                assert (host_threads.width(), _blas_threads()) == (3, 1)
            assert (host_threads.width(), _blas_threads()) == (3, 1)
        assert (host_threads.width(), _blas_threads()) == (1, 3)
        monkeypatch.setattr(host_threads, "_usable_cores", lambda: 2)
        with host_threads.spread_kernels:
            assert (host_threads.width(), _blas_threads()) == (2, 1)     # at most the usable cores
        monkeypatch.setenv("FLOWLAB_HOST_THREADS", "0")
        with host_threads.spread_kernels:
            assert (host_threads.width(), _blas_threads()) == (1, 3)     # turned off: BLAS keeps its threads
    with threadpool_limits(1, user_api="blas"):
        monkeypatch.delenv("FLOWLAB_HOST_THREADS")
        with host_threads.spread_kernels:
            assert (host_threads.width(), _blas_threads()) == (1, 1)


def test_a_host_plan_with_large_products_runs_its_kernels_spread(monkeypatch):
    from threadpoolctl import threadpool_limits
    if not one_blas_thread.controllers():
        pytest.skip("NumPy's BLAS cannot be controlled here")
    monkeypatch.setattr(host_threads, "_usable_cores", lambda: 2)
    seen = []
    original = C._folded_forward

    def recording(*a, **k):
        seen.append((host_threads.width(), _blas_threads()))
        return original(*a, **k)

    monkeypatch.setattr(C, "_folded_forward", recording)
    flow.clear_default_session()

    @flow.global_function()
    def conv(x: tp.Numpy.Placeholder((2, 16, 40, 40)), w: tp.Numpy.Placeholder((32, 16, 5, 5))) -> tp.Numpy:
        return flow.nn.conv2d(x, w, 1, "SAME", "NCHW")      # 2 x 40 x 40 x 32 x 400 = 41M multiply-adds

    x, w = rnd(2, 16, 40, 40, seed=11).astype(np.float32), rnd(32, 16, 5, 5, seed=12).astype(np.float32)
    with threadpool_limits(2, user_api="blas"):
        y = conv(x, w)
        assert _blas_threads() == 2
    assert seen == [(2, 1)]
    want = C.Conv2d.forward(np, x, w, strides=(1, 1), dilations=(1, 1), padding="SAME_UPPER", groups=1,
                            data_format="NCHW")
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork here")
def test_a_forked_child_starts_its_own_pool(split_everything):
    import multiprocessing
    with host_threads.using(2):
        host_threads.run([lambda: 1, lambda: 2])          # the parent's pool exists
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        assert pool.apply_async(_run_in_child).get(timeout=60) == [1, 2]


def _run_in_child():
    with host_threads.using(2):
        return host_threads.run([lambda: 1, lambda: 2])
