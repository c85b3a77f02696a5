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
from .math import matmul
from .nn import bias_add
from .variables import get_variable


def _prefix(name, default_prefix):
    if name is None:
        return f"{default_prefix}{g.new_unique_id()}"
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty string, got {name!r}")
    return name


def dense(inputs, units, activation=None, use_bias=True, kernel_initializer=None, bias_initializer=None,
          kernel_regularizer=None, bias_regularizer=None, trainable=True, name=None, model_distribute=None):
    """Fully connected layer ``activation(inputs @ weight.T + bias)``; inputs of rank > 2 are flattened to 2-D first."""
    x = as_tensor(inputs, argument="inputs")
    if not isinstance(units, int) or isinstance(units, bool) or units <= 0:
        raise ValueError(f"flow.layers.dense: units must be a positive int, got {units!r}")
    if x.ndim < 2:
        raise ValueError(f"flow.layers.dense: inputs must have rank >= 2 (batch, features), got shape {x.shape}")
    if kernel_regularizer is not None or bias_regularizer is not None or model_distribute is not None:
        raise ValueError("flow.layers.dense: regularizers and model_distribute are not supported by flowlab; "
                         "use AdamW's weight decay")
    if activation is not None and not callable(activation):
        raise TypeError(f"flow.layers.dense: activation must be callable such as flow.nn.relu, got {activation!r}")
    prefix = _prefix(name, "Dense_")
    lead_shape = x.shape[:-1]
    if x.ndim > 2:
        x = reshape(x, (-1, x.shape[-1]))
    weight = get_variable(f"{prefix}-weight", shape=(units, x.shape[1]), dtype=x.dtype,
                          initializer=kernel_initializer or xavier_uniform_initializer(), trainable=trainable)
    out = matmul(x, weight, transpose_b=True, name=f"{prefix}_matmul")
    if use_bias:
        bias = get_variable(f"{prefix}-bias", shape=(units,), dtype=x.dtype,
                            initializer=bias_initializer or zeros_initializer(), trainable=trainable)
        out = bias_add(out, bias, name=f"{prefix}_bias_add")
    if activation is not None:
        out = activation(out, name=f"{prefix}_activation")
    if len(lead_shape) > 1:
        out = reshape(out, lead_shape + (units,))
    return out
