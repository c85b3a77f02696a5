"""Compiler passes and backend selection."""
import os
import subprocess
import sys

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.compiler import fold_update, fuse, plan_buffers, prune
from flowlab.errors import DeviceError
from flowlab.runtime import backend


@pytest.fixture(autouse=True)
def fold_any_kernel(monkeypatch):
    """The fold's tests train kernels of a few elements: what they check is its rule (which updates may fold), not
    its size threshold (``test_small_kernels_are_not_folded`` checks that)."""
    monkeypatch.setattr(fold_update, "FOLD_MIN_ELEMENTS", 0)


def _traced(fn, *shapes):
    job = flow.global_function()(fn)
    return job.compiled(shapes).graph


def device_feeds(*arrays):
    """Feeds for calling a plan directly: arrays on the backend's device, as a job call passes them."""
    return [backend.current().asarray(a) for a in arrays]


def on_host(copy):
    """A delivered copy as a NumPy array: on CuPy the plan emits a function that waits for its asynchronous copy."""
    return copy() if callable(copy) else copy


def test_prune_keeps_only_what_outputs_need():
    def fn(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        flow.math.exp(x)                 # dead
        return flow.math.square(x)

    graph = _traced(fn, (3,))
    kept = prune(graph.nodes, graph.outputs)
    assert [n.op.__name__ for n in kept] == ["Input", "Square"]


def test_buffers_are_reused_only_after_last_use():
    def fn(x: tp.Numpy.Placeholder((4, 4))) -> tp.Numpy:
        a = flow.math.exp(x)             # buffer 0
        b = flow.math.square(a)          # a still needed below: new buffer
        c = flow.math.tanh(b)            # a dead? no: used by d
        d = a + c
        e = flow.math.sqrt(flow.math.abs(d))
        return e

    graph = _traced(fn, (4, 4))
    assignment, buffers, _ = plan_buffers(graph.nodes, {graph.outputs[0].id})
    ids = {n.op.__name__: n.outputs[0].id for n in graph.nodes}
    assert assignment[ids["Exp"]] != assignment[ids["Square"]]
    assert assignment[ids["Exp"]] != assignment[ids["Tanh"]]     # a is alive until Add
    assert graph.outputs[0].id not in assignment                 # returned tensors never share a pool buffer
    assert len(buffers) < 5


def test_views_keep_their_base_buffer_alive():
    def fn(x: tp.Numpy.Placeholder((2, 6))) -> tp.Numpy:
        a = flow.math.exp(x)
        v = flow.reshape(a, [3, 4])      # view of a's buffer
        b = flow.math.square(x)          # must not take a's buffer while v lives
        return flow.reshape(b, [3, 4]) + v

    job = flow.global_function()(fn)
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(2, 6)
    np.testing.assert_allclose(job(x), (np.square(x) + np.exp(x)).reshape(3, 4), rtol=1e-6)


def test_fusion_groups_single_use_same_shape_chains():
    def fn(x: tp.Numpy.Placeholder((8,)), y: tp.Numpy.Placeholder((8,))) -> tp.Numpy:
        a = flow.math.exp(x)
        b = a * y
        c = flow.nn.relu(b)
        return flow.math.tanh(c)

    graph = _traced(fn, (8,), (8,))
    chains = fuse.find_chains(graph.nodes, {graph.outputs[0].id})
    assert len(chains) == 1 and [n.op.__name__ for n in chains[0]] == ["Exp", "Multiply", "Relu", "Tanh"]
    inputs, expr, out = fuse.chain_expression(chains[0])
    assert [t.id for t in inputs] == [t.id for t in graph.placeholders]
    assert expr == "tanh(max((exp(x0) * x1), (T)0))"

    kernels = []
    nodes = fuse.fuse_elementwise(graph.nodes, {graph.outputs[0].id}, lambda n, e: kernels.append((n, e)) or "K")
    assert [n.op.__name__ for n in nodes] == ["Input", "Input", "FusedElementwise"]
    assert kernels == [(2, expr)]


def test_fusion_stops_at_watched_or_shared_tensors():
    def fn(x: tp.Numpy.Placeholder((8,))) -> tp.Numpy:
        a = flow.math.exp(x)
        b = flow.math.square(a)
        return b + a                     # a has two readers: it must stay materialised

    graph = _traced(fn, (8,))
    chains = fuse.find_chains(graph.nodes, {graph.outputs[0].id})
    exp = next(n for n in graph.nodes if n.op.__name__ == "Exp")
    assert not any(exp in chain[:-1] for chain in chains)    # never inlined into a later node
    square = next(n for n in graph.nodes if n.op.__name__ == "Square")
    protected = fuse.find_chains(graph.nodes, {graph.outputs[0].id, square.outputs[0].id})
    assert not any(square in chain[:-1] for chain in protected)


def test_gpu_request_without_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(backend, "_probe_cupy", lambda: (None, "CuPy found no CUDA device"))
    with pytest.raises(DeviceError, match="FLOWLAB_DEVICE=gpu asks for a GPU, but CuPy found no CUDA device"):
        backend.select("gpu")
    assert backend.select("auto").name == "numpy"
    with pytest.raises(ValueError, match="FLOWLAB_DEVICE must be 'cpu', 'gpu' or 'auto', got 'tpu'"):
        backend.select("tpu")
    backend.select("cpu")


def test_cpu_fallback_says_nothing_on_stderr_and_tells_when_asked():
    code = ("import numpy as np, flowlab as flow, flowlab.typing as tp\n"
            "@flow.global_function()\n"
            "def j(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:\n    return x + 1.0\n"
            "j(np.zeros(2, np.float32)); j(np.zeros(2, np.float32))\n"
            "print(flow.device())\n")
    env = dict(os.environ, FLOWLAB_DEVICE="auto")                       # the parent's PYTHONPATH and all
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""                 # a notebook would draw anything there as an error
    assert out.stdout.startswith("flowlab: running on NumPy without a GPU, as ")


@pytest.mark.gpu
def test_cupy_backend_matches_numpy_with_fused_kernels():
    def fn(x: tp.Numpy.Placeholder((64, 32)), y: tp.Numpy.Placeholder((64, 32))) -> tp.Numpy:
        return flow.math.tanh(flow.nn.relu(flow.math.exp(x) * y - 1.0)) + flow.math.sigmoid(x)

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(2, 64, 32)).astype(np.float32)
    backend.use("cpu")
    expected = flow.global_function()(fn)(x, y)
    flow.clear_default_session()
    backend.use("gpu")
    try:
        job = flow.global_function()(fn)
        got = job(x, y)
        assert any(n.op.__name__ == "FusedElementwise" for n in job.plan().nodes)
    finally:
        backend.use("cpu")
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_cupy_training_matches_numpy():
    from flowlab.examples import digits_mlp

    results = {}
    for device in ("cpu", "gpu"):
        flow.clear_default_session()
        backend.use(device)
        try:
            train, _ = digits_mlp.build(batch_size=100)
            (xs, ys), _ = flow.data.load_digits(100, 100)
            results[device] = [float(train(x, y).mean()) for x, y in zip(xs[:5], ys[:5])]
        finally:
            backend.use("cpu")
    np.testing.assert_allclose(results["gpu"], results["cpu"], rtol=1e-4)


