"""OneFlow's model I/O v2: ``flow.checkpoint.get`` / ``flow.checkpoint.save``, ``flow.load_variables`` and
``flow.get_all_variables``.

The directories are the ones ``flow.train.CheckPoint`` writes and reads (``flowlab/train/checkpoint.py`` owns the
format), so either API loads what the other saved; OneFlow's own ``<variable>/out`` model directories load too.
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping

import numpy as np

from .errors import CheckpointError
from .runtime import backend, session
from .train.checkpoint import SavedVariable, trace_all_jobs, assign, read_checkpoint, write_checkpoint


class VariableValue:
    """A session variable as ``flow.get_all_variables()`` hands it out: ``name``, ``shape``, ``dtype`` and
    ``numpy()``, a copy of the variable's value at the time of the call (after running jobs finish)."""

    def __init__(self, variable):
        self._variable = variable

    @property
    def name(self):
        return self._variable.name

    @property
    def shape(self):
        return self._variable.shape

    @property
    def dtype(self):
        return self._variable.dtype

    def numpy(self):
        sess = session.default()
        sess.sync()
        with sess.lock:
            if self._variable.value is None:
                raise CheckpointError(f"variable {self.name!r} has no value yet (its session was cleared?)")
            return self._variable.numpy()

    def __repr__(self):
        return f"VariableValue({self.name!r}, shape={self.shape}, dtype={self.dtype})"


def _ready_session():
    """The default session with every defined job's variables declared and initialised (OneFlow does this when
    its session starts, before any job runs)."""
    sess = session.default()
    sess.sync()
    trace_all_jobs(sess)
    sess.initialize_missing()
    return sess


def get_all_variables():
    """Every variable of every defined job, by name, as a ``VariableValue`` (``.numpy()`` reads its value)."""
    sess = _ready_session()
    with sess.lock:
        return {name: VariableValue(var) for name, var in sess.variables.items()}


def get(path):
    """The variables saved at ``path`` by name, each with ``shape``, ``dtype`` and ``numpy()`` (read on demand).

    ``path``: a directory written by ``flow.checkpoint.save`` or ``flow.train.CheckPoint().save``, or a OneFlow
    model directory (one ``<name>/out`` per variable); a single OneFlow variable's directory gives that variable.
    """
    return read_checkpoint(path, "flow.checkpoint.get")


def _host_value(name, value, caller):
    """``value`` (ndarray, SavedVariable or VariableValue) as a host ndarray; a TypeError names the entry."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (SavedVariable, VariableValue)):
        return value.numpy()
    raise TypeError(f"{caller}: the value for {name!r} must be a numpy.ndarray, a value of flow.checkpoint.get() "
                    f"or of flow.get_all_variables(), got {type(value).__name__}")


def _check_names(mapping, argument, caller):
    if not isinstance(mapping, Mapping):
        raise TypeError(f"{caller}: {argument} must be a dict of variable name -> value, got {type(mapping).__name__}")
    bad = [name for name in mapping if not isinstance(name, str) or not name]
    if bad:
        raise CheckpointError(f"{caller}: {argument} has keys that are not variable names (non-empty str): {bad}")


def save(path, var_dict=None):
    """Save ``var_dict`` (name -> ndarray or value from ``get``/``get_all_variables``; by default every variable)
    into the new checkpoint directory ``path`` (absent or empty), atomically: a crash leaves nothing behind."""
    caller = "flow.checkpoint.save"
    if var_dict is None:
        sess = _ready_session()

        def collect():
            be = backend.current()
            for var in sess.variables.values():
                if var.value is not None:
                    yield var.name, be.to_host(var.value)
    else:
        _check_names(var_dict, "var_dict", caller)
        arrays = {name: _host_value(name, value, caller) for name, value in var_dict.items()}

        def collect():
            yield from arrays.items()
    write_checkpoint(path, collect, caller)


def load_variables(value_dict, ignore_mismatch=True):
    """Set variables from ``value_dict``: name -> ndarray, or a value of ``flow.checkpoint.get`` or
    ``flow.get_all_variables`` (``flow.load_variables(flow.checkpoint.get(path))`` loads a saved model).

    Each value must have its variable's shape and dtype (``CheckpointError`` listing every mismatch). Names that
    are no variable of any defined job are skipped with a warning when ``ignore_mismatch`` (OneFlow skipped them
    silently), else raise. All values are read and checked before any variable changes.
    """
    caller = "flow.load_variables"
    if isinstance(value_dict, SavedVariable):
        raise TypeError(f"{caller}: value_dict is a single variable ({value_dict.name!r}); pass "
                        f"{{name: value}}, e.g. {{{value_dict.name!r}: value}}")
    _check_names(value_dict, "value_dict", caller)
    if not isinstance(ignore_mismatch, bool):
        raise TypeError(f"{caller}: ignore_mismatch must be True or False, got {ignore_mismatch!r}")
    sess = _ready_session()
    known = sess.variables
    unknown = [name for name in value_dict if name not in known]
    if unknown and not ignore_mismatch:
        raise CheckpointError(f"{caller}: {unknown} are not variable names (the defined jobs have "
                              f"{sorted(known)}); pass ignore_mismatch=True to skip them")

    arrays, mismatched = {}, []
    for name, value in value_dict.items():
        if name not in known:
            continue
        var = known[name]
        if isinstance(value, SavedVariable) and value.shape is None:   # a OneFlow file saved without meta
            host = value.read_as(var.shape, var.dtype)
        else:
            host = _host_value(name, value, caller)
        if host.shape != var.shape or host.dtype != var.dtype:
            mismatched.append(f"{name!r}: the variable has shape {var.shape} dtype {var.dtype}, the value "
                              f"shape {host.shape} dtype {host.dtype}")
        arrays[name] = host
    if mismatched:
        raise CheckpointError(f"{caller}: values do not fit their variables (nothing was loaded):\n  "
                              + "\n  ".join(mismatched))
    be = backend.current()
    with sess.lock:
        for name, host in arrays.items():
            assign(known[name], np.ascontiguousarray(host), be)
    if unknown:
        shown = ", ".join(map(repr, unknown[:10])) + (f", ... ({len(unknown)} names)" if len(unknown) > 10 else "")
        warnings.warn(f"{caller}: skipped {shown}: no defined job has variables of these names", stacklevel=2)


__all__ = ["get", "save"]
