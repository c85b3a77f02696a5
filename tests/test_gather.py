"""``flow.gather``: kernels against PyTorch and NumPy, the gradient by finite differences (float64), the batch
gather BERT uses, out-of-range indices, and the indexed-slices form of the gradient that sparse updates read."""
import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.autodiff import gradients
from flowlab.errors import ShapeError
from flowlab.ops.indexing import GatherGrad
from flowlab.ops.scatter import sum_rows
from gradcheck import check_grad, run


def test_embedding_lookup_matches_torch():
    torch = pytest.importorskip("torch")
    table = np.random.default_rng(0).standard_normal((11, 4)).astype(np.float32)
    ids = np.array([[3, 0, 10], [3, 3, 7]], np.int32)
    got, = run(lambda t, i: flow.gather(t, i), table, ids)
    want = torch.nn.functional.embedding(torch.from_numpy(ids).long(), torch.from_numpy(table)).numpy()
    assert got.shape == (2, 3, 4)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_gather_along_any_axis_matches_torch_index_select(axis):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(1).standard_normal((3, 5, 4)).astype(np.float32)
    idx = np.array([2, 0, 2], np.int64)
    got, = run(lambda t, i: flow.gather(t, i, axis=axis), x, idx)
    want = torch.index_select(torch.from_numpy(x), axis % 3, torch.from_numpy(idx)).numpy()
    np.testing.assert_array_equal(got, want)


def test_oneflow_docstring_examples():
    x = np.arange(1, 10, dtype=np.float32).reshape(3, 3)
    idx = np.array([0, 2], np.int32)
    cols, rows = run(lambda t, i: [flow.gather(t, i, axis=1), flow.gather(params=t, indices=i, axis=0)], x, idx)
    np.testing.assert_array_equal(cols, [[1, 3], [4, 6], [7, 9]])
    np.testing.assert_array_equal(rows, [[1, 2, 3], [7, 8, 9]])


def test_bert_batch_gather_matches_torch_gather():
    """BERT's ``gather(sequence, positions, axis=2, batch_dims=2)``: OneFlow's batch_gather, (B, S, H) x (B, P)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    seq = rng.standard_normal((2, 7, 3)).astype(np.float32)
    pos = rng.integers(0, 7, (2, 4)).astype(np.int32)
    got, = run(lambda s, p: flow.gather(params=s, indices=p, axis=2, batch_dims=2), seq, pos)
    index = torch.from_numpy(pos).long()[:, :, None].expand(2, 4, 3)
    want = torch.gather(torch.from_numpy(seq), 1, index).numpy()
    assert got.shape == (2, 4, 3)
    np.testing.assert_array_equal(got, want)


def test_tensorflow_batch_dims_below_axis():
    """``axis > batch_dims`` follows TensorFlow: out[b, p, i, q] = params[b, p, idx[b, i], q]."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 5, 4))
    idx = rng.integers(0, 5, (2, 6))
    got, = run(lambda t, i: flow.gather(t, i, axis=2, batch_dims=1), x, idx)
    want = np.stack([np.take(x[b], idx[b], axis=1) for b in range(2)])
    assert got.shape == (2, 3, 6, 4)
    np.testing.assert_array_equal(got, want)


def test_out_of_range_indices_give_zero_rows_and_no_gradient():
    table = np.arange(12, dtype=np.float64).reshape(4, 3) + 1
    ids = np.array([1, -1, 4, 1], np.int32)

    def build(t, i):
        y = flow.gather(t, i)
        return [y, gradients([flow.math.reduce_sum(y)], [t], [flow.constant(1.0, dtype=flow.float64)])[0]]
    y, grad = run(build, table, ids)
    np.testing.assert_array_equal(y, [table[1], np.zeros(3), np.zeros(3), table[1]])
    np.testing.assert_array_equal(grad, [[0] * 3, [2] * 3, [0] * 3, [0] * 3])


@pytest.mark.parametrize("shape,indices,kwargs", [
    ((6, 3), [[1, 5, 1], [0, 1, 1]], {}),                      # embedding: repeated ids add up
    ((3, 6, 2), [4, 4, 0, 5], {"axis": 1}),
    ((2, 5, 3), [[4, 4, 1], [0, 2, 2]], {"axis": 1, "batch_dims": 1}),
    ((2, 3, 5, 2), [[4, 1], [0, 0]], {"axis": 2, "batch_dims": 1}),
])
def test_gradient_by_finite_differences(shape, indices, kwargs):
    params = np.random.default_rng(4).standard_normal(shape)
    check_grad(lambda p, i: flow.gather(p, i, **kwargs), params, np.array(indices, np.int32))


def test_gradient_matches_torch_embedding_backward():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    table = rng.standard_normal((50, 8))
    ids = rng.integers(0, 50, (64, 16)).astype(np.int64)     # many more ids than rows: the sorted-sum path
    upstream = rng.standard_normal((64, 16, 8))

    def build(t, i, w):
        loss = flow.math.reduce_sum(flow.gather(t, i) * w)
        return gradients([loss], [t], [flow.constant(1.0, dtype=flow.float64)])[0]
    got, = run(build, table, ids, upstream)
    t = torch.from_numpy(table).requires_grad_()
    (torch.nn.functional.embedding(torch.from_numpy(ids), t) * torch.from_numpy(upstream)).sum().backward()
    np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("one_hot_rows", [0, 128])
