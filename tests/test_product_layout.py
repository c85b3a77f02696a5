"""The compiler's write_products_in_layout pass and its op, ops.math.MatMulInLayout: a product written straight into
the layout a transpose and a reshape of it give (attention merging its heads back), without the reshape's copy."""
import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.compiler import passes
from flowlab.ops.math import MatMul, MatMulInLayout

# (a shape, b shape, transpose_a, transpose_b, alpha, perm, merged shape)
CASES = [
    ((8, 2, 32, 32), (8, 2, 32, 64), False, False, 1.0, (0, 2, 1, 3), (256, 128)),      # BERT's context
    ((8, 2, 32, 32), (8, 2, 32, 64), True, False, 1.0, (0, 2, 1, 3), (256, 128)),       # its key gradient
    ((2, 3, 7, 5), (2, 3, 4, 5), False, True, 0.5, (0, 2, 1, 3), (14, 12)),
    ((3, 5, 4), (3, 6, 5), True, True, 2.0, (1, 0, 2), (4, 18)),
    ((3, 4, 5), (3, 5, 6), False, False, 1.0, (0, 2, 1), (3, 24)),      # the product's rows strided: NumPy copies
    ((2, 3, 4), (2, 4, 5), False, False, 1.0, (1, 2, 0), (15, 2)),        # cycles: perm is not its own inverse
    ((2, 3, 4, 5), (2, 3, 5, 6), False, False, 1.0, (2, 0, 1, 3), (24, 6)),
    ((1, 1, 1, 1), (1, 1, 1, 1), False, False, 1.0, (0, 2, 1, 3), (1, 1)),
    ((4, 7), (7, 3), False, False, 1.0, (1, 0), (3, 4)),
]


def _operands(case, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=case[0]).astype(dtype), rng.normal(size=case[1]).astype(dtype)


def _twin(a, b, ta, tb, alpha, perm, shape):
    """The three ops the pass replaces: MatMul, then a transposed view, then the reshape's copy."""
    return np.transpose(MatMul.forward(np, a, b, ta, tb, alpha), perm).reshape(shape)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES, ids=[str(c[0]) + str(c[2:4]) for c in CASES])
@pytest.mark.parametrize("out_kind", ["none", "contiguous", "strided"])
def test_the_product_in_layout_equals_the_product_transposed_and_reshaped(case, dtype, out_kind):
    a, b = _operands(case, dtype)
    ta, tb, alpha, perm, shape = case[2:]
    wide = np.transpose(alpha * np.matmul(np.swapaxes(a, -1, -2) if ta else a, np.swapaxes(b, -1, -2) if tb else b,
                                          dtype=np.float64), perm).reshape(shape)        # float64 reference
    out = {"none": None, "contiguous": np.full(shape, np.nan, dtype),
           "strided": np.full((shape[0], 2 * shape[1]), np.nan, dtype)[:, ::2]}[out_kind]
    got = MatMulInLayout.forward(np, a, b, ta, tb, alpha, perm, shape, out=out)
    assert got.shape == shape and got.dtype == dtype
    if out is not None:
        assert got is out
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, wide, **tolerance)
    np.testing.assert_allclose(got, _twin(a, b, *case[2:]), **tolerance)


def _attention_loss(x, heads=2, merge=True):
    """A self-attention-like block whose key gradient and merged context each come out of a product through a
    transpose and a reshape."""
    rows, hidden = x.shape
    batch, seq, d = 2, rows // 2, hidden // heads

    def split(t):
        return flow.transpose(flow.reshape(t, (batch, seq, heads, d)), (0, 2, 1, 3))
    init = flow.random_normal_initializer(stddev=0.5, seed=7)
    q = split(flow.matmul(x, flow.get_variable("wq", (hidden, hidden), initializer=init)))
    k = split(flow.matmul(x, flow.get_variable("wk", (hidden, hidden),
                                               initializer=flow.random_normal_initializer(stddev=0.5, seed=8))))
    scores = flow.math.tanh(flow.matmul(q, k, transpose_b=True))
    context = flow.matmul(scores, k)
    merged = flow.reshape(flow.transpose(context, (0, 2, 1, 3)), (rows, hidden))
    return flow.math.reduce_sum(flow.math.square(merged))


