"""The default session: variables (global by name, as in OneFlow), the job functions defined so far, the seed.

A predict job that builds ``layers.dense(..., name="enc")`` reads the very arrays a train job updates under that
name. Values live on the backend's device; ``CheckPoint`` moves them to and from disk.
"""
from __future__ import annotations

import threading
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ShapeError
from . import backend


@dataclass
class Variable:
    name: str
    shape: tuple
    dtype: np.dtype
    initializer: Any
    trainable: bool
    value: Any = None           # device array once initialised
    source: str = ""            # where it was first declared, for messages
    provisional: bool = False   # loaded from a checkpoint before any job declared it

    def initialize(self, seed: int):
        # One generator per variable, keyed by its name: initial values do not depend on declaration order.
        rng = np.random.default_rng([seed, zlib.crc32(self.name.encode())])
        host = backend.current().asarray(np.ascontiguousarray(self.initializer(self.shape, self.dtype, rng)))
        if self.value is not None and self.value.shape == host.shape:
            self.value[...] = host      # in place: anything holding the array sees the new values
        else:
            self.value = host


@dataclass
class Session:
    variables: dict[str, Variable] = field(default_factory=dict)
    jobs: list = field(default_factory=list)
    seed: int = 0
    lock: threading.RLock = field(default_factory=threading.RLock)
    # The call number (watch and summary step, from 0) of the last train-job call: the step widgets show.
    last_train_step: int | None = None
    # Model I/O switches (flow.config.enable_legacy_model_io / enable_model_io_v2): settings of the session.
    legacy_model_io: bool = True
    model_io_v2: bool = False
    # Devices jobs run on (flow.config.gpu_device_num / cpu_device_num; runtime/devices.py).
    device_num: int = 1

    def declare(self, name, shape, dtype, initializer, trainable, source, provisional=False) -> Variable:
        """Return the variable ``name``, creating it on first use; a second declaration must agree.

        A ``provisional`` variable (values loaded before any job declared it) takes the first job's
        ``initializer`` and ``trainable`` and keeps its loaded values.
        """
        with self.lock:
            var = self.variables.get(name)
            if var is None:
                var = Variable(name, tuple(shape), np.dtype(dtype), initializer, trainable, source=source,
                               provisional=provisional)
                self.variables[name] = var
            elif var.shape != tuple(shape) or var.dtype != np.dtype(dtype):
                raise ShapeError(f"variable {name!r} was declared with shape {var.shape} and dtype {var.dtype} "
                                 f"(at {var.source}); now asked for shape {tuple(shape)} and dtype {np.dtype(dtype)}")
            elif var.provisional and not provisional:
                var.initializer, var.trainable, var.source, var.provisional = initializer, trainable, source, False
            return var

    def initialize_missing(self):
        with self.lock:
            for var in self.variables.values():
                if var.value is None:
                    var.initialize(self.seed)

    def sync(self):
        """Wait until every job call and every callback it started has finished; raise a callback's error."""
        from . import dispatch
        for job in list(self.jobs):
            job.sync()
        dispatch.default().wait()
        dispatch.default().raise_pending()


_default = Session()


def default() -> Session:
    return _default


def clear():
    """``flow.clear_default_session()``: forget variables, jobs and compiled plans; names count from 0 again."""
    global _default
    from .. import graph
    from ..errors import WatchCallbackError
    try:
        _default.sync()
    except WatchCallbackError:
        pass   # a cleared session's callback errors have nobody left to report to
    _default = Session(seed=_default.seed)
    graph.reset_unique_ids()


def set_seed(seed: int):
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    _default.seed = int(seed)
