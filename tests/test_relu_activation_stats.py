"""``ops.nn.ReluActivationStats`` (a ReLU and ``watch_health``'s activation statistics of its output in one compiled
pass) against its twins (``Relu`` then ``ActivationStats``, compiled and NumPy) and a float64 reference, and the
compiler pass ``fuse_activation_stats`` that makes it: where it applies, where it does not, and health reports that
say the same with it."""
import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.ops import nn
from flowlab.ops.nn import Relu, ReluActivationStats
from flowlab.ops.stats import ActivationStats
from flowlab.runtime import jit

pytestmark = pytest.mark.skipif(not jit.available(), reason="numba is not installed")

NAMES = ["act_mean_abs", "act_std", "act_zero_fraction", "act_max_abs", "dead_fraction", "act_nan", "act_inf"]


@pytest.fixture
def calls(monkeypatch):
    """How many times the compiled kernel ran."""
    count = []
    kernel = nn._relu_activation_float32
    compiled = kernel.compile()
    spy = jit.Kernel(kernel.function, reduce=True)
    spy.compiled = lambda *args: (count.append(1), compiled(*args))[1]
    monkeypatch.setattr(nn, "_relu_activation_float32", spy)
    return count


def reference(x, unit_axis=-1):
    """``activation_vector`` of ``max(x, 0)`` in float64, written out."""
    y = np.maximum(x.astype(np.float64), 0)
    axes = tuple(a for a in range(y.ndim) if a != unit_axis % y.ndim)
    return np.array([y.mean(), y.std(), (y == 0).mean(), y.max(), (y == 0).all(axis=axes).mean(), 0, 0])


def separate(x, unit_axis=-1):
    """The twins: ``Relu`` then ``ActivationStats`` (under the caller's ``jit.using``)."""
    y = Relu.forward(np, x.copy())
    return y, ActivationStats.forward(np, y, unit_axis, True, None)


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (100, 128), (3, 5, 7), (5, 26_215)])   # the last: 131k + ...
@pytest.mark.parametrize("inplace", [True, False], ids=["in-place", "new-output"])
def test_fused_pass_matches_relu_then_statistics(shape, inplace, calls):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) + 0.2).astype(np.float32)
    x.reshape(-1)[::11] = 0
    source = x.copy()
    with jit.using(True):
        y, vector = ReluActivationStats.forward(np, source, -1, None, out=source if inplace else None)
        expected_y, compiled = separate(x)
    assert calls, "the compiled pass did not run"
    assert (y is source) == inplace
    np.testing.assert_array_equal(y, expected_y)
    np.testing.assert_array_equal(vector, compiled)         # the same sums as ActivationStats' compiled pass
    with jit.using(False):
        np.testing.assert_allclose(vector, separate(x)[1], rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(vector, reference(x), rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("planted", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_are_counted_as_the_twins_count_them(planted, calls):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((40, 33)).astype(np.float32)
    x[3, 4], x[7, 0], x[9, 9] = planted, -0.0, planted
    with jit.using(True):
        y, vector = ReluActivationStats.forward(np, x.copy(), 1, None)
    assert calls
    with jit.using(False):
        expected_y, expected = separate(x, 1)
    np.testing.assert_array_equal(y, expected_y)            # NaN stays NaN, -inf becomes 0
    assert np.signbit(y[7, 0]) and y[7, 0] == 0             # -0.0 stays -0.0, as Relu's clip leaves it
    np.testing.assert_allclose(vector, expected, rtol=1e-6, equal_nan=True)
    assert vector[5:].tolist() == expected[5:].tolist() and vector[5:].sum() == (0 if planted == -np.inf else 2)


def test_a_spread_small_next_to_the_mean_takes_the_centred_second_pass(calls):
    x = (1000 + np.random.default_rng(2).standard_normal((64, 50)) * 1e-3).astype(np.float32)
    with jit.using(True):
        vector = ReluActivationStats.forward(np, x.copy(), 1, None)[1]
    assert calls
    assert vector[1] == pytest.approx(x.astype(np.float64).std(), rel=1e-3)


@pytest.mark.parametrize("case", ["units-first", "non-contiguous", "float64", "kernels-off"])
def test_what_the_kernel_does_not_take_runs_the_twins(case, calls):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((24, 10, 6)).astype(np.float32)
    unit_axis, on = -1, True
    if case == "units-first":
        unit_axis = 1
    elif case == "non-contiguous":
        x = x.transpose(2, 0, 1)
    elif case == "float64":
        x = x.astype(np.float64)
    else:
        on = False
    with jit.using(on):
        y, vector = ReluActivationStats.forward(np, x, unit_axis, None)      # a new output: x is left as it is
        expected_y, expected = separate(x, unit_axis)
    assert not calls
    np.testing.assert_array_equal(y, expected_y)
    np.testing.assert_array_equal(vector, expected)
    np.testing.assert_allclose(vector, reference(x, unit_axis), rtol=1e-5, atol=1e-12)


# ------------------------------------------------------------------------------------------------ the pass

def health_job(reports, hidden_values=None, every=1):
    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((32, 20)), y: tp.Numpy.Placeholder((32,), dtype=flow.int32)) -> tp.Numpy:
        h = flow.layers.dense(x, 48, activation=flow.nn.relu, name="hidden",
                              bias_initializer=flow.constant_initializer(-0.3))
        if hidden_values is not None:
            flow.watch(h, lambda blob: hidden_values.append(blob.numpy().copy()))
        logits = flow.layers.dense(h, 5, name="output")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.watch_health(reports.append, every=every)
        flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
        return loss
    return job


def batches(steps):
    rng = np.random.default_rng(0)
    for _ in range(steps):
        yield rng.standard_normal((32, 20)).astype(np.float32), rng.integers(0, 5, 32).astype(np.int32)


def fused_nodes(job):
    return str(job.compiled().plan).count("(ReluActivationStats)")


def test_health_reports_take_the_statistics_from_the_fused_relu():
    reports, hidden = [], []
    job = health_job(reports, hidden)
    with jit.using(True):
        for x, y in batches(3):
            job(x, y)
        flow.sync_default_session()
        assert fused_nodes(job) == 1
        for report, h in zip(reports, hidden):
            expected = ActivationStats.forward(np, h, 1, True, None)     # the unfused op's compiled pass
            assert [report.table["hidden"][name] for name in NAMES] == pytest.approx(expected, rel=1e-12, abs=0)
    assert len(reports) == len(hidden) == 3 and 0 < reports[0].table["hidden"]["act_zero_fraction"] < 1


def test_no_fusion_with_kernels_off_or_statistics_not_taken_every_call():
    with jit.using(False):
        job = health_job([])
        job(*next(batches(1)))
        assert fused_nodes(job) == 0
    with jit.using(True):
        job = health_job([], every=2)
        for x, y in batches(2):
            job(x, y)
        flow.sync_default_session()
        assert fused_nodes(job) == 0
