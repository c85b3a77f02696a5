"""Train an MLP on the bundled 8x8 digits with OneFlow-0.x job functions, printing progress.

The same model definition serves the train job and the predict job: variables are global by name, so the predict
job reads the weights the train job updates.
"""
from __future__ import annotations

import time

import numpy as np

import flowlab as flow
import flowlab.typing as tp


def build(batch_size=100, hidden=128, lr=0.1):
    """Return ``(train_job, predict_job)`` for batches of ``batch_size`` 8x8 images."""

    def mlp(images):
        x = flow.reshape(images, [batch_size, -1])
        h = flow.layers.dense(x, hidden, activation=flow.nn.relu, kernel_initializer=flow.truncated_normal(0.1),
                              name="hidden")
        return flow.layers.dense(h, 10, kernel_initializer=flow.truncated_normal(0.1), name="output")

    @flow.global_function(type="train")
    def train_job(images: tp.Numpy.Placeholder((batch_size, 1, 8, 8)),
                  labels: tp.Numpy.Placeholder((batch_size,), dtype=flow.int32)) -> tp.Numpy:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, mlp(images))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [lr]), momentum=0.9).minimize(loss)
        return loss

    @flow.global_function(type="predict")
    def predict_job(images: tp.Numpy.Placeholder((batch_size, 1, 8, 8))) -> tp.Numpy:
        return flow.math.argmax(mlp(images))

    return train_job, predict_job


def accuracy(predict_job, images, labels):
    return float(np.mean([np.mean(predict_job(x) == y) for x, y in zip(images, labels)]))


def main(epochs=20, batch_size=100, log=print):
    (train_x, train_y), (test_x, test_y) = flow.data.load_digits(batch_size, batch_size)
    train_job, predict_job = build(batch_size)
    flow.train.CheckPoint().init()
    start, steps = time.perf_counter(), 0
    for epoch in range(1, epochs + 1):
        losses = [train_job(x, y).mean() for x, y in zip(train_x, train_y)]
        steps += len(losses)
        if epoch == 1 or epoch % 5 == 0 or epoch == epochs:
            rate = steps / (time.perf_counter() - start)
            log(f"epoch {epoch:3d}  loss {np.mean(losses):.4f}  test accuracy "
                f"{accuracy(predict_job, test_x, test_y):.3f}  ({rate:.0f} steps/s)")
    return accuracy(predict_job, test_x, test_y)


if __name__ == "__main__":
    main()
