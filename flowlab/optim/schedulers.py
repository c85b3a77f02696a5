"""Learning-rate schedules: callables ``step -> lr`` evaluated on the host once per training step, with OneFlow 0.x's
formulas (its ``learning_rate_schedule`` kernel).

``step`` is the train step, counted from 0 over every step of the job, warmup included. During a warmup's ``steps``
first steps the rate is ``base_lr`` times the warmup's multiplier (the decay is not applied); from then on the decay
is evaluated at the same global ``step``: a decay over ``steps`` batches that follows a warmup of ``w`` batches ends
at step ``steps``, not ``w + steps`` (OneFlow-Benchmark's optimizer_util passes ``steps = total - warmup`` and so
reaches the end rate ``w`` steps early, as it does on OneFlow). Boundaries of the piecewise schedules belong to the
piece before them: ``values[i]`` holds while ``step <= boundaries[i]``.
"""
from __future__ import annotations

import bisect
import numbers
import math


def _check_number(value, argument, positive=False):
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or \
            (positive and value <= 0):
        raise ValueError(f"{argument}: expected a {'positive ' if positive else ''}number, got {value!r}")
    return float(value)


def _check_steps(value, argument):
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{argument}: expected a positive int (a number of steps), got {value!r}")
    return value


def _check_bool(value, argument):
    if not isinstance(value, bool):
        raise ValueError(f"{argument}: expected True or False, got {value!r}")
    return value


class Warmup:
    """The rate of the first ``steps`` steps: ``base_lr * multiplier(step)``."""

    def __init__(self, steps, multiplier, linear):
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
            raise ValueError(f"warmup steps must be a non-negative int, got {steps!r}")
        name = "start_multiplier" if linear else "multiplier"
        multiplier = _check_number(multiplier, f"warmup.{'linear' if linear else 'constant'}: {name}")
        # OneFlow's kernel checks the same ranges (CHECK_GE / CHECK_GT, CHECK_LT)
        if not (0 <= multiplier < 1 if linear else 0 < multiplier < 1):
            raise ValueError(f"warmup.{'linear' if linear else 'constant'}: {name} must lie in "
                             f"{'[0, 1)' if linear else '(0, 1)'}, got {multiplier!r}")
        self.steps, self.multiplier, self.linear = steps, multiplier, linear

    @property
    def start_multiplier(self):
        return self.multiplier

    def active(self, step):
        return step < self.steps

    def rate(self, base_lr, step):
        if not self.linear:
            return base_lr * self.multiplier
        return base_lr * (self.multiplier + (1.0 - self.multiplier) * step / self.steps)


class warmup:  # noqa: N801 - OneFlow's namespace ``flow.optimizer.warmup``
    """``flow.optimizer.warmup``: ``linear(steps, start_multiplier)`` and ``constant(steps, multiplier)``, passed
    as a scheduler's ``warmup``.
    """
    @staticmethod
    def linear(steps, start_multiplier):
        """``base_lr * (start_multiplier + (1 - start_multiplier) * step / steps)`` while ``step < steps``."""
        return Warmup(steps, start_multiplier, linear=True)

    @staticmethod
    def constant(steps, multiplier):
        """``base_lr * multiplier`` while ``step < steps``."""
        return Warmup(steps, multiplier, linear=False)


class LrScheduler:
    """A schedule: ``scheduler(step)`` is the learning rate of train step ``step`` (from 0)."""

    def __init__(self, base_lr, warmup=None):
        if warmup is not None and not isinstance(warmup, Warmup):
            raise TypeError(f"warmup: expected flow.optimizer.warmup.linear(...) or .constant(...), got {warmup!r}")
        self.base_lr = base_lr
        self.warmup = warmup

    def __call__(self, step: int) -> float:
        if self.warmup is not None and self.warmup.active(step):
            return self.warmup.rate(self.base_lr, step)
        return self.rate(step)

    def rate(self, step: int) -> float:
        raise NotImplementedError


