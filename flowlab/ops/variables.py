"""``flow.get_variable``: a read of a session variable inside a job. Variables are global by name.

Tracing only records what the job declares (``graph.declarations``); the job declares it to the session once the
trace has succeeded, so a job whose trace fails leaves the session as it was.
"""
from __future__ import annotations

from .. import graph as g
from ..dtypes import as_dtype
from ..initializers import zeros_initializer
from ..regularizers import check as check_regularizer
from . import Op, apply, spec
from .placement import check_distribute


class Variable(Op):
    """Reads the session variable ``name``; the executor binds its device array."""
    prefix, api = "Variable_", "flow.get_variable"
    is_variable = True

    @staticmethod
    def infer(var, shape, dtype, regularizer=None):
        return spec(shape, dtype)


def get_variable(name, shape=None, dtype=None, initializer=None, regularizer=None, trainable=True,
                 model_name=None, random_seed=None, distribute=None, reuse=True):
    """Declare (or reuse) the variable ``name`` and read it in the job being traced.

    ``initializer`` defaults to zeros; ``dtype`` to the job's default data type (``FunctionConfig.default_data_type``,
    float32 unless set), as in OneFlow. The same name in another job is the same variable. ``regularizer``
    (``flow.regularizers``) is this job's: its optimizer adds it to the variable's gradient. ``distribute``
    (``flow.distribute.split(axis)`` / ``broadcast()``) is checked against the shape; every device holds the whole
    variable either way (``flowlab.ops.placement``).

    Differs from OneFlow: ``random_seed`` is refused with an error (seed jobs with ``flow.config.seed()``).
    """
    graph = g.current_graph("flow.get_variable")
    if not isinstance(name, str) or not name:
        raise TypeError(f"flow.get_variable: name must be a non-empty string, got {name!r}")
    if shape is None:
        raise ValueError(f"flow.get_variable: shape is required for variable {name!r}")
    if random_seed is not None:
        raise ValueError(f"flow.get_variable({name!r}): per-variable random_seed is not supported by flowlab; "
                         "use flow.config.seed()")
    regularizer = check_regularizer(regularizer, f"flow.get_variable({name!r}): regularizer")
    shape = tuple(int(d) for d in shape)
    if any(d <= 0 for d in shape):
        raise ValueError(f"flow.get_variable({name!r}): shape must hold positive ints, got {shape}")
    check_distribute(f"flow.get_variable({name!r})", "distribute", distribute, shape)
    dtype = graph.default_dtype if dtype is None else as_dtype(dtype)
    if initializer is None:
        initializer = zeros_initializer()
    if not callable(initializer):
        raise TypeError(f"flow.get_variable({name!r}): initializer must be a flowlab initializer, got {initializer!r}")
    full_name = g.scoped_name(name)
    if full_name in graph.variables:
        existing = graph.variables[full_name]
        if existing.shape != shape or existing.dtype != dtype:
            raise ValueError(f"flow.get_variable: variable {full_name!r} already has shape {existing.shape} and dtype "
                             f"{existing.dtype} in this job, asked for shape {shape} and dtype {dtype}")
        return existing
    graph.declarations[full_name] = g.VariableDecl(full_name, shape, dtype, initializer, bool(trainable),
                                                   g.user_source_line())
    # only a regularized read carries the attribute (printed graphs of other jobs stay as they were)
    extra = {} if regularizer is None else {"regularizer": regularizer}
    tensor = apply(Variable, (), name, var=full_name, shape=shape, dtype=dtype, **extra)
    graph.variables[full_name] = tensor
    return tensor
