"""Several logical devices on one machine (flow.config.gpu_device_num / cpu_device_num): programs written for
OneFlow's mirrored and consistent views run as written, n devices train exactly as one device on the whole batch,
feeds are split and results and watches joined as OneFlow did."""
import os
import subprocess
import sys
import unittest

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.errors import AnomalyError, FeedError, TraceError
from flowlab.runtime import session
from flowlab.watching import TensorStats

from oneflow_programs import (BATCH, CONSISTENT_TWO_DEVICES, MIRRORED_TWO_DEVICES, MLP_PRETRAIN,
                              printed_losses, write_mnist)

# These tests run the NumPy backend's devices (threads): on CuPy, cpu_device_num(n) means n GPUs, as gpu_device_num
# does (flowlab.config). The NCCL test at the end switches to the GPU itself.
pytestmark = pytest.mark.numpy_backend

FEATURES, HIDDEN, CLASSES = 12, 16, 5


def data(steps=5, batch=8, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(steps, batch, FEATURES)).astype(np.float32),
            rng.integers(0, CLASSES, (steps, batch)).astype(np.int32))


def mlp_loss(x, y, reduce=None):
    hidden = flow.layers.dense(x, HIDDEN, activation=flow.nn.relu, kernel_initializer=flow.truncated_normal(0.1),
                               name="hidden")
    logits = flow.layers.dense(hidden, CLASSES, kernel_initializer=flow.truncated_normal(0.1), name="output")
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
    if reduce == "mean":
        loss = flow.math.reduce_mean(loss)
    elif reduce == "sum":
        loss = flow.math.reduce_sum(loss)
    return loss


OPTIMIZERS = {
    "sgd_momentum": lambda: flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9),
    "adam": lambda: flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [0.01])),
}


def train(devices, view, optimizer, reduce=None, steps=5, batch=8):
    """Train the MLP for ``steps`` steps on ``devices`` devices; return the losses and the final variables."""
    flow.clear_default_session()
    flow.config.cpu_device_num(devices)
    config = flow.function_config()
    config.default_logical_view(flow.scope.mirrored_view() if view == "mirrored" else flow.scope.consistent_view())
    piece = batch // devices
    Arg = tp.ListNumpy if view == "mirrored" else tp.Numpy
    shape = piece if view == "mirrored" else batch

    @flow.global_function(type="train", function_config=config)
    def job(x: Arg.Placeholder((shape, FEATURES)), y: Arg.Placeholder((shape,), dtype=flow.int32)) -> tp.Numpy:
        loss = mlp_loss(x, y, reduce)
        OPTIMIZERS[optimizer]().minimize(loss)
        return loss

    xs, ys = data(steps, batch)
    losses = []
    for x, y in zip(xs, ys):
        if view == "mirrored":
            x, y = np.split(x, devices), np.split(y, devices)
        losses.append(job(x, y))
    return losses, {name: v.numpy() for name, v in session.default().variables.items()}


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("view", ["consistent", "mirrored"])
def test_two_devices_train_exactly_as_one_device_on_the_whole_batch(view, optimizer):
    one_losses, one = train(1, view, optimizer)
    two_losses, two = train(2, view, optimizer)
    assert sorted(one) == sorted(two) and any(name.endswith("-m") or name.endswith("-momentum") for name in one)
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=1e-5, atol=1e-6, err_msg=name)
    # per-example losses come back whole: concatenated in device order (tp.Numpy under mirrored view too)
    np.testing.assert_allclose(np.array(two_losses), np.array(one_losses), rtol=1e-5, atol=1e-6)
    moved = max(float(np.abs(one[n] - train(1, view, optimizer, steps=1)[1][n]).max()) for n in one)
    assert moved > 1e-3            # several steps really trained: the comparison is not between initial values


@pytest.mark.parametrize("reduce", ["mean", "sum"])
def test_consistent_view_reduced_losses_come_out_and_train_as_on_one_device(reduce):
    one_losses, one = train(1, "consistent", "sgd_momentum", reduce=reduce)
    two_losses, two = train(2, "consistent", "sgd_momentum", reduce=reduce)
    assert two_losses[0].shape == () and one_losses[0].shape == ()
    np.testing.assert_allclose(np.array(two_losses), np.array(one_losses), rtol=1e-5)
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_four_devices_train_as_one():
    _, one = train(1, "consistent", "adam", batch=16)
    _, four = train(4, "consistent", "adam", batch=16)
    for name in one:
        np.testing.assert_allclose(four[name], one[name], rtol=1e-5, atol=1e-6, err_msg=name)