def test_any_value_or_gradient_can_be_delivered_and_unmarked_tensors_cost_nothing():
    """The hook watching builds on: deliver host copies of marked tensors, taken before updates change variables."""
    from flowlab.compiler import compile_graph
    from flowlab.runtime import session

    seen = {}

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((4, 3)), y: tp.Numpy.Placeholder((4,), dtype=flow.int32)) -> tp.Numpy:
        logits = flow.layers.dense(x, 5, name="d")
        seen["logits"] = logits
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.optimizer.SGD(0.5, momentum=0).minimize(loss)
        return loss

    compiled = job.compiled()
    graph = compiled.graph
    assert "emit(" not in compiled.plan.source and "host(" in compiled.plan.source   # only the output is copied
    logits, weight = seen["logits"], graph.variables["d-weight"]
    grad = graph.grad_of[logits.id]
    plan = compile_graph(graph, graph.outputs, backend.current(), session.default().variables,
                         deliveries=[(logits, 1), (grad, 1), (weight, 1), (logits, 2)])
    session.default().initialize_missing()
    x = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    y = np.array([0, 1, 2, 3], np.int32)
    w_before = session.default().variables["d-weight"].numpy()
    delivered, order = {}, []

    def emit(k, copy, step):
        order.append(k)
        delivered[[logits, grad, weight, logits][k].id] = copy

    plan(device_feeds(x, y), 1, emit)                   # step 1: the every=2 delivery is skipped
    delivered = {k: on_host(copy) for k, copy in delivered.items()}
    assert sorted(order) == [0, 1, 2]
    np.testing.assert_allclose(delivered[logits.id], x @ w_before.T, rtol=1e-5)
    np.testing.assert_array_equal(delivered[weight.id], w_before)        # the value read, not the updated one
    z = delivered[logits.id]
    softmax = np.exp(z - z.max(1, keepdims=True))
    softmax /= softmax.sum(1, keepdims=True)
    np.testing.assert_allclose(delivered[grad.id], softmax - np.eye(5)[y], rtol=1e-5, atol=1e-6)  # unscaled
    assert not np.array_equal(session.default().variables["d-weight"].numpy(), w_before)


