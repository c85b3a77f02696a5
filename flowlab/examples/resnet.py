"""ResNet (bottleneck v1.5, OneFlow-Benchmark's layout and names) as a OneFlow 0.x user writes it, plus a train job.

The model follows OneFlow-Benchmark's ``Classification/cnns`` ResNet-50: NCHW, every convolution a
``flow.nn.conv2d`` of a ``flow.get_variable`` ``<name>-weight`` (He normal, fan in; no bias), batch normalization
with momentum 0.9 and epsilon 1e-5 fused with its ReLU (``batch_normalization_relu``) and, at the end of each
residual block, with the shortcut and the ReLU (``batch_normalization_add_relu``, gamma starting at zero), a 7x7/2
stem and 3x3/2 SAME max pool, four stages of bottleneck blocks (the stride in each stage's first 3x3 convolution),
a VALID average pool over the last feature map, ``fc1001`` (dense, 1000 classes), the mean sparse softmax
cross-entropy and SGD with momentum 0.875.

``depth`` picks the blocks per stage (50: 3, 4, 6, 3) or takes them as a tuple, ``width`` scales every channel count
(64 * width at the stem) and ``image_size`` the input, so that tests can train a tiny one; the final average pool
spans whatever the last stage's map is (7x7 at 224 pixels).
"""
# No ``from __future__ import annotations``: the train job's placeholder annotations are read at trace time and
# name locals of ``train_job``.
import flowlab as flow
import flowlab.typing as tp

DEPTHS = {26: (2, 2, 2, 2), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}
EXPANSION = 4            # a bottleneck's output channels over its inner ones
BN_MOMENTUM, BN_EPSILON = 0.9, 1e-5
SGD_MOMENTUM = 0.875


class ResnetBuilder:
    """Layers of a ResNet in NCHW; ``weight_decay`` > 0 puts an L2 regularizer on weights, gammas and betas (as
    OneFlow-Benchmark's ``--wd``). ``fused=False`` is OneFlow-Benchmark's unfused form (its default,
    ``--fuse_bn_relu=False``): batch normalisation ``<name>_bn``, then a ReLU, and a block's sum of its last batch
    norm and shortcut before the last ReLU; flowlab names those ``<name>_relu``, ``<block>_add`` and
    ``<block>_relu`` (OneFlow-Benchmark leaves them unnamed) so that health sees the ReLUs as their layers' outputs."""

    def __init__(self, weight_decay=0.0, trainable=True, training=True, fused=True):
        self.data_format = "NCHW"
        self.fused = fused
        self.initializer = flow.variance_scaling_initializer(2, "fan_in", "random_normal", data_format="NCHW")
        self.regularizer = flow.regularizers.l2(weight_decay) if 0.0 < weight_decay < 1.0 else None
        self.trainable, self.training = trainable, training

    def conv(self, x, name, filters, kernel, strides=1):
        """A bias-free convolution; SAME padding except for 1x1 stride-1 ones (VALID, the same thing)."""
        padding = "SAME" if strides > 1 or kernel > 1 else "VALID"
        weight = flow.get_variable(f"{name}-weight", shape=(filters, x.shape[1], kernel, kernel), dtype=x.dtype,
                                   initializer=self.initializer, regularizer=self.regularizer,
                                   model_name="weight", trainable=self.trainable)
        return flow.nn.conv2d(x, weight, strides, padding, self.data_format, 1, name=name)

    def _bn_args(self, last):
        start = flow.zeros_initializer() if last else flow.ones_initializer()
        return dict(axis=1, momentum=BN_MOMENTUM, epsilon=BN_EPSILON, center=True, scale=True,
                    trainable=self.trainable, training=self.training, gamma_initializer=start,
                    moving_variance_initializer=start, gamma_regularizer=self.regularizer,
                    beta_regularizer=self.regularizer)

    def bn(self, x, name):
        return flow.layers.batch_normalization(x, name=name, **self._bn_args(False))

    def bn_relu(self, x, name):
        if not self.fused:
            return flow.nn.relu(self.bn(x, f"{name}_bn"), name=f"{name}_relu")
        return flow.layers.batch_normalization_relu(x, name=f"{name}_bn_relu", **self._bn_args(False))

    def bn_add_relu(self, x, addend, name, block):
        # gamma starts at zero: each block starts as its shortcut (OneFlow-Benchmark's "last" BN)
        if not self.fused:
            y = flow.layers.batch_normalization(x, name=f"{name}_bn", **self._bn_args(True))
            return flow.nn.relu(flow.math.add(y, addend, name=f"{block}_add"), name=f"{block}_relu")
        return flow.layers.batch_normalization_add_relu(x, addend, name=f"{name}_bn_add_relu",
                                                        **self._bn_args(True))

    def bottleneck(self, x, name, filters, inner, strides):
        if strides != 1 or x.shape[1] != filters:     # a projection shortcut where the shape changes
            shortcut = self.bn(self.conv(x, f"{name}_branch1", filters, 1, strides), f"{name}_branch1_bn")
        else:
            shortcut = x
        a = self.bn_relu(self.conv(x, f"{name}_branch2a", inner, 1), f"{name}_branch2a")
        b = self.bn_relu(self.conv(a, f"{name}_branch2b", inner, 3, strides), f"{name}_branch2b")
        c = self.conv(b, f"{name}_branch2c", filters, 1)
        return self.bn_add_relu(c, shortcut, f"{name}_branch2c", name)

    def stem(self, images, channels):
        x = self.bn_relu(self.conv(images, "conv1", channels, 7, 2), "conv1")
        return flow.nn.max_pool2d(x, ksize=3, strides=2, padding="SAME", data_format=self.data_format,
                                  name="pool1")


