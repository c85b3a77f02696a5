"""``flow.layers``: layers built from ops, named exactly as OneFlow names them (users see these names in watches).

``dense(x, units, name=None)`` makes variables ``<p>-weight`` (shape ``(units, in)``) and ``<p>-bias`` and ops
``<p>_matmul``, ``<p>_bias_add``, ``<p>_activation``; ``<p>`` is ``name`` or ``Dense_<n>`` from the global counter.
Kernels default to Xavier-uniform (OneFlow's default of zeros leaves hidden units identical, so nothing trains).
"""
from __future__ import annotations

from .. import graph as g
from ..initializers import xavier_uniform_initializer, zeros_initializer
from . import as_tensor
from .array import reshape
from .conv import _data_format, _pair
from .conv import conv2d as nn_conv2d
from .math import matmul
from .nn import bias_add
from .placement import check_distribute
from .variables import get_variable


def _prefix(name, default_prefix):
    if name is None:
        return f"{default_prefix}{g.new_unique_id()}"
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string, got {name!r}")
    return name


def dense(inputs, units, activation=None, use_bias=True, kernel_initializer=None, bias_initializer=None,
          kernel_regularizer=None, bias_regularizer=None, trainable=True, name=None, model_distribute=None):
    """Fully connected layer ``activation(inputs @ weight.T + bias)`` along the last axis (leading axes are kept).

    The weight is ``(units, in)``, named ``<p>-weight``, the bias ``<p>-bias``; ops ``<p>_matmul``, ``<p>_bias_add``,
    ``<p>_activation``, ``<p>`` being ``name`` or ``Dense_<n>``.

    Differs from OneFlow: the kernel defaults to Xavier-uniform (OneFlow's default, zeros, leaves every hidden unit
    identical); ``model_distribute`` (model parallelism) is refused with an error.
    """
    x = as_tensor(inputs, argument="inputs")
    if not isinstance(units, int) or isinstance(units, bool) or units <= 0:
        raise ValueError(f"flow.layers.dense: units must be a positive int, got {units!r}")
    if x.ndim < 2:
        raise ValueError(f"flow.layers.dense: inputs must have rank >= 2 (batch, features), got shape {x.shape}")
    if model_distribute is not None:        # checked against the weight (units, in); see flowlab.ops.placement
        check_distribute("flow.layers.dense", "model_distribute", model_distribute, (units, x.shape[-1]))
    if activation is not None and not callable(activation):
        raise TypeError(f"flow.layers.dense: activation must be callable such as flow.nn.relu, got {activation!r}")
    prefix = _prefix(name, "Dense_")
    lead_shape = x.shape[:-1]
    if x.ndim > 2:
        x = reshape(x, (-1, x.shape[-1]))
    weight = get_variable(f"{prefix}-weight", shape=(units, x.shape[1]), dtype=x.dtype,
                          initializer=kernel_initializer or xavier_uniform_initializer(), trainable=trainable,
                          regularizer=kernel_regularizer)
    out = matmul(x, weight, transpose_b=True, name=f"{prefix}_matmul")
    if use_bias:
        bias = get_variable(f"{prefix}-bias", shape=(units,), dtype=x.dtype,
                            initializer=bias_initializer or zeros_initializer(), trainable=trainable,
                            regularizer=bias_regularizer)
        out = bias_add(out, bias, name=f"{prefix}_bias_add")
    if activation is not None:
        out = activation(out, name=f"{prefix}_activation")
    if len(lead_shape) > 1:
        out = reshape(out, lead_shape + (units,))
    return out


def conv2d(inputs, filters, kernel_size=1, strides=1, padding="VALID", data_format="NCHW", dilation_rate=1, groups=1,
           activation=None, use_bias=True, kernel_initializer=None, bias_initializer=None, kernel_regularizer=None,
           bias_regularizer=None, trainable=True, name=None, weight_name=None, bias_name=None):
    """2-D convolution layer ``activation(conv2d(inputs, weight) + bias)``.

    The weight is ``(filters, in/groups, kh, kw)`` for NCHW, ``(filters, kh, kw, in/groups)`` for NHWC, named
    ``weight_name`` or ``<p>-weight``; ops ``<p>_conv2d``, ``<p>_bias_add``, ``<p>_activation``, ``<p>`` being
    ``name`` or ``Conv2d_<n>``.

    Differs from OneFlow: the kernel defaults to Xavier-uniform (OneFlow's default, zeros, leaves every filter
    identical).
    """
    api = "flow.layers.conv2d"
    x = as_tensor(inputs, argument="inputs")
    if not isinstance(filters, int) or isinstance(filters, bool) or filters <= 0:
        raise ValueError(f"{api}: filters must be a positive int (the number of output channels), got {filters!r}")
    fmt = _data_format(data_format, api)
    if x.ndim != 4:
        raise ValueError(f"{api}: inputs must be a 4-D {fmt} tensor, got shape {x.shape}")
    kh, kw = _pair(kernel_size, "kernel_size", api)
    channels = x.shape[1] if fmt == "NCHW" else x.shape[3]
    if not isinstance(groups, int) or isinstance(groups, bool) or groups <= 0 or channels % groups or filters % groups:
        raise ValueError(f"{api}: groups must be a positive int dividing both the input channels ({channels}) and "
                         f"filters ({filters}), got {groups!r}")
    if activation is not None and not callable(activation):
        raise TypeError(f"{api}: activation must be callable such as flow.nn.relu, got {activation!r}")
    prefix = _prefix(name, "Conv2d_")
    shape = (filters, channels // groups, kh, kw) if fmt == "NCHW" else (filters, kh, kw, channels // groups)
    weight = get_variable(weight_name or f"{prefix}-weight", shape=shape, dtype=x.dtype,
                          initializer=kernel_initializer or xavier_uniform_initializer(fmt), trainable=trainable,
                          regularizer=kernel_regularizer)
    out = nn_conv2d(x, weight, strides, padding, fmt, dilation_rate, groups, name=f"{prefix}_conv2d")
    if use_bias:
        bias = get_variable(bias_name or f"{prefix}-bias", shape=(filters,), dtype=x.dtype,
                            initializer=bias_initializer or zeros_initializer(), trainable=trainable,
                            regularizer=bias_regularizer)
        out = bias_add(out, bias, data_format=fmt, name=f"{prefix}_bias_add")
    if activation is not None:
        out = activation(out, name=f"{prefix}_activation")
    return out