def test_elementwise_ops_run_in_place_when_their_input_dies():
    def fn(x: tp.Numpy.Placeholder((4, 4))) -> tp.Numpy:
        a = flow.math.exp(x)
        b = flow.nn.relu(a)              # a dies here: relu may write over it
        c = flow.math.tanh(b) + a * 0.0  # (keeps nothing alive past its use)
        return flow.math.square(c)

    graph = _traced(fn, (4, 4))
    nodes = graph.nodes
    assignment, _, _ = plan_buffers(nodes, {graph.outputs[0].id})
    ids = {n.op.__name__: n.outputs[0].id for n in nodes if n.outputs}
    assert assignment[ids["Tanh"]] == assignment[ids["Relu"]]          # relu's buffer dies at tanh
    job = flow.global_function()(fn)
    x = np.linspace(-2, 2, 16, dtype=np.float32).reshape(4, 4)
    np.testing.assert_allclose(job(x), np.square(np.tanh(np.maximum(np.exp(x), 0))), rtol=1e-6)


def test_sgd_scales_a_dying_gradient_in_place():
    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((8, 4))) -> tp.Numpy:
        h = flow.layers.dense(x, 3, name="d")
        loss = flow.math.reduce_sum(flow.math.square(h), axis=1)
        flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
        return loss

    job(np.ones((8, 4), np.float32))
    bias_update = next(line for line in job.plan().source.splitlines() if "d-bias-SGDUpdate (SGDUpdate)" in line)
    assert "writable=True" in bias_update       # (the kernel's update is folded into its gradient product)