def _blocks_per_stage(depth):
    if isinstance(depth, (tuple, list)) and depth and all(isinstance(d, int) and d >= 1 for d in depth):
        return tuple(depth)
    if depth in DEPTHS:
        return DEPTHS[depth]
    raise ValueError(f"resnet: depth must be one of {sorted(DEPTHS)} or a tuple of blocks per stage (ints >= 1), "
                     f"got {depth!r}")


def resnet(images, depth=50, width=1.0, classes=1000, weight_decay=0.0, trainable=True, training=True, fused=True):
    """The logits ``(N, classes)`` of a ResNet over NCHW ``images``, variables named as OneFlow-Benchmark's (under
    the ``Resnet`` namespace)."""
    stages = _blocks_per_stage(depth)
    if not (isinstance(width, (int, float)) and width > 0):
        raise ValueError(f"resnet: width must be a positive number, got {width!r}")
    inner = [max(1, int(round(64 * width * 2 ** i))) for i in range(len(stages))]
    builder = ResnetBuilder(weight_decay, trainable, training, fused)
    with flow.scope.namespace("Resnet"):
        x = builder.stem(images, inner[0])
        for s, (blocks, channels) in enumerate(zip(stages, inner)):
            for b in range(blocks):
                strides = 2 if s > 0 and b == 0 else 1
                x = builder.bottleneck(x, f"res{s + 2}_{b}", channels * EXPANSION, channels, strides)
        x = flow.nn.avg_pool2d(x, ksize=x.shape[2:4], strides=1, padding="VALID", data_format="NCHW",
                               name="pool5")
        x = flow.reshape(x, (x.shape[0], -1), name="pool5_flatten")
        return flow.layers.dense(x, units=classes, use_bias=True,
                                 kernel_initializer=flow.variance_scaling_initializer(2, "fan_in", "random_normal"),
                                 bias_initializer=flow.zeros_initializer(), kernel_regularizer=builder.regularizer,
                                 bias_regularizer=builder.regularizer, trainable=trainable, name="fc1001")


def block_names(depth=50):
    """The residual blocks' names in order: ``res2_0`` .. ``res5_2`` for ResNet-50."""
    return [f"res{s + 2}_{b}" for s, blocks in enumerate(_blocks_per_stage(depth)) for b in range(blocks)]


def train_job(batch_size=4, image_size=224, depth=50, width=1.0, classes=1000, lr=0.1, momentum=SGD_MOMENTUM,
              weight_decay=0.0, dtype=flow.float32, fused=True, mean_loss=True, health_writer=None, health_every=1,
              health_thresholds=None):
    """A ``@flow.global_function(type="train")`` job ``(images (N, 3, S, S) dtype, labels (N,) int32) -> loss``:
    the mean sparse softmax cross-entropy (``mean_loss=False``: the per-example one, named ``loss``, which OneFlow
    trains alike), minimized by SGD (``momentum``, constant ``lr``). Variables take the
    images' ``dtype`` (float64 makes exact comparisons with other implementations possible). With
    ``health_writer`` (a ``SummaryWriter``) the job also runs ``flow.watch_health(writer=health_writer,
    every=health_every, **health_thresholds)``."""
    if not (isinstance(image_size, int) and image_size >= 32):
        raise ValueError(f"train_job: image_size must be an int >= 32 (the stem and four stages halve it five "
                         f"times), got {image_size!r}")
    if not (isinstance(batch_size, int) and batch_size >= 2):
        raise ValueError(f"train_job: batch_size must be an int >= 2 (batch statistics), got {batch_size!r}")

    @flow.global_function(type="train")
    def resnet_train(images: tp.Numpy.Placeholder((batch_size, 3, image_size, image_size), dtype=dtype),
                     labels: tp.Numpy.Placeholder((batch_size,), dtype=flow.int32)) -> tp.Numpy:
        logits = resnet(images, depth, width, classes, weight_decay, fused=fused)
        if mean_loss:
            loss = flow.math.reduce_mean(flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits,
                                                                                         name="softmax_loss"))
        else:
            loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits, name="loss")
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [lr]), momentum=momentum).minimize(loss)
        if health_writer is not None:
            flow.watch_health(writer=health_writer, every=health_every, **(health_thresholds or {}))
        return loss

    return resnet_train


# The dashboard's ResNet-50 run: its depth and names (the unfused form, as OneFlow-Benchmark's default) at a size
# that traces and trains in seconds.
SMALL = dict(batch_size=2, image_size=32, width=0.125, classes=10, lr=0.01, momentum=0.9, fused=False, mean_loss=False)


def write_run(run_dir, steps=3, seed=0, **job_options):
    """Train ``train_job(health_writer=..., **SMALL, **job_options)`` for ``steps`` steps on random images, logging
    each step's loss and health report into ``run_dir``, then write the session's structure graph there
    (``flow.summary.Graph(run_dir).write_structure_graph()``: every job defined so far, so call it in a fresh
    session): a run for the dashboard's Graph and Health tabs (~1,100 ops, 107 layers). Returns the train job."""
    import numpy as np

    from flowlab.summary import SummaryWriter

    options = {**SMALL, **job_options}
    rng = np.random.default_rng(seed)
    with SummaryWriter(run_dir) as writer:
        job = train_job(health_writer=writer, **options)
        batch, size = options["batch_size"], options["image_size"]
        for step in range(steps):
            images = rng.standard_normal((batch, 3, size, size)).astype(np.float32)
            labels = rng.integers(0, options["classes"], batch).astype(np.int32)
            writer.add_scalar("loss", float(job(images, labels).mean()), step)
        flow.summary.Graph(run_dir).write_structure_graph()
    return job

