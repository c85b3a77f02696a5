"""Variable initializers with OneFlow's names. Each is a callable ``(shape, dtype, rng) -> numpy.ndarray``.

Weights follow OneFlow's layout ``(out, in, *kernel)`` (``(out, *kernel, in)`` with ``data_format="NHWC"``), which
decides the fans used by the Xavier/Kaiming/variance-scaling rules.
"""
from __future__ import annotations

import math

import numpy as np


class Initializer:
    """A variable initializer: called with ``(shape, dtype, rng)``, it returns the initial array; subclasses define
    ``sample(shape, rng)``.
    """
    def __call__(self, shape, dtype, rng: np.random.Generator) -> np.ndarray:
        return np.asarray(self.sample(tuple(shape), rng), dtype=dtype).reshape(shape)

    def sample(self, shape, rng):
        raise TypeError("initializers define sample")

    def __repr__(self):
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


class Constant(Initializer):
    """Every element ``value``."""
    def __init__(self, value=0.0):
        if not isinstance(value, (int, float, np.number)):
            raise TypeError(f"constant_initializer: value must be a number, got {value!r}")
        self.value = value

    def sample(self, shape, rng):
        return np.full(shape, self.value)


class RandomUniform(Initializer):
    """Uniform draws in ``[minval, maxval)``."""
    def __init__(self, minval=0.0, maxval=1.0):
        if not minval < maxval:
            raise ValueError(f"random_uniform_initializer: minval must be < maxval, got {minval} and {maxval}")
        self.minval, self.maxval = minval, maxval

    def sample(self, shape, rng):
        return rng.uniform(self.minval, self.maxval, shape)


class RandomNormal(Initializer):
    """Normal draws of mean ``mean`` and standard deviation ``stddev``."""
    def __init__(self, mean=0.0, stddev=1.0):
        if stddev < 0:
            raise ValueError(f"random_normal_initializer: stddev must be >= 0, got {stddev}")
        self.mean, self.stddev = mean, stddev

    def sample(self, shape, rng):
        return rng.normal(self.mean, self.stddev, shape)


class TruncatedNormal(Initializer):
    """Normal draws, with every draw farther than 2 standard deviations from the mean drawn again (TF's rule)."""

    def __init__(self, mean=0.0, stddev=1.0):
        if stddev <= 0:
            raise ValueError(f"truncated_normal: stddev must be > 0, got {stddev}")
        self.mean, self.stddev = mean, stddev

    def sample(self, shape, rng):
        z = rng.standard_normal(shape)
        bad = np.abs(z) > 2
        while bad.any():
            z[bad] = rng.standard_normal(int(bad.sum()))
            bad = np.abs(z) > 2
        return self.mean + self.stddev * z


def _fans(shape, data_format):
    if len(shape) < 2:
        n = shape[0] if shape else 1
        return n, n
    if data_format == "NHWC":
        receptive = int(np.prod(shape[1:-1], dtype=np.int64))
        return shape[-1] * receptive, shape[0] * receptive
    receptive = int(np.prod(shape[2:], dtype=np.int64))
    return shape[1] * receptive, shape[0] * receptive


class VarianceScaling(Initializer):
    """``scale / fan`` variance from a uniform, normal or truncated-normal draw."""

    def __init__(self, scale=1.0, mode="fan_in", distribution="truncated_normal", data_format="NCHW"):
        if mode not in ("fan_in", "fan_out", "fan_avg"):
            raise ValueError(f"mode must be 'fan_in', 'fan_out' or 'fan_avg', got {mode!r}")
        if distribution not in ("truncated_normal", "random_normal", "random_uniform"):
            raise ValueError("distribution must be 'truncated_normal', 'random_normal' or 'random_uniform', "
                             f"got {distribution!r}")
        if data_format not in ("NCHW", "NHWC", ""):
            raise ValueError(f"data_format must be 'NCHW' or 'NHWC', got {data_format!r}")
        self.scale, self.mode, self.distribution, self.data_format = scale, mode, distribution, data_format or "NCHW"

    def sample(self, shape, rng):
        fan_in, fan_out = _fans(shape, self.data_format)
        fan = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2}[self.mode]
        variance = self.scale / max(1.0, fan)
        if self.distribution == "random_uniform":
            limit = math.sqrt(3.0 * variance)
            return rng.uniform(-limit, limit, shape)
        if self.distribution == "random_normal":
            return rng.normal(0.0, math.sqrt(variance), shape)
        # TF's constant: the std of a standard normal truncated at 2 sigma is 0.87962566...
        return TruncatedNormal(0.0, math.sqrt(variance) / 0.87962566103423978).sample(shape, rng)


