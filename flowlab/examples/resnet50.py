"""A ResNet-50-shaped train job with OneFlow-Benchmark's names, for the dashboard's Graph and Health tabs, their
tests and benchmarks: ~1,000 ops (forward, gradients, updates) in 16 bottleneck blocks, as a user's real graph.

The layout and names follow OneFlow-Benchmark's ``Classification/cnns/resnet_model.py``: everything under
``flow.scope.namespace("Resnet")``; the stem ``conv1`` and ``pool1``; stages ``res2`` .. ``res5`` of 3, 4, 6, 3
bottleneck blocks ``res<stage>_<i>``, each of convolutions ``<block>_branch2a`` (1x1), ``_branch2b`` (3x3, the
stage's stride in its first block), ``_branch2c`` (1x1, 4x the inner width) and, in the first block of a stage, the
projection shortcut ``<block>_branch1``; ``pool5`` (a global average pool) and the classifier ``fc1001``. A
convolution ``<name>`` reads the variable ``<name>-weight`` and is followed by the batch normalisation ``<name>_bn``
(``flow.layers.batch_normalization``, momentum 0.9, epsilon 1e-5, as OneFlow-Benchmark's unfused form; the ReLU
after it is ``<name>_relu``). A block's last normalisation starts with a zero scale, as OneFlow-Benchmark's
(``gamma_initializer=zeros`` for ``last``), so each residual branch starts at zero. 53 convolution layers, 53
batch-norm layers and ``fc1001``: 107 layers for ``flow.watch_health``.

``base_width`` scales every stage's channels (64 is ResNet-50's: 64-256 in res2 up to 512-2048 in res5, 23.5 M
weights); a small width and a small image (32x32 reaches res5 at 1x1) keep tracing and a train step fast while the
graph keeps ResNet-50's ops and names.
"""
# No ``from __future__ import annotations``: the job's placeholder annotations name locals of ``build``.
import flowlab as flow
import flowlab.typing as tp

BLOCK_COUNTS = (3, 4, 6, 3)         # bottleneck blocks per stage, res2 .. res5
EXPANSION = 4                        # a block's output channels / its inner channels


def block_names():
    """The 16 blocks' names, in order: ``res2_0`` .. ``res5_2``."""
    return [f"res{stage + 2}_{i}" for stage, count in enumerate(BLOCK_COUNTS) for i in range(count)]


def conv(x, name, filters, kernel, strides=1):
    """``flow.nn.conv2d`` of ``x`` (NCHW) with a new ``<name>-weight`` (He-normal, as OneFlow-Benchmark's); SAME
    padding unless the convolution is 1x1 with stride 1."""
    weight = flow.get_variable(name + "-weight", shape=(filters, x.shape[1], kernel, kernel),
                               initializer=flow.variance_scaling_initializer(2.0, "fan_in", "random_normal"))
    padding = "SAME" if strides > 1 or kernel > 1 else "VALID"
    return flow.nn.conv2d(x, weight, strides, padding, name=name)


def normalize(x, name, last=False):
    """The batch normalisation ``<name>_bn`` after convolution ``name``; ``last``: its scale starts at zero."""
    return flow.layers.batch_normalization(
        x, axis=1, momentum=0.9, epsilon=1e-5, name=name + "_bn",
        gamma_initializer=flow.zeros_initializer() if last else flow.ones_initializer())


def conv_unit(x, name, filters, kernel, strides=1, relu=True, last=False):
    """Convolution, batch normalisation and (unless ``relu`` is false) a ReLU named ``<name>_relu``; ``last``: the
    block's residual branch, which starts at zero (see ``normalize``)."""
    y = normalize(conv(x, name, filters, kernel, strides), name, last)
    return flow.nn.relu(y, name=name + "_relu") if relu else y


