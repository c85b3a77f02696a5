"""DCGAN as a OneFlow 0.x user writes it (OneFlow-Benchmark's ``Generative/dcgan.py`` layout), plus its two train
jobs.

The generator maps noise ``z`` through a dense layer to ``(4 * width) x S/4 x S/4`` feature maps, batch
normalization and leaky ReLU (alpha 0.3), then three ``flow.nn.conv2d_transpose`` layers (5x5, SAME; strides 1, 2,
2: to ``S/4``, ``S/2`` and ``S``), the first two with batch normalization and leaky ReLU, the last with ``tanh``:
images ``(N, 1, S, S)`` in [-1, 1]. The discriminator is two ``flow.nn.compat_conv2d`` layers (5x5, stride 2,
TensorFlow's SAME) with leaky ReLU and dropout 0.3, then a dense layer to one logit. Both losses are
``flow.nn.sigmoid_cross_entropy_with_logits``: the discriminator learns real -> 1 and fake -> 0, the generator
learns to make the discriminator say 1. Each job trains only its own network (the other's variables are read with
``trainable=False``), with Adam, as in OneFlow-Benchmark. ``S`` (``image_size``) is a multiple of 4 (28 for MNIST);
``width`` is the generator's channels at its last hidden layer (64 in the original, so its first is 256).
"""
# No ``from __future__ import annotations``: the jobs' placeholder annotations are read at trace time.
import flowlab as flow
import flowlab.typing as tp

ALPHA = 0.3          # leaky ReLU slope of OneFlow-Benchmark's DCGAN
DROPOUT = 0.3
Z_DIM = 100


def _weight(name, shape, trainable):
    return flow.get_variable(f"{name}-weight", shape=shape, initializer=flow.random_normal_initializer(stddev=0.02),
                             trainable=trainable)


def _deconv(x, filters, strides, name, trainable):
    weight = _weight(name, (x.shape[1], filters, 5, 5), trainable)       # (in, out, kh, kw)
    size = (x.shape[0], filters, x.shape[2] * strides, x.shape[3] * strides)
    return flow.nn.conv2d_transpose(x, weight, output_shape=size, strides=strides, padding="SAME", name=name)


def _batchnorm(x, name, trainable, training):
    return flow.layers.batch_normalization(x, axis=1, trainable=trainable, training=training, name=name)


def generator(z, image_size=28, width=64, trainable=True, training=True):
    """Images ``(N, 1, image_size, image_size)`` in [-1, 1] from noise ``z`` ``(N, z_dim)``; variables ``g_*``."""
    if not (isinstance(image_size, int) and image_size >= 4 and image_size % 4 == 0):
        raise ValueError(f"dcgan.generator: image_size must be a positive multiple of 4, got {image_size!r}")
    side = image_size // 4
    weight = _weight("g_fc1", (side * side * 4 * width, z.shape[1]), trainable)
    h = flow.matmul(z, weight, transpose_b=True, name="g_fc1_matmul")
    h = flow.nn.leaky_relu(_batchnorm(h, "g_bn1", trainable, training), ALPHA)
    h = flow.reshape(h, (-1, 4 * width, side, side))
    h = flow.nn.leaky_relu(_batchnorm(_deconv(h, 2 * width, 1, "g_deconv1", trainable), "g_bn2", trainable,
                                      training), ALPHA)
    h = flow.nn.leaky_relu(_batchnorm(_deconv(h, width, 2, "g_deconv2", trainable), "g_bn3", trainable, training),
                           ALPHA)
    return flow.math.tanh(_deconv(h, 1, 2, "g_deconv3", trainable), name="g_out")


def discriminator(images, width=64, trainable=True, reuse=False):
    """One logit ``(N, 1)`` per image: real (high) or generated (low); variables ``d_*`` (``reuse`` only renames
    the ops of a second use, as OneFlow-Benchmark's layers do)."""
    suffix = "_reuse" if reuse else ""
    h = images
    for i, filters in enumerate((width, 2 * width), 1):
        name = f"d_conv{i}"
        weight = _weight(name, (filters, h.shape[1], 5, 5), trainable)
        bias = flow.get_variable(f"{name}-bias", shape=(filters,), initializer=flow.zeros_initializer(),
                                 trainable=trainable)
        h = flow.nn.compat_conv2d(h, weight, strides=2, padding="SAME", name=name + suffix)
        h = flow.nn.leaky_relu(flow.nn.bias_add(h, bias, "NCHW"), ALPHA)
        h = flow.nn.dropout(h, rate=DROPOUT)
    h = flow.reshape(h, (h.shape[0], -1))
    return flow.matmul(h, _weight("d_fc", (1, h.shape[1]), trainable), transpose_b=True, name="d_fc" + suffix)


def train_jobs(batch_size=32, image_size=28, width=64, z_dim=Z_DIM, lr=1e-4):
    """``(train_discriminator, train_generator)``: ``train_discriminator(z, images) -> (d_loss, d_loss_fake,
    d_loss_real)`` and ``train_generator(z) -> (g_loss, images)``, each a ``@flow.global_function(type="train")``
    minimizing its per-element loss with Adam (``lr``) over its own network's variables."""
    def adam():
        return flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [lr]))

    @flow.global_function(type="train")
    def train_discriminator(z: tp.Numpy.Placeholder((batch_size, z_dim)),
                            images: tp.Numpy.Placeholder((batch_size, 1, image_size, image_size))
                            ) -> tp.Bundle[tp.Numpy]:
        fake = generator(z, image_size, width, trainable=False)
        fake_logits = discriminator(fake, width)
        d_loss_fake = flow.nn.sigmoid_cross_entropy_with_logits(flow.zeros_like(fake_logits), fake_logits,
                                                                name="d_loss_fake")
        real_logits = discriminator(images, width, reuse=True)
        d_loss_real = flow.nn.sigmoid_cross_entropy_with_logits(flow.ones_like(real_logits), real_logits,
                                                                name="d_loss_real")
        d_loss = d_loss_fake + d_loss_real
        adam().minimize(d_loss)
        return d_loss, d_loss_fake, d_loss_real

    @flow.global_function(type="train")
    def train_generator(z: tp.Numpy.Placeholder((batch_size, z_dim))) -> tp.Bundle[tp.Numpy]:
        fake = generator(z, image_size, width)
        logits = discriminator(fake, width, trainable=False)
        g_loss = flow.nn.sigmoid_cross_entropy_with_logits(flow.ones_like(logits), logits, name="g_loss")
        adam().minimize(g_loss)
        return g_loss, fake

    return train_discriminator, train_generator