class PiecewiseConstantScheduler(LrScheduler):
    """``values[i]`` while ``boundaries[i-1] < step <= boundaries[i]``; ``len(values) == len(boundaries) + 1``.
    A warmup starts from ``values[0]``."""

    def __init__(self, boundaries, values, warmup=None):
        boundaries, values = list(boundaries), list(values)
        if len(values) != len(boundaries) + 1:
            raise ValueError(f"PiecewiseConstantScheduler: needs len(values) == len(boundaries) + 1, got "
                             f"{len(values)} values for {len(boundaries)} boundaries")
        _check_boundaries("PiecewiseConstantScheduler", boundaries)
        values = [_check_number(v, "PiecewiseConstantScheduler values") for v in values]
        super().__init__(values[0], warmup)
        self.boundaries, self.values = boundaries, values

    def rate(self, step):
        return self.values[bisect.bisect_left(self.boundaries, step)]


class PiecewiseScalingScheduler(LrScheduler):
    """``base_lr * scale[i-1]`` while ``boundaries[i-1] < step <= boundaries[i]`` (``base_lr`` up to and including
    ``boundaries[0]``); ``scale`` is one number for every boundary or one per boundary."""

    def __init__(self, base_lr, boundaries, scale, warmup=None):
        base_lr = _check_number(base_lr, "PiecewiseScalingScheduler: base_lr", positive=True)
        boundaries = list(boundaries)
        _check_boundaries("PiecewiseScalingScheduler", boundaries)
        scale = [scale] * len(boundaries) if isinstance(scale, (int, float)) else list(scale)
        if len(scale) != len(boundaries):
            raise ValueError(f"PiecewiseScalingScheduler: scale needs one entry per boundary, got {len(scale)} "
                             f"for {len(boundaries)}")
        super().__init__(base_lr, warmup)
        self.boundaries = boundaries
        self.scale = [1.0] + [_check_number(s, "PiecewiseScalingScheduler scale") for s in scale]

    def rate(self, step):
        return self.base_lr * self.scale[bisect.bisect_left(self.boundaries, step)]


class CosineScheduler(LrScheduler):
    """``base_lr * ((1 - alpha) * 0.5 * (1 + cos(pi * min(step, steps) / steps)) + alpha)``."""

    def __init__(self, base_lr, steps, alpha=0.0, warmup=None):
        super().__init__(_check_number(base_lr, "CosineScheduler: base_lr", positive=True), warmup)
        self.steps = _check_steps(steps, "CosineScheduler: steps")
        self.alpha = _check_number(alpha, "CosineScheduler: alpha")

    def rate(self, step):
        cosine = 0.5 * (1 + math.cos(math.pi * min(step, self.steps) / self.steps))
        return self.base_lr * ((1 - self.alpha) * cosine + self.alpha)


class LinearCosineScheduler(LrScheduler):
    """``base_lr * ((alpha + (steps - s) / steps) * 0.5 * (1 + cos(2 pi num_periods s / steps)) + beta)`` with
    ``s = min(step, steps)``."""

    def __init__(self, base_lr, steps, num_periods=0.5, alpha=0.0, beta=0.001, warmup=None):
        super().__init__(_check_number(base_lr, "LinearCosineScheduler: base_lr", positive=True), warmup)
        self.steps = _check_steps(steps, "LinearCosineScheduler: steps")
        self.num_periods = _check_number(num_periods, "LinearCosineScheduler: num_periods")
        self.alpha = _check_number(alpha, "LinearCosineScheduler: alpha")
        self.beta = _check_number(beta, "LinearCosineScheduler: beta")

    def rate(self, step):
        s = min(step, self.steps)
        linear = (self.steps - s) / self.steps
        cosine = 0.5 * (1 + math.cos(math.pi * 2 * self.num_periods * s / self.steps))
        return self.base_lr * ((self.alpha + linear) * cosine + self.beta)


