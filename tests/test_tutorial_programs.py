"""OneFlow 0.x tutorial programs (oneflow-documentation's quick start and basics topics) run with only the import
changed: LeNet (conv2d, max_pool2d, dropout, dense) trains, saves with ``flow.train.CheckPoint`` and a second program
loads it; the MLP of the model loading/saving tutorial is fine-tuned with an extra layer the checkpoint lacks; the
asynchronous programs hand results to ``tp.Callback`` functions.

Each program runs as ``__main__`` in a fresh session, in a working directory holding a small generated
``mnist.npz`` (present, so ``flow.data.load_mnist`` reads it and downloads nothing): the programs' own data code runs.
Epoch counts are cut to keep the test short; everything else is the tutorials' text."""
import io
import math
import re

import numpy as np
import pytest

import flowlab as flow

# ---------------------------------------------------------------------------------------------------- the programs

LENET = '''
import numpy as np
import flowlab as flow
import flowlab.typing as tp

BATCH_SIZE = 100


def lenet(data, train=False):
    initializer = flow.truncated_normal(0.1)
    conv1 = flow.layers.conv2d(
        data,
        32,
        5,
        padding="SAME",
        activation=flow.nn.relu,
        name="conv1",
        kernel_initializer=initializer,
    )
    pool1 = flow.nn.max_pool2d(
        conv1, ksize=2, strides=2, padding="SAME", name="pool1", data_format="NCHW"
    )
    conv2 = flow.layers.conv2d(
        pool1,
        64,
        5,
        padding="SAME",
        activation=flow.nn.relu,
        name="conv2",
        kernel_initializer=initializer,
    )
    pool2 = flow.nn.max_pool2d(
        conv2, ksize=2, strides=2, padding="SAME", name="pool2", data_format="NCHW"
    )
    reshape = flow.reshape(pool2, [pool2.shape[0], -1])
    hidden = flow.layers.dense(
        reshape,
        512,
        activation=flow.nn.relu,
        kernel_initializer=initializer,
        name="dense1",
    )
    if train:
        hidden = flow.nn.dropout(hidden, rate=0.5, name="dropout")
    return flow.layers.dense(hidden, 10, kernel_initializer=initializer, name="dense2")
'''

LENET_TRAIN = LENET + '''

@flow.global_function(type="train")
def train_job(
    images: tp.Numpy.Placeholder((BATCH_SIZE, 1, 28, 28), dtype=flow.float),
    labels: tp.Numpy.Placeholder((BATCH_SIZE,), dtype=flow.int32),
) -> tp.Numpy:
    with flow.scope.placement("gpu", "0:0"):
        logits = lenet(images, train=True)
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(
            labels, logits, name="softmax_loss"
        )

    lr_scheduler = flow.optimizer.PiecewiseConstantScheduler([], [0.1])
    flow.optimizer.SGD(lr_scheduler, momentum=0).minimize(loss)
    return loss


if __name__ == "__main__":
    flow.config.gpu_device_num(1)
    check_point = flow.train.CheckPoint()
    check_point.init()

    (train_images, train_labels), (test_images, test_labels) = flow.data.load_mnist(
        BATCH_SIZE, BATCH_SIZE
    )

    for epoch in range(2):  # 20 in the tutorial
        for i, (images, labels) in enumerate(zip(train_images, train_labels)):
            loss = train_job(images, labels)
            if i % 20 == 0:
                print(loss.mean())
    check_point.save("./lenet_models_1")  # need remove the existed folder
    print("model saved")
'''

