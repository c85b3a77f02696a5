"""flowlab: OneFlow-0.x-style lazy jobs on CuPy (NumPy without a GPU), built to let you see inside while it trains.

``import flowlab as flow`` gives OneFlow 0.x's public names; this module only re-exports.
"""
import logging as _logging

from . import config, data, dtypes, initializers, layers, losses, math, nn, optim, scope, summary, train, typing
from . import checkpoint, env, image, random, regularizers, unittest
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
from .ops.array import (cast, concat, constant, identity, identity_n, one_hot, ones_like, pad, reshape, transpose,
                        zeros_like)
from .ops.indexing import gather
from .ops.math import clip_by_value, matmul
from .ops.placement import parallel_cast

clip = clamp = clip_by_scalar = clip_by_value     # OneFlow 0.3.4's other names of clip_by_value
from .ops.variables import get_variable
from .runtime import session as _session
from .runtime.session import clear as clear_default_session
from .typing import FixedTensorDef, MirroredTensorDef
from .watching import watch, watch_diff, watch_scope
from .health import HealthAlert, HealthReport, watch_health

optimizer = optim


def sync_default_session():
    """Wait until every job call and every watch callback it started has finished."""
    _session.default().sync()


# One log line says which backend runs (GPU or NumPy); users can silence it through logging as usual.
_log = _logging.getLogger("flowlab")
if not _log.handlers:
    _handler = _logging.StreamHandler()
    _handler.setFormatter(_logging.Formatter("%(message)s"))
    _log.addHandler(_handler)
    _log.setLevel(_logging.INFO)
    _log.propagate = False

__version__ = "0.1.0"