def test_sum_rows_every_path_agrees_with_add_at(monkeypatch, one_hot_rows):
    """The one-hot product (small tables), sorting and reduceat (ids repeating a lot), add.at (the rest): the same
    sums, ids outside the table dropped; a NaN or Inf row reaches its own id's row alone (the product would spread
    it through its zeros, so it is not taken then)."""
    from flowlab.ops import scatter
    monkeypatch.setattr(scatter, "ONE_HOT_ROWS", one_hot_rows)
    rng = np.random.default_rng(6)
    for n_rows, n, dtype in ((5, 100, np.float64), (100, 7, np.float64), (100, 256, np.float32), (300, 40, np.float32)):
        ids = rng.integers(-2, n_rows + 2, n)
        rows = rng.standard_normal((n, 2, 3)).astype(dtype)
        want = np.zeros((n_rows, 2, 3))
        keep = (ids >= 0) & (ids < n_rows)
        np.add.at(want, ids[keep], rows[keep].astype(np.float64))
        got = sum_rows(np, ids, rows, n_rows)
        assert got.dtype == dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-12 if dtype == np.float64 else 1e-5, atol=1e-6)
    ids, rows = np.array([1, 3, 1]), np.ones((3, 2))
    rows[0, 0], rows[1, 1] = np.nan, np.inf
    got = sum_rows(np, ids, rows, 4)
    assert np.isnan(got[1, 0]) and got[3, 1] == np.inf and got[1, 1] == 2.0 and got[3, 0] == 1.0
    assert (got[[0, 2]] == 0).all()


def test_indexed_slices_rebuild_the_dense_gradient():
    """A sparse update reads the gradient node's ``indexed_slices``: (ids, rows) whose sum by id is the gradient."""
    rng = np.random.default_rng(7)
    table = rng.standard_normal((9, 4))
    ids = np.array([[8, 2], [2, 0]], np.int32)
    upstream = rng.standard_normal((2, 2, 4))

    def build(t, i, w):
        grad = gradients([flow.math.reduce_sum(flow.gather(t, i) * w)], [t],
                         [flow.constant(1.0, dtype=flow.float64)])[0]
        assert grad.node.op is GatherGrad
        slice_ids, slice_rows = grad.node.op.indexed_slices(grad.node)
        return [grad, slice_ids, slice_rows]
    dense, slice_ids, slice_rows = run(build, table, ids, upstream)
    np.testing.assert_array_equal(slice_ids, ids.ravel())
    np.testing.assert_array_equal(slice_rows, upstream.reshape(4, 4))
    np.testing.assert_allclose(sum_rows(np, slice_ids, slice_rows, 9), dense, rtol=1e-12)


def test_indexed_slices_only_for_embedding_gathers():
    def build(t, i):
        grad = gradients([flow.math.reduce_sum(flow.gather(t, i, axis=1))], [t],
                         [flow.constant(1.0, dtype=flow.float64)])[0]
        assert grad.node.op.indexed_slices(grad.node) is None
        return grad
    run(build, np.ones((2, 3)), np.array([0, 2], np.int32))


def test_embedding_trains_only_its_gathered_rows():
    """SGD through a gather changes exactly the rows that were looked up."""
    @flow.global_function(type="train")
    def train(ids: tp.Numpy.Placeholder((4,), dtype=flow.int32)) -> tp.Numpy:
        table = flow.get_variable("gather_table", shape=(10, 3), initializer=flow.ones_initializer())
        loss = flow.math.reduce_sum(flow.math.square(flow.gather(table, ids)))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss
    before = np.ones((10, 3), np.float32)
    train(np.array([1, 1, 4, 7], np.int32))
    after = flow.get_all_variables()["gather_table"].numpy()
    changed = np.flatnonzero(np.any(after != before, axis=1))
    np.testing.assert_array_equal(changed, [1, 4, 7])
    # d(sum x^2)/dx = 2x = 2 per use, scaled by 1/loss.size (1); row 1 is used twice
    np.testing.assert_allclose(after[[1, 4]], [[1 - 0.1 * 4] * 3, [1 - 0.1 * 2] * 3], rtol=1e-6)


@pytest.mark.parametrize("call,error,match", [
    (lambda t, i: flow.gather(t, flow.cast(i, flow.float32)), ShapeError, "indices must be integers"),
    (lambda t, i: flow.gather(t, i, axis=2), ValueError, "axis must be in"),
    (lambda t, i: flow.gather(t, i, axis=0, batch_dims=1), ValueError, "must not be less than batch_dims"),
    (lambda t, i: flow.gather(t, i, batch_dims=-1), ValueError, "batch_dims must be a non-negative int"),
    (lambda t, i: flow.gather(t, i, axis=1.0), TypeError, "axis must be an int"),
])
def test_bad_arguments_are_named(call, error, match):
    with pytest.raises(error, match=match):
        run(call, np.ones((3, 4), np.float32), np.array([0, 1], np.int32))


def test_batch_axes_must_match():
    with pytest.raises(ShapeError, match="batch"):
        run(lambda s, p: flow.gather(s, p, axis=1, batch_dims=1), np.ones((2, 5, 3), np.float32),
            np.zeros((3, 4), np.int32))