def _numpy_attention_loss(x, wq, wk, heads=2):
    rows, hidden = x.shape
    batch, seq, d = 2, rows // 2, hidden // heads

    def split(t):
        return t.reshape(batch, seq, heads, d).transpose(0, 2, 1, 3)
    q, k = split(x @ wq), split(x @ wk)
    context = np.tanh(q @ np.swapaxes(k, -1, -2)) @ k
    return float(np.sum(np.square(context.transpose(0, 2, 1, 3).reshape(rows, hidden))))


def _train_step(x, dtype, lr, monkeypatch=None):
    """One SGD step of ``_attention_loss``; returns (loss, initial variables, updated variables, plan source)."""
    from flowlab.runtime import session
    flow.clear_default_session()
    config = flow.FunctionConfig()
    config.default_data_type(flow.double if dtype == np.float64 else flow.float)

    @flow.global_function(type="train", function_config=config)
    def job(x_: tp.Numpy.Placeholder(x.shape, dtype=flow.double if dtype == np.float64 else flow.float)
            ) -> tp.Numpy:
        loss = _attention_loss(x_)
        flow.optimizer.SGD(lr).minimize(loss)
        return loss

    source = job.plan().source
    session.default().initialize_missing()
    initial = {name: v.numpy().copy() for name, v in session.default().variables.items()}
    loss = job(x.astype(dtype))
    return loss, initial, {name: v.numpy() for name, v in session.default().variables.items()}, source


@pytest.mark.numpy_backend
def test_attention_trains_with_products_in_layout_and_its_gradients_match_finite_differences():
    x = np.random.default_rng(1).normal(size=(8, 4))
    lr = 1e-3
    loss, before, after, source = _train_step(x, np.float64, lr)
    # the forward's merged context and the key gradient (one product, no sum) come out in the merged layout
    assert source.count("(MatMulInLayout)") >= 2
    assert np.isclose(float(np.asarray(loss)), _numpy_attention_loss(x, before["wq"], before["wk"]), rtol=1e-12)
    for name in ("wq", "wk"):
        grad = (before[name] - after[name]) / lr
        numeric = np.zeros_like(grad)
        for index in np.ndindex(grad.shape):
            for sign in (1, -1):
                w = {k: before[k].copy() for k in ("wq", "wk")}
                w[name][index] += sign * 1e-6
                numeric[index] += sign * _numpy_attention_loss(x, w["wq"], w["wk"]) / 2e-6
        np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.numpy_backend
def test_float32_training_matches_the_plan_without_the_pass(monkeypatch):
    x = np.random.default_rng(2).normal(size=(8, 4))
    loss, _, fused, source = _train_step(x, np.float32, 0.01)
    monkeypatch.setattr(passes, "products_in_layout", lambda nodes, protected: (nodes, 0))
    reference_loss, _, reference, reference_source = _train_step(x, np.float32, 0.01)
    assert "(MatMulInLayout)" in source and "(MatMulInLayout)" not in reference_source
    np.testing.assert_allclose(np.asarray(loss), np.asarray(reference_loss), rtol=1e-6)
    for name in reference:
        np.testing.assert_allclose(fused[name], reference[name], rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.numpy_backend
def test_a_product_or_transpose_seen_elsewhere_keeps_its_three_ops():
    def plan_source(body):
        flow.clear_default_session()

        @flow.global_function()
        def job(a: tp.Numpy.Placeholder((2, 3, 4)), b: tp.Numpy.Placeholder((2, 4, 5))) -> tp.Numpy:
            return body(a, b)
        return job.plan().source

    def merged(p):
        return flow.reshape(flow.transpose(p, (1, 0, 2)), (3, 10))
    assert "(MatMulInLayout)" in plan_source(lambda a, b: merged(flow.matmul(a, b)) * 2.0)

    def product_read_twice(a, b):
        p = flow.matmul(a, b)
        return merged(p) + flow.reshape(flow.math.reduce_sum(p), (1, 1))

    def transpose_read_twice(a, b):
        t = flow.transpose(flow.matmul(a, b), (1, 0, 2))
        return flow.reshape(t, (3, 10)) + flow.reshape(flow.math.reduce_sum(t), (1, 1))
    for body in (product_read_twice, transpose_read_twice):
        assert "(MatMulInLayout)" not in plan_source(body)
