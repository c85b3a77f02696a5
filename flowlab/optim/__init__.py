"""``flow.optimizer``: SGD, Adam, AdamW, learning-rate schedules, warmup and gradient clipping."""
from .optimizers import SGD, Adam, AdamW, Optimizer, grad_clipping
from .schedulers import (CosineScheduler, LrScheduler, PiecewiseConstantScheduler, PiecewiseScalingScheduler,
                         warmup)

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "grad_clipping", "CosineScheduler", "LrScheduler",
           "PiecewiseConstantScheduler", "PiecewiseScalingScheduler", "warmup"]
