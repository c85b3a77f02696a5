"""OneFlow's seed programs (shared/seeds) run with only the import changed and print what the seeds show.

Each program is run as its own process, as a user would run it: the seeds' code as published, with
``import oneflow as flow`` -> ``import flowlab as flow``.
"""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]

RELU_JOB_FIXED_TENSOR_DEF = """
import numpy as np
import flowlab as flow

def cb(y):
    print("out", y.ndarray())

@flow.global_function()
def ReluJob(x=flow.FixedTensorDef((10,))):
    y = flow.nn.relu(x)
    flow.watch(y, cb)

flow.config.gpu_device_num(1)
data = np.random.uniform(-1, 1, 10).astype(np.float32)
print("in: ", data)
ReluJob(data)
"""

TRAIN_JOB_OLD_CONFIG = """
import numpy as np
import flowlab as flow

def get_cb(bn):
    def cb(x):
        blob = x.ndarray()
        print(bn, blob.shape, blob.dtype)
        # print(blob)
    return cb

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

    flow.watch(logits, get_cb("logits"))
    flow.watch_diff(logits, get_cb("logits_grad"))

    return loss

flow.train.CheckPoint().init()
images = np.random.uniform(-10, 10, (8, 1, 28, 28)).astype(np.float32)
labels = np.random.randint(-10, 10, (8,)).astype(np.int32)
loss = train_job(images, labels).get().mean()
print("loss", loss)
"""

WATCH_SCOPE = """
import numpy as np
import flowlab as flow

def get_train_config():
    config = flow.function_config()
    config.default_data_type(flow.float)
    config.train.primary_lr(0.1)
    config.train.model_update_conf({"naive_conf": {}})
    return config

tensor_watched = {}
tensor_grad_watched = {}

@flow.global_function(get_train_config())
def train_job(images=flow.FixedTensorDef((8, 1, 28, 28), dtype=flow.float),
              labels=flow.FixedTensorDef((8,), dtype=flow.int32)):
    initializer = flow.truncated_normal(0.1)
    reshape = flow.reshape(images, [images.shape[0], -1])
    hidden = flow.layers.dense(reshape, 512, activation=flow.nn.relu, kernel_initializer=initializer)
    with flow.watch_scope(tensor_watched, tensor_grad_watched):
        logits = flow.layers.dense(hidden, 10, kernel_initializer=initializer)
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
    flow.losses.add_loss(loss)

    return loss

flow.train.CheckPoint().init()
images = np.random.uniform(-10, 10, (8, 1, 28, 28)).astype(np.float32)
labels = np.random.randint(-10, 10, (8,)).astype(np.int32)
loss = train_job(images, labels).get().mean()

print("view watched blobs")
for lbn, tensor_data in tensor_watched.items():
    print(lbn)
    #print(tensor_data["blob"].ndarray())
    #print(tensor_data["blob_def"])

print("view watched grad blobs")
for lbn, tensor_data in tensor_grad_watched.items():
    print(lbn)
    #print(tensor_data["blob"].ndarray())
    #print(tensor_data["blob_def"])
"""

RELU_JOB_TYPED = """
import numpy as np
import flowlab as flow
import flowlab.typing as tp


def watch_handler(y: tp.Numpy):
    print("out:", y)


@flow.global_function()
def ReluJob(x: tp.Numpy.Placeholder((5,))) -> None:
    y = flow.nn.relu(x)
    flow.watch(y, watch_handler)


flow.config.gpu_device_num(1)
data = np.random.uniform(-1, 1, 5).astype(np.float32)
print("in:", data)
ReluJob(data)
"""

MNIST_TRAIN = """
import flowlab as flow
import flowlab.typing as tp

BATCH_SIZE = 100


def watch_diff_handler(blob: tp.Numpy):
    print("watch_diff_handler:", blob, blob.shape, blob.dtype)


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
    flow.watch_diff(logits, watch_diff_handler)
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
    # the parent's environment (packages it finds through PYTHONPATH), flowlab from this checkout, on NumPy
    env = dict(os.environ, FLOWLAB_DEVICE="cpu",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(program)], cwd=cwd, capture_output=True,
                            text=True, timeout=300, env=env)
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


def _relu_lines(out, prompt):
    lines = out.replace("\n ", " ").splitlines()     # NumPy wraps long arrays onto a second line
    data = np.array(lines[0].split("[")[1].rstrip("]").split(), dtype=np.float32)
    result = np.array(lines[1].split("[")[1].rstrip("]").split(), dtype=np.float32)
    assert lines[1].startswith(prompt)
    return data, result


@pytest.mark.parametrize("program,prompt", [(RELU_JOB_FIXED_TENSOR_DEF, "out ["), (RELU_JOB_TYPED, "out: [")],
                         ids=["fixed_tensor_def", "typed"])
def test_relu_watch_prints_the_relu_of_the_input(program, prompt, tmp_path):
    data, result = _relu_lines(_run(program, tmp_path), prompt)
    np.testing.assert_array_equal(result, np.maximum(data, 0))


def test_watch_diff_seed_prints_shapes_and_dtypes(tmp_path):
    out = _run(TRAIN_JOB_OLD_CONFIG, tmp_path).splitlines()
    assert out[:2] == ["logits (8, 10) float32", "logits_grad (8, 10) float32"]
    loss = float(out[2].split()[-1])
    assert np.isfinite(loss) and loss >= 0


def test_watch_scope_seed_prints_oneflows_names(tmp_path):
    out = _run(WATCH_SCOPE, tmp_path).splitlines()
    assert out == ["view watched blobs", "Dense_6-bias/out", "Dense_6-weight/out", "Dense_6_matmul/out_0",
                   "Dense_6_bias_add/out_0", "view watched grad blobs", "Dense_6_matmul/out_0",
                   "Dense_6_bias_add/out_0", "Dense_6-bias/out", "Dense_6-weight/out"]


def test_mnist_training_seed_learns_and_watches_the_gradient(tmp_path):
    _fake_mnist(tmp_path / "mnist.npz", n_train=6000)
    out = _run(MNIST_TRAIN, tmp_path)
    # 60 steps: 60 gradient prints of shape (100, 10), and the loss printed at steps 0, 20, 40.
    assert out.count("watch_diff_handler:") == 60 and out.count("(100, 10) float32") == 60
    losses = [float(line) for line in out.splitlines() if line and line[0].isdigit()]
    assert len(losses) == 3 and losses[-1] < losses[0] / 5
