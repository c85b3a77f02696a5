"""Learning-rate schedules: callables ``step -> lr`` evaluated on the host once per training step."""
from __future__ import annotations

import bisect
import math


def _check_number(value, argument, positive=False):
    if not isinstance(value, (int, float)) or isinstance(value, bool) or (positive and value <= 0):
        raise ValueError(f"{argument}: expected a {'positive ' if positive else ''}number, got {value!r}")


class Warmup:
    """Multiplies the schedule's rate during the first ``steps`` steps."""

    def __init__(self, steps, start_multiplier, linear):
        if not isinstance(steps, int) or steps < 0:
            raise ValueError(f"warmup steps must be a non-negative int, got {steps!r}")
        _check_number(start_multiplier, "start_multiplier")
        self.steps, self.start_multiplier, self.linear = steps, float(start_multiplier), linear

    def __call__(self, step, lr):
        if step >= self.steps:
            return lr
        if not self.linear:
            return lr * self.start_multiplier
        frac = step / self.steps
        return lr * (self.start_multiplier + (1.0 - self.start_multiplier) * frac)


class warmup:  # noqa: N801 - OneFlow's namespace ``flow.optimizer.warmup``
    @staticmethod
    def linear(steps, start_multiplier):
        return Warmup(steps, start_multiplier, linear=True)

    @staticmethod
    def constant(steps, multiplier):
        return Warmup(steps, multiplier, linear=False)


class LrScheduler:
    def __init__(self, warmup=None):
        if warmup is not None and not isinstance(warmup, Warmup):
            raise TypeError(f"warmup: expected flow.optimizer.warmup.linear(...) or .constant(...), got {warmup!r}")
        self.warmup = warmup

    def __call__(self, step: int) -> float:
        lr = self.rate(step)
        return self.warmup(step, lr) if self.warmup is not None else lr


class PiecewiseConstantScheduler(LrScheduler):
    """``values[i]`` for ``boundaries[i-1] <= step < boundaries[i]``; ``len(values) == len(boundaries) + 1``."""

    def __init__(self, boundaries, values, warmup=None):
        super().__init__(warmup)
        boundaries, values = list(boundaries), list(values)
        if len(values) != len(boundaries) + 1:
            raise ValueError(f"PiecewiseConstantScheduler: needs len(values) == len(boundaries) + 1, got "
                             f"{len(values)} values for {len(boundaries)} boundaries")
        if boundaries != sorted(boundaries):
            raise ValueError(f"PiecewiseConstantScheduler: boundaries must increase, got {boundaries}")
        for v in values:
            _check_number(v, "PiecewiseConstantScheduler values")
        self.boundaries, self.values = boundaries, [float(v) for v in values]

    def rate(self, step):
        return self.values[bisect.bisect_right(self.boundaries, step)]


class PiecewiseScalingScheduler(LrScheduler):
    """``base_lr * scale[i]`` past ``boundaries[i]`` (OneFlow's step decay)."""

    def __init__(self, base_lr, boundaries, scale, warmup=None):
        super().__init__(warmup)
        _check_number(base_lr, "base_lr", positive=True)
        scale = [scale] * len(boundaries) if isinstance(scale, (int, float)) else list(scale)
        if len(scale) != len(boundaries):
            raise ValueError(f"PiecewiseScalingScheduler: scale needs one entry per boundary, got {len(scale)} "
                             f"for {len(boundaries)}")
        self.base_lr, self.boundaries, self.scale = float(base_lr), list(boundaries), [1.0] + [float(s) for s in scale]

    def rate(self, step):
        return self.base_lr * self.scale[bisect.bisect_right(self.boundaries, step)]


class CosineScheduler(LrScheduler):
    """Cosine decay from ``base_lr`` to ``alpha * base_lr`` over ``steps`` steps."""

    def __init__(self, base_lr, steps, alpha=0.0, warmup=None):
        super().__init__(warmup)
        _check_number(base_lr, "base_lr", positive=True)
        if not isinstance(steps, int) or steps <= 0:
            raise ValueError(f"CosineScheduler: steps must be a positive int, got {steps!r}")
        self.base_lr, self.steps, self.alpha = float(base_lr), steps, float(alpha)

    def rate(self, step):
        cosine = 0.5 * (1 + math.cos(math.pi * min(step, self.steps) / self.steps))
        return self.base_lr * ((1 - self.alpha) * cosine + self.alpha)


def as_scheduler(lr_scheduler, argument="lr_scheduler"):
    if isinstance(lr_scheduler, LrScheduler):
        return lr_scheduler
    if isinstance(lr_scheduler, (int, float)) and not isinstance(lr_scheduler, bool) and lr_scheduler > 0:
        return PiecewiseConstantScheduler([], [float(lr_scheduler)])
    raise TypeError(f"{argument}: expected a scheduler such as flow.optimizer.PiecewiseConstantScheduler([], [0.1]) "
                    f"or a positive learning rate, got {lr_scheduler!r}")
