"""Optimizers with OneFlow 0.x semantics, and their in-place update ops.

``minimize(loss)`` seeds the gradient of a per-example ``loss`` with ones, so intermediate gradients (what
``watch_diff`` sees) are unscaled, and scales *model* gradients by ``1 / loss.size`` so training behaves like a mean
(under a loss scale the seed is the scale and the model gradients are divided by it again: ``optim.loss_scale``).
A variable's regularizer (``flow.regularizers``) adds ``l1 * sign(w) + l2 * w`` to its scaled gradient inside the
update, before the global-norm clip, as OneFlow's update kernels do. Each variable gets one update node that changes
its array in place; optimizer state lives in session variables named as OneFlow names them and is saved by
``CheckPoint``: ``<var>-momentum`` (SGD, LARS), ``<var>-m``/``<var>-v`` (Adam, AdamW, LazyAdam, LAMB),
``<var>-beta1_t``/``<var>-beta2_t`` (LazyAdam, LAMB), ``<var>-mean_square`` and ``<var>-mean_gradient`` (RMSProp).
Update kernels take ``xp`` (NumPy or CuPy) and keep scalars such as norms on the device, so an update never waits for
a host copy (a dynamic loss scale's NaN/Inf count is the one exception).
"""
from __future__ import annotations

import math
import re
import warnings
from typing import NamedTuple

import numpy as np

from .. import graph as g
from ..autodiff import gradients
from ..errors import TraceError
from ..initializers import constant_initializer, zeros_initializer
from ..ops import Op, apply, spec
from ..ops.array import concat, constant, identity
from ..ops.scatter import unique_rows
from ..ops.math import Add
from ..ops.variables import get_variable
from ..runtime import blas, host_threads, jit, session
from .loss_scale import (DynamicLossScalePolicy, DynamicLossScaleSchedule, ScaledSeed, SkippedSteps,
                         StaticLossScalePolicy, as_policy)
from .schedulers import as_scheduler


# ------------------------------------------------------------------------------------------------------- update ops

class _Update(Op):
    """An optimizer update. Its inputs are ``(variable, gradient, *state, *extras)``; the extras are, in order, the
    global-norm clip factor (attr ``clipped``) and, under a dynamic loss scale (attr ``dynamic``), ``1 / scale`` and
    the step's count of NaN/Inf gradients (the update returns at once when it is not 0). Attrs ``l1`` / ``l2`` are
    the variable's regularizer (``flow.regularizers``)."""
    outputs = ()
    side_effect = True
    updates_variable = True
    donates = (1,)      # the gradient: when nothing else reads its buffer, the update scales it in place

    @staticmethod
    def infer(*inputs, **attrs):
        return []

    @staticmethod
    def host_args(node, step):
        return {"lr": node.attrs["schedule"](_train_step(node, step))}


def _train_step(node, step):
    """The train step of call ``step``: the call number, less the steps a dynamic loss scale skipped."""
    skipped = node.attrs.get("skipped")
    return step if skipped is None else skipped.train_step(step)


def _scaled(grad, scale, writable):
    """``grad * scale``, in the gradient's own buffer when the plan says nothing else reads it (no pass at all for a
    scale of exactly 1, the usual ``grad_scale``: ``g * 1`` is ``g``)."""
    if writable:
        if scale != 1:
            grad *= scale
        return grad
    return grad * scale


def _extras(extras, clipped, dynamic):
    """``(clip factor, 1 / loss scale, count of NaN/Inf)`` from an update's trailing inputs (None where absent)."""
    clip = extras[0] if clipped else None
    inv_scale, not_finite = extras[int(clipped):int(clipped) + 2] if dynamic else (None, None)
    return clip, inv_scale, not_finite


def _gradient(xp, w, grad, extras, clipped, dynamic, grad_scale, l1, l2, writable):
    """The gradient an update applies, in OneFlow's order: ``grad * grad_scale`` (``1 / loss.size``, over a static
    loss scale), times ``1 / scale`` of a dynamic loss scale, plus ``l1 * sign(w) + l2 * w``, times the clip factor.
    Returns an array the update may overwrite, or None when the step is skipped (NaN/Inf under a dynamic scale)."""
    clip, inv_scale, not_finite = _extras(extras, clipped, dynamic)
    if not_finite is not None and not_finite:
        return None
    factor = grad.dtype.type(grad_scale) if inv_scale is None else inv_scale * grad_scale
    if not (l1 or l2):
        return _scaled(grad, factor if clip is None else factor * clip, writable)
    g = _scaled(grad, factor, writable)
    if l1:
        g += l1 * xp.sign(w)
    if l2:
        g += l2 * w
    if clip is not None:
        g *= clip
    return g


def _norm(xp, a):
    """L2 norm as a 0-d array on ``a``'s device (no host round trip on CuPy)."""
    flat = a.ravel()
    return xp.sqrt(xp.vdot(flat, flat))


def _ratio_or_one(xp, numerator, denominator, w_norm, g_norm):
    """``numerator / denominator`` where both norms are positive, else 1 (OneFlow's LARS and LAMB rule)."""
    both = (w_norm > 0) & (g_norm > 0)
    return xp.where(both, numerator / xp.where(both, denominator, 1), 1)


BLAS_PASS_FROM = 4096      # elements: below, a BLAS call through ctypes costs more than NumPy's two passes
SPLIT_PART_MIN = 4096      # elements: the smallest part of an update a host thread takes


COMPILED_STEP_BELOW = 1 << 16   # elements: from here BLAS's axpy is as fast (65k: 5.2 us against 5.8; 131k: 12.8
                                # against 10.9; 1M: 108 against 61) and host threads split it


def _compiled_step(xp, w, grad):
    """Whether a plain SGD step on ``w`` runs ``_sgd_step_float32``: where ``_blas_pass`` would take BLAS's axpy
    (large enough, contiguous) for float32, below ``COMPILED_STEP_BELOW``, with compiled kernels on. Smaller steps
    keep NumPy's two passes, whose rounding (the scaled gradient rounded, then subtracted) a fused multiply-add
    would change."""
    return xp is np and BLAS_PASS_FROM <= w.size < COMPILED_STEP_BELOW and jit.takes(w, grad, contiguous=True)


@jit.kernel
def _sgd_step_float32(w, grad, alpha):
    """``w += alpha * grad`` over flat float32 arrays of one size, one fused multiply-add an element (what BLAS's
    saxpy computes, bit for bit)."""
    for i in range(w.size):
        w[i] = w[i] + alpha * grad[i]


def _blas_pass(xp, w, grad):
    """Whether an SGD step on ``w`` can read ``grad`` once through BLAS (``runtime.blas``): NumPy arrays, large
    enough, contiguous, of one dtype BLAS takes."""
    return xp is np and w.size >= BLAS_PASS_FROM and w.flags.c_contiguous and grad.flags.c_contiguous and \
        grad.dtype == w.dtype and blas.available(w.dtype)


