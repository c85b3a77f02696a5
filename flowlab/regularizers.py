"""``flow.regularizers``: L1/L2 weight regularizers for ``flow.get_variable(regularizer=...)`` and the layers'
``kernel_regularizer`` / ``bias_regularizer``, as OneFlow 0.x defines them.

A regularizer adds ``l1 * sign(w) + l2 * w`` to the variable's gradient inside its optimizer update, after the
gradient was scaled by ``1 / loss.size`` and by the loss scale, before gradient clipping (whose global norm includes
it), for every optimizer. ``l2 * w`` is the gradient of ``l2 / 2 * |w|²``: ``l2(l)`` does *not* double ``l``.
``sign(0) = 0``, as OneFlow's GPU kernels (and its fused update kernels) compute it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Regularizer:
    """OneFlow's ``RegularizerConf.l1_l2_conf``: the two coefficients."""
    l1: float
    l2: float

    def __post_init__(self):
        for argument in ("l1", "l2"):
            value = getattr(self, argument)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or \
                    value < 0:
                raise ValueError(f"flow.regularizers: {argument} must be a finite number >= 0, got {value!r}")
            object.__setattr__(self, argument, float(value))

    @property
    def active(self) -> bool:
        """Whether it changes anything (``l1_l2(0, 0)`` does not)."""
        return bool(self.l1 or self.l2)


def l1_l2(l1=0.01, l2=0.01) -> Regularizer:
    """Both terms: ``l1 * sign(w) + l2 * w`` is added to the gradient of ``w``."""
    return Regularizer(l1, l2)


def l1(l=0.01) -> Regularizer:  # noqa: E741 - OneFlow's argument name
    """``l * sign(w)`` is added to the gradient of ``w``."""
    return Regularizer(l, 0.0)


def l2(l=0.01) -> Regularizer:  # noqa: E741 - OneFlow's argument name
    """``l * w`` is added to the gradient of ``w`` (the gradient of ``l / 2 * |w|²``)."""
    return Regularizer(0.0, l)


def check(regularizer, api):
    """``regularizer`` if it is None or a ``Regularizer``; a TypeError naming ``api`` otherwise."""
    if regularizer is None or isinstance(regularizer, Regularizer):
        return regularizer
    raise TypeError(f"{api}: expected a regularizer from flow.regularizers.l1 / l2 / l1_l2 or None, "
                    f"got {regularizer!r}")


__all__ = ["Regularizer", "l1", "l2", "l1_l2"]
