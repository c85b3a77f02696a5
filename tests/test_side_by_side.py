"""The compiler's ``side_by_side`` pass (``compiler.side_by_side``): a convolution's input and filter gradients run
as one node, each kernel whole on its own host thread; a small ResNet trains as it does without the pass; which
nodes pair and which do not."""
import threading

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.compiler import passes
from flowlab.compiler.side_by_side import SideBySide, pair_side_by_side
from flowlab.examples import resnet
from flowlab.ops import conv as C
from flowlab.runtime import backend as backend_module
from flowlab.runtime import host_threads
from flowlab.runtime.backend import one_blas_thread

pytestmark = pytest.mark.numpy_backend        # a host plan's threads


@pytest.fixture
def spread_small_plans(monkeypatch):
    """Small products count as large: plans spread kernels over two host threads (no second stream, which takes
    plans of middling products) and pairs form."""
    if not one_blas_thread.controllers():
        pytest.skip("NumPy's BLAS cannot be controlled here")
    monkeypatch.setenv("FLOWLAB_SIDE_STREAM", "0")
    monkeypatch.setattr(host_threads, "_usable_cores", lambda: 2)
    monkeypatch.setattr(host_threads, "SPLIT_MACS", 1)
    monkeypatch.setattr(backend_module, "ONE_BLAS_THREAD_BELOW", 1)
    monkeypatch.setattr(passes, "ONE_BLAS_THREAD_BELOW", 1)
    from threadpoolctl import threadpool_limits
    with threadpool_limits(2, user_api="blas"):
        yield


def test_the_two_kernels_run_at_once_each_on_one_thread():
    """Both kernels wait at one barrier: they can only pass it running at the same time, on two threads; each sees
    one thread for its own work."""
    barrier, seen = threading.Barrier(2, timeout=10), []

    def kernel(xp, a, b, scale):
        barrier.wait()
        seen.append((threading.get_ident(), host_threads.width()))
        return (a + b) * scale

    a, b, c = np.ones(3), np.arange(3.0), np.full(3, 2.0)
    with host_threads.using(2):
        first, second = SideBySide.forward(np, a, b, c, a, first=lambda xp, *x: kernel(xp, *x, scale=1),
                                           second=lambda xp, *x: kernel(xp, *x, scale=-1), arity=2, members=())
    np.testing.assert_array_equal(first, a + b)
    np.testing.assert_array_equal(second, -(c + a))
    assert len({ident for ident, _ in seen}) == 2 and {width for _, width in seen} == {1}


def test_on_one_thread_they_run_one_after_the_other():
    order = []
    first, second = SideBySide.forward(np, np.ones(2), first=lambda xp, a: order.append(1) or a,
                                       second=lambda xp: order.append(2) or 5, arity=1, members=())
    assert order == [1, 2] and second == 5


def _train(dtype, steps=3):
    """Losses and variables after ``steps`` calls of a two-stage ResNet's train job, and its plan."""
    flow.clear_default_session()
    job = resnet.train_job(batch_size=2, image_size=32, depth=(1, 2), width=0.25, classes=10, lr=0.05,
                           momentum=0.9, dtype=dtype)
    rng = np.random.default_rng(3)
    np_dtype = np.float64 if dtype == flow.float64 else np.float32
    losses = []
    for _ in range(steps):
        images = rng.standard_normal((2, 3, 32, 32)).astype(np_dtype)
        losses.append(float(job(images, rng.integers(0, 10, 2).astype(np.int32))))
    return np.array(losses), {n: v.numpy().copy() for n, v in flow.get_all_variables().items()}, job.plan()


@pytest.mark.parametrize("dtype, rtol", [(flow.float64, 1e-12), (flow.float32, 2e-5)], ids=["float64", "float32"])
def test_a_resnet_trains_with_pairs_as_without(spread_small_plans, monkeypatch, dtype, rtol):
    """Paired and unpaired, each gradient is the same kernel on the same values (unpaired split over two threads):
    losses, weights, momenta and moving statistics agree to rounding over three SGD-momentum steps."""
    paired, paired_vars, paired_plan = _train(dtype)
    monkeypatch.setattr(C.ConvInputGrad, "side_by_side", None)
    alone, alone_vars, alone_plan = _train(dtype)
    pairs = [n for n in paired_plan.nodes if n.op is SideBySide]
    convs = [n for n in paired_plan.nodes if n.op is C.Conv2d]
    # every convolution but the stem (its input needs no gradient) pairs its two gradients
    assert len(pairs) == len(convs) - 1 and not any(n.op is SideBySide for n in alone_plan.nodes)
    assert dict(paired_plan.passes)["side_by_side"] == f"{len(pairs)} pairs side by side"
    for pair in pairs:
        first, second = pair.attrs["members"]
        assert (first.op, second.op) == (C.ConvInputGrad, C.ConvFilterGrad)
        assert pair.outputs == first.outputs + second.outputs and first.inputs[0] is second.inputs[1]
    np.testing.assert_allclose(paired, alone, rtol=rtol)
    assert paired_vars.keys() == alone_vars.keys()
    for name in alone_vars:
        np.testing.assert_allclose(paired_vars[name], alone_vars[name], rtol=rtol, atol=rtol, err_msg=name)


def test_a_pair_does_not_form_where_an_update_in_between_changes_what_the_later_one_reads(monkeypatch):
    """The filter gradient moves up to the input gradient's place: with an update in between of a variable it reads
    (here the convolution's input is a variable too) it would read the changed value, so those two stay apart.
    Products below ``SPLIT_MACS`` stay apart as well (a hand-off costs more than it saves)."""
    flow.clear_default_session()

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((1,))) -> tp.Numpy:
        v = flow.get_variable("v", shape=(2, 8, 16, 16), initializer=flow.random_normal_initializer())
        w = flow.get_variable("w", shape=(8, 8, 3, 3), initializer=flow.random_normal_initializer())
        loss = flow.math.reduce_mean(flow.nn.conv2d(v, w, 1, "SAME", "NCHW")) + flow.math.reduce_sum(x)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss

    nodes = list(job.plan().graph.nodes)
    dx = next(n for n in nodes if n.op is C.ConvInputGrad)
    dw = next(n for n in nodes if n.op is C.ConvFilterGrad)
    v_update = next(n for n in nodes if n.op.updates_variable and n.inputs[1] is dx.output)
    monkeypatch.setattr(host_threads, "SPLIT_MACS", 1)
    paired, count = pair_side_by_side(nodes)
    assert count == 1 and [n.op for n in paired].count(SideBySide) == 1 and dw not in paired
    reordered = [n for n in nodes if n is not v_update]
    reordered.insert(reordered.index(dw), v_update)          # v changes between the two: a valid order
    assert pair_side_by_side(reordered)[1] == 0
    monkeypatch.setattr(host_threads, "SPLIT_MACS", 1 << 40)
    assert pair_side_by_side(nodes)[1] == 0
