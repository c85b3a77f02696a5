"""``flow.optimizer.loss_scale``: loss scaling, as OneFlow 0.x does it for mixed precision.

The gradient that seeds backpropagation is ``loss_scale`` instead of 1, so every intermediate gradient is
``loss_scale`` times larger (small fp16 gradients stay representable), and the model gradients are divided by it again
before the update (folded into the update's ``1 / loss.size`` factor). ``watch_diff`` sees the scaled gradients, as
OneFlow's do.

- ``static_loss_scale(loss_scale_factor)``: a constant scale (``Optimizer(loss_scale_factor=...)`` is the same).
- ``dynamic_loss_scale(initial_loss_scale=2**30, increment_period=2000, multiplier=2.0)``: the scale is a variable
  of the job, ``System-Train-DynamicLossScale-<job>-LossScale`` (float32; its count of good steps is
  ``...-GoodStepCounter``, int64; both saved by checkpoints). A step whose model gradients hold a NaN or Inf is
  skipped: no variable and no optimizer state changes, the train step of learning-rate schedules does not advance,
  and the scale becomes ``max(scale / multiplier, 1)``. After ``increment_period`` good steps in a row it becomes
  ``min(scale * multiplier, FLT_MAX)``. The step uses the scale it started with; the new one applies from the next.

Checking for NaN/Inf needs the count on the host before the updates run: on CuPy a dynamically scaled job waits for
the device each step and runs eagerly, not as a replayed CUDA graph.
"""
from __future__ import annotations

import math

import numpy as np

from ..ops import Op, spec

FLOAT32_MAX = float(np.finfo(np.float32).max)


class LossScalePolicy:
    """Base of the two policies (OneFlow's ``LossScalePolicy``)."""


class StaticLossScalePolicy(LossScalePolicy):
    def __init__(self, loss_scale_factor):
        if isinstance(loss_scale_factor, bool) or not isinstance(loss_scale_factor, (int, float)) or \
                not math.isfinite(loss_scale_factor) or loss_scale_factor <= 0:
            raise ValueError(f"loss_scale.static_loss_scale: loss_scale_factor must be a positive finite number, "
                             f"got {loss_scale_factor!r}")
        self.loss_scale_factor = float(loss_scale_factor)

    def __repr__(self):
        return f"static_loss_scale({self.loss_scale_factor!r})"


class DynamicLossScalePolicy(LossScalePolicy):
    def __init__(self, initial_loss_scale=2 ** 30, increment_period=2000, multiplier=2.0):
        api = "loss_scale.dynamic_loss_scale"
        if isinstance(initial_loss_scale, bool) or not isinstance(initial_loss_scale, (int, float)) or \
                not 1 <= initial_loss_scale <= FLOAT32_MAX:
            raise ValueError(f"{api}: initial_loss_scale must be a number in [1, FLT_MAX], got {initial_loss_scale!r}")
        if isinstance(increment_period, bool) or not isinstance(increment_period, int) or increment_period < 1:
            raise ValueError(f"{api}: increment_period must be a positive int (a number of steps), got "
                             f"{increment_period!r}")
        if isinstance(multiplier, bool) or not isinstance(multiplier, (int, float)) or not math.isfinite(multiplier) \
                or multiplier <= 1:
            raise ValueError(f"{api}: multiplier must be a finite number > 1, got {multiplier!r}")
        self.initial_loss_scale = float(initial_loss_scale)
        self.increment_period = increment_period
        self.multiplier = float(multiplier)

    def __repr__(self):
        return (f"dynamic_loss_scale(initial_loss_scale={self.initial_loss_scale!r}, "
                f"increment_period={self.increment_period!r}, multiplier={self.multiplier!r})")


class loss_scale:  # noqa: N801 - OneFlow's namespace ``flow.optimizer.loss_scale``
    """``flow.optimizer.loss_scale``: ``static_loss_scale(factor)`` and ``dynamic_loss_scale(...)``, the
    policies an optimizer's ``loss_scale_policy`` takes (see this module's docstring).
    """
    static_loss_scale = StaticLossScalePolicy
    dynamic_loss_scale = DynamicLossScalePolicy


def as_policy(loss_scale_factor, loss_scale_policy, owner):
    """The policy an optimizer uses: ``loss_scale_factor`` is a static one; giving both is an error (as OneFlow)."""
    if loss_scale_factor is not None:
        if loss_scale_policy is not None:
            raise ValueError(f"{owner}: give loss_scale_factor or loss_scale_policy, not both")
        return StaticLossScalePolicy(loss_scale_factor)
    if loss_scale_policy is not None and not isinstance(loss_scale_policy, LossScalePolicy):
        raise TypeError(f"{owner}: loss_scale_policy must be flow.optimizer.loss_scale.static_loss_scale(...) or "
                        f"dynamic_loss_scale(...), got {loss_scale_policy!r}")
    return loss_scale_policy


class SkippedSteps:
    """How many steps of one job a dynamic loss scale skipped: learning-rate schedules and Adam's bias correction
    read the train step ``call number - skipped`` (OneFlow does not advance its train step on a skipped step).
    Kept on the host, per traced signature of the job (a job called with several input shapes counts each one's
    skips apart) and not saved by checkpoints, like flowlab's call number itself."""

    def __init__(self):
        self.count = 0

    def train_step(self, step):
        return step - self.count


class ScaledSeed(Op):
    """The gradient that seeds backpropagation under a dynamic loss scale: ``shape`` filled with the scale (read on
    the device: no host round trip)."""
    prefix, api = "System-Seed-", "loss_scale.dynamic_loss_scale"

    @staticmethod
    def infer(scale, shape, dtype):
        return spec(shape, dtype)

    @staticmethod
    def forward(xp, scale, shape, dtype):
        out = xp.empty(shape, dtype)
        out[...] = scale.reshape(())
        return out


class DynamicLossScaleSchedule(Op):
    """One step of a dynamic loss scale (OneFlow's count_not_finite + dynamic_loss_scale_schedule): counts the NaN
    and Inf values of the model gradients, then changes the scale and the good-step counter (its inputs 0 and 1, in
    place) by the policy. Outputs ``1 / scale`` as this step used it (taken before the change) and the count (on the
    host), which the updates read to unscale the gradients and to skip the step."""
    prefix, api = "System-Train-DynamicLossScale-", "loss_scale.dynamic_loss_scale"
    outputs = ("inv_scale", "count_not_finite")
    side_effect = True      # changes the scale variables in place, and waits for the host

    @staticmethod
    def infer(scale, good_steps, *grads, increment_period, multiplier, skipped):
        return [spec((), scale.dtype), spec((), np.int64)]

    @staticmethod
    def forward(xp, scale, good_steps, *grads, increment_period, multiplier, skipped):
        inv_scale = 1 / scale.reshape(())                       # a new array: the step's own scale
        count = int(sum(xp.count_nonzero(~xp.isfinite(g)) for g in grads))     # one wait for the device
        if count:
            skipped.count += 1
            good_steps[...] = 0
            scale[...] = max(float(scale[0]) / multiplier, 1.0)
        else:
            good = int(good_steps[0]) + 1
            if good >= increment_period:
                scale[...] = min(float(scale[0]) * multiplier, FLOAT32_MAX)
                good = 0
            good_steps[...] = good
        return inv_scale, np.asarray(count, np.int64)