def bottleneck(x, block, filters, strides):
    """One residual block: 1x1 -> 3x3 (``strides``) -> 1x1 (``filters`` out), plus the shortcut (a strided 1x1
    projection when the shape changes), summed and rectified (``<block>_add``, ``<block>_relu``)."""
    inner = filters // EXPANSION
    if strides != 1 or x.shape[1] != filters:
        shortcut = conv_unit(x, block + "_branch1", filters, 1, strides, relu=False)
    else:
        shortcut = x
    y = conv_unit(x, block + "_branch2a", inner, 1)
    y = conv_unit(y, block + "_branch2b", inner, 3, strides)
    y = conv_unit(y, block + "_branch2c", filters, 1, relu=False, last=True)
    return flow.nn.relu(flow.math.add(y, shortcut, name=block + "_add"), name=block + "_relu")


def resnet50(images, base_width=64, num_classes=1000):
    """The logits of ``images`` (NCHW) through ResNet-50 (see the module docstring)."""
    if not isinstance(base_width, int) or isinstance(base_width, bool) or base_width < EXPANSION:
        raise ValueError(f"resnet50: base_width must be an int >= {EXPANSION}, got {base_width!r}")
    with flow.scope.namespace("Resnet"):
        x = conv_unit(images, "conv1", base_width, 7, 2)
        x = flow.nn.max_pool2d(x, ksize=3, strides=2, padding="SAME", name="pool1")
        names = iter(block_names())
        for stage, count in enumerate(BLOCK_COUNTS):
            filters = base_width * EXPANSION * 2 ** stage
            for i in range(count):
                x = bottleneck(x, next(names), filters, 2 if i == 0 and stage > 0 else 1)
        # Global average pooling: ResNet-50's 7x7 pool5 at 224x224, whatever the image size here.
        x = flow.nn.avg_pool2d(x, ksize=x.shape[2:], strides=1, padding="VALID", name="pool5")
        x = flow.reshape(x, (x.shape[0], -1), name="pool5_flatten")
        return flow.layers.dense(x, num_classes, kernel_initializer=flow.variance_scaling_initializer(
            2, "fan_in", "random_normal"), name="fc1001")


def build(batch_size=2, image_size=32, base_width=8, num_classes=10, lr=0.01, health_writer=None, health_every=1,
          health_thresholds=None):
    """A train job ``train_job(images (batch, 3, size, size) float32, labels (batch,) int32) -> loss`` of
    ResNet-50 with SGD (momentum 0.9, as OneFlow-Benchmark trains it); with ``health_writer`` (a ``SummaryWriter``)
    the job also runs ``flow.watch_health(writer=health_writer, every=health_every, **health_thresholds)``."""
    @flow.global_function(type="train")
    def train_job(images: tp.Numpy.Placeholder((batch_size, 3, image_size, image_size)),
                  labels: tp.Numpy.Placeholder((batch_size,), dtype=flow.int32)) -> tp.Numpy:
        logits = resnet50(images, base_width, num_classes)
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits, name="loss")
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [lr]), momentum=0.9).minimize(loss)
        if health_writer is not None:
            flow.watch_health(writer=health_writer, every=health_every, **(health_thresholds or {}))
        return loss

    return train_job


def write_run(run_dir, steps=3, seed=0, **build_options):
    """Train ``build(health_writer=..., **build_options)`` for ``steps`` steps on random images, logging each
    step's loss and health report into ``run_dir``, then write the session's structure graph there
    (``flow.summary.Graph(run_dir).write_structure_graph()``: every job defined so far, so call it in a fresh
    session): a run for the dashboard's Graph and Health tabs. Returns the train job."""
    import numpy as np

    from flowlab.summary import SummaryWriter

    rng = np.random.default_rng(seed)
    with SummaryWriter(run_dir) as writer:
        job = build(health_writer=writer, **build_options)
        batch, size = job.graph().placeholders[0].shape[0], job.graph().placeholders[0].shape[2]
        classes = build_options.get("num_classes", 10)
        for step in range(steps):
            images = rng.standard_normal((batch, 3, size, size)).astype(np.float32)
            labels = rng.integers(0, classes, batch).astype(np.int32)
            writer.add_scalar("loss", float(job(images, labels).mean()), step)
        flow.summary.Graph(run_dir).write_structure_graph()
    return job
