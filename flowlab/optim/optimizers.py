"""Optimizers with OneFlow 0.x semantics, and their in-place update ops.

``minimize(loss)`` seeds the gradient of a per-example ``loss`` with ones, so intermediate gradients (what
``watch_diff`` sees) are unscaled, and scales *model* gradients by ``1 / loss.size`` so training behaves like a mean.
Each variable gets one update node that changes its array in place; optimizer state (momentum, Adam's ``m``/``v``)
lives in session variables named ``<var>-momentum``, ``<var>-m``, ``<var>-v`` and is saved by ``CheckPoint``.
"""
from __future__ import annotations

import re

import numpy as np

from .. import graph as g
from ..autodiff import gradients
from ..errors import TraceError
from ..initializers import zeros_initializer
from ..ops import Op, apply, spec
from ..ops.array import constant
from ..ops.variables import get_variable
from ..runtime import session
from .schedulers import as_scheduler


# ------------------------------------------------------------------------------------------------------- update ops

class _Update(Op):
    outputs = ()
    side_effect = True
    updates_variable = True
    donates = (1,)      # the gradient: when nothing else reads its buffer, the update scales it in place

    @staticmethod
    def infer(*inputs, **attrs):
        return []

    @staticmethod
    def host_args(node, step):
        return {"lr": node.attrs["schedule"](step)}


def _scaled(grad, scale, writable):
    """``grad * scale``, in the gradient's own buffer when the plan says nothing else reads it."""
    if writable:
        grad *= scale
        return grad
    return grad * scale


class SGDUpdate(_Update):
    prefix, api = "SGDUpdate_", "SGD.minimize"

    @staticmethod
    def forward(xp, w, grad, *rest, momentum, clipped, grad_scale, schedule, lr, writable=False):
        scale = (rest[0] * grad_scale if clipped else grad_scale) * lr      # one pass over the gradient
        if momentum:
            m = rest[-1]
            m *= momentum
            m -= _scaled(grad, scale, writable)
            w += m
        else:
            w -= _scaled(grad, scale, writable)


class AdamUpdate(_Update):
    prefix, api = "AdamUpdate_", "Adam.minimize"

    @staticmethod
    def host_args(node, step):
        return {"lr": node.attrs["schedule"](step), "step": step + 1}

    @staticmethod
    def forward(xp, w, grad, m, v, *rest, beta1, beta2, epsilon, do_bias_correction, weight_decay, clipped,
                grad_scale, schedule, lr, step, writable=False):
        grad = _scaled(grad, rest[0] * grad_scale if clipped else grad.dtype.type(grad_scale), writable)
        m *= beta1
        m += (1 - beta1) * grad
        v *= beta2
        v += (1 - beta2) * (grad * grad)
        if do_bias_correction:
            lr = lr * np.sqrt(1 - beta2 ** step) / (1 - beta1 ** step)
        update = m / (xp.sqrt(v) + epsilon)
        if weight_decay:
            update += weight_decay * w
        update *= lr
        w -= update


class GlobalNormClipFactor(Op):
    """``grad_scale``-aware factor ``min(1, clip_norm / ||scaled grads||)`` shared by every update of one minimize."""
    prefix, api = "ClipByGlobalNorm_", "grad_clipping.by_global_norm"

    @staticmethod
    def infer(*grads, clip_norm, grad_scale):
        return spec((), grads[0].dtype)

    @staticmethod
    def forward(xp, *grads, clip_norm, grad_scale):
        total = sum(xp.sum(gr.astype(xp.float64) ** 2) for gr in grads)
        norm = xp.sqrt(total) * grad_scale
        return xp.minimum(1.0, clip_norm / xp.maximum(norm, 1e-12)).astype(grads[0].dtype)


class grad_clipping:  # noqa: N801 - OneFlow's namespace ``flow.optimizer.grad_clipping``
    class by_global_norm:  # noqa: N801
        def __init__(self, clip_norm):
            if not isinstance(clip_norm, (int, float)) or clip_norm <= 0:
                raise ValueError(f"grad_clipping.by_global_norm: clip_norm must be a positive number, got {clip_norm!r}")
            self.clip_norm = float(clip_norm)


# ------------------------------------------------------------------------------------------------------- optimizers