LENET_EVAL = LENET + '''
from typing import Tuple


@flow.global_function(type="predict")
def eval_job(
    images: tp.Numpy.Placeholder((BATCH_SIZE, 1, 28, 28), dtype=flow.float),
    labels: tp.Numpy.Placeholder((BATCH_SIZE,), dtype=flow.int32),
) -> Tuple[tp.Numpy, tp.Numpy]:
    with flow.scope.placement("gpu", "0:0"):
        logits = lenet(images, train=False)
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(
            labels, logits, name="softmax_loss"
        )

    return (labels, logits)


g_total = 0
g_correct = 0


def acc(labels, logits):
    global g_total
    global g_correct

    predictions = np.argmax(logits, 1)
    right_count = np.sum(predictions == labels)
    g_total += labels.shape[0]
    g_correct += right_count


def main():
    check_point = flow.train.CheckPoint()
    check_point.load("./lenet_models_1")
    (train_images, train_labels), (test_images, test_labels) = flow.data.load_mnist(
        BATCH_SIZE, BATCH_SIZE
    )

    for i, (images, labels) in enumerate(zip(test_images, test_labels)):
        labels, logits = eval_job(images, labels)
        acc(labels, logits)

    print("accuracy: {0:.1f}%".format(g_correct * 100 / g_total))


if __name__ == "__main__":
    main()
'''

MLP_HEAD = '''
import flowlab as flow
import flowlab.typing as tp

BATCH_SIZE = 100


@flow.global_function(type="train")
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
            name="dense1",
        )
        dense2 = flow.layers.dense(
            hidden, 10, kernel_initializer=initializer, name="dense2"
        )
'''

MLP_ORIGIN = MLP_HEAD + '''
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, dense2)

    lr_scheduler = flow.optimizer.PiecewiseConstantScheduler([], [0.1])
    flow.optimizer.SGD(lr_scheduler, momentum=0).minimize(loss)

    return loss


if __name__ == "__main__":
    check_point = flow.train.CheckPoint()
    check_point.init()

    (train_images, train_labels), (test_images, test_labels) = flow.data.load_mnist(
        BATCH_SIZE, BATCH_SIZE
    )
    for i, (images, labels) in enumerate(zip(train_images, train_labels)):
        loss = train_job(images, labels)
        if i % 20 == 0:
            print(loss.mean())
    check_point.save("./mlp_models_1")
'''

MLP_FINETUNE = MLP_HEAD + '''

        dense3 = flow.layers.dense(
            dense2, 10, kernel_initializer=initializer, name="dense3"
        )
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, dense3)

    lr_scheduler = flow.optimizer.PiecewiseConstantScheduler([], [0.1])
    flow.optimizer.SGD(lr_scheduler, momentum=0).minimize(loss)

    return loss


if __name__ == "__main__":
    check_point = flow.train.CheckPoint()
    check_point.load("./mlp_models_1")

    (train_images, train_labels), (test_images, test_labels) = flow.data.load_mnist(
        BATCH_SIZE, BATCH_SIZE
    )
    for i, (images, labels) in enumerate(zip(train_images, train_labels)):
        loss = train_job(images, labels)
        if i % 20 == 0:
            print(loss.mean())
    check_point.save("./mlp_ext_models_1")
'''

ASYNC_TRAIN = '''
import flowlab as flow
import flowlab.typing as tp

BATCH_SIZE = 100


@flow.global_function(type="train")
def train_job(
    images: tp.Numpy.Placeholder((BATCH_SIZE, 1, 28, 28), dtype=flow.float),
    labels: tp.Numpy.Placeholder((BATCH_SIZE,), dtype=flow.int32),
) -> tp.Callback[tp.Numpy]:
    # mlp
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

    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(
        labels, logits, name="softmax_loss"
    )
    lr_scheduler = flow.optimizer.PiecewiseConstantScheduler([], [0.1])
    flow.optimizer.SGD(lr_scheduler, momentum=0).minimize(loss)
    return loss


g_i = 0


def cb_print_loss(result: tp.Numpy):
    global g_i
    if g_i % 20 == 0:
        print(result.mean())
    g_i += 1


def main():
    check_point = flow.train.CheckPoint()
    check_point.init()

    (train_images, train_labels), (test_images, test_labels) = flow.data.load_mnist(
        BATCH_SIZE, BATCH_SIZE
    )
    for epoch in range(1):  # 20 in the tutorial
        for i, (images, labels) in enumerate(zip(train_images, train_labels)):
            train_job(images, labels)(cb_print_loss)

    check_point.save("./mlp_models_1")


if __name__ == "__main__":
    main()
'''

