"""User programs written against OneFlow 0.x's API, for the tests to run with flowlab in its place, and the small
MNIST-shaped file they read (a test-support module, like ``dashboard_page``)::

    from oneflow_programs import CONVNET_TRAIN, write_mnist

Each program is plain user code beginning ``import flowlab as flow``; with ``import oneflow as flow`` it would be a
OneFlow 0.x program. The programs are put together from shared parts (the imports, a small LeNet-style convnet, a
small MLP) so each part is written once, and their sizes are kept small so a run takes seconds on the CPU. The
programs read ``mnist.npz`` from their working directory through ``flow.data.load_mnist``; ``write_mnist`` puts one
there, so nothing is downloaded.

What the programs print, and the checkpoint folders they write, are named by the constants below for the tests."""
import re

import numpy as np

CONVNET_DIR = "convnet_snapshot"           # CONVNET_TRAIN saves here, CONVNET_EVAL loads from here
MLP_DIR = "mlp_snapshot"                   # MLP_PRETRAIN and ASYNC_TRAIN save here; MLP_FINETUNE, ASYNC_EVAL load
FINETUNED_DIR = "mlp_finetuned"            # MLP_FINETUNE saves here
BATCH = 50                                 # every program's batch size
LOSS_EVERY = 10                            # programs that print the loss per step print it every LOSS_EVERY steps

# -------------------------------------------------------------------------------------------------- the parts

_IMPORTS = '''import flowlab as flow
import flowlab.typing as tp
import numpy as np
from typing import Tuple
'''

_CONSTANTS = f'''
BATCH = {BATCH}
LOSS_EVERY = {LOSS_EVERY}
'''

# Two 5x5 conv + 2x2 max-pool stages (28 -> 14 -> 7), a dense layer with dropout while training, ten logits.
_CONVNET = '''

def convnet(images, training):
    init = flow.truncated_normal(0.1)
    x = images
    for stage, channels in (("stage1", 6), ("stage2", 12)):
        x = flow.layers.conv2d(x, channels, 5, padding="SAME", activation=flow.nn.relu,
                               kernel_initializer=init, name=stage)
        x = flow.nn.max_pool2d(x, ksize=2, strides=2, padding="SAME", data_format="NCHW", name=stage + "_pool")
    x = flow.reshape(x, [x.shape[0], -1])
    x = flow.layers.dense(x, 64, activation=flow.nn.relu, kernel_initializer=init, name="features")
    if training:
        x = flow.nn.dropout(x, rate=0.25, name="features_dropout")   # only the train job drops units
    return flow.layers.dense(x, 10, kernel_initializer=init, name="scores")
'''

# One hidden layer; the fine-tuning program stacks a new layer on these ten outputs.
_MLP = '''

def mlp(images):
    init = flow.truncated_normal(0.1)
    flat = flow.reshape(images, [images.shape[0], -1])
    body = flow.layers.dense(flat, 128, activation=flow.nn.relu, kernel_initializer=init, name="body")
    return flow.layers.dense(body, 10, kernel_initializer=init, name="head")
'''


def _sgd_train_job(logits, returns="tp.Numpy"):
    """The text of a train job ``train_step(images, digits)`` minimising, by plain SGD, the cross-entropy of the
    ``logits`` expression."""
    return f'''

@flow.global_function(type="train")
def train_step(
    images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float),
    digits: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32),
) -> {returns}:
    logits = {logits}
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(digits, logits, name="xent")
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
    return loss
'''


# -------------------------------------------------------------------------------------------------- convnet

CONVNET_TRAIN = _IMPORTS + _CONSTANTS + _CONVNET + _sgd_train_job("convnet(images, training=True)") + f'''

if __name__ == "__main__":
    flow.config.gpu_device_num(1)
    checkpoint = flow.train.CheckPoint()
    checkpoint.init()
    (train_images, train_digits), _ = flow.data.load_mnist(BATCH, BATCH)
    for epoch in range(2):
        losses = [train_step(x, y).mean() for x, y in zip(train_images, train_digits)]
        print("epoch", epoch, "mean loss", np.mean(losses))
    checkpoint.save("{CONVNET_DIR}")
    print("saved to {CONVNET_DIR}")
'''

# Counts what the restored convnet gets right on the test set, in a job of its own (no dropout there).
CONVNET_EVAL = _IMPORTS + _CONSTANTS + _CONVNET + f'''

@flow.global_function(type="predict")
def predict(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float)) -> tp.Numpy:
    return flow.math.argmax(convnet(images, training=False))


if __name__ == "__main__":
    flow.train.CheckPoint().load("{CONVNET_DIR}")
    _, (test_images, test_digits) = flow.data.load_mnist(BATCH, BATCH)
    right = seen = 0
    for x, y in zip(test_images, test_digits):
        right += int(np.sum(predict(x) == y))
        seen += len(y)
    print("right", right, "of", seen)
'''

# -------------------------------------------------------------------------------------------------- fine-tuning

_PRINT_LOSS_EVERY = '''
        if step % LOSS_EVERY == 0:
            print("step", step, "loss", loss.mean())
'''

MLP_PRETRAIN = _IMPORTS + _CONSTANTS + _MLP + _sgd_train_job("mlp(images)") + f'''

if __name__ == "__main__":
    checkpoint = flow.train.CheckPoint()
    checkpoint.init()
    (train_images, train_digits), _ = flow.data.load_mnist(BATCH, BATCH)
    for step, (x, y) in enumerate(zip(train_images, train_digits)):
        loss = train_step(x, y){_PRINT_LOSS_EVERY}
    checkpoint.save("{MLP_DIR}")
'''

