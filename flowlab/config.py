"""``flow.config`` (process settings) and ``flow.function_config()`` (per job settings)."""
from __future__ import annotations

from . import optim
from .dtypes import as_dtype, float32
from .runtime import session

# How many machines, and devices on each, flowlab can run a job on: flow.config's device settings and
# flow.unittest's skip_unless_<n>n<d>d() both ask devices_supported. Devices on one machine are replicas of the job
# (runtime/devices.py): threads on the CPU, one GPU each with CuPy.
MAX_MACHINE_NUM = 1
MAX_DEVICE_NUM = 8


def devices_supported(machine_num, device_num):
    """Whether flowlab can run on ``machine_num`` machines with ``device_num`` devices each."""
    return 1 <= machine_num <= MAX_MACHINE_NUM and 1 <= device_num <= MAX_DEVICE_NUM


def gpu_device_num(n):
    """Run jobs on ``n`` devices of this machine: ``n`` GPUs with CuPy, or, without a GPU, ``n`` NumPy devices
    (threads). A setting of the session, as in OneFlow; with ``cpu_device_num`` the last call counts, since
    flowlab's backend (not the call) decides whether the devices are GPUs."""
    _check_count("gpu_device_num", n, MAX_DEVICE_NUM, "device(s) per machine")
    session.default().device_num = n


def cpu_device_num(n):
    """See ``gpu_device_num``."""
    _check_count("cpu_device_num", n, MAX_DEVICE_NUM, "device(s) per machine")
    session.default().device_num = n


def device_num():
    """How many devices jobs run on (``gpu_device_num`` / ``cpu_device_num``; 1 by default)."""
    return session.default().device_num


def machine_num(n):
    _check_count("machine_num", n, MAX_MACHINE_NUM, "machine(s)")


def _check_count(argument, n, most, what):
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"flow.config.{argument}: expected a positive int, got {n!r}")
    if n > most:
        raise ValueError(f"flow.config.{argument}({n}): flowlab runs on at most {most} {what}; use {most}")


def enable_legacy_model_io(val=True):
    """Choose ``flow.train.CheckPoint`` (True, flowlab's default, as OneFlow up to 0.2) or OneFlow's model I/O v2
    (False): ``flow.checkpoint.save`` / ``flow.load_variables(flow.checkpoint.get(path))``, where constructing a
    ``CheckPoint`` warns that it is deprecated and ``CheckPoint().init()`` does nothing (variables initialise
    themselves). Both APIs read and write the same checkpoint directories, and the v2 functions work either way.
    A setting of the session, as in OneFlow: ``flow.clear_default_session()`` resets it.
    """
    if not isinstance(val, bool):
        raise TypeError(f"flow.config.enable_legacy_model_io: val must be True or False, got {val!r}")
    session.default().legacy_model_io = val


def legacy_model_io_enabled():
    """Whether ``flow.train.CheckPoint`` is the model I/O in use (see ``enable_legacy_model_io``)."""
    return session.default().legacy_model_io


def enable_model_io_v2(val):
    """OneFlow's switch between two implementations of the legacy save/load jobs (``MakeModelIoV2Jobs``). flowlab
    has one implementation, whose files both APIs read, so the value is checked and kept, and changes nothing."""
    if not isinstance(val, bool):
        raise TypeError(f"flow.config.enable_model_io_v2: val must be True or False, got {val!r}")
    session.default().model_io_v2 = val


def model_io_v2_enabled():
    return session.default().model_io_v2


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
        """The dtype of the job's variables created without one (``flow.get_variable(dtype=None)``), as in OneFlow.
        Placeholders keep their own dtype (``tp.Numpy.Placeholder(shape, dtype=flow.float32)``, as OneFlow's) and
        layers make their weights in their input's dtype."""
        self.default_dtype = as_dtype(dtype, "default_data_type")

    def detect_anomaly(self, enabled=True):
        """Check every op's output and gradient for NaN/Inf and raise ``AnomalyError`` naming the first op that made
        one (its logical blob name, its inputs' statistics and your source line). Slower: for debugging."""
        if not isinstance(enabled, bool):
            raise TypeError(f"detect_anomaly: expected True or False, got {enabled!r}")
        self.anomaly_detection = enabled

    def default_logical_view(self, view):
        """``flow.scope.consistent_view()`` (the default: arguments and results are whole batches, split over the
        devices and joined back) or ``flow.scope.mirrored_view()`` (``tp.ListNumpy``: one piece a device). On one
        device both are the same. See ``runtime/devices.py``."""
        if view not in ("consistent", "mirrored"):
            raise ValueError(f"default_logical_view: expected flow.scope.consistent_view() or mirrored_view(), "
                             f"got {view!r}")
        self.logical_view = view

    default_distribute_strategy = default_logical_view     # OneFlow 0.2's name


def function_config():
    return FunctionConfig()