COMPILED_FROM = 1024       # elements: below, calling a compiled kernel costs as much as NumPy's four small passes


def _momentum_compiled(xp, w, grad, m):
    """Whether a momentum step takes ``_sgd_momentum_float32``: float32 NumPy arrays of ``COMPILED_FROM`` elements or
    more, all contiguous (one thread, 2.4M elements: 1.9 -> 0.9 ms; 64k: 86 -> 16 us; 128: 3.9 against 4.4 us)."""
    return xp is np and w.size >= COMPILED_FROM and jit.takes(w, grad, m, contiguous=True)


@jit.kernel
def _sgd_momentum_float32(w, grad, m, rate, momentum):
    """``m = momentum * m - rate * grad; w += m`` of flat float32 arrays in one pass (the BLAS route reads ``m``
    twice and writes it once more; small variables took four NumPy calls). Rounds in float32 as that route does."""
    rate32, momentum32 = np.float32(rate), np.float32(momentum)
    for i in range(w.size):
        v = momentum32 * m[i] - rate32 * grad[i]
        m[i] = v
        w[i] += v


class SGDUpdate(_Update):
    """``w -= lr * (g + weight_decay * w)``, or with momentum ``m = momentum * m - lr * g; w += m - lr *
    weight_decay * w`` (the decay from the weight before the step; ``weight_decay`` is SGDW's, 0 for SGD). Inputs
    ``(w, grad[, momentum], *extras)``."""
    prefix, api = "SGDUpdate_", "SGD.minimize"

    @staticmethod
    def is_plain_step(node):
        """The update is ``w -= lr * grad_scale * grad`` and nothing else: no momentum, clipping, regularization
        or dynamic loss scale (what the compiler may fold into a matrix product, and health reads back)."""
        attrs = node.attrs
        return not (attrs["momentum"] or attrs["clipped"] or attrs.get("l1") or attrs.get("l2") or
                    attrs.get("dynamic") or attrs.get("weight_decay"))

    @staticmethod
    def forward(xp, w, grad, *rest, momentum, clipped, grad_scale, schedule, lr, l1=0.0, l2=0.0, dynamic=False,
                skipped=None, weight_decay=0.0, writable=False):
        m, extras = (rest[0], rest[1:]) if momentum else (None, rest)
        if l1 or l2 or dynamic or weight_decay:
            g = _gradient(xp, w, grad, extras, clipped, dynamic, grad_scale, l1, l2, writable)
            if g is None:
                return
            decay = w * (lr * weight_decay) if weight_decay else None       # of the weight before this step
            g *= lr
            if momentum:
                m *= momentum
                m -= g
                w += m
            else:
                w -= g
            if decay is not None:
                w -= decay
            return
        scale = (extras[0] * grad_scale if clipped else grad_scale) * lr      # one pass over the gradient
        if momentum and _momentum_compiled(xp, w, grad, m):       # one pass over the three arrays
            flat_w, flat_g, flat_m = w.reshape(-1), grad.reshape(-1), m.reshape(-1)
            rate, momentum = float(scale), float(momentum)
            host_threads.each(lambda part: _sgd_momentum_float32(flat_w[part], flat_g[part], flat_m[part], rate,
                                                                 momentum), w.size, SPLIT_PART_MIN,
                              work=host_threads.compiled_work(w.size))
            return
        if m is None and _compiled_step(xp, w, grad):
            # BLAS's axpy, compiled: the same fused multiply-add (bit for bit), without the ctypes call and NumPy
            # attribute reads a small layer's step cannot hide (64x128: 3.3 us against 7.2)
            _sgd_step_float32(w.reshape(-1), grad.reshape(-1), np.float32(-float(scale)))
            return
        if _blas_pass(xp, w, grad) and (m is None or m.flags.c_contiguous):
            flat_w, flat_g, flat_m = w.reshape(-1), grad.reshape(-1), None if m is None else m.reshape(-1)

            def step(part):             # host threads take blocks of the flattened arrays
                if momentum:
                    blas.axpby(flat_m[part], flat_g[part], -float(scale), momentum)   # m = momentum m - scale g
                    flat_w[part] += flat_m[part]
                else:
                    blas.axpy(flat_w[part], flat_g[part], -float(scale))          # w -= scale g, one pass

            host_threads.each(step, w.size, SPLIT_PART_MIN, work=w.size)
            return
        if momentum:
            m *= momentum
            m -= _scaled(grad, scale, writable)
            w += m
        else:
            w -= _scaled(grad, scale, writable)


class SGDGemmUpdate(_Update):
    """Plain SGD on a variable whose gradient is one matrix product read by nothing else: ``w -= lr * grad_scale *
    alpha * op(a) @ op(b)`` as one BLAS call that accumulates into ``w`` (``runtime.blas``), instead of writing,
    scaling and re-reading the gradient. Made by the compiler's ``fold_sgd_into_gemm`` pass from a ``MatMul`` and
    its ``SGDUpdate``, never traced."""
    prefix, api = "SGDUpdate_", "SGD.minimize"
    donates = ()

    @staticmethod
    def gemm_macs(node):
        w, a = node.inputs[:2]
        return w.size * a.shape[0 if node.attrs["transpose_a"] else 1]

    @staticmethod
    def forward(xp, w, a, b, transpose_a, transpose_b, alpha, grad_scale, schedule, lr):
        scale = alpha * grad_scale * lr
        if w.flags.c_contiguous:
            blas.gemm_accumulate(w, a, b, -scale, transpose_a, transpose_b)
        else:                           # (variables are contiguous; a view set from outside would not be)
            w -= scale * ((a.T if transpose_a else a) @ (b.T if transpose_b else b))


def _moments(g, m, v, beta1, beta2):
    """Adam's moment updates in place (``m = beta1 m + (1 - beta1) g``, ``v = beta2 v + (1 - beta2) g²``), with
    ``g`` used as scratch; returns the one array allocated (free for the caller)."""
    scratch = g * g
    scratch *= 1 - beta2
    v *= beta2
    v += scratch
    m *= beta1
    g *= 1 - beta1
    m += g
    return scratch


