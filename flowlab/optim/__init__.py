"""``flow.optimizer``: SGD, Adam, AdamW, RMSProp, LazyAdam, LARS, LAMB, learning-rate schedules, warmup and gradient
clipping."""
from .optimizers import LAMB, LARS, SGD, Adam, AdamW, LazyAdam, Optimizer, RMSProp, grad_clipping
from .schedulers import (CosineScheduler, LrScheduler, PiecewiseConstantScheduler, PiecewiseScalingScheduler,
                         warmup)

__all__ = ["SGD", "Adam", "AdamW", "RMSProp", "LazyAdam", "LARS", "LAMB", "Optimizer", "grad_clipping",
           "CosineScheduler", "LrScheduler", "PiecewiseConstantScheduler", "PiecewiseScalingScheduler", "warmup"]
