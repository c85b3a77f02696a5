"""The default session: variables (global by name, as in OneFlow), the job functions defined so far, the seed.

A predict job that builds ``layers.dense(..., name="enc")`` reads the very arrays a train job updates under that
name. Values live on the backend's device; ``CheckPoint`` moves them to and from disk.
"""
from __future__ import annotations

import difflib
import threading
import warnings
import weakref
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import graph
from ..errors import ShapeError, WatchCallbackError
from . import backend, dispatch


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
    declared_by: dict = field(default_factory=dict)   # job name -> whether it is a train job
    fresh: bool = False         # its value came from its initializer (no checkpoint set it since)

    def __setattr__(self, name, value):
        if name == "value":     # a value set from outside (a checkpoint) is no fresh initial value
            object.__setattr__(self, "fresh", False)
        object.__setattr__(self, name, value)

    def initialize(self, seed: int):
        # One generator per variable, keyed by its name: initial values do not depend on declaration order.
        rng = np.random.default_rng([seed, zlib.crc32(self.name.encode())])
        host = backend.current().asarray(np.ascontiguousarray(self.initializer(self.shape, self.dtype, rng)))
        if self.value is not None and self.value.shape == host.shape:
            self.value[...] = host      # in place: anything holding the array sees the new values
        else:
            self.value = host
        self.fresh = True

    def numpy(self) -> np.ndarray:
        """A host copy of the value (a NumPy array on either backend) that no later call changes."""
        if self.value is None:
            raise ValueError(f"variable {self.name!r} has no value yet")
        return backend.current().to_host_copy(self.value)

    @property
    def trained(self) -> bool:
        """Whether some train job declares it."""
        return any(self.declared_by.values())


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
    # The other flow.config settings (resource, collective_boxing, debug mode), checked and kept: config.settings().
    config: dict = field(default_factory=dict)

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

    def declare_all(self, declarations, job_name, is_train):
        """Declare a traced job's variables (``graph.VariableDecl`` s): all of them, or, when one disagrees with the
        session, none. Returns a function that undoes exactly these declarations (a job whose compilation then
        fails calls it, leaving the session as it was)."""
        with self.lock:
            for d in declarations:
                var = self.variables.get(d.name)
                if var is not None and (var.shape != d.shape or var.dtype != d.dtype):
                    raise ShapeError(f"variable {d.name!r} was declared with shape {var.shape} and dtype {var.dtype} "
                                     f"(at {var.source}); job {job_name} asks for shape {d.shape} and dtype "
                                     f"{d.dtype} (at {d.source})")
            undo = []
            for d in declarations:
                var = self.variables.get(d.name)
                if var is None:
                    undo.append(lambda name=d.name: self.variables.pop(name, None))
                elif var.provisional:
                    undo.append(lambda var=var, saved=(var.initializer, var.trainable, var.source):
                                _restore_provisional(var, saved))
                var = self.declare(d.name, d.shape, d.dtype, d.initializer, d.trainable, d.source)
                if job_name not in var.declared_by:
                    var.declared_by[job_name] = is_train
                    undo.append(lambda var=var: var.declared_by.pop(job_name, None))

        def undo_all():
            with self.lock:
                for step in reversed(undo):
                    step()
        return undo_all

    def warn_untrained(self, job_name, names, stacklevel=1):
        """A predict job is about to run: warn (one ``UserWarning``) about those of its variables ``names`` that hold
        fresh initial values which no train job declares and no checkpoint set, when the session has trained or
        loaded variables the job may have meant (a misspelt layer name reads fresh random weights otherwise)."""
        with self.lock:
            fresh = [n for n in names if self.variables[n].fresh and not self.variables[n].trained]
            meant = sorted(v.name for v in self.variables.values()
                           if v.name not in names and (v.trained or (v.value is not None and not v.fresh)))
        if not fresh or not meant:
            return
        lines = []
        for name in fresh:
            close = difflib.get_close_matches(name, meant, n=3, cutoff=0.6)
            lines.append(f"  {name!r}" + (f": did you mean {', '.join(map(repr, close))}?" if close else ""))
        warnings.warn(f"predict job {job_name} reads variable(s) that no train job declares and no checkpoint "
                      f"loaded, so they hold fresh initial values (random weights, for a layer):\n" + "\n".join(lines)
                      + "\nCheck the names (name= of the layer or flow.get_variable) against the train job's.",
                      UserWarning, stacklevel=stacklevel + 1)

    def initialize_missing(self):
        with self.lock:
            for var in self.variables.values():
                if var.value is None:
                    var.initialize(self.seed)

    def sync(self):
        """Wait until every job call and every callback it started has finished; raise a callback's error."""
        for job in list(self.jobs):
            job.sync()
        for hook in _sync_hooks():
            hook()
        dispatch.default().wait()
        dispatch.default().raise_pending()


def _restore_provisional(var, saved):
    var.initializer, var.trainable, var.source = saved
    var.provisional = True


_default = Session()
_clear_hooks: list = []     # run by clear(): e.g. the data pipelines stop their threads (flowlab.data.pipeline)


def on_clear(hook):
    """Call ``hook()`` whenever the default session is cleared."""
    _clear_hooks.append(hook)


_sync_methods: list = []    # weak references to bound methods run by Session.sync (on_sync)
_sync_lock = threading.Lock()


def on_sync(method):
    """Call the bound method ``method()`` in ``Session.sync``, once the jobs' calls are done and before the watch
    callbacks are waited for (``watch_health``'s block path delivers the calls it holds), for as long as its object
    lives."""
    with _sync_lock:
        _sync_methods.append(weakref.WeakMethod(method))


def _sync_hooks():
    """The live ``on_sync`` methods (the dead ones forgotten)."""
    with _sync_lock:
        live = [(ref, ref()) for ref in _sync_methods]
        _sync_methods[:] = [ref for ref, method in live if method is not None]
    return [method for _, method in live if method is not None]


def default() -> Session:
    return _default


def clear():
    """``flow.clear_default_session()``: forget variables, jobs and compiled plans; names count from 0 again."""
    global _default
    try:
        _default.sync()
    except WatchCallbackError:
        pass   # a cleared session's callback errors have nobody left to report to
    for hook in _clear_hooks:
        hook()
    _default = Session(seed=_default.seed)
    graph.reset_unique_ids()


def set_seed(seed: int):
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    _default.seed = int(seed)