def _adam_blas(w, grad, m, v, scale, beta1, beta2, epsilon, lr, weight_decay, writable):
    """Adam's step on NumPy arrays in 9 passes instead of 13 (PyTorch's ``foreach`` Adam fuses likewise): the
    gradient's scale folds into the factor of a BLAS ``axpy`` for each moment (``m = beta1 m; m += (1 - beta1) scale
    g``; ``v = beta2 v; v += (1 - beta2) scale² g²``), and the step is one more (``w -= lr m / (sqrt(v) + epsilon)``).
    OpenBLAS's ``axpby`` would make each moment one pass, but its kernel is scalar: 4x slower than two NumPy passes
    here; and cutting the arrays into cache-sized blocks lost more to the calls than it gained (a 64k-element
    update: 148 us in 16k blocks, 107 whole, 139 in NumPy's 13 passes). Large arrays are split over the host
    threads; the gradient's buffer is the scratch when the plan lets the update overwrite it."""
    flat_w, flat_g, flat_m, flat_v = w.reshape(-1), grad.reshape(-1), m.reshape(-1), v.reshape(-1)
    alpha_m, alpha_v = (1 - beta1) * scale, (1 - beta2) * scale * scale
    t = w.dtype.type
    beta1, beta2, epsilon = t(beta1), t(beta2), t(epsilon)

    def step(part):
        g, mb, vb = flat_g[part], flat_m[part], flat_v[part]
        mb *= beta1
        blas.axpy(mb, g, alpha_m)
        scratch = np.square(g, out=g if writable else None)
        vb *= beta2
        blas.axpy(vb, scratch, alpha_v)
        np.sqrt(vb, out=scratch)
        scratch += epsilon
        np.divide(mb, scratch, out=scratch)
        if weight_decay:                                   # AdamW: the decay of the weight before this step
            blas.axpy(scratch, flat_w[part], weight_decay)
        blas.axpy(flat_w[part], scratch, -float(lr))

    host_threads.each(step, w.size, SPLIT_PART_MIN, work=w.size)


@jit.kernel
def _adam_float32_compiled(w, g, m, v, alpha_m, alpha_v, beta1, beta2, epsilon, lr, weight_decay):
    """Adam's step on flat float32 arrays in one pass (``_adam_blas``'s arithmetic, its twin): ``m = beta1 m +
    alpha_m g``, ``v = beta2 v + alpha_v g²`` (``alpha_m = (1 - beta1) scale``, ``alpha_v = (1 - beta2) scale²``, the
    gradient's scale folded in), ``w -= lr (m / (sqrt(v) + epsilon) + weight_decay w)``. ``g`` is only read."""
    decay = weight_decay != 0
    for i in range(w.size):
        gi = g[i]
        mi = beta1 * m[i] + alpha_m * gi
        vi = beta2 * v[i] + alpha_v * (gi * gi)
        m[i] = mi
        v[i] = vi
        direction = mi / (math.sqrt(vi) + epsilon)
        if decay:                                          # AdamW: the decay of the weight before this step
            direction += weight_decay * w[i]
        w[i] -= lr * direction


def _adam_compiled(w, grad, m, v, scale, beta1, beta2, epsilon, lr, weight_decay):
    """Adam's step through ``_adam_float32_compiled`` (its scalars rounded to float32, as BLAS's ``axpy`` rounds
    them in ``_adam_blas``), from ``host_threads.SPLIT_COMPILED`` on split over the host threads."""
    t = np.float32
    flat = [a.reshape(-1) for a in (w, grad, m, v)]
    scalars = (t((1 - beta1) * scale), t((1 - beta2) * scale * scale), t(beta1), t(beta2), t(epsilon), t(lr),
               t(weight_decay))
    if not host_threads.compiled_work(w.size):
        _adam_float32_compiled(*flat, *scalars)
    else:
        host_threads.each(lambda part: _adam_float32_compiled(*(f[part] for f in flat), *scalars), w.size,
                          SPLIT_PART_MIN, work=w.size)


class AdamUpdate(_Update):
    """``m = beta1 m + (1 - beta1) g``, ``v = beta2 v + (1 - beta2) g²``, ``w -= lr (m / (sqrt(v) + epsilon) +
    weight_decay w)``, ``lr`` times ``sqrt(1 - beta2^t) / (1 - beta1^t)`` with ``do_bias_correction`` (OneFlow's
    adam_update; AdamW's decay from the weight before the step). Inputs ``(w, grad, m, v, *extras)``."""
    prefix, api = "AdamUpdate_", "Adam.minimize"

    @staticmethod
    def host_args(node, step):
        train_step = _train_step(node, step)
        return {"lr": node.attrs["schedule"](train_step), "step": train_step + 1}

    @staticmethod
    def forward(xp, w, grad, m, v, *rest, beta1, beta2, epsilon, do_bias_correction, weight_decay, clipped,
                grad_scale, schedule, lr, step, l1=0.0, l2=0.0, dynamic=False, skipped=None, writable=False):
        if do_bias_correction:
            lr = _bias_corrected(lr, beta1, beta2, step)
        compiled = jit.takes(w, grad, m, v, contiguous=True)       # (then _adam_passes: one pass)
        if not (l1 or l2 or dynamic or compiled) and _blas_pass(xp, w, grad) and m.flags.c_contiguous and \
                v.flags.c_contiguous:
            scale = float(rest[0]) * grad_scale if clipped else grad_scale
            _adam_blas(w, grad, m, v, scale, beta1, beta2, epsilon, lr, weight_decay, writable)
            return
        _adam_passes(xp, w, grad, m, v, rest, beta1, beta2, epsilon, weight_decay, clipped, grad_scale, lr, l1, l2,
                     dynamic, writable, compiled)


def _bias_corrected(lr, beta1, beta2, step):
    """Adam's learning rate at ``step`` with its moments' bias corrected. math.sqrt rounds as np.sqrt does, without
    its ~1 us scalar-to-array trip; the rate stays a NumPy float64 (the NumPy path's last multiply in float64)."""
    return np.float64(lr * math.sqrt(1 - beta2 ** step) / (1 - beta1 ** step))


def _adam_passes(xp, w, grad, m, v, extras, beta1, beta2, epsilon, weight_decay, clipped, grad_scale, lr, l1, l2,
                 dynamic, writable, compiled):
    """Adam's step as NumPy's (CuPy's) elementwise passes, ``lr`` bias-corrected already; False when a dynamic loss
    scale skips the step. Every element is computed alone, so a step over arrays laid end to end gives each element
    what its own array's step gives it. ``compiled`` (``jit.takes`` the four arrays, contiguous): the passes are
    one (``_adam_float32_compiled``), the gradient's scale folded into the moments' factors where nothing else
    changes the gradient (as ``_adam_blas`` folds it)."""
    if compiled and not (l1 or l2 or dynamic):
        scale = float(extras[0]) * grad_scale if clipped else grad_scale
        _adam_compiled(w, grad, m, v, scale, beta1, beta2, epsilon, lr, weight_decay)
        return True
    g = _gradient(xp, w, grad, extras, clipped, dynamic, grad_scale, l1, l2, writable)
    if g is None:
        return False
    if compiled and g.dtype == np.float32 and g.flags.c_contiguous:
        _adam_compiled(w, g, m, v, 1.0, beta1, beta2, epsilon, lr, weight_decay)
        return True
    scratch = _moments(g, m, v, beta1, beta2)       # g's buffer is free from here on
    xp.sqrt(v, out=scratch)
    scratch += epsilon
    xp.divide(m, scratch, out=scratch)
    if weight_decay:
        xp.multiply(w, weight_decay, out=g)
        scratch += g
    scratch *= lr
    w -= scratch
    return True


