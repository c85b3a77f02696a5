"""The compiled-kernel layer (``runtime.jit``): its switch, and its helpers checked against float64 references."""
import numpy as np
import pytest

from flowlab.runtime import jit

needs_numba = pytest.mark.skipif(not jit.available(), reason="numba is not installed")


@jit.kernel
def _exp_each(x, out):
    for i in range(x.size):
        out[i] = jit.exp32(x[i])


@needs_numba
def test_exp32_is_within_one_ulp_and_keeps_special_values():
    rng = np.random.default_rng(0)
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 88.72283, 88.7229, -87.33, -103.97, -104.0, -1e30,
                        1e-30, -1e-30, 1e30], np.float32)
    x = np.concatenate([rng.uniform(-105, 89, 2_000_000).astype(np.float32), special])
    out = np.empty_like(x)
    _exp_each(x, out)
    with np.errstate(over="ignore"):                    # exp(1e30) is inf in float64 too
        exact = np.exp(x.astype(np.float64))
        rounded = exact.astype(np.float32)
    normal = np.isfinite(rounded) & (rounded >= np.finfo(np.float32).tiny)
    ulps = np.abs(out[normal] - exact[normal]) / np.spacing(rounded[normal])
    assert ulps.max() <= 1.05
    small = np.isfinite(x) & (rounded < np.finfo(np.float32).tiny)        # subnormal results and zeros
    assert np.abs(out[small] - exact[small]).max() <= 2.0 ** -149
    np.testing.assert_array_equal(np.isnan(out), np.isnan(x))
    np.testing.assert_array_equal(np.isposinf(out), np.isposinf(rounded))
    tail = out[-special.size:]
    assert tail[1] == np.inf and tail[2] == 0.0 and tail[10] == 0.0 and tail[11] == 1.0   # inf, -inf, -1e30, 1e-30


def test_using_switches_the_calling_thread_only():
    import threading
    seen = []
    with jit.using(False):
        assert not jit.enabled()
        worker = threading.Thread(target=lambda: seen.append(jit.enabled()))
        worker.start()
        worker.join()
    assert seen == [jit.available() and not jit._SWITCHED_OFF]
    with jit.using(True):
        assert jit.enabled() == jit.available()


def test_switched_off_by_the_environment(tmp_path):
    import subprocess
    import sys
    code = "from flowlab.runtime import jit; print(jit.enabled())"
    for value, expected in (("0", "False"), ("off", "False"), ("1", str(jit.available()))):
        env = dict(__import__("os").environ, FLOWLAB_JIT=value)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == expected


def test_importing_flowlab_does_not_import_numba():
    import subprocess
    import sys
    code = "import sys, flowlab; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@jit.kernel(inline=True)
def _row_sum(row):
    total = 0.0
    for v in row:
        total += v
    return total


@jit.kernel
def _row_sums(x, out):
    for r in range(x.shape[0]):
        out[r] = _row_sum(x[r])


@needs_numba
def test_a_kernel_calls_another_by_name():
    x = np.arange(12.0).reshape(3, 4)
    out = np.empty(3)
    _row_sums(x, out)
    np.testing.assert_array_equal(out, x.sum(axis=1))
    assert _row_sum(np.ones(5)) == 5.0            # and stays callable on its own
