"""Train an MLP on the bundled 8x8 digits with OneFlow-0.x job functions, printing progress.

The same model definition serves the train job and the predict job: variables are global by name, so the predict
job reads the weights the train job updates.

With a ``logdir``, training also writes TensorBoard summaries there (what ``flowlab demo`` shows live): the loss and
learning rate per step, test accuracy per epoch, histograms of every weight and its gradient per epoch (delivered
by ``flow.watch_scope``), a few test digits, the config as text, the train job's graph, the hparams with the
final accuracy, the hidden layer's activations of the test digits for the projector (labelled by digit), and
every step's network health (``flow.watch_health``: per-layer statistics and alerts, for the Health tab).
"""
# No ``from __future__ import annotations`` here: the jobs' placeholder annotations name ``batch_size``, a local of
# ``build``, and string annotations cannot see a function's locals when the job is traced.
import time

import numpy as np

import flowlab as flow
import flowlab.typing as tp


def _mlp(images, batch_size, hidden):
    """The model: ``(hidden activations, logits)``."""
    x = flow.reshape(images, [batch_size, -1])
    h = flow.layers.dense(x, hidden, activation=flow.nn.relu, kernel_initializer=flow.truncated_normal(0.1),
                          name="hidden")
    return h, flow.layers.dense(h, 10, kernel_initializer=flow.truncated_normal(0.1), name="output")


def build(batch_size=100, hidden=128, lr=0.1, variables=None, naive_loss=False, writer=None):
    """Return ``(train_job, predict_job)`` for batches of ``batch_size`` 8x8 images. ``variables``: a dict the train
    job fills after each call with ``name -> (value, gradient)`` of the model's variables. ``naive_loss``: the
    textbook cross-entropy, -sum(one_hot * log(softmax(logits))), whose softmax underflows to 0 once the logits
    grow (log(0) = -inf, then NaN): a classic bug, for the demo's Anomalies tab; the train job then takes one-hot
    labels (float32, ``(batch_size, 10)``). ``writer``: a ``SummaryWriter`` taking the train job's health reports."""

    def mlp(images):
        return _mlp(images, batch_size, hidden)[1]

    label_def = tp.Numpy.Placeholder((batch_size, 10)) if naive_loss else \
        tp.Numpy.Placeholder((batch_size,), dtype=flow.int32)

    @flow.global_function(type="train")
    def train_job(images: tp.Numpy.Placeholder((batch_size, 1, 8, 8)), labels: label_def) -> tp.Numpy:
        if variables is None:
            logits = mlp(images)
        else:
            with flow.watch_scope(_variable_watcher(variables, 0), _variable_watcher(variables, 1)):
                logits = mlp(images)
        if naive_loss:
            loss = -flow.math.reduce_sum(labels * flow.math.log(flow.nn.softmax(logits)), axis=1)
        else:
            loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [lr]), momentum=0.9).minimize(loss)
        if writer is not None:
            flow.watch_health(writer=writer)
        return loss

    @flow.global_function(type="predict")
    def predict_job(images: tp.Numpy.Placeholder((batch_size, 1, 8, 8))) -> tp.Numpy:
        return flow.math.argmax(mlp(images))

    return train_job, predict_job


def build_features(batch_size=100, hidden=128):
    """A predict job giving the hidden layer's activations (the learned features) of a batch: the same variables."""
    @flow.global_function(type="predict")
    def features_job(images: tp.Numpy.Placeholder((batch_size, 1, 8, 8))) -> tp.Numpy:
        return _mlp(images, batch_size, hidden)[0]
    return features_job


def _variable_watcher(variables, slot):
    """A watch_scope callback keeping the latest value (slot 0) or gradient (slot 1) of each variable."""
    def watcher(blob, blob_def):
        if blob_def.op_name.endswith(("-weight", "-bias")):
            pair = variables.setdefault(blob_def.op_name, [None, None])
            pair[slot] = blob.numpy()
    return watcher


def accuracy(predict_job, images, labels):
    return float(np.mean([np.mean(predict_job(x) == y) for x, y in zip(images, labels)]))


def main(epochs=20, batch_size=100, log=print, logdir=None, hidden=128, lr=0.1, naive_loss=False, pace=None):
    """Train and return the final test accuracy; with ``logdir``, write summaries there (see the module doc).
    ``naive_loss``: see ``build``. ``pace``: at most this many steps a second (so a person can watch it live);
    ``None`` trains as fast as it can."""
    (train_x, train_y), (test_x, test_y) = flow.data.load_digits(batch_size, batch_size)
    if naive_loss:
        train_y = [np.eye(10, dtype=np.float32)[y] for y in train_y]
    variables = None if logdir is None else {}
    writer = None
    if logdir is not None:
        from flowlab.summary import SummaryWriter
        writer = SummaryWriter(logdir)
    train_job, predict_job = build(batch_size, hidden, lr, variables, naive_loss, writer)
    flow.train.CheckPoint().init()
    config = dict(epochs=epochs, batch_size=batch_size, hidden=hidden, lr=lr, momentum=0.9, optimizer="SGD",
                  loss="-sum(one_hot * log(softmax))" if naive_loss else "sparse_softmax_cross_entropy_with_logits")
    if writer is not None:
        _start_summaries(writer, train_job, test_x[0], config)
    start, steps = time.perf_counter(), 0
    for epoch in range(1, epochs + 1):
        losses = []
        for x, y in zip(train_x, train_y):
            if pace:                  # hold to the schedule, not a fixed sleep: a slow step is not made slower
                time.sleep(max(0.0, start + steps / pace - time.perf_counter()))
            losses.append(train_job(x, y).mean())
            if writer is not None:
                writer.add_scalar("train/loss", float(losses[-1]), steps)
                writer.add_scalar("train/lr", lr, steps)
            steps += 1
        test_accuracy = accuracy(predict_job, test_x, test_y)
        if writer is not None:
            writer.add_scalar("test/accuracy", test_accuracy, steps)
            flow.sync_default_session()                  # the watch callbacks have delivered this step's arrays
            for name, (value, grad) in sorted(variables.items()):
                writer.add_histogram(f"weights/{name}", value, steps)
                writer.add_histogram(f"gradients/{name}", grad, steps)
            writer.flush()
        if epoch == 1 or epoch % 5 == 0 or epoch == epochs:
            rate = steps / (time.perf_counter() - start)
            log(f"epoch {epoch:3d}  loss {np.mean(losses):.4f}  test accuracy {test_accuracy:.3f}  "
                f"({rate:.0f} steps/s)")
    if writer is not None:
        writer.add_hparams(dict(lr=lr, hidden=hidden, batch_size=batch_size, epochs=epochs),
                           {"hparams/test_accuracy": test_accuracy}, global_step=steps)
        if np.isfinite(losses).all():        # a run that diverged has no features worth projecting
            features_job = build_features(batch_size, hidden)
            features = np.concatenate([features_job(x) for x in test_x])
            writer.add_embedding(features, metadata=[str(int(y)) for y in np.concatenate(test_y)],
                                 label_img=np.concatenate(test_x), global_step=steps, tag="hidden")
        writer.close()
    return test_accuracy


def _start_summaries(writer, job, images, config):
    """Write the job's graph, the config as text and a few digits (scaled up 4x)."""
    writer.add_graph(job)
    table = "| setting | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in config.items())
    writer.add_text("config", table, 0)
    digits = np.kron(images[:8], np.ones((1, 1, 4, 4), images.dtype))      # (8, 1, 32, 32), values in 0..1
    writer.add_images("test/digits", digits, 0, dataformats="NCHW")


if __name__ == "__main__":
    main()