def test_demand_and_histogram_deliveries():
    """A Delivery with ``when`` is emitted only on calls where it says so (and on its every-th call); with ``bins``
    it carries the tensor's histogram, computed where the tensor lives, not the tensor."""
    from flowlab.compiler import Delivery, compile_graph
    from flowlab.ops.stats import histogram_vector
    from flowlab.runtime import session
    seen = {}

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((6, 4))) -> tp.Numpy:
        seen["y"] = y = flow.math.tanh(x)
        return y * 2.0

    compiled = job.compiled()
    graph, y = compiled.graph, seen["y"]
    want = {"now": False}
    plan = compile_graph(graph, graph.outputs, backend.current(), session.default().variables,
                         deliveries=[Delivery(y, 2, lambda: want["now"], 5)])
    assert "if step % 2 == 0 and w0(): emit(0, d0(" in plan.source
    x = np.random.default_rng(1).normal(size=(6, 4)).astype(np.float32)
    got = []
    for step, now in ((0, False), (1, True), (2, True)):
        want["now"] = now
        plan(device_feeds(x), step, lambda k, copy, s: got.append((s, copy)))
    assert [s for s, _ in got] == [2]                     # step 0 not wanted, step 1 not an even call
    be = backend.current()                                # the histogram of tanh(x) as the device computes it
    want = be.to_host(histogram_vector(be.xp, be.xp.tanh(be.asarray(x)), 5))
    np.testing.assert_array_equal(on_host(got[0][1]), want)


@pytest.mark.numpy_backend
def test_plans_of_small_products_run_blas_on_one_thread():
    from flowlab.runtime.backend import one_blas_thread
    # The BLAS libraries flowlab limits: those loaded when first asked (NumPy's; SciPy's too once an op imported it:
    # threadpoolctl then lists SciPy's first, and a test reading the first of a fresh list read 2 when SciPy's came
    # after flowlab's first plan). ``runtime.blas`` binds one of these.
    libraries = one_blas_thread.controllers()
    if not libraries or max(lib.num_threads for lib in libraries) < 2:
        pytest.skip("needs a BLAS with more than one thread to tell")
    before = [lib.num_threads for lib in libraries]
    inside = {}

    def make(units):
        @flow.global_function()
        def job(x: tp.Numpy.Placeholder((100, 64))) -> tp.Numpy:
            return flow.layers.dense(x, units, name=f"d{units}")
        return job

    small, large = make(128), make(512)                   # 0.8M and 3.3M multiply-adds
    assert small.plan().largest_gemm == 100 * 64 * 128 and small.plan().blas_limit is not None
    assert large.plan().blas_limit is None
    g = small.plan()._run.__globals__                      # look inside a call: wrap its matmul kernel
    matmul = next(name for name, f in g.items() if name.startswith("k") and "MatMul" in repr(f))
    kernel = g[matmul]

    def spy(*args, **kwargs):
        inside["threads"] = [lib.num_threads for lib in libraries]
        return kernel(*args, **kwargs)
    g[matmul] = spy
    small(np.ones((100, 64), np.float32))
    assert inside["threads"] == [1] * len(libraries) and [lib.num_threads for lib in libraries] == before


# ------------------------------------------------------------------------------- plain SGD folded into its product

def _train(body, x, steps=3, momentum=0.0, dtype=np.float32, fold=True, monkeypatch=None, anomaly=False,
           **minimize):
    """Run a train job ``steps`` times from fixed weights; returns (initial variables, final variables, plan
    source). ``fold=False`` compiles it as a NumPy without ``runtime.blas`` would (the unfolded reference)."""
    from flowlab.runtime import blas, session
    flow.clear_default_session()
    if not fold:
        monkeypatch.setattr(blas, "available", lambda dtype: False)
    config = flow.FunctionConfig()
    config.default_data_type(flow.double if dtype == np.float64 else flow.float)
    config.detect_anomaly(anomaly)

    @flow.global_function(type="train", function_config=config)
    def job(x_: tp.Numpy.Placeholder(x.shape, dtype=flow.double if dtype == np.float64 else flow.float)
            ) -> tp.Numpy:
        loss = body(x_)
        flow.optimizer.SGD(0.05, momentum=momentum, **minimize).minimize(loss)
        return loss

    source = job.plan().source
    session.default().initialize_missing()
    initial = {name: v.numpy() for name, v in session.default().variables.items()}
    for _ in range(steps):
        job(x.astype(dtype))
    if not fold:
        monkeypatch.undo()
    return initial, {name: v.numpy() for name, v in session.default().variables.items()}, source