# The pretrained MLP with a new layer on top: loading the checkpoint fills the MLP, the new layer keeps its
# initial values (the checkpoint has none for it), and all of it trains on.
MLP_FINETUNE = _IMPORTS + _CONSTANTS + _MLP + _sgd_train_job(
    'flow.layers.dense(mlp(images), 10, kernel_initializer=flow.truncated_normal(0.1), name="refine")') + f'''

if __name__ == "__main__":
    checkpoint = flow.train.CheckPoint()
    checkpoint.load("{MLP_DIR}")
    (train_images, train_digits), _ = flow.data.load_mnist(BATCH, BATCH)
    for step, (x, y) in enumerate(zip(train_images, train_digits)):
        loss = train_step(x, y){_PRINT_LOSS_EVERY}
    checkpoint.save("{FINETUNED_DIR}")
'''

# -------------------------------------------------------------------------------------------------- callbacks

# The train job hands each step's losses to a callback instead of returning them; the callback counts the steps.
ASYNC_TRAIN = _IMPORTS + _CONSTANTS + _MLP + _sgd_train_job("mlp(images)", returns="tp.Callback[tp.Numpy]") + f'''

steps_seen = 0


def report(loss: tp.Numpy):
    global steps_seen
    if steps_seen % LOSS_EVERY == 0:
        print("step", steps_seen, "loss", loss.mean())
    steps_seen += 1


if __name__ == "__main__":
    checkpoint = flow.train.CheckPoint()
    checkpoint.init()
    (train_images, train_digits), _ = flow.data.load_mnist(BATCH, BATCH)
    for x, y in zip(train_images, train_digits):
        train_step(x, y)(report)
    checkpoint.save("{MLP_DIR}")
'''

# The predict job hands (digits, logits) pairs to a callback that keeps the tally.
ASYNC_EVAL = _IMPORTS + _CONSTANTS + _MLP + f'''

@flow.global_function(type="predict")
def score(
    images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float),
    digits: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32),
) -> tp.Callback[Tuple[tp.Numpy, tp.Numpy]]:
    with flow.scope.placement("cpu", "0:0"):
        return digits, mlp(images)


tally = {{"right": 0, "seen": 0}}


def count(result: Tuple[tp.Numpy, tp.Numpy]):
    digits, logits = result
    tally["right"] += int(np.sum(logits.argmax(axis=1) == digits))
    tally["seen"] += len(digits)


if __name__ == "__main__":
    flow.load_variables(flow.checkpoint.get("{MLP_DIR}"))
    _, (test_images, test_digits) = flow.data.load_mnist(BATCH, BATCH)
    for x, y in zip(test_images, test_digits):
        score(x, y)(count)
'''

# -------------------------------------------------------------------------------------------------- two devices

# Mirrored view: each device gets its own half of the batch as one entry of a list, and returns its own losses.
MIRRORED_TWO_DEVICES = _IMPORTS + _CONSTANTS + _MLP + '''

DEVICES = 2


def mirrored_config():
    config = flow.function_config()
    config.default_data_type(flow.float)
    config.default_logical_view(flow.scope.mirrored_view())
    return config


@flow.global_function(type="train", function_config=mirrored_config())
def train_step(
    images: tp.ListNumpy.Placeholder((BATCH // DEVICES, 1, 28, 28), dtype=flow.float),
    digits: tp.ListNumpy.Placeholder((BATCH // DEVICES,), dtype=flow.int32),
) -> tp.ListNumpy:
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(digits, mlp(images))
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
    return loss


if __name__ == "__main__":
    flow.config.cpu_device_num(DEVICES)
    flow.train.CheckPoint().init()
    (train_images, train_digits), _ = flow.data.load_mnist(BATCH, BATCH)
    for step, (x, y) in enumerate(zip(train_images, train_digits)):
        per_device = train_step(np.split(x, DEVICES), np.split(y, DEVICES))
        loss = np.concatenate(per_device)''' + _PRINT_LOSS_EVERY

# Consistent view (the default): the program is written for one device; flowlab splits each batch over the two.
CONSISTENT_TWO_DEVICES = _IMPORTS + _CONSTANTS + _CONVNET + _sgd_train_job("convnet(images, training=True)") + '''

if __name__ == "__main__":
    flow.config.gpu_device_num(2)
    flow.train.CheckPoint().init()
    (train_images, train_digits), _ = flow.data.load_mnist(BATCH, BATCH)
    for step, (x, y) in enumerate(zip(train_images, train_digits)):
        loss = train_step(x, y)''' + _PRINT_LOSS_EVERY


# -------------------------------------------------------------------------------------------------- the data

def write_mnist(directory, n_train, n_test, seed=0):
    """Write ``directory/mnist.npz`` in the layout ``flow.data.load_mnist`` reads (uint8 28x28 images, uint8 labels)
    and return the test set as the programs see it: float32 (n, 1, 28, 28) in [0, 1] and int32 labels.

    Each class lights its own 14x5 cell of a 2x5 grid over dim noise, so a few dozen steps separate the classes."""
    rng = np.random.default_rng(seed)

    def draw(n):
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 90, (n, 28, 28))
        for image, label in zip(images, labels):
            row, col = divmod(int(label), 5)
            image[row * 14:(row + 1) * 14, col * 5 + 2:col * 5 + 7] += 150
        return images.astype(np.uint8), labels.astype(np.uint8)

    (x_train, y_train), (x_test, y_test) = draw(n_train), draw(n_test)
    np.savez(directory / "mnist.npz", x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    return (x_test.astype(np.float32) / 255).reshape(-1, 1, 28, 28), y_test.astype(np.int32)


def printed_losses(out):
    """The losses a program printed as ``step N loss V`` lines, by step."""
    return {int(step): float(loss) for step, loss in re.findall(r"^step (\d+) loss (\S+)$", out, re.M)}