ASYNC_EVAL = '''
import numpy as np
import flowlab as flow
import flowlab.typing as tp
from typing import Tuple

BATCH_SIZE = 100


@flow.global_function(type="predict")
def eval_job(
    images: tp.Numpy.Placeholder((BATCH_SIZE, 1, 28, 28), dtype=flow.float),
    labels: tp.Numpy.Placeholder((BATCH_SIZE,), dtype=flow.int32),
) -> tp.Callback[Tuple[tp.Numpy, tp.Numpy]]:
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

        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(
            labels, logits, name="softmax_loss"
        )

    return (labels, logits)


g_total = 0
g_correct = 0


def acc(arguments: Tuple[tp.Numpy, tp.Numpy]):
    global g_total
    global g_correct

    labels = arguments[0]
    logits = arguments[1]
    predictions = np.argmax(logits, 1)
    right_count = np.sum(predictions == labels)
    g_total += labels.shape[0]
    g_correct += right_count


def main():
    flow.load_variables(flow.checkpoint.get("./mlp_models_1"))
    (train_images, train_labels), (test_images, test_labels) = flow.data.load_mnist(
        BATCH_SIZE
    )
    for epoch in range(1):
        for i, (images, labels) in enumerate(zip(test_images, test_labels)):
            eval_job(images, labels)(acc)

    print("accuracy: {0:.1f}%".format(g_correct * 100 / g_total))


if __name__ == "__main__":
    main()
'''


# ---------------------------------------------------------------------------------------------------- helpers