def _init(shape):
    return flow.random_normal_initializer(stddev=0.5, seed=sum(shape))


def _dense_loss(x):
    return flow.math.reduce_sum(flow.math.square(flow.layers.dense(x, 5, kernel_initializer=_init((5, 6)),
                                                                   name="d")), axis=1)


FOLD_CASES = {
    "dense": (_dense_loss, (8, 6)),
    "x@w": (lambda x: flow.math.reduce_sum(flow.math.tanh(flow.matmul(
        x, flow.get_variable("w", (6, 5), initializer=_init((6, 5))))), axis=1), (8, 6)),
    "w@x": (lambda x: flow.math.reduce_sum(flow.math.square(flow.matmul(
        flow.get_variable("w", (5, 8), initializer=_init((5, 8))), x)), axis=0), (8, 6)),
    "wT@x alpha": (lambda x: flow.math.reduce_sum(flow.math.square(flow.matmul(
        flow.get_variable("w", (8, 5), initializer=_init((8, 5))), x, transpose_a=True, alpha=0.5)), axis=0),
        (8, 6)),
    "x@wT alpha": (lambda x: flow.math.reduce_sum(flow.math.square(flow.matmul(
        x, flow.get_variable("w", (5, 6), initializer=_init((5, 6))), transpose_b=True, alpha=2.0)), axis=1),
        (8, 6)),
}


@pytest.mark.numpy_backend
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", FOLD_CASES)
def test_plain_sgd_folds_into_the_gradient_product_and_trains_the_same(case, dtype, monkeypatch):
    body, shape = FOLD_CASES[case]
    x = np.random.default_rng(3).normal(size=shape)
    initial, folded, source = _train(body, x, dtype=dtype)
    _, reference, reference_source = _train(body, x, dtype=dtype, fold=False, monkeypatch=monkeypatch)
    assert "(SGDGemmUpdate)" in source and "(SGDGemmUpdate)" not in reference_source
    weight = next(name for name in folded if name.endswith("w") or name.endswith("weight"))
    assert folded[weight].dtype == dtype
    assert not np.allclose(folded[weight], initial[weight])                          # it did train
    for name in reference:
        np.testing.assert_allclose(folded[name], reference[name], rtol=1e-5 if dtype == np.float32 else 1e-12,
                                   atol=1e-6 if dtype == np.float32 else 1e-13, err_msg=name)


@pytest.mark.numpy_backend
def test_sgd_is_not_folded_where_the_gradient_is_seen_or_transformed():
    x = np.random.default_rng(4).normal(size=(8, 6))
    *_, momentum = _train(_dense_loss, x, steps=1, momentum=0.9)
    *_, clipped = _train(_dense_loss, x, steps=1,
                        grad_clipping=flow.optimizer.grad_clipping.by_global_norm(1.0))
    seen = []

    def watched(x_):
        loss = _dense_loss(x_)
        flow.watch_diff(flow.get_variable("d-weight", (5, 6)), lambda g: seen.append(g.copy()))
        return loss
    *_, diffed = _train(watched, x, steps=1)
    for source in (momentum, clipped, diffed):
        assert "(SGDGemmUpdate)" not in source and "d-weight-SGDUpdate (SGDUpdate)" in source
    assert len(seen) == 1 and seen[0].shape == (5, 6)
    *_, checked = _train(_dense_loss, x, steps=1, anomaly=True)
    assert "(SGDGemmUpdate)" not in checked


