"""``flow.config`` (process settings) and ``flow.function_config()`` (per job settings)."""
from __future__ import annotations

from .dtypes import as_dtype, float32
from .runtime import session


def gpu_device_num(n):
    """flowlab runs each job on one device: a GPU through CuPy when one works, else NumPy (logged once)."""
    _one_device("gpu_device_num", n)


def cpu_device_num(n):
    _one_device("cpu_device_num", n)


def machine_num(n):
    _one_device("machine_num", n)


def _one_device(argument, n):
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"flow.config.{argument}: expected a positive int, got {n!r}")
    if n > 1:
        raise ValueError(f"flow.config.{argument}({n}): flowlab runs on one device; use 1")


def seed(value):
    """Seed variable initialisation and dropout; call before jobs are first run."""
    session.set_seed(value)


class _TrainConfig:
    def __init__(self):
        self.lr = None
        self.model_update = None

    def primary_lr(self, lr):
        if not isinstance(lr, (int, float)) or lr <= 0:
            raise ValueError(f"train.primary_lr: expected a positive number, got {lr!r}")
        self.lr = float(lr)

    def model_update_conf(self, conf):
        known = {"naive_conf", "momentum_conf", "adam_conf"}
        if not isinstance(conf, dict) or len(conf) != 1 or next(iter(conf)) not in known:
            raise ValueError(f"train.model_update_conf: expected one of {sorted(known)} as the only key, got {conf!r}")
        self.model_update = conf

    @property
    def configured(self):
        return self.lr is not None or self.model_update is not None

    def make_optimizer(self):
        """The optimizer that ``flow.losses.add_loss`` trains with (OneFlow's oldest training style)."""
        from . import optim
        if self.lr is None:
            raise ValueError("flow.losses.add_loss needs config.train.primary_lr(lr) in the job's function_config")
        kind, conf = next(iter((self.model_update or {"naive_conf": {}}).items()))
        schedule = optim.PiecewiseConstantScheduler([], [self.lr])
        if kind == "naive_conf":
            return optim.SGD(schedule, momentum=0.0)
        if kind == "momentum_conf":
            return optim.SGD(schedule, momentum=conf.get("beta", 0.9))
        return optim.Adam(schedule, beta1=conf.get("beta1", 0.9), beta2=conf.get("beta2", 0.999),
                          epsilon=conf.get("epsilon", 1e-8), do_bias_correction=conf.get("do_bias_correction", False))


class FunctionConfig:
    """Settings of one job function: default dtype, the old-style training config, anomaly detection."""

    def __init__(self):
        self.default_dtype = float32
        self.train = _TrainConfig()
        self.logical_view = "consistent"
        self.anomaly_detection = False

    def default_data_type(self, dtype):
        self.default_dtype = as_dtype(dtype, "default_data_type")

    def detect_anomaly(self, enabled=True):
        """Check every op's output and gradient for NaN/Inf and raise ``AnomalyError`` naming the first op that made
        one (its logical blob name, its inputs' statistics and your source line). Slower: for debugging."""
        if not isinstance(enabled, bool):
            raise TypeError(f"detect_anomaly: expected True or False, got {enabled!r}")
        self.anomaly_detection = enabled

    def default_logical_view(self, view):
        """One device makes consistent and mirrored views the same; the choice is recorded."""
        if view not in ("consistent", "mirrored"):
            raise ValueError(f"default_logical_view: expected flow.scope.consistent_view() or mirrored_view(), "
                             f"got {view!r}")
        self.logical_view = view


def function_config():
    return FunctionConfig()