class AdamGroupUpdate(_Update):
    """The Adam steps of several small variables as one: inputs ``(w, grad, m, v)`` of each of ``count`` variables,
    then their shared extras (``_Update``); attrs those of each member's ``AdamUpdate`` (all equal). The gradients,
    weights and moments are laid end to end in one array each, ``_adam_passes`` (AdamUpdate's NumPy path, which
    variables under ``BLAS_PASS_FROM`` elements take) runs once over them, and the weights and moments are copied
    back: each element gets the same float operations as in its own update (bit-identical results), in 13 NumPy
    passes for the group instead of 13 per variable, plus four concatenations and three copies back per variable (a
    small update alone is ~15 us of per-call costs for ~1 us of arithmetic). With compiled kernels (``runtime.jit``,
    float32) the 13 passes are one (``_adam_float32_compiled``: BERT's 36 small variables 105 -> 94 us, the
    concatenations and copies being most of it); stepping each member in place instead, without them, cost more
    (~4.5 us a member in checks, reshapes, scalars and the call: 170 us). Made by the compiler's
    ``group_small_updates`` pass, never traced."""
    prefix, api = "AdamUpdate_", "Adam.minimize"
    donates = ()
    host_args = AdamUpdate.host_args

    @staticmethod
    def forward(xp, *arrays, count, beta1, beta2, epsilon, do_bias_correction, weight_decay, clipped, grad_scale,
                schedule, lr, step, l1=0.0, l2=0.0, dynamic=False, skipped=None):
        if do_bias_correction:
            lr = _bias_corrected(lr, beta1, beta2, step)
        members, extras = arrays[:4 * count], arrays[4 * count:]
        w, grad, m, v = (xp.concatenate(members[k::4], axis=None) for k in range(4))     # flattened, end to end
        if not _adam_passes(xp, w, grad, m, v, extras, beta1, beta2, epsilon, weight_decay, clipped, grad_scale, lr,
                            l1, l2, dynamic, True, jit.takes(w, grad, m, v, contiguous=True)):
            return                                  # a step skipped by a dynamic loss scale
        start = 0
        for i in range(0, 4 * count, 4):
            stop = start + members[i].size
            for target, flat in ((members[i], w), (members[i + 2], m), (members[i + 3], v)):
                if target.flags.c_contiguous:
                    target.reshape(-1)[:] = flat[start:stop]           # a view: no shape to rebuild
                else:
                    target[...] = flat[start:stop].reshape(target.shape)
            start = stop


class RMSPropUpdate(_Update):
    """``ms = d*ms + (1-d)*g^2``; centered: ``mg = d*mg + (1-d)*g``, ``denom = ms - mg^2``, else ``denom = ms``;
    ``w -= lr * g / sqrt(denom + epsilon)`` (epsilon inside the root, as OneFlow's rmsprop_update)."""
    prefix, api = "RMSPropUpdate_", "RMSProp.minimize"

    @staticmethod
    def forward(xp, w, grad, mean_square, *rest, decay_rate, epsilon, centered, clipped, grad_scale, schedule, lr,
                l1=0.0, l2=0.0, dynamic=False, skipped=None, writable=False):
        g = _gradient(xp, w, grad, rest[1:] if centered else rest, clipped, dynamic, grad_scale, l1, l2, writable)
        if g is None:
            return
        scratch = g * g                     # the one array this update allocates
        scratch *= 1 - decay_rate
        mean_square *= decay_rate
        mean_square += scratch
        if centered:
            mean_gradient = rest[0]
            mean_gradient *= decay_rate
            xp.multiply(g, 1 - decay_rate, out=scratch)
            mean_gradient += scratch
            xp.multiply(mean_gradient, mean_gradient, out=scratch)
            xp.subtract(mean_square, scratch, out=scratch)
            scratch += epsilon
        else:
            xp.add(mean_square, epsilon, out=scratch)
        xp.sqrt(scratch, out=scratch)
        xp.divide(g, scratch, out=scratch)
        scratch *= lr
        w -= scratch


class LARSUpdate(_Update):
    """``lars = coefficient * |w| / (epsilon + |g|)`` (1 where a norm is 0); ``momentum = beta * momentum -
    lr * lars * g``; ``w += momentum``. Norms are L2 over the whole variable, taken before the update."""
    prefix, api = "LARSUpdate_", "LARS.minimize"

    @staticmethod
    def forward(xp, w, grad, momentum, *rest, momentum_beta, epsilon, lars_coefficient, clipped, grad_scale, schedule,
                lr, l1=0.0, l2=0.0, dynamic=False, skipped=None, writable=False):
        g = _gradient(xp, w, grad, rest, clipped, dynamic, grad_scale, l1, l2, writable)
        if g is None:
            return
        w_norm, g_norm = _norm(xp, w), _norm(xp, g)
        lars = _ratio_or_one(xp, lars_coefficient * w_norm, epsilon + g_norm, w_norm, g_norm)
        g *= lr * lars
        momentum *= momentum_beta
        momentum -= g
        w += momentum


class LazyAdamUpdate(_Update):
    """Adam with bias correction through the state scalars ``beta1_t``/``beta2_t`` (start at beta1/beta2, multiplied
    by them after each step): ``lr_t = lr * sqrt(1 - beta2_t) / (1 - beta1_t)``, then ``AdamUpdate`` on every
    element."""
    prefix, api = "LazyAdamUpdate_", "LazyAdam.minimize"

    @staticmethod
    def forward(xp, w, grad, m, v, beta1_t, beta2_t, *rest, beta1, beta2, epsilon, clipped, grad_scale, schedule, lr,
                l1=0.0, l2=0.0, dynamic=False, skipped=None, writable=False):
        if dynamic and _extras(rest, clipped, dynamic)[2]:
            return                      # a skipped step: beta1_t and beta2_t stay as they are too
        lr_t = lr * xp.sqrt(1 - beta2_t[0]) / (1 - beta1_t[0])        # 0-d, stays on the device
        AdamUpdate.forward(xp, w, grad, m, v, *rest, beta1=beta1, beta2=beta2, epsilon=epsilon,
                           do_bias_correction=False, weight_decay=0.0, clipped=clipped, grad_scale=grad_scale,
                           schedule=schedule, lr=lr_t, step=0, l1=l1, l2=l2, dynamic=dynamic, writable=writable)
        beta1_t *= beta1
        beta2_t *= beta2


