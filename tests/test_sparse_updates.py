"""Sparse embedding updates (``FunctionConfig.indexed_slices_optimizer_conf``): only the gathered rows of a table
change, as PyTorch's ``SparseAdam`` and sparse SGD change them; rows no id touched stay bit for bit; a step costs
O(batch), not O(table); n logical devices train as one; and the update stays dense, with a warning saying why,
where OneFlow's rewrite would not apply."""
import time
import warnings

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.optim.optimizers import IndexedSlicesUpdate, unique_rows
from flowlab.runtime import session
from flowlab.runtime.devices import join_kinds

pytestmark = pytest.mark.numpy_backend      # the multi-device test runs NumPy devices (threads)

ROWS, DIM, BATCH, FIELDS = 50, 4, 6, 3


def lr(value):
    return flow.optimizer.PiecewiseConstantScheduler([], [value])


def config(tables=("emb",), enable=True):
    cfg = flow.FunctionConfig()
    cfg.indexed_slices_optimizer_conf(dict(include_op_names=dict(op_name=list(tables)), enable=enable))
    return cfg


def embedding_job(optimizer, cfg=None, rows=ROWS, batch=BATCH, devices=1, reduce="sum", regularizer=None):
    """A train job: ``sum(w * gather(emb, ids))`` over the batch (a summed loss: model gradients unscaled, so
    PyTorch's step on the same loss is the reference)."""
    flow.clear_default_session()
    flow.config.gpu_device_num(devices)
    flow.config.seed(0)
    cfg = cfg or flow.FunctionConfig()

    @flow.global_function(type="train", function_config=cfg)
    def job(ids: tp.Numpy.Placeholder((batch, FIELDS), dtype=flow.int32),
            weights: tp.Numpy.Placeholder((batch, FIELDS, DIM))) -> tp.Numpy:
        table = flow.get_variable("emb", shape=(rows, DIM), initializer=flow.random_uniform_initializer(-1, 1),
                                  regularizer=regularizer)
        picked = flow.gather(table, ids)
        loss = flow.math.reduce_sum(flow.math.square(picked * weights), axis=[1, 2])
        if reduce == "sum":
            loss = flow.math.reduce_sum(loss)
        optimizer().minimize(loss)
        return loss
    return job