class Optimizer:
    def __init__(self, lr_scheduler, loss_scale_factor=None, grad_clipping=None, variables=None):
        self.lr_scheduler = as_scheduler(lr_scheduler)
        if loss_scale_factor is not None:
            raise ValueError("loss_scale_factor is for mixed precision, which flowlab does not do; leave it None")
        if grad_clipping is not None and not hasattr(grad_clipping, "clip_norm"):
            raise TypeError("grad_clipping: expected flow.optimizer.grad_clipping.by_global_norm(clip_norm), "
                            f"got {grad_clipping!r}")
        self.grad_clipping = grad_clipping
        self.variables = None if variables is None else [v if isinstance(v, str) else v.op_name for v in variables]

    def minimize(self, loss):
        """Train the job's variables to lower ``loss`` (called inside a ``type="train"`` job)."""
        graph = g.current_graph(f"{type(self).__name__}.minimize")
        if not isinstance(loss, g.LazyTensor):
            raise TypeError(f"minimize: loss must be a tensor of the job, got {type(loss).__name__}")
        if loss.dtype.kind != "f":
            raise TypeError(f"minimize: loss must be floating point, got {loss.logical_blob_name} of dtype {loss.dtype}")
        if not graph.is_train:
            raise TraceError(f"minimize: job {graph.name!r} is a predict job; declare it with "
                             "@flow.global_function(type=\"train\") to train")
        graph.losses.append((self, loss))

    def _trained(self, graph):
        sess = session.default()
        names = self.variables if self.variables is not None else \
            [n for n in graph.variables if sess.variables[n].trainable]
        missing = [n for n in names if n not in graph.variables]
        if missing:
            raise TraceError(f"minimize: variables {missing} are not used by job {graph.name!r}")
        return [graph.variables[n] for n in names]

    def build(self, graph, loss, extra_targets=()):
        """Add gradient and update nodes for ``loss`` (called once the job function has returned)."""
        variables = self._trained(graph)
        seed = constant(np.ones(loss.shape, loss.dtype), dtype=loss.dtype, name=f"System-Seed-{loss.op_name}")
        grads = gradients([loss], list(variables) + list(extra_targets), [seed])[:len(variables)]
        pairs = [(v, gr) for v, gr in zip(variables, grads) if gr is not None]
        if not pairs:
            raise TraceError(f"minimize: loss {loss.logical_blob_name} does not depend on any trainable variable "
                             f"of job {graph.name!r}; nothing would train")
        grad_scale = 1.0 / max(loss.size, 1)
        factor = None
        if self.grad_clipping is not None:
            factor = apply(GlobalNormClipFactor, tuple(gr for _, gr in pairs), name=graph.local_name("ClipFactor_"),
                           clip_norm=self.grad_clipping.clip_norm, grad_scale=grad_scale)
        for var, grad in pairs:
            self._update(graph, var, grad, factor, grad_scale)

    def _slot(self, var, suffix):
        return get_variable(f"{var.op_name}-{suffix}", shape=var.shape, dtype=var.dtype,
                            initializer=zeros_initializer(), trainable=False)


class SGD(Optimizer):
    """``w -= lr * g``, or with ``momentum``: ``m = momentum * m - lr * g; w += m`` (OneFlow's default 0.9)."""

    def __init__(self, lr_scheduler, loss_scale_factor=None, momentum=0.9, grad_clipping=None, train_step_lbn=None,
                 variables=None):
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping, variables)
        if not isinstance(momentum, (int, float)) or not 0 <= momentum < 1:
            raise ValueError(f"SGD: momentum must be a number in [0, 1), got {momentum!r}")
        self.momentum = float(momentum)

    def _update(self, graph, var, grad, factor, grad_scale):
        inputs = (var, grad) + ((factor,) if factor is not None else ()) + \
            ((self._slot(var, "momentum"),) if self.momentum else ())
        apply(SGDUpdate, inputs, name=f"{var.op_name}-SGDUpdate", momentum=self.momentum, clipped=factor is not None,
              grad_scale=grad_scale, schedule=self.lr_scheduler)


class Adam(Optimizer):
    """Adam; ``do_bias_correction`` defaults to False as in OneFlow."""

    def __init__(self, lr_scheduler, beta1=0.9, beta2=0.999, epsilon=1e-8, do_bias_correction=False,
                 loss_scale_factor=None, grad_clipping=None, train_step_lbn=None, variables=None):
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping, variables)
        for arg, value in (("beta1", beta1), ("beta2", beta2)):
            if not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ValueError(f"{type(self).__name__}: {arg} must be a number in [0, 1), got {value!r}")
        if not isinstance(epsilon, (int, float)) or epsilon <= 0:
            raise ValueError(f"{type(self).__name__}: epsilon must be a positive number, got {epsilon!r}")
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)
        self.do_bias_correction = bool(do_bias_correction)

    def _weight_decay(self, name):
        return 0.0

    def _update(self, graph, var, grad, factor, grad_scale):
        inputs = (var, grad, self._slot(var, "m"), self._slot(var, "v")) + ((factor,) if factor is not None else ())
        apply(AdamUpdate, inputs, name=f"{var.op_name}-AdamUpdate", beta1=self.beta1, beta2=self.beta2,
              epsilon=self.epsilon, do_bias_correction=self.do_bias_correction,
              weight_decay=self._weight_decay(var.op_name), clipped=factor is not None, grad_scale=grad_scale,
              schedule=self.lr_scheduler)


class AdamW(Adam):
    """Adam with decoupled weight decay ``w -= lr * weight_decay * w``, limited by name patterns if given."""

    def __init__(self, lr_scheduler, beta1=0.9, beta2=0.999, epsilon=1e-8, do_bias_correction=False,
                 loss_scale_factor=None, weight_decay=None, weight_decay_includes=None, weight_decay_excludes=None,
                 grad_clipping=None, train_step_lbn=None, variables=None):
        super().__init__(lr_scheduler, beta1, beta2, epsilon, do_bias_correction, loss_scale_factor, grad_clipping,
                         train_step_lbn, variables)
        if weight_decay is not None and (not isinstance(weight_decay, (int, float)) or weight_decay < 0):
            raise ValueError(f"AdamW: weight_decay must be a non-negative number, got {weight_decay!r}")
        if weight_decay_includes is not None and weight_decay_excludes is not None:
            raise ValueError("AdamW: give weight_decay_includes or weight_decay_excludes, not both")
        self.weight_decay = float(weight_decay or 0.0)
        self.includes = _patterns(weight_decay_includes)
        self.excludes = _patterns(weight_decay_excludes)

    def _weight_decay(self, name):
        if self.includes is not None and not any(p.search(name) for p in self.includes):
            return 0.0
        if self.excludes is not None and any(p.search(name) for p in self.excludes):
            return 0.0
        return self.weight_decay


def _patterns(patterns):
    if patterns is None:
        return None
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    return [re.compile(p) for p in patterns]
