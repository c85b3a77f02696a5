"""The training code of OneFlow's seed programs (shared/seeds) runs with only the import changed.

Each program is run as its own process, as a user would run it. Watch lines come with the watching feature and are
left out here; the rest is the seeds' code as published, with ``import oneflow as flow`` -> ``import flowlab as flow``.
"""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

RELU_JOB_FIXED_TENSOR_DEF = """
import numpy as np
import flowlab as flow

@flow.global_function()
def ReluJob(x=flow.FixedTensorDef((10,))):
    y = flow.nn.relu(x)

flow.config.gpu_device_num(1)
data = np.random.uniform(-1, 1, 10).astype(np.float32)
print("in: ", data)
ReluJob(data)
"""

TRAIN_JOB_OLD_CONFIG = """
import numpy as np
import flowlab as flow

def get_train_config():
    config = flow.function_config()
    config.default_data_type(flow.float)
    config.train.primary_lr(0.1)
    config.train.model_update_conf({"naive_conf": {}})
    return config

@flow.global_function(get_train_config())
def train_job(images=flow.FixedTensorDef((8, 1, 28, 28), dtype=flow.float),
              labels=flow.FixedTensorDef((8,), dtype=flow.int32)):
    initializer = flow.truncated_normal(0.1)
    reshape = flow.reshape(images, [images.shape[0], -1])
    hidden = flow.layers.dense(reshape, 512, activation=flow.nn.relu, kernel_initializer=initializer)
    logits = flow.layers.dense(hidden, 10, kernel_initializer=initializer)
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
    flow.losses.add_loss(loss)

    return loss

flow.train.CheckPoint().init()
images = np.random.uniform(-10, 10, (8, 1, 28, 28)).astype(np.float32)
labels = np.random.randint(-10, 10, (8,)).astype(np.int32)
loss = train_job(images, labels).get().mean()
print("loss", loss)
"""

RELU_JOB_TYPED = """
import numpy as np
import flowlab as flow
import flowlab.typing as tp


@flow.global_function()
def ReluJob(x: tp.Numpy.Placeholder((5,))) -> None:
    y = flow.nn.relu(x)


flow.config.gpu_device_num(1)
data = np.random.uniform(-1, 1, 5).astype(np.float32)
print("in:", data)
ReluJob(data)
"""

MNIST_TRAIN = """
import flowlab as flow
import flowlab.typing as tp

BATCH_SIZE = 100


def get_train_config():
    config = flow.function_config()
    config.default_data_type(flow.float)
    return config


@flow.global_function(type="train", function_config=get_train_config())
def train_job(
    images: tp.Numpy.Placeholder((BATCH_SIZE, 1, 28, 28), dtype=flow.float),
    labels: tp.Numpy.Placeholder((BATCH_SIZE,), dtype=flow.int32),
) -> tp.Numpy:
    with flow.scope.placement("cpu", "0:0"):
        initializer = flow.truncated_normal(0.1)
        reshape = flow.reshape(images, [images.shape[0], -1])
        hidden = flow.layers.dense(
            reshape,
            512,
            activation=flow.nn.relu,
            kernel_initializer=initializer,
            name="hidden",
        )
        logits = flow.layers.dense(
            hidden, 10, kernel_initializer=initializer, name="output"
        )
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)

    lr_scheduler = flow.optimizer.PiecewiseConstantScheduler([], [0.1])
    flow.optimizer.SGD(lr_scheduler, momentum=0).minimize(loss)
    return loss


if __name__ == "__main__":
    check_point = flow.train.CheckPoint()
    check_point.init()

    (train_images, train_labels), (test_images, test_labels) = flow.data.load_mnist(
        BATCH_SIZE
    )
    for i, (images, labels) in enumerate(zip(train_images, train_labels)):
        loss = train_job(images, labels)
        if i % 20 == 0:
            print(loss.mean())
"""


def _run(program, cwd):
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(program)], cwd=cwd, capture_output=True,
                            text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "FLOWLAB_DEVICE": "cpu"})
    assert result.returncode == 0, result.stderr
    return result.stdout


def _fake_mnist(path, n_train=1000, n_test=200):
    """A learnable stand-in for mnist.npz: each class lights up its own 28x28 band."""
    rng = np.random.default_rng(0)

    def make(n):
        y = rng.integers(0, 10, n).astype(np.uint8)
        x = rng.integers(0, 60, (n, 28, 28)).astype(np.uint8)
        for i, label in enumerate(y):
            x[i, label * 2:label * 2 + 3, :] = 255
        return x, y

    (xtr, ytr), (xte, yte) = make(n_train), make(n_test)
    np.savez(path, x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)


@pytest.mark.parametrize("program", [RELU_JOB_FIXED_TENSOR_DEF, RELU_JOB_TYPED], ids=["fixed_tensor_def", "typed"])
def test_relu_jobs_run(program, tmp_path):
    out = _run(program, tmp_path)
    assert out.startswith("in:")


def test_old_style_train_job_runs_with_out_of_range_labels(tmp_path):
    out = _run(TRAIN_JOB_OLD_CONFIG, tmp_path)
    loss = float(out.split()[-1])
    assert np.isfinite(loss) and loss >= 0


def test_mnist_training_seed_loss_falls(tmp_path):
    _fake_mnist(tmp_path / "mnist.npz", n_train=6000)
    out = _run(MNIST_TRAIN, tmp_path)
    losses = [float(v) for v in out.split()]
    assert len(losses) == 3 and losses[-1] < losses[0] / 5
