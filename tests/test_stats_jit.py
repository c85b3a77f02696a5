"""The compiled one-pass statistics kernels of ``ops.stats`` (``runtime.jit``) against their NumPy twins (``with
jit.using(False)``) and float64 references: ``stats_vector``, ``activation_vector``, ``SquaresStats``, and
``StatsFeed.put_tensor``, which summarises a float32 tensor at once with them."""
import math

import numpy as np
import pytest

from flowlab.ops import stats
from flowlab.ops.stats import (CANCELLING_SPREAD, SquaresStats, activation_vector, histogram_vector, square_vector,
                               stats_vector)
from flowlab.runtime import host_threads, jit
from flowlab.watching import StatsFeed

pytestmark = pytest.mark.skipif(not jit.available(), reason="numba is not installed")

SIZES = [1, 7, 12_800, (1 << 17) + 3]


@pytest.fixture
def split_small(monkeypatch):
    """Compiled passes split over two host threads from 4,096 elements on (normally from ~1M), so that tests cover
    the pieces' combination on small tensors."""
    monkeypatch.setattr(stats, "COMPILED_SPLIT_ELEMENTS", 4096)
    monkeypatch.setattr(host_threads, "SPLIT_ELEMENTS", 1024)          # (host_threads.parts' own threshold)
    calls = []
    each = host_threads.each
    monkeypatch.setattr(host_threads, "each", lambda *args, **kwargs: calls.append(1) or each(*args, **kwargs))
    with host_threads.using(2):
        yield
    assert calls, "nothing ran in pieces"


def twin(function, *args, **kwargs):
    with jit.using(False):
        return function(*args, **kwargs)


def compiled(function, *args, **kwargs):
    with jit.using(True):
        return function(*args, **kwargs)


def reference_stats(x):
    """``stats_vector`` in float64 from first principles: moments of the finite elements, counts of the others."""
    x64 = np.asarray(x, np.float64).ravel()
    finite = x64[np.isfinite(x64)]
    nan, inf = np.isnan(x64).sum(), np.isinf(x64).sum()
    if finite.size == 0:
        return np.array([np.nan] * 4 + [nan, inf])
    return np.array([finite.min(), finite.max(), finite.mean(), finite.std(), nan, inf])


