"""``flow.optimizer``: SGD, SGDW, Adam, AdamW, RMSProp, LazyAdam, LARS, LAMB, learning-rate schedules, warmup, gradient
clipping and loss scaling."""
from .loss_scale import loss_scale
from .optimizers import LAMB, LARS, SGD, SGDW, Adam, AdamW, LazyAdam, Optimizer, RMSProp, grad_clipping
from .schedulers import (CosineScheduler, ExponentialScheduler, InverseTimeScheduler, LinearCosineScheduler,
                         LrScheduler, NaturalExpScheduler, PiecewiseConstantScheduler, PiecewiseScalingScheduler,
                         PolynomialSchduler, PolynomialScheduler, warmup)

__all__ = ["SGD", "SGDW", "Adam", "AdamW", "RMSProp", "LazyAdam", "LARS", "LAMB", "Optimizer", "grad_clipping", "loss_scale",
           "CosineScheduler", "ExponentialScheduler", "InverseTimeScheduler", "LinearCosineScheduler", "LrScheduler",
           "NaturalExpScheduler", "PiecewiseConstantScheduler", "PiecewiseScalingScheduler", "PolynomialSchduler",
           "PolynomialScheduler", "warmup"]