def constant_initializer(value=0.0, dtype=None):
    """Every element ``value`` (``dtype`` is the variable's own)."""
    return Constant(value)


def zeros_initializer(dtype=None):
    """Every element 0: ``get_variable``'s default and the bias of a layer."""
    return Constant(0.0)


def ones_initializer(dtype=None):
    """Every element 1."""
    return Constant(1.0)


def random_uniform_initializer(minval=0.0, maxval=1.0, dtype=None):
    """Uniform draws in ``[minval, maxval)``; also ``flow.random_uniform``."""
    return RandomUniform(minval, maxval)


def random_normal_initializer(mean=0.0, stddev=1.0, seed=None, dtype=None):
    """Normal draws of mean ``mean`` and standard deviation ``stddev``; also ``flow.random_normal``. Seed jobs
    with ``flow.config.seed()`` (``seed`` is OneFlow's argument and changes nothing).
    """
    return RandomNormal(mean, stddev)


def truncated_normal_initializer(mean=0.0, stddev=1.0):
    """Normal draws, each one farther than 2 standard deviations from ``mean`` drawn again (TF's rule)."""
    return TruncatedNormal(mean, stddev)


def truncated_normal(stddev=1.0, mean=0.0):
    """``flow.truncated_normal(stddev)``: OneFlow's short form, standard deviation first."""
    return TruncatedNormal(mean, stddev)


def xavier_uniform_initializer(data_format=""):
    """Xavier (Glorot) uniform: variance ``1 / fan_avg``; the default kernel of ``layers.dense`` and
    ``layers.conv2d``. Also ``flow.glorot_uniform_initializer``.
    """
    return VarianceScaling(1.0, "fan_avg", "random_uniform", data_format)


def xavier_normal_initializer(data_format=""):
    """Xavier (Glorot) normal: variance ``1 / fan_avg``. Also ``flow.glorot_normal_initializer``."""
    return VarianceScaling(1.0, "fan_avg", "random_normal", data_format)


def variance_scaling_initializer(scale=1.0, mode="fan_in", distribution="truncated_normal", data_format=""):
    """Variance ``scale / fan`` (``mode``: ``fan_in``, ``fan_out`` or ``fan_avg``) from a ``truncated_normal``,
    ``random_normal`` or ``random_uniform`` draw; the fans follow the weight's ``data_format``.
    """
    return VarianceScaling(scale, mode, distribution, data_format)


def kaiming_initializer(shape=None, distribution="random_normal", mode="fan_in", nonlinearity="leaky_relu",
                        negative_slope=0.0, data_format="NCHW"):
    """He initialisation. OneFlow's first argument ``shape`` is accepted; the variable's own shape is what counts."""
    gains = {"linear": 1.0, "sigmoid": 1.0, "tanh": 5.0 / 3, "relu": math.sqrt(2.0),
             "leaky_relu": math.sqrt(2.0 / (1 + negative_slope ** 2))}
    if nonlinearity not in gains:
        raise ValueError(f"kaiming_initializer: nonlinearity must be one of {sorted(gains)}, got {nonlinearity!r}")
    return VarianceScaling(gains[nonlinearity] ** 2, mode, distribution, data_format)


glorot_uniform_initializer = xavier_uniform_initializer
"""OneFlow's other name of ``xavier_uniform_initializer``."""
glorot_normal_initializer = xavier_normal_initializer
"""OneFlow's other name of ``xavier_normal_initializer``."""
random_normal = random_normal_initializer
"""OneFlow's short name of ``random_normal_initializer``."""
random_uniform = random_uniform_initializer
"""OneFlow's short name of ``random_uniform_initializer``."""


__all__ = [
    "Initializer", "Constant", "RandomUniform", "RandomNormal", "TruncatedNormal", "VarianceScaling",
    "constant_initializer", "zeros_initializer", "ones_initializer", "random_uniform_initializer",
    "random_normal_initializer", "truncated_normal_initializer", "truncated_normal", "xavier_uniform_initializer",
    "xavier_normal_initializer", "variance_scaling_initializer", "kaiming_initializer", "glorot_uniform_initializer",
    "glorot_normal_initializer", "random_normal", "random_uniform",
]