@pytest.mark.numpy_backend
def test_a_product_reading_a_variable_that_an_earlier_update_changes_is_not_folded(monkeypatch):
    """loss = sum((w1 @ w2) ** 2): w1's gradient reads w2 and w2's reads w1. Whichever update runs first changes a
    variable the other's product reads, so that product must run where autodiff put it, before the update."""
    def tied(x_):
        w1 = flow.get_variable("w1", (4, 3), initializer=_init((4, 3)))
        w2 = flow.get_variable("w2", (3, 5), initializer=_init((3, 5)))
        return flow.math.reduce_sum(flow.math.square(flow.matmul(w1, w2)) * flow.math.reduce_mean(x_))

    x = np.ones((2, 2))
    _, folded, source = _train(tied, x)
    _, reference, _ = _train(tied, x, fold=False, monkeypatch=monkeypatch)
    assert source.count("(SGDGemmUpdate)") == 1             # the first update's product still reads the old values
    for name in reference:
        np.testing.assert_allclose(folded[name], reference[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.numpy_backend
def test_small_kernels_are_not_folded(monkeypatch):
    """Below ``FOLD_MIN_ELEMENTS`` the fold's call costs more than it saves: a kernel one element short keeps its
    product and update apart, one of exactly that size folds."""
    from flowlab.runtime import blas
    if not blas.available(np.float32):
        pytest.skip("NumPy here is not linked against OpenBLAS")
    monkeypatch.setattr(fold_update, "FOLD_MIN_ELEMENTS", 30)       # the dense layer's kernel: 6 x 5
    x = np.random.default_rng(3).normal(size=(8, 6))
    *_, folded = _train(_dense_loss, x, steps=1)
    monkeypatch.setattr(fold_update, "FOLD_MIN_ELEMENTS", 31)
    *_, kept = _train(_dense_loss, x, steps=1)
    assert "(SGDGemmUpdate)" in folded
    assert "(SGDGemmUpdate)" not in kept and "d-weight-SGDUpdate (SGDUpdate)" in kept
    monkeypatch.undo()
    assert fold_update.FOLD_MIN_ELEMENTS == 16_384


def test_blas_updates_match_numpy_for_every_layout():
    from flowlab.runtime import blas
    if not blas.available(np.float32):
        pytest.skip("NumPy here is not linked against OpenBLAS")
    rng = np.random.default_rng(5)
    for dtype in (np.float32, np.float64):
        for ta in (False, True):
            for tb in (False, True):
                a = rng.normal(size=(7, 9)[::-1] if ta else (7, 9)).astype(dtype)
                b = rng.normal(size=(9, 4)[::-1] if tb else (9, 4)).astype(dtype)
                for a_view in (a, np.asfortranarray(a), np.repeat(a, 2, axis=1)[:, ::2]):   # C, F, strided
                    c = rng.normal(size=(7, 4)).astype(dtype)
                    want = c + -0.3 * ((a_view.T if ta else a_view) @ (b.T if tb else b))
                    blas.gemm_accumulate(c, a_view, b, -0.3, ta, tb)
                    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-6)
        x, y = rng.normal(size=5000).astype(dtype), rng.normal(size=5000).astype(dtype)
        got = y.copy()
        blas.axpy(got, x, -0.25)
        np.testing.assert_allclose(got, y - 0.25 * x, rtol=1e-6)
        got = y.copy()
        blas.axpby(got, x, -0.25, 0.9)
        np.testing.assert_allclose(got, 0.9 * y - 0.25 * x, rtol=1e-5, atol=1e-6)
    assert not blas.available(np.float16)


# ----------------------------------------------------------- calls on which no watch is due run the plan without them

def test_calls_no_watch_is_due_on_run_the_plan_compiled_without_watches():
    """watch_diff(every=3) on a kernel keeps its gradient visible, so the delivering plan cannot fold that update;
    the other calls run the plan compiled without the watch, which does. Training is the same either way."""
    from flowlab.runtime import session
    x = np.random.default_rng(6).normal(size=(8, 6)).astype(np.float32)
    seen = []

    def build(watched):
        flow.clear_default_session()

        @flow.global_function(type="train")
        def job(x_: tp.Numpy.Placeholder((8, 6))) -> tp.Numpy:
            loss = _dense_loss(x_)
            if watched:
                flow.watch_diff(flow.get_variable("d-weight", (5, 6)), lambda g: seen.append(g.copy()), every=3)
            flow.optimizer.SGD(0.05, momentum=0).minimize(loss)
            return loss
        return job

    job = build(True)
    compiled = job.compiled()
    if backend.current().is_gpu:
        # CuPy folds no update (fold_sgd_into_gemm is a BLAS pass): without the watch the plan would do the same
        # work, so there is one plan, run on every call
        assert compiled.quiet_plan is None and "(SGDGemmUpdate)" not in compiled.plan.source
        assert all(compiled.plan_for(step) is compiled.plan for step in range(4))
    else:
        assert compiled.quiet_plan is not None
        assert [compiled.plan_for(step) is compiled.plan for step in range(4)] == [True, False, False, True]
        assert "(SGDGemmUpdate)" not in compiled.plan.source and "(SGDGemmUpdate)" in compiled.quiet_plan.source
        assert "emit(" not in compiled.quiet_plan.source
        # one set of scratch memory: every buffer of the quiet plan is one of the delivering plan's of its shape
        shared = {id(b) for b in compiled.plan.buffers}
        assert compiled.quiet_plan.buffers and all(id(b) in shared for b in compiled.quiet_plan.buffers)
        assert len({id(b) for b in compiled.quiet_plan.buffers}) == len(compiled.quiet_plan.buffers)
    for _ in range(7):
        job(x)
    flow.sync_default_session()
    watched = session.default().variables["d-weight"].numpy()
    assert len(seen) == 3                                           # calls 0, 3, 6

    job = build(False)
    for _ in range(7):
        job(x)
    np.testing.assert_allclose(watched, session.default().variables["d-weight"].numpy(), rtol=1e-5, atol=1e-6)


def test_a_watch_due_every_call_keeps_one_plan_and_the_two_plans_share_one_random_stream():
    def make(every):
        flow.clear_default_session()

        @flow.global_function(type="train")
        def job(x_: tp.Numpy.Placeholder((8, 6))) -> tp.Numpy:
            h = flow.nn.dropout(flow.layers.dense(x_, 5, kernel_initializer=_init((5, 6)), name="d"), rate=0.5)
            if every:
                flow.watch_diff(flow.get_variable("d-weight", (5, 6)), lambda g: None, every=every)
            flow.optimizer.SGD(0.05, momentum=0).minimize(flow.math.reduce_sum(h, axis=1))
            return h
        return job

    x = np.ones((8, 6), np.float32)
    assert make(1).compiled().quiet_plan is None
    alternating = make(2)
    # two plans where the watch changes what the passes do: on NumPy (the watched gradient is not folded into its
    # update); CuPy folds nothing, so there its one plan serves every call
    assert (alternating.compiled().quiet_plan is not None) == (not backend.current().is_gpu)
    masks = [alternating(x) != 0 for _ in range(4)]
    plain = make(0)
    assert plain.compiled().quiet_plan is None
    # the same dropout masks call by call: had each plan its own generator, calls 0 and 1 would draw the same
    np.testing.assert_array_equal(masks, [plain(x) != 0 for _ in range(4)])
    assert not np.array_equal(masks[0], masks[1])


def test_the_folded_update_of_a_non_contiguous_variable_takes_numpys_passes():
    from flowlab.optim.optimizers import SGDGemmUpdate
    rng = np.random.default_rng(7)
    a, b = rng.normal(size=(6, 4)).astype(np.float32), rng.normal(size=(6, 5)).astype(np.float32)
    for w in (rng.normal(size=(4, 5)).astype(np.float32), np.asfortranarray(rng.normal(size=(4, 5)), np.float32)):
        want = w - 0.5 * 0.1 * 2.0 * (a.T @ b)
        SGDGemmUpdate.forward(np, w, a, b, transpose_a=True, transpose_b=False, alpha=2.0, grad_scale=0.5,
                              schedule=None, lr=0.1)
        np.testing.assert_allclose(w, want, rtol=1e-5, atol=1e-6)