class LAMBUpdate(_Update):
    """OneFlow 0.x's lamb_update: ``beta1_t *= beta1; beta2_t *= beta2`` first (they start at beta1/beta2, so step t
    corrects with ``beta^(t+1)``); ``d = (m / (1 - beta1_t)) / sqrt(v / (1 - beta2_t) + epsilon)``;
    ``trust = |w| / |d|`` (1 where a norm is 0); ``w -= lr * trust * (d + weight_decay * w)``."""
    prefix, api = "LAMBUpdate_", "LAMB.minimize"

    @staticmethod
    def forward(xp, w, grad, m, v, beta1_t, beta2_t, *rest, beta1, beta2, epsilon, weight_decay, clipped, grad_scale,
                schedule, lr, l1=0.0, l2=0.0, dynamic=False, skipped=None, writable=False):
        g = _gradient(xp, w, grad, rest, clipped, dynamic, grad_scale, l1, l2, writable)
        if g is None:
            return
        beta1_t *= beta1
        beta2_t *= beta2
        scratch = _moments(g, m, v, beta1, beta2)       # g's buffer is free from here on: it becomes the direction d
        xp.divide(v, 1 - beta2_t[0], out=scratch)
        scratch += epsilon
        xp.sqrt(scratch, out=scratch)
        xp.divide(m, 1 - beta1_t[0], out=g)
        g /= scratch
        w_norm, d_norm = _norm(xp, w), _norm(xp, g)
        trust = _ratio_or_one(xp, w_norm, d_norm, w_norm, d_norm)
        if weight_decay:
            xp.multiply(w, weight_decay, out=scratch)
            g += scratch
        g *= lr * trust
        w -= g


class IndexedSlicesUpdate(_Update):
    """A dense update rule (attr ``update``: ``SGDUpdate``, ``AdamUpdate``, ``LazyAdamUpdate``) run on the rows of
    an embedding table that the step's ids touched, and only those (``indexed_slices_optimizer_conf``). Inputs
    ``(table, rows, ids, *state)``: ``rows`` the gradient rows of the ids (repeats allowed), then the rule's state,
    of which the first ``row_states`` are per element like the table (moments) and the rest scalars (``beta1_t``).
    The ids' rows of the table and its state are gathered, updated by the rule's own kernel, and written back:
    a row no id touched keeps its value and state bit for bit, and a touched row gets exactly what the dense rule
    gives it."""
    prefix, api = "IndexedSlicesUpdate_", "minimize (indexed slices)"
    row_sparse = True
    donates = ()

    @staticmethod
    def host_args(node, step):
        return node.attrs["update"].host_args(node, step)

    @staticmethod
    def forward(xp, table, rows, ids, *state, update, row_states, **attrs):
        unique, summed = unique_rows(xp, ids, rows, table.shape[0])
        touched = table[unique]
        per_row = [s[unique] for s in state[:row_states]]
        update.forward(xp, touched, summed, *per_row, *state[row_states:], writable=True, **attrs)
        table[unique] = touched
        for s, r in zip(state, per_row):
            s[unique] = r


class GlobalNormClipFactor(Op):
    """``min(1, clip_norm / |g|)`` over the gradients of one minimize as their updates apply them before clipping:
    ``grad * grad_scale`` (times ``1 / scale`` of a dynamic loss scale, the last input when ``dynamic``) plus each
    variable's regularization (``regularizers``: ``(l1, l2)`` per gradient, the variables following the gradients;
    None when no variable is regularized). One factor shared by every update."""
    prefix, api = "ClipByGlobalNorm_", "grad_clipping.by_global_norm"

    @staticmethod
    def infer(*inputs, clip_norm, grad_scale, regularizers=None, dynamic=False):
        return spec((), inputs[0].dtype)

    @staticmethod
    def forward(xp, *inputs, clip_norm, grad_scale, regularizers=None, dynamic=False):
        n = len(inputs) - int(dynamic)
        if regularizers is not None:
            n //= 2
        grads = inputs[:n]
        scale = grad_scale * (inputs[-1].astype(xp.float64) if dynamic else 1.0)
        if regularizers is None:
            total = sum(xp.sum(gr.astype(xp.float64) ** 2) for gr in grads) * scale * scale
        else:
            total = 0.0
            for gr, w, (l1, l2) in zip(grads, inputs[n:2 * n], regularizers):
                applied = gr.astype(xp.float64) * scale
                if l1:
                    applied += l1 * xp.sign(w)
                if l2:
                    applied += l2 * w.astype(xp.float64)
                total = total + xp.sum(applied * applied)
        norm = xp.sqrt(total)
        return xp.minimum(1.0, clip_norm / xp.maximum(norm, 1e-12)).astype(grads[0].dtype)


class grad_clipping:  # noqa: N801 - OneFlow's namespace ``flow.optimizer.grad_clipping``
    """``flow.optimizer.grad_clipping``: ``by_global_norm(clip_norm)`` scales every model gradient by
    ``clip_norm / max(global_norm, clip_norm)`` before the update (``Optimizer(grad_clipping=...)``).
    """
    class by_global_norm:  # noqa: N801
        def __init__(self, clip_norm):
            if not isinstance(clip_norm, (int, float)) or clip_norm <= 0:
                raise ValueError(f"grad_clipping.by_global_norm: clip_norm must be a positive number, got {clip_norm!r}")
            self.clip_norm = float(clip_norm)


# ------------------------------------------------------------------------------------------------------- optimizers