# ------------------------------------------------------------------------------------- user programs
# Two-device programs as a OneFlow 0.x user writes them (tests/oneflow_programs.py), each run as its own process.

def run_program(directory, source, n_train):
    """Run ``source`` as ``python program.py`` in ``directory`` beside a generated mnist.npz of ``n_train`` training
    images; return the losses it printed, by step."""
    directory.mkdir(exist_ok=True)
    write_mnist(directory, n_train=n_train, n_test=BATCH)
    (directory / "program.py").write_text(source)
    env = dict(os.environ, FLOWLAB_DEVICE="cpu")
    done = subprocess.run([sys.executable, "program.py"], cwd=directory, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    return printed_losses(done.stdout)


def test_mirrored_program_on_two_devices_prints_the_one_device_programs_losses(tmp_path):
    two = run_program(tmp_path / "two", MIRRORED_TWO_DEVICES, n_train=21 * BATCH)
    one = run_program(tmp_path / "one", MLP_PRETRAIN, n_train=21 * BATCH)      # the same MLP on one device
    assert sorted(two) == [0, 10, 20] and all(np.isfinite(list(two.values())))
    assert two[20] < two[0]
    np.testing.assert_allclose([two[s] for s in sorted(two)], [one[s] for s in sorted(two)], rtol=1e-5)


def test_consistent_program_runs_on_two_devices(tmp_path):
    losses = run_program(tmp_path, CONSISTENT_TWO_DEVICES, n_train=2 * BATCH)
    assert list(losses) == [0] and np.isfinite(losses[0])


def test_mirrored_returns_each_devices_piece_and_blobs_give_both():
    flow.config.cpu_device_num(2)
    config = flow.function_config()
    config.default_distribute_strategy(flow.scope.mirrored_view())     # OneFlow 0.2's name

    @flow.global_function(function_config=config)
    def double(x: tp.ListNumpy.Placeholder((3,))) -> tp.ListNumpy:
        return x * 2

    @flow.global_function(function_config=config)
    def double_blob(x: tp.ListNumpy.Placeholder((3,))):
        return x * 2

    a, b = np.arange(3, dtype=np.float32), np.arange(2, dtype=np.float32) + 10    # pieces of different lengths
    out = double([a, b])
    assert len(out) == 2 and np.array_equal(out[0], a * 2) and np.array_equal(out[1], b * 2)
    blob = double_blob([a, b]).get()
    assert [list(p) for p in blob.ndarray_list()] == [list(a * 2), list(b * 2)]
    assert np.array_equal(blob.numpy(), np.concatenate([a, b]) * 2)


def test_consistent_view_splits_the_batch_and_joins_results_as_one_device():
    flow.config.gpu_device_num(2)
    seen = []

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        flow.watch(x, lambda piece: seen.append(piece.numpy().shape))       # the logical blob, as OneFlow
        return flow.math.reduce_max(x * 2, axis=0)

    @flow.global_function()
    def as_list(x: tp.Numpy.Placeholder((4, 3))) -> tp.ListNumpy:
        return x + 1

    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    assert np.array_equal(job(x), (x * 2).max(0))
    flow.sync_default_session()
    assert seen == [(4, 3)]
    out = as_list(x)                       # a consistent blob's list holds its one logical value
    assert len(out) == 1 and np.array_equal(out[0], x + 1)


def test_consistent_results_flowlab_cannot_join_are_an_error_naming_them():
    flow.config.cpu_device_num(2)

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        return flow.transpose(x, perm=[1, 0])           # the batch axis moves: its pieces are not rows any more

    @flow.global_function()
    def fine(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        return flow.math.reduce_mean(x, axis=0) * 2 + 1

    x = np.abs(np.random.default_rng(0).normal(size=(4, 3))).astype(np.float32)
    with pytest.raises(TraceError, match=r"cannot tell how the devices' values of Transpose_\d+/out_0"):
        job(x)
    np.testing.assert_allclose(fine(x), x.mean(0) * 2 + 1, rtol=1e-6)


# ---------------------------------------------------------------------------------------------------- feeds

def test_list_feeds_with_the_wrong_number_of_pieces_name_the_argument():
    flow.config.cpu_device_num(2)
    config = flow.function_config()
    config.default_logical_view(flow.scope.mirrored_view())

    @flow.global_function(function_config=config)
    def job(images: tp.ListNumpy.Placeholder((2, 3))) -> tp.ListNumpy:
        return images + 1

    piece = np.zeros((2, 3), np.float32)
    with pytest.raises(FeedError, match=r"argument 'images': expected a list of 2 numpy.ndarray, one for each of the "
                                        r"2 devices .* got list of length 1"):
        job([piece])
    with pytest.raises(FeedError, match=r"argument 'images' \(piece 1\): expected dtype float32, got float64"):
        job([piece, piece.astype(np.float64)])
    assert len(job([piece, piece])) == 2


def test_a_consistent_batch_must_split_evenly():
    flow.config.cpu_device_num(2)

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((3, 2))) -> tp.Numpy:
        return x + 1

    with pytest.raises(FeedError, match=r"argument 'x': the consistent view splits the batch .* evenly over 2 "
                                        r"devices, but shape \(3, 2\) has 3 rows"):
        job(np.zeros((3, 2), np.float32))


# ---------------------------------------------------------------------------------------------------- watches

def test_watches_deliver_per_device_pieces_under_the_mirrored_view():
    flow.config.cpu_device_num(2)
    config = flow.function_config()
    config.default_logical_view(flow.scope.mirrored_view())
    got = {}

    def as_list(y: tp.ListNumpy):
        got["list"] = y

    def as_numpy(y: tp.Numpy):
        got["numpy"] = y

    def as_blob(y):
        got["blob"] = y.numpy_list()

    def stats(s: TensorStats):
        got["stats"] = s

    @flow.global_function(function_config=config)
    def job(x: tp.ListNumpy.Placeholder((2, 3))) -> None:
        y = flow.nn.relu(x)
        flow.watch(y, as_list)
        flow.watch(y, as_numpy)
        flow.watch(y, as_blob)
        flow.watch(y, stats, stats=True)

    a, b = -np.ones((2, 3), np.float32), np.arange(6, dtype=np.float32).reshape(2, 3)
    job([a, b])
    flow.sync_default_session()
    assert len(got["list"]) == 2 and np.array_equal(got["list"][0], np.maximum(a, 0)) and \
        np.array_equal(got["list"][1], b)
    assert np.array_equal(got["numpy"], np.maximum(np.concatenate([a, b]), 0))
    assert [p.tolist() for p in got["blob"]] == [p.tolist() for p in got["list"]]
    assert got["stats"].shape == (4, 3) and got["stats"].max == 5 and got["stats"].min == 0


def test_watch_diff_on_two_devices_gives_the_one_device_gradients():
    def run(devices):
        flow.clear_default_session()
        flow.config.cpu_device_num(devices)
        got = {}

        @flow.global_function(type="train")
        def job(x: tp.Numpy.Placeholder((8, FEATURES)), y: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> None:
            loss = mlp_loss(x, y)
            flow.watch_diff(flow.get_variable("hidden-weight", shape=(HIDDEN, FEATURES)),
                            lambda g: got.setdefault("weight", g.numpy()))
            hidden = flow.get_variable("output-bias", shape=(CLASSES,))
            flow.watch_diff(hidden, lambda g: got.setdefault("bias", g.numpy()))
            flow.optimizer.SGD(0.1, momentum=0).minimize(loss)

        xs, ys = data(1)
        job(xs[0], ys[0])
        flow.sync_default_session()
        return got

    one, two = run(1), run(2)
    for name in ("weight", "bias"):
        np.testing.assert_allclose(two[name], one[name], rtol=1e-5, atol=1e-7, err_msg=name)


# ---------------------------------------------------------------------------------------------------- misc

def test_a_failure_on_one_device_is_raised_and_the_next_call_runs():
    flow.config.cpu_device_num(2)
    config = flow.function_config()
    config.detect_anomaly(True)

    @flow.global_function(type="train", function_config=config)
    def job(x: tp.Numpy.Placeholder((8, FEATURES)), y: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
        loss = mlp_loss(x, y)
        flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
        return loss

    xs, ys = data(2)
    bad = xs[0].copy()
    bad[6, 0] = np.nan                     # only the second device's piece
    with pytest.raises(AnomalyError, match="argument"):
        job(bad, ys[0])
    assert np.all(np.isfinite(job(xs[1], ys[1])))


def test_one_device_plans_have_no_replica_code_and_the_device_count_is_a_session_setting():
    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((8, FEATURES)), y: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
        loss = mlp_loss(x, y)
        flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
        return loss

    assert "R." not in job.plan().source
    flow.config.cpu_device_num(2)
    xs, ys = data(1)
    job(xs[0], ys[0])
    assert "R.all_reduce(0," in job.plan().source and "R.release(0)" in job.plan().source
    assert flow.config.device_num() == 2
    flow.clear_default_session()
    assert flow.config.device_num() == 1
    with pytest.raises(ValueError, match=r"cpu_device_num\(9\): flowlab runs on at most 8 device"):
        flow.config.cpu_device_num(9)


def test_skip_unless_1n2d_tests_run_with_two_cpu_devices(monkeypatch):
    monkeypatch.setenv("ONEFLOW_TEST_DEVICE_NUM", "2")
    monkeypatch.delenv("ONEFLOW_TEST_NODE_LIST", raising=False)
    ran = []

    @flow.unittest.skip_unless_1n2d()
    class TestTwoDevices(flow.unittest.TestCase):
        def test_mirrored_relu(test_case):
            flow.config.cpu_device_num(flow.unittest.env.device_num())
            config = flow.function_config()
            config.default_logical_view(flow.scope.mirrored_view())

            @flow.global_function(function_config=config)
            def relu_job(x: tp.ListNumpy.Placeholder((5,))) -> tp.ListNumpy:
                with flow.scope.placement("cpu", "0:0-1"):
                    return flow.nn.relu(x)

            x = [np.array([-1, 2, -3, 4, 5], np.float32), np.array([1, -2, 3, -4, 5], np.float32)]
            out = relu_job(x)
            test_case.assertEqual(len(out), 2)
            test_case.assertTrue(np.array_equal(out[1], np.maximum(x[1], 0)))
            ran.append(True)

    result = unittest.TextTestRunner(stream=open(os.devnull, "w")).run(
        unittest.defaultTestLoader.loadTestsFromTestCase(TestTwoDevices))
    assert result.wasSuccessful() and not result.skipped and ran == [True]


@pytest.mark.gpu
def test_two_gpus_train_as_one_with_nccl():
    """Unverified here (no GPU on the development machine): replicas on GPU 0 and 1, NCCL reduce and broadcast."""
    import cupy
    from flowlab.runtime import backend
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    backend.use("gpu")
    try:
        _, one = train(1, "consistent", "adam")
        _, two = train(2, "consistent", "adam")
        for name in one:
            np.testing.assert_allclose(two[name], one[name], rtol=1e-5, atol=1e-6)
    finally:
        backend.use("cpu")



def test_a_reshape_to_the_logical_batch_size_trains_on_two_devices_as_on_one():
    """OneFlow's consistent view shows logical shapes: a program that writes its batch size into a reshape (as
    flowlab's own digits example does) runs on several devices, each reshaping its share of the batch."""
    rng = np.random.default_rng(5)
    x = rng.random((100, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, 100).astype(np.int32)

    def run(n):
        flow.clear_default_session()
        flow.config.cpu_device_num(n)
        flow.config.seed(0)

        @flow.global_function(type="train")
        def train(images: tp.Numpy.Placeholder((100, 1, 8, 8)),
                  labels: tp.Numpy.Placeholder((100,), dtype=flow.int32)) -> tp.Numpy:
            flat = flow.reshape(images, [100, -1])          # the logical batch size, written out
            logits = flow.layers.dense(flat, 10, name="head")
            loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
            return loss

        losses = [train(x, y) for _ in range(3)]
        return losses, {k: v.numpy() for k, v in session.default().variables.items()}

    one, two = run(1), run(2)
    assert [l.shape for l in two[0]] == [(100,)] * 3
    np.testing.assert_allclose(two[0], one[0], rtol=1e-5, atol=1e-6)
    assert two[1].keys() == one[1].keys()
    for name in one[1]:
        np.testing.assert_allclose(two[1][name], one[1][name], rtol=1e-5, atol=1e-6, err_msg=name)
