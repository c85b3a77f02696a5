"""flowlab: OneFlow-0.x-style lazy jobs on CuPy (NumPy without a GPU), built to let you see inside while it trains.

``import flowlab as flow`` gives OneFlow 0.x's public names; this module only re-exports.
"""
from . import config, data, dtypes, initializers, layers, losses, math, nn, optim, scope, summary, train, typing
from . import checkpoint, env, errors, health, image, random, regularizers, unittest
from . import distribute
from .checkpoint import get_all_variables, load_variables
from .dtypes import char, double, float, float16, float32, float64, int8, int32, int64, uint8
from .initializers import (constant_initializer, glorot_normal_initializer, glorot_uniform_initializer,
                           kaiming_initializer, ones_initializer, random_normal, random_normal_initializer,
                           random_uniform, random_uniform_initializer, truncated_normal,
                           truncated_normal_initializer, variance_scaling_initializer, xavier_normal_initializer,
                           xavier_uniform_initializer, zeros_initializer)
from .blob import Blob
from .job import global_function
from .config import FunctionConfig, function_config
from .ops.array import (cast, concat, constant, expand_dims, identity, identity_n, one_hot, ones_like, pad, reshape,
                        slice_v2, squeeze, transpose, zeros_like)
from .ops.array import slice_ as slice  # noqa: A004 - OneFlow's name
from .ops.indexing import gather, where
from .ops.math import broadcast_like, clip_by_value, matmul
from .ops.math import clip_by_value as clamp, clip_by_value as clip, clip_by_value as clip_by_scalar  # OneFlow's too
from .ops.placement import parallel_cast
from .ops.variables import get_variable
from .runtime import session as _session
from .runtime.session import clear as clear_default_session
from .typing import FixedTensorDef, MirroredTensorDef
from .watching import watch, watch_diff, watch_scope
from .health import HealthAlert, HealthReport, watch_health

from . import optim as optimizer


def sync_default_session():
    """Wait until every job call and every watch callback it started has finished."""
    _session.default().sync()


# flowlab adds no log handler of its own, as a library should: the backend notice is logged at INFO, which stays quiet
# unless the application turns INFO on, while warnings still reach stderr through Python's last-resort handler.


def device() -> str:
    """Which array backend runs jobs, and why: e.g. ``"flowlab: running on NumPy without a GPU, as CuPy is not
    installed; ..."``. The backend is chosen once, on first use (``$FLOWLAB_DEVICE``: ``cpu``, ``gpu`` or ``auto``)."""
    from .runtime import backend
    return backend.current().notice


__version__ = "0.1.0"

# The public namespace: OneFlow 0.x's names and the namespaces a user imports (the API reference documents each;
# tests/test_docs_site.py checks that). flowlab's machinery (graph, ops, compiler, runtime, ...) is not in it.
__all__ = [
    "Blob", "broadcast_like", "cast", "char", "checkpoint", "clamp", "clear_default_session", "clip", "clip_by_scalar",
    "clip_by_value", "concat", "config", "constant", "constant_initializer", "data", "device", "distribute", "double",
    "dtypes", "env", "errors", "expand_dims", "FixedTensorDef", "float", "float16", "float32", "float64",
    "function_config", "FunctionConfig", "gather", "get_all_variables", "get_variable", "global_function",
    "glorot_normal_initializer", "glorot_uniform_initializer", "health", "HealthAlert", "HealthReport", "identity",
    "identity_n", "image", "initializers", "int32", "int64", "int8", "kaiming_initializer", "layers", "load_variables",
    "losses", "math", "matmul", "MirroredTensorDef", "nn", "one_hot", "ones_initializer", "ones_like", "optim",
    "optimizer", "pad", "parallel_cast", "random", "random_normal", "random_normal_initializer", "random_uniform",
    "random_uniform_initializer", "regularizers", "reshape", "scope", "slice", "slice_v2", "squeeze", "summary",
    "sync_default_session", "train", "transpose", "truncated_normal", "truncated_normal_initializer", "typing", "uint8",
    "unittest", "variance_scaling_initializer", "watch", "watch_diff", "watch_health", "watch_scope", "where",
    "xavier_normal_initializer", "xavier_uniform_initializer", "zeros_initializer", "zeros_like"
]