class Optimizer:
    """What every optimizer shares: the learning-rate schedule, gradient clipping, the loss scale policy
    (``loss_scale_factor`` is a static one; see ``optim.loss_scale``) and the variables it trains (all trainable
    variables of the job by default). Variables' regularizers (``flow.regularizers``) apply in every update."""

    def __init__(self, lr_scheduler, loss_scale_factor=None, grad_clipping=None, variables=None,
                 loss_scale_policy=None):
        owner = type(self).__name__
        self.lr_scheduler = as_scheduler(lr_scheduler)
        self.loss_scale_policy = as_policy(loss_scale_factor, loss_scale_policy, owner)
        if grad_clipping is not None and not hasattr(grad_clipping, "clip_norm"):
            raise TypeError(f"{owner}: grad_clipping: expected flow.optimizer.grad_clipping.by_global_norm("
                            f"clip_norm), got {grad_clipping!r}")
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
        """The variables this minimize trains: those given, else every variable this job declared trainable. A
        variable is trainable per job, as in OneFlow (a GAN's discriminator job reads the generator with
        ``trainable=False`` and its generator job trains it)."""
        sess = session.default()

        def trainable(name):
            decl = graph.declarations.get(name)
            return decl.trainable if decl is not None else sess.variables[name].trainable

        names = self.variables if self.variables is not None else [n for n in graph.variables if trainable(n)]
        missing = [n for n in names if n not in graph.variables]
        if missing:
            raise TraceError(f"minimize: variables {missing} are not used by job {graph.name!r}")
        return [graph.variables[n] for n in names]

    def build(self, graph, loss, extra_targets=(), sparse_variables=frozenset()):
        """Add gradient and update nodes for ``loss`` (called once the job function has returned).

        In OneFlow's order: the model gradients are scaled by ``1 / loss.size`` and by ``1 / loss scale``; under a
        dynamic loss scale their NaN/Inf are counted (a step with any is skipped); each variable's regularization
        is added; the global-norm clip factor is taken over the result; the updates apply it. The variables named
        in ``sparse_variables`` (``indexed_slices_optimizer_conf``) get sparse updates where they can
        (``_indexed_slices``).
        """
        variables = self._trained(graph)
        policy = self.loss_scale_policy
        dynamic = isinstance(policy, DynamicLossScalePolicy)
        static_scale = policy.loss_scale_factor if isinstance(policy, StaticLossScalePolicy) else 1.0
        seed_name = f"System-Seed-{loss.op_name}"
        if dynamic:
            scale, good_steps = self._dynamic_scale_variables(graph, policy)
            seed = apply(ScaledSeed, (scale,), name=seed_name, shape=loss.shape, dtype=loss.dtype)
        else:
            seed = constant(np.full(loss.shape, static_scale, loss.dtype), dtype=loss.dtype, name=seed_name)
        grads = gradients([loss], list(variables) + list(extra_targets), [seed])[:len(variables)]
        pairs = [(v, gr) for v, gr in zip(variables, grads) if gr is not None]
        if sparse_variables:
            pairs = [(v, self._indexed_slices(v, gr, policy) if v.op_name in sparse_variables else gr)
                     for v, gr in pairs]
        if not pairs:
            raise TraceError(f"minimize: loss {loss.logical_blob_name} does not depend on any trainable variable "
                             f"of job {graph.name!r}; nothing would train")
        grad_scale = 1.0 / max(loss.size, 1) / static_scale
        shared = {"grad_scale": grad_scale, "schedule": self.lr_scheduler}
        unscale = ()
        if dynamic:
            skipped = SkippedSteps()
            unscale = apply(DynamicLossScaleSchedule, (scale, good_steps) + tuple(gr for _, gr in pairs),
                            name=f"System-Train-DynamicLossScale-{graph.name}-Schedule",
                            increment_period=policy.increment_period, multiplier=policy.multiplier, skipped=skipped)
            shared.update(dynamic=True, skipped=skipped)
        regularizers = [_regularization(var) for var, _ in pairs]
        factor = ()
        if self.grad_clipping is not None:
            regularized = any(l1 or l2 for l1, l2 in regularizers)
            inputs = tuple(gr for _, gr in pairs) + (tuple(v for v, _ in pairs) if regularized else ()) + unscale[:1]
            factor = (apply(GlobalNormClipFactor, inputs, name=graph.local_name("ClipFactor_"),
                            clip_norm=self.grad_clipping.clip_norm, grad_scale=grad_scale,
                            regularizers=tuple(regularizers) if regularized else None, dynamic=dynamic),)
        for (var, grad), (l1, l2) in zip(pairs, regularizers):
            attrs = dict(shared, clipped=bool(factor))
            if l1 or l2:
                attrs.update(l1=l1, l2=l2)
            self._update(var, grad, factor + tuple(unscale), attrs)

    @staticmethod
    def _dynamic_scale_variables(graph, policy):
        """The job's loss scale and good-step counter, named as OneFlow names them."""
        prefix = f"System-Train-DynamicLossScale-{graph.name}"
        if f"{prefix}-LossScale" in graph.variables:
            raise TraceError(f"job {graph.name!r}: only one minimize of a job can use a dynamic loss scale")
        scale = get_variable(f"{prefix}-LossScale", shape=(1,), dtype=np.float32,
                             initializer=constant_initializer(policy.initial_loss_scale), trainable=False)
        good_steps = get_variable(f"{prefix}-GoodStepCounter", shape=(1,), dtype=np.int64,
                                  initializer=zeros_initializer(), trainable=False)
        return scale, good_steps

    def _update(self, var, grad, extras, attrs):
        """Add ``var``'s update node: inputs ``(var, grad, *state, *extras)``, with the shared ``attrs``."""
        raise NotImplementedError

    # Optimizers whose rule is elementwise (SGD, Adam and their kin) can update the gathered rows alone; LARS and
    # LAMB take norms over the whole variable, and OneFlow has no sparse RMSProp.
    row_sparse = False

    def _indexed_slices(self, var, grad, policy):
        """``grad`` as ``IndexedSlices`` (ids, rows) when ``var`` can be updated sparsely, as OneFlow's
        IndexedSlicesOptimizerRewritePass decides: its gradient comes from gathers alone, it has no regularizer, and
        the optimizer neither clips nor scales the loss. Otherwise ``grad`` as it is, with a warning saying why."""
        reason = None
        if not self.row_sparse:
            reason = f"{type(self).__name__} has no sparse update (SGD, Adam, AdamW, SGDW and LazyAdam have)"
        elif self.grad_clipping is not None:
            reason = "the optimizer clips gradients by their global norm"
        elif policy is not None:
            reason = "the optimizer scales the loss"
        elif any(_regularization(var)):
            reason = "the variable has a regularizer"
        else:
            with g.grad_scope(var.node):        # named as the variable's gradient, off the global counter
                slices = _gathered_slices(grad)
                if slices is not None:
                    ids = [identity(i) for i, _ in slices]      # tensors of their own, read by the update alone
                    rows = [identity(r) for _, r in slices]
                    if len(slices) > 1:
                        ids, rows = [concat(ids, axis=0)], [concat(rows, axis=0)]
                    return IndexedSlices(ids[0], rows[0])
            reason = "its gradient does not come from flow.gather (axis 0) alone"
        warnings.warn(f"indexed_slices_optimizer_conf: variable {var.op_name!r} is updated densely: {reason}",
                      RuntimeWarning, stacklevel=2)
        return grad

    def _apply(self, op, var, grad, state, extras, row_states, name, **attrs):
        """The update node of ``op`` with inputs ``(var, grad, *state, *extras)``, or, for ``IndexedSlices``, an
        ``IndexedSlicesUpdate`` running ``op`` on the gathered rows (the first ``row_states`` of ``state`` are per
        element). Sparse gradients never come with extras (``_indexed_slices`` rules out clipping and loss scales)."""
        if isinstance(grad, IndexedSlices):
            return apply(IndexedSlicesUpdate, (var, grad.rows, grad.ids) + tuple(state), name=name, update=op,
                         row_states=row_states, **attrs)
        return apply(op, (var, grad) + tuple(state) + tuple(extras), name=name, **attrs)

    def _slot(self, var, suffix):
        return get_variable(f"{var.op_name}-{suffix}", shape=var.shape, dtype=var.dtype,
                            initializer=zeros_initializer(), trainable=False)

    def _scalar_slot(self, var, suffix, value):
        """A one-element state variable, as OneFlow declares ``beta1_t``: shape (1,), starting at ``value``."""
        return get_variable(f"{var.op_name}-{suffix}", shape=(1,), dtype=var.dtype,
                            initializer=constant_initializer(value), trainable=False)