def assert_same_stats(got, want, rtol=1e-5):
    """Counts exactly, min/max exactly (they are elements), moments to float32 accuracy; NaN where NaN."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape == (6,)
    np.testing.assert_array_equal(got[[0, 1, 4, 5]], want[[0, 1, 4, 5]])
    np.testing.assert_allclose(got[2:4], want[2:4], rtol=rtol, atol=1e-6 * max(1.0, np.nanmax(np.abs(want[:2]))))


@pytest.mark.parametrize("size", SIZES)
def test_compiled_stats_match_the_numpy_twin_and_a_float64_reference(size):
    rng = np.random.default_rng(size)
    x = (rng.standard_normal(size) * 3 + 0.5).astype(np.float32)
    got = compiled(stats_vector, np, x)
    assert_same_stats(got, twin(stats_vector, np, x))
    assert_same_stats(got, reference_stats(x), rtol=1e-9)       # float64 sums: the reference's own accuracy


@pytest.mark.parametrize("size", [4096, 12_801, (1 << 17) + 3])
def test_compiled_stats_in_pieces_over_host_threads(size, split_small):
    x = (np.random.default_rng(size).standard_normal(size) * 3 - 1).astype(np.float32)
    assert_same_stats(compiled(stats_vector, np, x), reference_stats(x), rtol=1e-9)
    x[size // 2] = np.nan
    np.testing.assert_array_equal(compiled(stats_vector, np, x), twin(stats_vector, np, x))


@pytest.mark.parametrize("size, in_pieces", [(1, False), (1000, False), (12_800, False), (12_800, True),
                                             ((1 << 17) + 3, True)])
def test_a_row_writer_writes_the_next_row_of_a_block_its_step_and_the_copy(size, in_pieces, request):
    if in_pieces:                                   # the writer for a tensor the pass splits over host threads
        request.getfixturevalue("split_small")
    rng = np.random.default_rng(size)
    x = (rng.standard_normal(size) * 2 + 1).astype(np.float32)
    write = compiled(stats.stats_row_writer, size)
    block, copy = stats.stats_block(3), np.zeros(size, np.float32)
    steps_at, rows_at = stats.BLOCK_HEADER, stats.BLOCK_HEADER + 3
    block[steps_at:] = -7.0
    assert write(x, block, 41, copy) == 0
    assert block[stats.WRITTEN] == 1 and block[stats.COPIED] == 41 and block[steps_at] == 41
    assert_same_stats(block[rows_at:rows_at + 6], reference_stats(x), rtol=1e-9)
    assert (block[steps_at + 1:rows_at] == -7).all() and (block[rows_at + 6:] == -7).all()    # the rest untouched
    np.testing.assert_array_equal(copy, x)
    x[size // 2] = np.nan                           # NaN: no row written (the feed's NumPy path counts)
    assert write(x, block, 42, copy) == stats.PUT_NONFINITE
    assert block[stats.WRITTEN] == 1 and (block[rows_at + 6:] == -7).all()
    assert block[stats.COPIED] == 42                # the copy and its step are written all the same
    np.testing.assert_array_equal(copy, x)
    x[size // 2] = 0.5
    block[stats.WAKE] = 1.0                         # a take came: the next put says so, once
    assert write(x, block, 43, copy) == stats.PUT_WAKE
    assert write(x, block, 44, copy) == stats.PUT_FULL                 # the last row
    assert block[stats.WRITTEN] == 3 and block[steps_at:rows_at].tolist() == [41, 43, 44]
    assert write(x, block, 45, copy) == stats.PUT_RETRY                # full: nothing written
    steps, rows = stats.stats_block_rows(block, 3)
    assert steps.dtype == np.int64 and steps.tolist() == [41, 43, 44]
    assert_same_stats(rows[2], reference_stats(x), rtol=1e-9)


def test_a_closed_block_takes_no_row_and_passes_its_copy_step_and_wake_flag_on():
    x = np.arange(10, dtype=np.float32)
    block, fresh, copy = stats.stats_block(4), stats.stats_block(4), np.zeros(10, np.float32)
    write = compiled(stats.stats_row_writer, 10)
    assert write(x, block, 5, copy) == 0 and write(x, block, 6, copy) == 0
    assert stats.close_stats_block(block, fresh, True) == 2
    assert write(x, block, 7, copy) == stats.PUT_RETRY and block[stats.WRITTEN] == 2     # a put on its way
    assert fresh[stats.COPIED] == 6 and fresh[stats.WAKE] == 1 and fresh[stats.WRITTEN] == 0
    assert write(x, fresh, 7, copy) == stats.PUT_WAKE
    assert write(np.arange(11, dtype=np.float32), fresh, 8, copy) == stats.PUT_RETRY    # a copy of another size


@pytest.mark.parametrize("view", ["columns", "transposed", "reversed"])
def test_compiled_stats_of_non_contiguous_views(view):
    base = np.random.default_rng(1).standard_normal((300, 77)).astype(np.float32)
    x = {"columns": base[:, ::3], "transposed": base.T, "reversed": base[::-1, ::-2]}[view]
    assert not x.flags.c_contiguous
    assert_same_stats(compiled(stats_vector, np, x), reference_stats(x), rtol=1e-9)


@pytest.mark.parametrize("planted", ["nan", "+inf", "-inf", "nan and inf", "all nan", "all +inf", "one finite"])
@pytest.mark.parametrize("size", [1, 7, 12_800])
def test_nan_and_inf_are_counted_as_the_numpy_twin_counts_them(planted, size):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(size).astype(np.float32)
    positions = rng.permutation(size)
    if planted == "nan":
        x[positions[0]] = np.nan
    elif planted == "+inf":
        x[positions[0]] = np.inf
    elif planted == "-inf":
        x[positions[0]] = -np.inf
    elif planted == "nan and inf":
        x[positions[: max(1, size // 3)]] = np.nan
        x[positions[-1]] = -np.inf if size > 1 else np.nan
    elif planted == "all nan":
        x[:] = np.nan
    elif planted == "all +inf":
        x[:] = np.inf
    else:
        x[:] = np.nan
        x[positions[0]] = 2.5
    got, want = compiled(stats_vector, np, x), twin(stats_vector, np, x)
    np.testing.assert_array_equal(got, want)                    # the masked path itself: the same numbers
    np.testing.assert_allclose(got, reference_stats(x), rtol=1e-6, atol=1e-6)


def test_empty_and_size_one_tensors():
    empty = np.zeros((0, 4), np.float32)
    np.testing.assert_array_equal(compiled(stats_vector, np, empty), twin(stats_vector, np, empty))
    one = np.array([[-3.25]], np.float32)
    np.testing.assert_array_equal(compiled(stats_vector, np, one), [-3.25, -3.25, -3.25, 0.0, 0.0, 0.0])


def test_minimum_and_maximum_order_signed_zeros_subnormals_and_infinities_as_floats():
    tiny = np.float32(1e-45)                                    # the smallest subnormal
    x = np.array([0.0, -0.0, tiny, -tiny, 3.0, -7.5, 1e38, -1e38], np.float32)
    got = compiled(stats_vector, np, x)
    assert got[0] == np.float32(-1e38) and got[1] == np.float32(1e38)
    small = np.array([tiny, -tiny, 0.0], np.float32)
    got = compiled(stats_vector, np, small)
    assert got[0] == -tiny and got[1] == tiny


def test_a_spread_small_next_to_the_mean_takes_a_centred_second_pass():
    rng = np.random.default_rng(2)
    x = (1000 + rng.standard_normal(12_800) * 1e-3).astype(np.float32)    # var / mean² ~ 1e-12
    assert x.astype(np.float64).var() < CANCELLING_SPREAD * x.astype(np.float64).mean() ** 2
    got = compiled(stats_vector, np, x)
    np.testing.assert_allclose(got[3], x.astype(np.float64).std(), rtol=1e-9)
    assert_same_stats(got, twin(stats_vector, np, x), rtol=1e-5)
    constant = np.full(1000, 0.1, np.float32)
    assert compiled(stats_vector, np, constant)[3] == 0.0


def test_a_cancelling_spread_in_pieces(split_small):
    x = (1000 + np.random.default_rng(2).standard_normal(12_800) * 1e-3).astype(np.float32)
    np.testing.assert_allclose(compiled(stats_vector, np, x)[3], x.astype(np.float64).std(), rtol=1e-9)
    y = (50 + np.random.default_rng(8).standard_normal((64, 32, 3)) * 1e-4).astype(np.float32)
    np.testing.assert_allclose(compiled(activation_vector, np, y, 1)[1], y.astype(np.float64).std(), rtol=1e-9)


def test_values_whose_float32_squares_overflow():
    x = np.array([3e30, -2e30, 1e30, 5.0], np.float32)           # squares beyond float32, not float64
    got = compiled(stats_vector, np, x)
    assert_same_stats(got, reference_stats(x), rtol=1e-9)
    assert_same_stats(got, twin(stats_vector, np, x), rtol=1e-6)
    np.testing.assert_allclose(compiled(SquaresStats.forward, np, x, keeps=(None,))[0],
                               float(np.sum(x.astype(np.float64) ** 2)), rtol=1e-12)


def reference_activation(x, unit_axis):
    x64 = np.asarray(x, np.float64)
    finite = np.isfinite(x64)
    kept = np.where(finite, x64, 0.0)
    count = max(finite.sum(), 1)
    axes = tuple(a for a in range(x.ndim) if a != unit_axis % x.ndim)
    unit_max = np.abs(x64).max(axis=axes)
    mean = kept.sum() / count
    std = math.sqrt(max(((kept - mean) ** 2 * finite).sum() / count, 0.0))
    return np.array([np.abs(kept).sum() / count, std, (x64 == 0).mean(), np.abs(kept).max(),
                     (unit_max == 0).mean(), np.isnan(x64).sum(), np.isinf(x64).sum()])


@pytest.mark.parametrize("shape, unit_axis", [((100, 128), 1), ((100, 128), -1), ((4, 3, 5, 7), 1),
                                              ((2, 6, 1, 1), 1), ((1,), 0), ((7,), 0), ((3, 5, 2), 2),
                                              ((2, 16, 64, 65), 1)])
@pytest.mark.parametrize("relu", [True, False])
def test_compiled_activation_matches_its_twin_and_reference(shape, unit_axis, relu):
    rng = np.random.default_rng(len(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    if relu:
        x = np.maximum(x, 0)
    if x.ndim > 1:                                              # a dead unit: zero for every example and position
        index = [slice(None)] * x.ndim
        index[unit_axis % x.ndim] = 0
        x[tuple(index)] = 0
    got = compiled(activation_vector, np, x, unit_axis, relu)
    want = twin(activation_vector, np, x, unit_axis, relu)
    np.testing.assert_array_equal(got[[2, 3, 4, 5, 6]], want[[2, 3, 4, 5, 6]])    # counts and the largest |x|
    np.testing.assert_allclose(got[:2], want[:2], rtol=1e-5)
    np.testing.assert_allclose(got, reference_activation(x, unit_axis), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("shape, unit_axis", [((100, 128), 1), ((4, 3, 40, 41), 1), ((2, 16, 64, 65), 1)])
def test_compiled_activation_in_pieces_over_host_threads(shape, unit_axis, split_small):
    x = np.maximum(np.random.default_rng(3).standard_normal(shape).astype(np.float32), 0)
    x[:, 1] = 0                                                  # a dead unit in every piece
    np.testing.assert_allclose(compiled(activation_vector, np, x, unit_axis, True),
                               reference_activation(x, unit_axis), rtol=1e-9, atol=1e-12)
    x[-1, -1] = np.inf
    np.testing.assert_array_equal(compiled(activation_vector, np, x, unit_axis), twin(activation_vector, np, x, 1))


def test_compiled_activation_of_a_non_contiguous_output():
    x = np.random.default_rng(5).standard_normal((40, 30)).astype(np.float32).T      # (30, 40), units last
    np.testing.assert_allclose(compiled(activation_vector, np, x, 1), reference_activation(x, 1), rtol=1e-9)


@pytest.mark.parametrize("planted", [np.nan, np.inf, -np.inf])
def test_compiled_activation_with_nan_or_inf_is_the_twins(planted):
    x = np.maximum(np.random.default_rng(6).standard_normal((10, 8)).astype(np.float32), 0)
    x[3, 2] = planted
    np.testing.assert_array_equal(compiled(activation_vector, np, x, 1, True), twin(activation_vector, np, x, 1, True))
    x[:] = planted
    np.testing.assert_array_equal(compiled(activation_vector, np, x, 1), twin(activation_vector, np, x, 1))


def test_compiled_activation_with_a_cancelling_spread():
    x = (50 + np.random.default_rng(8).standard_normal((64, 32)) * 1e-4).astype(np.float32)
    got = compiled(activation_vector, np, x, 1, True)
    np.testing.assert_allclose(got[1], x.astype(np.float64).std(), rtol=1e-9)


def test_squares_stats_of_several_tensors_in_one_compiled_call():
    rng = np.random.default_rng(9)
    tensors = [rng.standard_normal(shape).astype(np.float32) for shape in [(64, 128), (128,), (128, 10), (1,)]]
    tensors.append(rng.standard_normal((10, 7)).astype(np.float32).T)           # non-contiguous
    keeps = (None,) * len(tensors)
    want = np.concatenate([[np.sum(t.astype(np.float64) ** 2), 0, 0] for t in tensors])
    np.testing.assert_allclose(compiled(SquaresStats.forward, np, *tensors, keeps=keeps), want, rtol=1e-9)
    np.testing.assert_allclose(twin(SquaresStats.forward, np, *tensors, keeps=keeps), want, rtol=1e-5)
    tensors[1][5], tensors[2][0, 0], tensors[3][0] = np.nan, -np.inf, np.inf
    got = compiled(SquaresStats.forward, np, *tensors, keeps=keeps)
    want = twin(SquaresStats.forward, np, *tensors, keeps=keeps)
    np.testing.assert_array_equal(got[3:12], want[3:12])        # the tensors holding NaN/Inf: the masked path
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert got[4:6].tolist() == [1, 0] and got[7:9].tolist() == [0, 1] and got[9:12].tolist() == [0, 0, 1]
    big = rng.standard_normal(stats.COMPILED_SPLIT_ELEMENTS).astype(np.float32)    # BLAS products: the NumPy path
    got = compiled(SquaresStats.forward, np, tensors[0], big, keeps=(None, None))
    want = twin(SquaresStats.forward, np, tensors[0], big, keeps=(None, None))
    assert got[3] == want[3]
    assert got[0] == compiled(square_vector, np, tensors[0])[0]       # the small one as square_vector sums it
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("size", SIZES)
def test_square_vector_sums_a_float32_tensor_as_squares_stats_does(size):
    x = np.random.default_rng(size).standard_normal(size).astype(np.float32)
    got = compiled(square_vector, np, x)
    np.testing.assert_array_equal(got, compiled(SquaresStats.forward, np, x, keeps=(None,)))
    np.testing.assert_allclose(got, [np.sum(x.astype(np.float64) ** 2), 0, 0], rtol=1e-9)
    np.testing.assert_allclose(twin(square_vector, np, x), got, rtol=1e-5)
    x[size // 2] = -np.inf
    np.testing.assert_array_equal(compiled(square_vector, np, x), twin(square_vector, np, x))


def test_squares_stats_keeps_the_tensors_it_is_asked_to():
    class Keep:
        def save(self, xp, array):
            self.array = array.copy()
    keep = Keep()
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = compiled(SquaresStats.forward, np, w, np.ones(2, np.float32), keeps=(keep, None))
    np.testing.assert_array_equal(keep.array, w)
    np.testing.assert_allclose(got, [55, 0, 0, 2, 0, 0])


# ----------------------------------------------------------------------------------------------- StatsFeed

@pytest.mark.parametrize("size", [1, 1000, 12_800, (1 << 17) + 3])
def test_stats_feed_summarises_float32_tensors_at_once_every_step_and_keeps_small_ones_last_copy(size):
    rng = np.random.default_rng(size)
    steps = 40
    tensors = rng.standard_normal((steps, size)).astype(np.float32)
    tensors[5, 0] = np.nan                                    # NaN and Inf steps stay visible, counted
    tensors[9, -1] = -np.inf
    full = []
    feed = StatsFeed(lambda: None, lambda: full.append(feed.take()), limit=10**6)
    with jit.using(True):
        for step in range(steps):
            buffer = tensors[step].copy()
            feed.put_tensor(step, buffer)
            buffer[:] = 99                                    # the plan overwrites its buffer: nothing kept from it
    latest = feed.latest()
    got_steps, got = feed.take()
    assert got_steps == list(range(steps))
    want = np.array([twin(stats_vector, np, t) for t in tensors])
    np.testing.assert_array_equal(got[:, 4:], want[:, 4:])
    assert got[5, 4] == 1 and got[9, 5] == 1
    np.testing.assert_allclose(got[:, :4], want[:, :4], rtol=1e-5, atol=1e-6)
    if StatsFeed._copied(size, 4):
        assert latest[0] == steps - 1
        np.testing.assert_array_equal(latest[1], tensors[-1])
    else:
        assert latest is None                                 # a large tensor is summarised in place, not copied


def test_stats_feed_hands_over_full_blocks_of_summaries_in_order_with_takes_between():
    rng = np.random.default_rng(11)
    n = 2 * StatsFeed.MAX_ROWS + 5
    tensors = rng.standard_normal((n, 300)).astype(np.float32)
    tensors[StatsFeed.MAX_ROWS - 1, 3] = np.inf                 # the last row of the first block: the NumPy path
    feed = StatsFeed(lambda: None, lambda: None, limit=10**6)
    got_steps, got = [], []
    with jit.using(True):
        for step in range(n):
            feed.put_summary(step, tensors[step])
            if step in (10, StatsFeed.MAX_ROWS + 2):
                steps, vectors = feed.take(arrays=True)
                got_steps.append(steps)
                got.append(vectors)
    steps, vectors = feed.take(arrays=True)
    got_steps.append(steps)
    got.append(vectors)
    assert np.concatenate(got_steps).tolist() == list(range(n)) and len(feed) == 0 and feed._chunk_rows == 0
    want = np.array([twin(stats_vector, np, t) for t in tensors])
    got = np.concatenate(got)
    np.testing.assert_array_equal(got[:, 4:], want[:, 4:])
    assert got[StatsFeed.MAX_ROWS - 1, 5] == 1
    np.testing.assert_allclose(got[:, :4], want[:, :4], rtol=1e-5, atol=1e-6)


def test_stats_feed_summarises_an_empty_tensor_as_stats_vector_does():
    feed = StatsFeed(lambda: None, lambda: None)
    with jit.using(True):
        feed.put_tensor(0, np.zeros((0, 3), np.float32))
        feed.put_tensor(1, np.ones(2, np.float32))
    steps, vectors = feed.take()
    assert steps == [0, 1]
    np.testing.assert_array_equal(vectors[0], [np.nan] * 4 + [0, 0])
    np.testing.assert_array_equal(vectors[1], [1, 1, 1, 0, 0, 0])


def test_stats_feed_keeps_step_order_across_puts_blocks_and_a_change_of_mode_or_shape():
    rng = np.random.default_rng(4)
    feed = StatsFeed(lambda: None, lambda: None, limit=10**6)
    want, order = [], []
    step = 0
    for mode, size in [(True, 100), (False, 100), (True, 100), (False, 64), (False, 100), (True, 3000)]:
        with jit.using(mode):
            for _ in range(StatsFeed.MAX_ROWS + 3 if size == 64 else 7):      # fills a block of the fewest rows
                x = rng.standard_normal(size).astype(np.float32)
                feed.put_tensor(step, x)
                want.append(twin(stats_vector, np, x))
                order.append(step)
                step += 1
        feed.put(step, np.full(6, float(step)))
        want.append(np.full(6, float(step)))
        order.append(step)
        step += 1
    assert len(feed) == step
    steps, vectors = feed.take()
    assert steps == order and len(feed) == 0 and feed._chunk_rows == 0
    np.testing.assert_allclose(vectors, np.array(want), rtol=1e-5, atol=1e-6)


def test_stats_feed_batches_any_float32_tensor_with_compiled_kernels():
    class Lazy:
        def __init__(self, shape, dtype):
            self.shape, self.dtype = shape, np.dtype(dtype)
    big, small = Lazy((1000, 1000), np.float32), Lazy((10, 10), np.float32)
    with jit.using(True):
        assert StatsFeed.batches(big) and StatsFeed.batches(small)
        assert not StatsFeed.batches(Lazy((1000, 1000), np.float64))
        assert not StatsFeed.batches(Lazy((10,), np.int32))
    with jit.using(False):
        assert not StatsFeed.batches(big) and StatsFeed.batches(small)
    feed = StatsFeed(lambda: None, lambda: None)
    with jit.using(True):       # the plan's put: the compiled summary's own path for float32, put_tensor else
        assert feed.put_for(small) == feed.put_summary
        assert feed.put_for(Lazy((10,), np.float64)) == feed.put_tensor
    with jit.using(False):
        assert feed.put_for(small) == feed.put_tensor


def test_put_summary_inside_jit_using_false_takes_the_numpy_path():
    """A plan compiled with kernels binds ``put_summary``; a call run inside ``jit.using(False)`` copies the tensor
    into a block as ``put_tensor`` does without kernels, and the feed gives the same vectors either way."""
    feed = StatsFeed(lambda: None, lambda: None)
    xs = np.random.default_rng(5).standard_normal((4, 50)).astype(np.float32)
    feed.put_summary(0, xs[0])
    with jit.using(False):
        feed.put_summary(1, xs[1])
        assert feed._rows == 1 and feed._block.shape[1] == 50     # a block of copies
    feed.put_summary(2, xs[2])
    steps, vectors = feed.take()
    assert steps == [0, 1, 2]
    np.testing.assert_allclose(vectors, [twin(stats_vector, np, x) for x in xs[:3]], rtol=1e-5, atol=1e-7)


def test_a_large_tensor_put_while_kernels_are_off_is_summarised_by_numpy_not_copied():
    feed = StatsFeed(lambda: None, lambda: None)
    x = np.random.default_rng(0).standard_normal(200_000).astype(np.float32)
    with jit.using(False):
        feed.put_tensor(3, x)
    assert feed._block is None and feed.latest() is None
    steps, vectors = feed.take()
    assert steps == [3]
    np.testing.assert_allclose(vectors[0], twin(stats_vector, np, x), rtol=1e-12)


def test_histograms_are_unchanged_by_the_kernels():
    x = np.random.default_rng(3).standard_normal((100, 128)).astype(np.float32)
    np.testing.assert_array_equal(compiled(histogram_vector, np, x, 30), twin(histogram_vector, np, x, 30))
