"""Statistics computed where the tensor lives, so a watch ships six numbers instead of the whole tensor."""
from __future__ import annotations

import numpy as np

from . import Op, apply, as_tensor, spec


class TensorStats(Op):
    """``[min, max, mean, std, nan_count, inf_count]`` as float64; min/max/mean/std over the finite elements."""
    prefix, api = "TensorStats_", "watch stats"

    @staticmethod
    def infer(x):
        return spec((6,), np.float64)

    @staticmethod
    def forward(xp, x):
        x = x.astype(xp.float64, copy=False)
        finite = xp.isfinite(x)
        nan = xp.isnan(x).sum()
        inf = x.size - finite.sum() - nan
        n = finite.sum()
        if int(n) == 0:
            return xp.stack([xp.asarray(v, dtype=xp.float64) for v in (np.nan, np.nan, np.nan, np.nan)] +
                            [nan.astype(xp.float64), inf.astype(xp.float64)])
        values = x[finite] if int(n) < x.size else x.ravel()
        return xp.stack([values.min(), values.max(), values.mean(), values.std(),
                         nan.astype(xp.float64), inf.astype(xp.float64)])


def tensor_stats(x, name=None):
    return apply(TensorStats, (as_tensor(x, argument="x"),), name)