class IndexedSlices(NamedTuple):
    """A table's gradient as the rows of the ids that touched it: ``ids`` 1-D ints, ``rows`` ``(ids.size,) +
    table.shape[1:]``; the dense gradient sums the rows by id."""
    ids: g.LazyTensor
    rows: g.LazyTensor


def _gathered_slices(grad):
    """``[(ids, rows), ...]`` when ``grad`` is made only of gathers' gradients (one, or several added up: a table
    gathered more than once), else None. Each op says whether it can through its ``indexed_slices`` trait."""
    node = grad.node
    offer = node.op.indexed_slices
    if offer is not None:
        slices = offer(node)
        return None if slices is None else [slices]
    if node.op is Add and all(t.shape == grad.shape for t in node.inputs):      # autodiff's sum of contributions
        parts = [_gathered_slices(t) for t in node.inputs]
        return None if None in parts else [s for part in parts for s in part]
    return None


def _regularization(var):
    """``(l1, l2)`` of the regularizer ``var`` was declared with in this job (``flow.get_variable(regularizer=)``)."""
    regularizer = var.node.attrs.get("regularizer")
    return (regularizer.l1, regularizer.l2) if regularizer is not None else (0.0, 0.0)


def _number(value):
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _check_fraction(owner, argument, value):
    if not _number(value) or not 0 <= value < 1:
        raise ValueError(f"{owner}: {argument} must be a number in [0, 1), got {value!r}")
    return float(value)


def _check_positive(owner, argument, value):
    if not _number(value) or not value > 0:
        raise ValueError(f"{owner}: {argument} must be a positive number, got {value!r}")
    return float(value)


def _check_non_negative(owner, argument, value):
    if not _number(value) or not value >= 0:
        raise ValueError(f"{owner}: {argument} must be a non-negative number, got {value!r}")
    return float(value)


class SGD(Optimizer):
    """``w -= lr * g``, or with ``momentum``: ``m = momentum * m - lr * g; w += m`` (OneFlow's default 0.9).
    ``momentum`` 0 or None (OneFlow-Benchmark passes None) is plain SGD."""

    def __init__(self, lr_scheduler, loss_scale_factor=None, momentum=0.9, grad_clipping=None, train_step_lbn=None,
                 loss_scale_policy=None, variables=None):
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping, variables, loss_scale_policy)
        self.momentum = 0.0 if momentum is None else _check_fraction("SGD", "momentum", momentum)

    row_sparse = True

    def _update(self, var, grad, extras, attrs):
        state = (self._slot(var, "momentum"),) if self.momentum else ()
        self._apply(SGDUpdate, var, grad, state, extras, len(state), f"{var.op_name}-SGDUpdate",
                    momentum=self.momentum, **attrs)


class Adam(Optimizer):
    """Adam; ``do_bias_correction`` defaults to False as in OneFlow."""

    def __init__(self, lr_scheduler, beta1=0.9, beta2=0.999, epsilon=1e-8, do_bias_correction=False,
                 loss_scale_factor=None, grad_clipping=None, train_step_lbn=None, loss_scale_policy=None,
                 variables=None):
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping, variables, loss_scale_policy)
        owner = type(self).__name__
        self.beta1 = _check_fraction(owner, "beta1", beta1)
        self.beta2 = _check_fraction(owner, "beta2", beta2)
        self.epsilon = _check_positive(owner, "epsilon", epsilon)
        self.do_bias_correction = bool(do_bias_correction)

    def _weight_decay(self, name):
        return 0.0

    row_sparse = True

    def _update(self, var, grad, extras, attrs):
        self._apply(AdamUpdate, var, grad, (self._slot(var, "m"), self._slot(var, "v")), extras, 2,
                    f"{var.op_name}-AdamUpdate", beta1=self.beta1, beta2=self.beta2, epsilon=self.epsilon,
                    do_bias_correction=self.do_bias_correction, weight_decay=self._weight_decay(var.op_name),
                    **attrs)


class _WeightDecayByName:
    """OneFlow's ``weight_decay_conf``: one rate, for the variables whose names match ``weight_decay_includes``
    (``re.search``), or all but those matching ``weight_decay_excludes``, or all when neither is given."""

    def _set_weight_decay(self, weight_decay, includes, excludes):
        owner = type(self).__name__
        self.weight_decay = 0.0 if weight_decay is None else _check_non_negative(owner, "weight_decay", weight_decay)
        if includes is not None and excludes is not None:
            raise ValueError(f"{owner}: give weight_decay_includes or weight_decay_excludes, not both")
        self.includes = _patterns(includes)
        self.excludes = _patterns(excludes)

    def _weight_decay(self, name):
        if self.includes is not None and not any(p.search(name) for p in self.includes):
            return 0.0
        if self.excludes is not None and any(p.search(name) for p in self.excludes):
            return 0.0
        return self.weight_decay


class AdamW(_WeightDecayByName, Adam):
    """Adam with decoupled weight decay ``w -= lr * weight_decay * w``, limited by name patterns if given."""

    def __init__(self, lr_scheduler, beta1=0.9, beta2=0.999, epsilon=1e-8, do_bias_correction=False,
                 loss_scale_factor=None, weight_decay=None, weight_decay_includes=None, weight_decay_excludes=None,
                 grad_clipping=None, train_step_lbn=None, loss_scale_policy=None, variables=None):
        super().__init__(lr_scheduler, beta1, beta2, epsilon, do_bias_correction, loss_scale_factor, grad_clipping,
                         train_step_lbn, loss_scale_policy, variables)
        self._set_weight_decay(weight_decay, weight_decay_includes, weight_decay_excludes)


class SGDW(_WeightDecayByName, SGD):
    """SGD with decoupled weight decay (OneFlow's ``SGDW``): ``w -= lr * (g + weight_decay * w)``, or with
    momentum ``m = momentum * m - lr * g; w += m - lr * weight_decay * w``; the decay applies by name as in AdamW."""

    def __init__(self, lr_scheduler, loss_scale_factor=None, momentum=0.9, weight_decay=None,
                 weight_decay_includes=None, weight_decay_excludes=None, grad_clipping=None, train_step_lbn=None,
                 loss_scale_policy=None, variables=None):
        super().__init__(lr_scheduler, loss_scale_factor, momentum, grad_clipping, train_step_lbn, loss_scale_policy,
                         variables)
        self._set_weight_decay(weight_decay, weight_decay_includes, weight_decay_excludes)

    def _update(self, var, grad, extras, attrs):
        decay = self._weight_decay(var.op_name)
        super()._update(var, grad, extras, dict(attrs, weight_decay=decay) if decay else attrs)