def batches(steps, rows=ROWS, batch=BATCH, seed=1):
    """Ids that repeat within a step and leave some rows untouched for whole steps."""
    rng = np.random.default_rng(seed)
    for step in range(steps):
        ids = rng.integers(0, rows // 2 if step % 2 else rows, (batch, FIELDS)).astype(np.int32)
        ids[0, :2] = ids[1, 0]                      # repeats in one step add up
        yield ids, rng.uniform(0.5, 1.5, (batch, FIELDS, DIM)).astype(np.float32)


def table():
    return session.default().variables["emb"].numpy().copy()


def torch_reference(optimizer, initial, steps):
    torch = pytest.importorskip("torch")
    emb = torch.nn.Embedding(ROWS, DIM, sparse=True)
    with torch.no_grad():
        emb.weight.copy_(torch.tensor(initial))
    opt = optimizer(emb.parameters())
    for ids, weights in batches(steps):
        opt.zero_grad()
        loss = ((emb(torch.tensor(ids, dtype=torch.long)) * torch.tensor(weights)) ** 2).sum()
        loss.backward()
        opt.step()
    return emb.weight.detach().numpy()


@pytest.mark.parametrize("ours, theirs", [
    (lambda: flow.optimizer.LazyAdam(lr(0.05)),
     lambda params: __import__("torch").optim.SparseAdam(list(params), lr=0.05)),
    (lambda: flow.optimizer.SGD(lr(0.05), momentum=0),
     lambda params: __import__("torch").optim.SGD(list(params), lr=0.05)),
], ids=["lazy_adam_vs_SparseAdam", "sgd_vs_sparse_SGD"])
def test_sparse_updates_match_pytorch_sparse_embeddings(ours, theirs):
    job = embedding_job(ours, config())
    steps = 6
    initial = None
    for ids, weights in batches(steps):
        if initial is None:
            job.compiled(((BATCH, FIELDS), (BATCH, FIELDS, DIM)))      # declares the table
            flow.train.CheckPoint().init()                              # and gives it its initial value
            initial = table()
        job(ids, weights)
    assert any(n.op is IndexedSlicesUpdate for n in job.graph().nodes)
    np.testing.assert_allclose(table(), torch_reference(theirs, initial, steps), rtol=2e-5, atol=2e-6)


def lazy_adam_reference(initial, steps, lr_value=0.05, beta1=0.9, beta2=0.999, eps=1e-8):
    """LazyAdam in NumPy: moments and weights of the touched rows only, bias correction by the global step."""
    w, m, v = initial.astype(np.float64), np.zeros_like(initial, np.float64), np.zeros_like(initial, np.float64)
    for t, (ids, weights) in enumerate(batches(steps), 1):
        grad = np.zeros_like(w)
        np.add.at(grad, ids.reshape(-1), (2 * w[ids] * weights ** 2).reshape(-1, DIM))
        rows = np.unique(ids)
        m[rows] = beta1 * m[rows] + (1 - beta1) * grad[rows]
        v[rows] = beta2 * v[rows] + (1 - beta2) * grad[rows] ** 2
        w[rows] -= lr_value * np.sqrt(1 - beta2 ** t) / (1 - beta1 ** t) * m[rows] / (np.sqrt(v[rows]) + eps)
    return w


def test_untouched_rows_keep_value_and_state_bit_for_bit_and_touched_rows_follow_lazy_adam():
    job = embedding_job(lambda: flow.optimizer.LazyAdam(lr(0.05)), config())
    job.compiled(((BATCH, FIELDS), (BATCH, FIELDS, DIM)))
    flow.train.CheckPoint().init()
    initial = table()
    touched_ever = set()
    for step, (ids, weights) in enumerate(batches(5)):
        variables = session.default().variables
        before = {name: variables[name].numpy().copy() for name in ("emb", "emb-m", "emb-v")}
        job(ids, weights)
        untouched = np.setdiff1d(np.arange(ROWS), ids)
        for name, old in before.items():       # this step's untouched rows: value, m and v as they were, exactly
            assert np.array_equal(variables[name].numpy()[untouched], old[untouched]), (step, name)
        assert not np.array_equal(variables["emb"].numpy()[ids[2]], before["emb"][ids[2]])
        touched_ever.update(ids.reshape(-1).tolist())
    never = sorted(set(range(ROWS)) - touched_ever)
    assert never and np.array_equal(table()[never], initial[never])
    np.testing.assert_allclose(table(), lazy_adam_reference(initial, 5), rtol=1e-5, atol=1e-5)   # float32


def test_dense_adam_moves_rows_by_old_momentum_where_the_sparse_update_does_not():
    """The difference LazyAdam makes: without the config, a row touched once keeps moving on later steps."""
    results = {}
    for sparse in (True, False):
        job = embedding_job(lambda: flow.optimizer.LazyAdam(lr(0.05)), config() if sparse else None)
        ids = np.zeros((BATCH, FIELDS), np.int32)
        weights = np.ones((BATCH, FIELDS, DIM), np.float32)
        job(ids, weights)                                   # step 1: row 0 only
        after_first = table()
        job(ids + 1, weights)                               # step 2: row 1 only
        results[sparse] = np.array_equal(table()[0], after_first[0])
    assert results == {True: True, False: False}


@pytest.mark.parametrize("optimizer", [
    lambda: flow.optimizer.SGD(lr(0.1), momentum=0),
    lambda: flow.optimizer.SGD(lr(0.1), momentum=0.9),
    lambda: flow.optimizer.Adam(lr(0.05), do_bias_correction=True),
    lambda: flow.optimizer.AdamW(lr(0.05), weight_decay=0.01),
], ids=["sgd", "momentum", "adam", "adamw"])
def test_one_step_from_fresh_state_equals_the_dense_step_on_touched_rows(optimizer):
    """From zero state a sparse step gives the touched rows what the dense step gives them, and the dense step
    leaves rows with zero gradient as they were, except AdamW's decay, which the sparse step (as OneFlow's
    indexed_slices_adam_update) applies to touched rows only."""
    values = {}
    ids, weights = next(batches(1))
    for sparse in (True, False):
        job = embedding_job(optimizer, config() if sparse else None, reduce="mean")
        job.compiled(((BATCH, FIELDS), (BATCH, FIELDS, DIM)))
        flow.train.CheckPoint().init()
        initial = table()
        job(ids, weights)
        values[sparse] = table()
    touched = np.unique(ids)
    untouched = np.setdiff1d(np.arange(ROWS), ids)
    np.testing.assert_allclose(values[True][touched], values[False][touched], rtol=1e-6, atol=1e-7)
    assert np.array_equal(values[True][untouched], initial[untouched])
    decays = optimizer().__class__ is flow.optimizer.AdamW
    assert np.array_equal(values[False][untouched], initial[untouched]) != decays


def test_n_logical_devices_train_sparse_tables_as_one():
    finals = []
    for devices in (1, 2, 3, 4):
        job = embedding_job(lambda: flow.optimizer.LazyAdam(lr(0.05)), config(), batch=12, devices=devices,
                            reduce="mean")
        losses = [job(ids, weights) for ids, weights in batches(4, batch=12)]
        finals.append((np.concatenate(losses), table()))
        update = next(n for n in job.graph().nodes if n.op is IndexedSlicesUpdate)
        if devices > 1:     # the devices' gradient rows and ids, one after another, are the logical ones: they can
            kinds = join_kinds(job.graph())       # be joined (and so returned or watched, as watch_health does)
            assert [kinds[t.id] for t in update.inputs[1:3]] == ["split", "split"]
    flow.clear_default_session()
    for losses, values in finals[1:]:
        np.testing.assert_allclose(losses, finals[0][0], rtol=1e-5)
        np.testing.assert_allclose(values, finals[0][1], rtol=1e-5, atol=1e-7)


def test_a_table_gathered_twice_and_ids_out_of_range():
    torch = pytest.importorskip("torch")
    flow.clear_default_session()
    flow.config.seed(0)

    @flow.global_function(type="train", function_config=config())
    def job(a: tp.Numpy.Placeholder((4,), dtype=flow.int32), b: tp.Numpy.Placeholder((3,), dtype=flow.int32)) \
            -> tp.Numpy:
        table = flow.get_variable("emb", shape=(8, 2), initializer=flow.random_uniform_initializer(-1, 1))
        loss = flow.math.reduce_sum(flow.math.square(flow.gather(table, a))) + \
            flow.math.reduce_sum(flow.gather(table, b) * 3.0)
        flow.optimizer.SGD(lr(0.1), momentum=0).minimize(loss)
        return loss

    job.compiled(((4,), (3,)))
    flow.train.CheckPoint().init()
    initial = table()
    a, b = np.array([1, 1, 9, 2], np.int32), np.array([2, -1, 5], np.int32)     # 9 and -1 gather zeros
    job(a, b)
    w = torch.tensor(initial, requires_grad=True)
    keep_a, keep_b = a[(a >= 0) & (a < 8)], b[(b >= 0) & (b < 8)]
    ((w[torch.tensor(keep_a, dtype=torch.long)] ** 2).sum() + (w[torch.tensor(keep_b, dtype=torch.long)] * 3).sum()
     ).backward()
    np.testing.assert_allclose(table(), initial - 0.1 * w.grad.numpy(), rtol=1e-6)
    assert sum(n.op is IndexedSlicesUpdate for n in job.graph().nodes) == 1


def test_unique_rows_sums_repeats_and_drops_ids_outside_the_table():
    ids = np.array([3, 1, 3, 7, -2, 1, 3])
    rows = np.arange(14, dtype=np.float32).reshape(7, 2)
    unique, summed = unique_rows(np, ids, rows, 5)
    assert unique.tolist() == [1, 3]
    np.testing.assert_array_equal(summed, [[2 + 10, 3 + 11], [0 + 4 + 12, 1 + 5 + 13]])
    unique, summed = unique_rows(np, np.array([9]), rows[:1], 5)
    assert unique.size == 0 and summed.shape == (0, 2)


@pytest.mark.parametrize("optimizer, regularizer, match", [
    (lambda: flow.optimizer.RMSProp(lr(0.01)), None, "RMSProp has no sparse update"),
    (lambda: flow.optimizer.SGD(lr(0.1), momentum=0, grad_clipping=flow.optimizer.grad_clipping.by_global_norm(1.0)),
     None, "clips gradients"),
    (lambda: flow.optimizer.SGD(lr(0.1), momentum=0, loss_scale_factor=8.0), None, "scales the loss"),
    (lambda: flow.optimizer.SGD(lr(0.1), momentum=0), flow.regularizers.l2(0.1), "has a regularizer"),
])
def test_updates_stay_dense_with_a_warning_where_oneflow_would_not_rewrite_them(optimizer, regularizer, match):
    job = embedding_job(optimizer, config(), regularizer=regularizer)
    ids, weights = next(batches(1))
    with pytest.warns(RuntimeWarning, match=f"variable 'emb' is updated densely: .*{match}"):
        job(ids, weights)
    assert not any(n.op is IndexedSlicesUpdate for n in job.graph().nodes)


def test_a_table_also_used_densely_updates_densely_and_disabled_conf_is_dense():
    flow.clear_default_session()

    @flow.global_function(type="train", function_config=config())
    def job(ids: tp.Numpy.Placeholder((4,), dtype=flow.int32)) -> tp.Numpy:
        table = flow.get_variable("emb", shape=(8, 2), initializer=flow.ones_initializer())
        tied = flow.matmul(flow.gather(table, ids), table, transpose_b=True)     # BERT's tied output layer
        loss = flow.math.reduce_sum(tied)
        flow.optimizer.SGD(lr(0.1), momentum=0).minimize(loss)
        return loss

    with pytest.warns(RuntimeWarning, match="does not come from flow.gather"):
        job(np.arange(4, dtype=np.int32))
    off = embedding_job(lambda: flow.optimizer.SGD(lr(0.1), momentum=0), config(enable=False))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        off(*next(batches(1)))
    assert not any(n.op is IndexedSlicesUpdate for n in off.graph().nodes)


@pytest.mark.parametrize("value", [
    {"include_op_names": ["emb"]}, {"include_op_names": {"op_name": [1]}}, {"op_name": ["emb"]},
    {"include_op_names": {"op_name": ["emb"]}, "enable": "yes"},
])
def test_bad_confs_are_refused(value):
    with pytest.raises(ValueError, match="indexed_slices_optimizer_conf: expected {'include_op_names'"):
        flow.FunctionConfig().indexed_slices_optimizer_conf(value)


def _median_step(job, feeds, repeats=7):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        job(*feeds)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def test_a_sparse_step_costs_o_batch_not_o_table():
    """1M x 16 table, 512 ids a step: the sparse LazyAdam step takes about as long as on a table of 1,000 rows
    (no pass over the table, its moments or a dense gradient), and far less than the dense step."""
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 1000, (512, 1)).astype(np.int32)
    steps = {}
    for rows, sparse in ((1_000_000, True), (1_000, True), (1_000_000, False)):
        flow.clear_default_session()
        flow.config.gpu_device_num(1)
        cfg = config() if sparse else flow.FunctionConfig()

        @flow.global_function(type="train", function_config=cfg)
        def job(ids: tp.Numpy.Placeholder((512, 1), dtype=flow.int32)) -> tp.Numpy:
            table = flow.get_variable("emb", shape=(rows, 16), initializer=flow.zeros_initializer())
            loss = flow.math.reduce_sum(flow.math.square(flow.gather(table, ids) - 1.0), axis=[1, 2])
            flow.optimizer.LazyAdam(lr(0.01)).minimize(loss)
            return loss

        job(ids)                                          # compile, allocate state
        steps[rows, sparse] = _median_step(job, (ids,))
        untouched = np.setdiff1d(np.arange(1000), ids)
        assert not table()[untouched].any() and table()[ids[:, 0]].all()   # zeros stay zeros; ids moved
    flow.clear_default_session()
    assert steps[1_000_000, True] < 4 * steps[1_000, True], steps
    assert steps[1_000_000, False] > 8 * steps[1_000_000, True], steps