def write_mnist(directory, n_train, n_test, seed=0):
    """A small ``mnist.npz`` in Keras's layout: uint8 28x28 digits drawn as a noisy class template each, so a few
    steps of training separate the classes."""
    rng = np.random.default_rng(seed)
    templates = (rng.random((10, 28, 28)) < 0.3) * 200

    def draw(n):
        labels = rng.integers(0, 10, n).astype(np.uint8)
        images = np.clip(templates[labels] + rng.normal(0, 30, (n, 28, 28)), 0, 255).astype(np.uint8)
        return images, labels

    (x_train, y_train), (x_test, y_test) = draw(n_train), draw(n_test)
    buffer = io.BytesIO()
    np.savez(buffer, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    (directory / "mnist.npz").write_bytes(buffer.getvalue())
    return (x_test.astype(np.float32) / 255).reshape(-1, 1, 28, 28), y_test.astype(np.int32)


def run_program(source, name, capsys):
    """Run ``source`` as ``__main__`` in a fresh session (as its own process would); return (globals, stdout)."""
    flow.clear_default_session()
    namespace = {"__name__": "__main__", "__file__": name}
    exec(compile(source, name, "exec"), namespace)
    return namespace, capsys.readouterr().out


def variable_values():
    return {name: np.array(blob.numpy()) for name, blob in flow.get_all_variables().items()}


def saved_values(path):
    return {name: np.array(blob.numpy()) for name, blob in flow.checkpoint.get(path).items()}


def printed_losses(out):
    return [float(v) for v in re.findall(r"^(-?[0-9.]+(?:e[-+]?\d+)?|nan|inf)$", out, re.M)]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ---------------------------------------------------------------------------------------------------- LeNet

def test_lenet_trains_saves_and_a_second_program_loads_it(workdir, capsys):
    write_mnist(workdir, n_train=300, n_test=100)
    _, out = run_program(LENET_TRAIN, "lenet_train.py", capsys)
    losses = printed_losses(out)
    assert len(losses) == 2 and all(math.isfinite(v) and v > 0 for v in losses), out     # i == 0 of each epoch
    assert out.endswith("model saved\n")
    trained = variable_values()
    shapes = {"conv1-weight": (32, 1, 5, 5), "conv1-bias": (32,), "conv2-weight": (64, 32, 5, 5),
              "conv2-bias": (64,), "dense1-weight": (512, 64 * 7 * 7), "dense1-bias": (512,),
              "dense2-weight": (10, 512), "dense2-bias": (10,)}
    assert {name: trained[name].shape for name in shapes} == shapes
    saved = saved_values("lenet_models_1")
    for name in shapes:
        np.testing.assert_array_equal(saved[name], trained[name], err_msg=name)

    namespace, out = run_program(LENET_EVAL, "lenet_eval.py", capsys)
    loaded = variable_values()
    for name in shapes:
        np.testing.assert_array_equal(loaded[name], trained[name], err_msg=name)
    accuracy = float(re.fullmatch(r"accuracy: ([0-9.]+)%\n", out).group(1))
    assert accuracy == pytest.approx(100 * namespace["g_correct"] / namespace["g_total"], abs=0.05)
    assert namespace["g_total"] == 100


# ---------------------------------------------------------------------------------------------------- fine-tuning

def test_mlp_fine_tuning_loads_the_backbone_and_initialises_the_new_layer(workdir, capsys, monkeypatch):
    write_mnist(workdir, n_train=2100, n_test=100)
    _, out = run_program(MLP_ORIGIN, "mlp_mnist_origin.py", capsys)
    first, last = printed_losses(out)                           # steps 0 and 20
    assert last < first / 2, out
    origin = variable_values()
    assert sorted(origin) == ["dense1-bias", "dense1-weight", "dense2-bias", "dense2-weight"]

    after_load = {}
    load = flow.train.CheckPoint.load

    def load_and_look(self, path):                              # the values the fine-tuning starts from
        load(self, path)
        after_load.update(variable_values())
    monkeypatch.setattr(flow.train.CheckPoint, "load", load_and_look)
    with pytest.warns(UserWarning, match=r"has no values for variables \['dense3-weight', 'dense3-bias'\]; they keep "
                                         r"their current or initial values"):
        _, out = run_program(MLP_FINETUNE, "mlp_mnist_finetune.py", capsys)
    for name in origin:
        np.testing.assert_array_equal(after_load[name], origin[name], err_msg=name)
    assert after_load["dense3-weight"].shape == (10, 10) and np.abs(after_load["dense3-weight"]).max() > 0
    first, last = printed_losses(out)
    assert math.isfinite(first) and last < first, out
    tuned = variable_values()
    assert not np.array_equal(tuned["dense1-weight"], origin["dense1-weight"])    # the backbone trains on
    np.testing.assert_array_equal(saved_values("mlp_ext_models_1")["dense3-weight"], tuned["dense3-weight"])


# ---------------------------------------------------------------------------------------------------- callbacks

def test_async_programs_hand_every_result_to_their_callbacks(workdir, capsys):
    test_x, test_y = write_mnist(workdir, n_train=2100, n_test=300)
    namespace, out = run_program(ASYNC_TRAIN, "async_train.py", capsys)
    flow.sync_default_session()                                 # callbacks run off the calling thread
    assert namespace["g_i"] == 21                               # one call per batch of the epoch
    out += capsys.readouterr().out
    first, last = printed_losses(out)                           # the callbacks of steps 0 and 20
    assert last < first, out
    trained = variable_values()

    namespace, out = run_program(ASYNC_EVAL, "async_eval.py", capsys)
    flow.sync_default_session()
    assert namespace["g_total"] == 300
    assert re.fullmatch(r"accuracy: [0-9.]+%\n", out), out
    for name, value in trained.items():                         # flow.load_variables(flow.checkpoint.get(...))
        np.testing.assert_array_equal(variable_values()[name], value, err_msg=name)

    # the callbacks saw what a synchronous job computes from the same variables
    @flow.global_function(type="predict")
    def logits_job(images: flow.typing.Numpy.Placeholder((100, 1, 28, 28))) -> flow.typing.Numpy:
        hidden = flow.layers.dense(flow.reshape(images, [100, -1]), 512, activation=flow.nn.relu, name="hidden")
        return flow.layers.dense(hidden, 10, name="output")

    correct = sum(int((logits_job(x).argmax(1) == y).sum())
                  for x, y in zip(test_x.reshape(3, 100, 1, 28, 28), test_y.reshape(3, 100)))
    assert namespace["g_correct"] == correct
    assert correct > 150                                        # well above chance (30 of 300)