class RMSProp(Optimizer):
    """RMSProp as OneFlow 0.x's ``rmsprop_update``: ``ms = decay_rate * ms + (1 - decay_rate) * g^2``; with
    ``centered`` also ``mg = decay_rate * mg + (1 - decay_rate) * g`` and ``denom = ms - mg^2`` (else ``denom = ms``);
    ``w -= lr * g / sqrt(denom + epsilon)``. State: ``<var>-mean_square`` and, centered, ``<var>-mean_gradient``."""

    def __init__(self, lr_scheduler, decay_rate=0.99, epsilon=1e-8, centered=False, loss_scale_factor=None,
                 grad_clipping=None, train_step_lbn=None, loss_scale_policy=None, variables=None):
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping, variables, loss_scale_policy)
        self.decay_rate = _check_fraction("RMSProp", "decay_rate", decay_rate)
        self.epsilon = _check_positive("RMSProp", "epsilon", epsilon)
        if not isinstance(centered, (bool, np.bool_)):
            raise ValueError(f"RMSProp: centered must be True or False, got {centered!r}")
        self.centered = bool(centered)

    def _update(self, var, grad, extras, attrs):
        state = (self._slot(var, "mean_square"),) + ((self._slot(var, "mean_gradient"),) if self.centered else ())
        apply(RMSPropUpdate, (var, grad) + state + extras, name=f"{var.op_name}-RMSPropUpdate",
              decay_rate=self.decay_rate, epsilon=self.epsilon, centered=self.centered, **attrs)


class LARS(Optimizer):
    """LARS as OneFlow 0.x's ``lars_update``: per variable ``lars = lars_coefficient * |w| / (epsilon + |g|)`` (L2
    norms; 1 when either norm is 0, so zero-initialised biases train at ``lr``), ``momentum = momentum_beta *
    momentum - lr * lars * g``, ``w += momentum``. State: ``<var>-momentum``."""

    def __init__(self, lr_scheduler, momentum_beta=0.9, epsilon=1e-9, lars_coefficient=0.0001, loss_scale_factor=None,
                 grad_clipping=None, train_step_lbn=None, loss_scale_policy=None, variables=None):
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping, variables, loss_scale_policy)
        self.momentum_beta = _check_fraction("LARS", "momentum_beta", momentum_beta)
        self.epsilon = _check_non_negative("LARS", "epsilon", epsilon)
        self.lars_coefficient = _check_positive("LARS", "lars_coefficient", lars_coefficient)

    def _update(self, var, grad, extras, attrs):
        apply(LARSUpdate, (var, grad, self._slot(var, "momentum")) + extras, name=f"{var.op_name}-LARSUpdate",
              momentum_beta=self.momentum_beta, epsilon=self.epsilon, lars_coefficient=self.lars_coefficient,
              **attrs)


class LazyAdam(Optimizer):
    """LazyAdam as OneFlow 0.x runs it on a dense gradient: its ``adam_update`` kernel with bias correction always on,
    over *every* element: ``m = beta1*m + (1-beta1)*g``, ``v = beta2*v + (1-beta2)*g^2``, ``w -= lr * sqrt(1 -
    beta2^t) / (1 - beta1^t) * m / (sqrt(v) + epsilon)``; elements whose gradient is 0 still move by their ``m``.

    With ``FunctionConfig.indexed_slices_optimizer_conf`` naming an embedding table, only the rows the step's ids
    gathered are updated, each as above, and the others keep their value and moments (``IndexedSlicesUpdate``).
    State: ``<var>-m``, ``<var>-v`` and the scalars ``<var>-beta1_t``, ``<var>-beta2_t`` (``beta^t`` after step t),
    so the bias correction resumes exactly from a checkpoint.
    """

    def __init__(self, lr_scheduler, beta1=0.9, beta2=0.999, epsilon=1e-8, loss_scale_factor=None, grad_clipping=None,
                 train_step_lbn=None, loss_scale_policy=None, variables=None):
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping, variables, loss_scale_policy)
        self.beta1 = _check_fraction("LazyAdam", "beta1", beta1)
        self.beta2 = _check_fraction("LazyAdam", "beta2", beta2)
        self.epsilon = _check_positive("LazyAdam", "epsilon", epsilon)

    row_sparse = True

    def _update(self, var, grad, extras, attrs):
        state = (self._slot(var, "m"), self._slot(var, "v"),
                 self._scalar_slot(var, "beta1_t", self.beta1), self._scalar_slot(var, "beta2_t", self.beta2))
        self._apply(LazyAdamUpdate, var, grad, state, extras, 2, f"{var.op_name}-LazyAdamUpdate",
                    beta1=self.beta1, beta2=self.beta2, epsilon=self.epsilon, **attrs)


class LAMB(_WeightDecayByName, Optimizer):
    """LAMB as OneFlow 0.x's ``lamb_update``: ``m``, ``v`` as Adam; ``d = m_hat / sqrt(v_hat + epsilon)`` with the
    bias correction of ``beta^(t+1)`` at step t (OneFlow multiplies ``beta_t``, which starts at ``beta``, *before*
    using it); ``trust = |w| / |d|`` (1 when either norm is 0); ``w -= lr * trust * (d + weight_decay * w)``.
    ``weight_decay`` applies by name as in AdamW. State: ``<var>-m``, ``<var>-v``, ``<var>-beta1_t``, ``<var>-beta2_t``.
    """

    def __init__(self, lr_scheduler, beta1=0.9, beta2=0.999, epsilon=1e-6, loss_scale_factor=None, weight_decay=None,
                 weight_decay_includes=None, weight_decay_excludes=None, grad_clipping=None, train_step_lbn=None,
                 loss_scale_policy=None, variables=None):
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping, variables, loss_scale_policy)
        self.beta1 = _check_fraction("LAMB", "beta1", beta1)
        self.beta2 = _check_fraction("LAMB", "beta2", beta2)
        self.epsilon = _check_positive("LAMB", "epsilon", epsilon)
        self._set_weight_decay(weight_decay, weight_decay_includes, weight_decay_excludes)

    def _update(self, var, grad, extras, attrs):
        inputs = (var, grad, self._slot(var, "m"), self._slot(var, "v"),
                  self._scalar_slot(var, "beta1_t", self.beta1), self._scalar_slot(var, "beta2_t", self.beta2))
        apply(LAMBUpdate, inputs + extras, name=f"{var.op_name}-LAMBUpdate", beta1=self.beta1, beta2=self.beta2,
              epsilon=self.epsilon, weight_decay=self._weight_decay(var.op_name), **attrs)


def _patterns(patterns):
    if patterns is None:
        return None
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    return [re.compile(p) for p in patterns]