class PolynomialScheduler(LrScheduler):
    """``(base_lr - end_learning_rate) * (1 - s / d) ** power + end_learning_rate``. Without ``cycle``: ``s =
    min(step, steps)``, ``d = steps``; with ``cycle``: ``s = step`` (1 at step 0) and ``d = steps * ceil(s /
    steps)``, so the decay restarts from a lower peak every ``steps`` steps."""

    def __init__(self, base_lr, steps, end_learning_rate=0.0001, power=1.0, cycle=False, warmup=None):
        super().__init__(_check_number(base_lr, f"{type(self).__name__}: base_lr", positive=True), warmup)
        self.steps = _check_steps(steps, f"{type(self).__name__}: steps")
        self.end_learning_rate = _check_number(end_learning_rate, f"{type(self).__name__}: end_learning_rate")
        self.power = _check_number(power, f"{type(self).__name__}: power")
        self.cycle = _check_bool(cycle, f"{type(self).__name__}: cycle")

    def rate(self, step):
        if self.cycle:
            s = max(step, 1)
            decay = self.steps * math.ceil(s / self.steps)
        else:
            s, decay = min(step, self.steps), self.steps
        return (self.base_lr - self.end_learning_rate) * (1 - s / decay) ** self.power + self.end_learning_rate


class PolynomialSchduler(PolynomialScheduler):
    """OneFlow 0.x's (misspelled, deprecated) name of ``PolynomialScheduler``, which OneFlow-Benchmark uses."""


class _RatioDecay(LrScheduler):
    """Decays by ``p = step / steps`` (``floor(p)`` with ``staircase``)."""

    def __init__(self, base_lr, steps, decay_rate, staircase=False, warmup=None):
        owner = type(self).__name__
        super().__init__(_check_number(base_lr, f"{owner}: base_lr", positive=True), warmup)
        self.steps = _check_steps(steps, f"{owner}: steps")
        self.decay_rate = _check_number(decay_rate, f"{owner}: decay_rate")
        self.staircase = _check_bool(staircase, f"{owner}: staircase")

    def _p(self, step):
        p = step / self.steps
        return math.floor(p) if self.staircase else p


class ExponentialScheduler(_RatioDecay):
    """``base_lr * decay_rate ** p``, ``p = step / steps`` (``floor(p)`` with ``staircase``)."""

    def rate(self, step):
        return self.base_lr * self.decay_rate ** self._p(step)


class InverseTimeScheduler(_RatioDecay):
    """``base_lr / (1 + decay_rate * p)``, ``p = step / steps`` (``floor(p)`` with ``staircase``, as OneFlow's
    kernel computes it)."""

    def rate(self, step):
        return self.base_lr / (1.0 + self.decay_rate * self._p(step))


class NaturalExpScheduler(_RatioDecay):
    """``base_lr * exp(-decay_rate * p)``, ``p = step / steps`` (``floor(p)`` with ``staircase``)."""

    def rate(self, step):
        return self.base_lr * math.exp(-self.decay_rate * self._p(step))


def _check_boundaries(owner, boundaries):
    if any(not isinstance(b, numbers.Integral) or isinstance(b, bool) for b in boundaries):
        raise ValueError(f"{owner}: boundaries must be ints (train steps), got {boundaries}")
    if boundaries != sorted(boundaries):
        raise ValueError(f"{owner}: boundaries must increase, got {boundaries}")


def as_scheduler(lr_scheduler, argument="lr_scheduler"):
    if isinstance(lr_scheduler, LrScheduler):
        return lr_scheduler
    if isinstance(lr_scheduler, (int, float)) and not isinstance(lr_scheduler, bool) and lr_scheduler > 0:
        return PiecewiseConstantScheduler([], [float(lr_scheduler)])
    raise TypeError(f"{argument}: expected a scheduler such as flow.optimizer.PiecewiseConstantScheduler([], [0.1]) "
                    f"or a positive learning rate, got {lr_scheduler!r}")
