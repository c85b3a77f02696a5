"""The compiler's second stream (``compiler.side_stream``): weight gradients and updates on a second thread beside a
host plan's backward pass give the very weights and losses the one-thread plan gives, in the right order against the
forward reads of the variables; which nodes it takes; errors raised on it reach the caller; its thread ends with its
plan."""
import gc
import threading

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.compiler import prune, side_stream
from flowlab.runtime import host_threads

pytestmark = pytest.mark.numpy_backend        # a host plan's threads

BATCH, FEATURES, HIDDEN = 256, 128, 256          # products of 8.4M multiply-adds: the second stream's range


def mlp_job(optimizer, tied=False):
    """A three-layer MLP (Adam or SGD with momentum), its last layer's kernel tied to its first one's transpose when
    ``tied`` (a variable read again in the backward pass after its own gradient is made)."""
    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((BATCH, FEATURES)), y: tp.Numpy.Placeholder((BATCH, FEATURES))) -> tp.Numpy:
        w0 = flow.get_variable("w0", shape=(FEATURES, HIDDEN), initializer=flow.random_normal_initializer(0, 0.05))
        h = flow.math.gelu(flow.matmul(x, w0))
        h = flow.layers.dense(h, HIDDEN, activation=flow.math.tanh, name="d1")
        out = flow.matmul(h, w0, transpose_b=True) if tied else flow.layers.dense(h, FEATURES, name="d2")
        loss = flow.math.reduce_mean(flow.math.square(out - y))
        optimizer().minimize(loss)
        return loss
    return job


def train(monkeypatch, enabled, optimizer, tied=False, steps=4):
    """``(losses, {variable: value}, the job's plan)`` after ``steps`` calls, with the second stream on or off."""
    monkeypatch.setattr(host_threads, "side_stream_enabled", lambda: enabled)
    flow.clear_default_session()
    job = mlp_job(optimizer, tied)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(steps):
        x = rng.standard_normal((BATCH, FEATURES)).astype(np.float32)
        losses.append(float(job(x, np.tanh(x))))
    weights = {name: v.numpy().copy() for name, v in flow.get_all_variables().items()}
    return losses, weights, job.plan()


@pytest.mark.parametrize("optimizer, tied", [
    (lambda: flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [1e-3])), False),
    (lambda: flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9), False),
    (lambda: flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [1e-3])), True)],
    ids=["adam", "sgd-momentum", "adam-tied"])
def test_the_second_stream_trains_exactly_as_one_thread(monkeypatch, optimizer, tied):
    """Same kernels on the same values in an order that respects every dependency: losses and weights equal to the
    bit. Tied: w0's update must wait for the last product reading w0 (the input gradient through the last layer)."""
    one, one_weights, one_plan = train(monkeypatch, False, optimizer, tied)
    two, two_weights, two_plan = train(monkeypatch, True, optimizer, tied)
    assert not one_plan.side and "S.put(" not in one_plan.source
    assert two_plan.side and "S.put(" in two_plan.source and "S.join()" in two_plan.source
    assert "side_stream: " in two_plan.describe_passes() and "on a second thread" in two_plan.describe_passes()
    assert one == two
    assert one_weights.keys() == two_weights.keys()
    for name, value in one_weights.items():
        np.testing.assert_array_equal(two_weights[name], value, err_msg=name)
    assert one[-1] < one[0]          # it trains


def test_it_takes_weight_gradients_and_updates_and_leaves_the_input_gradient_chain():
    """Every update is on it, with the products making weight gradients (``xᵀ dy``) and the bias gradients' sums;
    a product making an input gradient that reaches the updates of two layers below is not. Each update comes right
    after the last node it must follow, not at the end."""
    flow.clear_default_session()
    graph = mlp_job(lambda: flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [1e-3]))).compiled(
        ((BATCH, FEATURES), (BATCH, FEATURES))).graph
    nodes = prune(graph.nodes, graph.outputs, graph.side_effects)        # (x's gradient goes)
    nodes = [n for n in nodes if n.op.is_variable] + [n for n in nodes if not n.op.is_variable]   # as plans read
    nodes, side, kept, donatable = side_stream.split(nodes, {t.id for t in graph.outputs})
    on_side = [n for n in nodes if id(n) in side]
    updates = [n for n in nodes if n.op.updates_variable]
    assert updates and all(id(n) in side for n in updates)
    products = [n for n in nodes if n.op.__name__ == "MatMul" and n.name.startswith("System-AutoGrad")]
    weight_grads = [n for n in products if n.attrs["transpose_a"]]           # xᵀ dy
    input_grads = [n for n in products if not n.attrs["transpose_a"]]
    assert len(weight_grads) == 3 and all(id(n) in side for n in weight_grads)
    # d2's input gradient reaches the updates of d1 and w0: the chain; d1's reaches w0's update alone (no layer
    # below has work for it), so it is that update's own work
    (d2_input_grad,) = [n for n in input_grads if "d2" in n.name]
    (d1_input_grad,) = [n for n in input_grads if "d1" in n.name]
    assert id(d2_input_grad) not in side and id(d1_input_grad) in side
    (tanh_grad,) = [n for n in nodes if n.op.__name__ == "TanhGrad"]      # d1's: reaches d1's and w0's updates
    assert id(tanh_grad) not in side
    # d2's kernel update directly follows its gradient's product, before the backward pass reaches layer d1
    position = {id(n): i for i, n in enumerate(nodes)}
    d2_update = next(n for n in updates if n.name.startswith("d2-weight"))
    assert position[id(d2_update)] < position[id(d1_input_grad)]
    assert all(t.id in kept for n in on_side for t in n.inputs)
    # an update may overwrite the gradient only its own node reads (a weight gradient's product), nothing else
    assert donatable and all(id(r) in side for n in on_side for t in n.outputs if t.id in donatable
                             for r in nodes if t in r.inputs)


def test_an_error_on_the_second_stream_reaches_the_caller_and_the_next_call_runs(monkeypatch):
    """A kernel failing on the second thread: the job call raises its error (after the thread stopped using the
    buffers), and the calls after it run normally."""
    _, _, plan = train(monkeypatch, True, lambda: flow.optimizer.Adam(
        flow.optimizer.PiecewiseConstantScheduler([], [1e-3])), steps=1)
    namespace = plan._run.__globals__
    group = next(name for name in namespace if name.startswith("g") and name[1:].isdigit())
    original = namespace[group]

    def failing(M, step):
        raise RuntimeError("broken kernel")
    namespace[group] = failing
    feeds = [np.ones((BATCH, FEATURES), np.float32), np.zeros((BATCH, FEATURES), np.float32)]
    with pytest.raises(RuntimeError, match="broken kernel"):
        plan(feeds, 1)
    namespace[group] = original
    outputs = plan(feeds, 2)
    assert np.isfinite(outputs[0]).all()


def test_its_thread_ends_with_its_plan(monkeypatch):
    """The thread holds no reference to its plan: dropping the plan (a new session) ends the thread."""
    def side_threads_after_collecting():
        for _ in range(100):
            gc.collect()
            threads = [t for t in threading.enumerate() if t.name.startswith("flowlab-side")]
            if not threads:
                break
            threading.Event().wait(0.02)
        return threads

    flow.clear_default_session()
    assert side_threads_after_collecting() == []        # (earlier tests' plans dropped)
    train(monkeypatch, True, lambda: flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                                                         momentum=0.9), steps=1)
    assert [t.name for t in threading.enumerate() if t.name.startswith("flowlab-side")] == ["flowlab-side job"]
    flow.clear_default_session()
    assert side_threads_after_collecting() == []


def test_small_or_huge_products_keep_one_stream(monkeypatch):
    """Under ``runtime.backend.ONE_BLAS_THREAD_BELOW`` multiply-adds one thread does the step sooner; from
    ``SPLIT_KERNELS_FROM`` kernels split over the cores instead; and FLOWLAB_SIDE_STREAM=0 turns it off."""
    monkeypatch.setattr(host_threads, "side_stream_enabled", lambda: True)
    flow.clear_default_session()

    @flow.global_function(type="train")
    def small(x: tp.Numpy.Placeholder((8, 4))) -> tp.Numpy:
        loss = flow.math.reduce_mean(flow.math.square(flow.layers.dense(x, 3, name="d")))
        flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [1e-3])).minimize(loss)
        return loss
    small(np.ones((8, 4), np.float32))
    assert not small.plan().side and "side_stream: skipped: small products" in small.plan().describe_passes()
    monkeypatch.setattr(side_stream, "SPLIT_KERNELS_FROM", 1_000_000)
    monkeypatch.setattr(flow.compiler.passes, "SPLIT_KERNELS_FROM", 1_000_000)
    _, _, plan = train(monkeypatch, True, lambda: flow.optimizer.Adam(
        flow.optimizer.PiecewiseConstantScheduler([], [1e-3])), steps=1)
    assert not plan.side and "kernels split over the cores instead" in plan.describe_passes()
    monkeypatch.undo()
    monkeypatch.setenv("FLOWLAB_SIDE_STREAM", "0")
    assert not host_threads.side_stream_enabled()


def branchy_job():
    """Three products of one input (as attention's query, key and value), each through its own bias and tanh, then
    combined; Adam."""
    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((BATCH, FEATURES)), y: tp.Numpy.Placeholder((BATCH, HIDDEN))) -> tp.Numpy:
        h = [flow.layers.dense(x, HIDDEN, activation=flow.math.tanh, name=f"branch{k}") for k in range(3)]
        out = flow.math.multiply(flow.math.add(h[0], h[1]), h[2])
        loss = flow.math.reduce_mean(flow.math.square(out - y))
        flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [1e-3])).minimize(loss)
        return loss
    return job


def train_branchy(monkeypatch, enabled, forks=True, steps=4):
    monkeypatch.setattr(host_threads, "side_stream_enabled", lambda: enabled)
    if not forks:
        monkeypatch.setattr(flow.compiler.passes, "fork_branches", lambda nodes, side, roots: (nodes, set(), set(),
                                                                                                 set()))
    flow.clear_default_session()
    job = branchy_job()
    rng = np.random.default_rng(1)
    losses = []
    for _ in range(steps):
        x = rng.standard_normal((BATCH, FEATURES)).astype(np.float32)
        losses.append(float(job(x, np.tanh(x @ np.ones((FEATURES, HIDDEN), np.float32) / FEATURES))))
    weights = {name: v.numpy().copy() for name, v in flow.get_all_variables().items()}
    monkeypatch.undo()
    return losses, weights, job.plan()


def test_forward_branches_run_on_the_second_stream_and_train_exactly_as_one_thread(monkeypatch):
    """The second and third products of the shared input, each with the chain only it feeds (bias add, tanh), run
    on the second thread, handed over right after the input is made; the plan's thread waits for each where it
    first reads it. Losses and weights equal those of one thread and of the second stream without branches."""
    one, one_weights, _ = train_branchy(monkeypatch, False)
    plain, plain_weights, plain_plan = train_branchy(monkeypatch, True, forks=False)
    two, two_weights, plan = train_branchy(monkeypatch, True)
    assert "forward branches" not in plain_plan.describe_passes() and "S.wait(" not in plain_plan.source
    assert "and 2 forward branches of 6 nodes" in plan.describe_passes()
    branch_groups = [j for j in range(plan.source.count("S.put(")) if "_matmul" in plan.source.split(
        f"def g{j}(")[1].split("\ndef ")[0] and "AutoGrad" not in plan.source.split(f"def g{j}(")[1].split("\ndef ")[0]]
    assert branch_groups == [0, 1]
    bodies = [plan.source.split(f"def g{j}(")[1].split("\ndef ")[0] for j in branch_groups]
    for k, body in zip((1, 2), bodies):
        assert [line.split("(")[-1].rstrip(")") for line in body.splitlines() if "# " in line] == \
            ["MatMul", "BiasAdd", "Tanh"], body
        assert f"# branch{k}_matmul" in body
    run = plan.source.split("def run(")[1].split("\ndef ")[0].splitlines()
    put = [i for i, line in enumerate(run) if "S.put(g0" in line or "S.put(g1" in line]
    first = next(i for i, line in enumerate(run) if "# branch0_matmul" in line)
    assert put == [put[0], put[0] + 1] and put[1] < first      # both handed over before the first branch runs
    waits = [i for i, line in enumerate(run) if "S.wait(" in line]
    assert [run[i].split("#")[0].strip() for i in waits] == ["S.wait(0)", "S.wait(1)"]
    assert all(first < i for i in waits)
    assert one == plain == two
    for name, value in one_weights.items():
        np.testing.assert_array_equal(two_weights[name], value, err_msg=name)
        np.testing.assert_array_equal(plain_weights[name], value, err_msg=name)
    assert one[-1] < one[0]


# ------------------------------------------------------------------------------- the stream itself (SideStream)

def _recorder(log, name, before=None, after=None):
    """A task that records ``(name, its thread's name)`` in ``log``, after ``before()`` and before ``after()``."""
    def task():
        if before is not None:
            before()
        log.append((name, threading.current_thread().name))
        if after is not None:
            after()
    return task


def test_join_runs_the_ready_tasks_itself_latest_first_while_the_thread_is_busy():
    """The stream's thread is held in task 0; the caller, in join, takes the independent tasks 3, 2 and 1 itself,
    the latest first (task 1 lets task 0 go), and join returns once task 0 has ended on the thread."""
    stream = host_threads.SideStream("test", depends=[frozenset()] * 4)
    started, release, log = threading.Event(), threading.Event(), []
    caller = threading.current_thread().name
    stream.put(_recorder(log, 0, before=lambda: (started.set(), release.wait(5))))
    assert started.wait(5)
    for k in (1, 2, 3):
        stream.put(_recorder(log, k, after=release.set if k == 1 else None))
    stream.join()
    assert log[:3] == [(3, caller), (2, caller), (1, caller)]
    assert log[3] == (0, "flowlab-side test")
    stream.put(_recorder(log, "next call"))             # indices start again at 0 after a join
    stream.join()
    assert log[-1][0] == "next call"


def test_a_task_waits_for_the_task_it_reads_from_when_the_caller_took_that_one():
    """Task 2 reads what task 1 makes. The thread is held in task 0 while the caller takes task 1 (task 2 is not
    ready); task 1 lets task 0 go and is slow: the thread, taking task 2 next, must wait until task 1 has made its
    result, and task 2 then sees it. Without ``depends`` the caller only waits, and the thread runs all in order."""
    for depends in ([frozenset(), frozenset(), frozenset({1})], None):
        stream = host_threads.SideStream("test", depends=depends)
        started, release, made, seen = threading.Event(), threading.Event(), {}, {}

        def slow_one():
            release.set()
            threading.Event().wait(0.2)                  # the thread is free and reaches task 2 meanwhile
            made["one"] = threading.current_thread().name

        def two():
            seen["one"] = made.get("one")
            seen["thread"] = threading.current_thread().name
        stream.put(lambda: (started.set(), release.wait(5)))
        assert started.wait(5)
        stream.put(slow_one)
        stream.put(two)
        stream.join()
        caller = threading.current_thread().name
        assert seen == {"one": caller if depends else "flowlab-side test", "thread": "flowlab-side test"}, depends


def test_the_first_error_by_task_order_is_raised_and_later_tasks_that_had_not_begun_are_skipped():
    stream = host_threads.SideStream("test", depends=None)
    ran = []

    def fail(message):
        def task():
            raise ValueError(message)
        return task
    stream.put(fail("first"))
    stream.put(fail("second"))
    stream.put(lambda: ran.append("after"))
    with pytest.raises(ValueError, match="first"):
        stream.join()
    assert ran == []
    stream.put(lambda: ran.append("next call"))
    stream.join()
    assert ran == ["next call"]


def test_a_plans_groups_know_which_earlier_groups_they_read_from(monkeypatch):
    """BERT's grouped Adam step of its small variables reads the gradients that many earlier groups of the second
    stream made: its ``depends`` names them; a weight gradient and its update read only the plan's own tensors."""
    from flowlab.examples import bert
    monkeypatch.setattr(host_threads, "side_stream_enabled", lambda: True)
    flow.clear_default_session()
    job = bert.pretrain_job(batch_size=8, seq_length=32, max_predictions=5, vocab_size=100, hidden=128, layers=1,
                            heads=2, lr=1e-3, warmup_steps=0, dropout=0.0, attention_dropout=0.0)
    examples = bert.pretraining_examples(8, seq_length=32, vocab_size=100, max_predictions=5, seed=0)
    job(*bert.batches(examples, 8)[0])
    plan = job.plan()
    depends = plan._side.depends
    assert len(depends) == plan.source.count("S.put(")
    grouped = [j for j in range(len(depends)) if "AdamGroupUpdate" in plan.source.split(f"def g{j}(")[1]
               .split("\ndef ")[0]]
    assert len(grouped) == 1 and len(depends[grouped[0]]) >= 5
    assert all(d < j for j, ds in enumerate(depends) for d in ds)
    assert sum(not ds for ds in depends) >= len(depends) // 2
    # a group ends after an update: each variable's chain is a task of its own (the embeddings' last updates too)
    bodies = [plan.source.split(f"def g{j}(")[1].split("\ndef ")[0].splitlines() for j in range(len(depends))]
    updates = [[k for k, line in enumerate(body) if line.rstrip().endswith("Update)")]
               for body in bodies]
    assert all(len(u) <= 1 for u in updates) and sum(map(len, updates)) >= 10
    assert all(not u or u[0] == max(k for k, line in enumerate(body) if "# " in line)
               for u, body in zip(updates, bodies))


def test_wait_returns_once_that_task_has_run_and_takes_it_when_the_thread_is_busy():
    """``wait(k)``: task k run by the stream's thread is waited for; a task still queued behind a busy thread, whose
    dependencies are done, runs on the caller instead."""
    stream = host_threads.SideStream("test", depends=[frozenset(), frozenset(), frozenset()])
    ran, release = {}, threading.Event()
    stream.put(lambda: None)                # the thread is started (a call's first put starts it)
    stream.join()

    def record(name, then=None):
        def task():
            ran[name] = threading.current_thread().name
            if then is not None:
                then()
        return task
    started, ended = threading.Event(), threading.Event()
    stream.put(record("zero", then=lambda: (started.set(), threading.Event().wait(0.1), ended.set())))
    assert started.wait(5)                  # the thread has it
    stream.wait(0)
    assert ended.is_set() and ran == {"zero": "flowlab-side test"}
    holding = threading.Event()
    stream.put(record("one", then=lambda: (holding.set(), release.wait(5))))      # holds the thread
    assert holding.wait(5)
    stream.put(record("two"))
    stream.wait(1 + 1)
    assert ran["two"] == threading.current_thread().name
    release.set()
    stream.join()
    assert ran["one"] == "flowlab-side test"


def test_wait_raises_the_error_of_the_call_and_join_leaves_the_stream_usable():
    """The task waited for reads a task that failed: it is skipped, and wait raises that error (the caller must not
    read what was not made); join raises it too, and the next call runs."""
    stream = host_threads.SideStream("test", depends=[frozenset(), frozenset({0})])

    def fail():
        raise ValueError("branch failed")
    stream.put(fail)
    stream.put(lambda: None)
    with pytest.raises(ValueError, match="branch failed"):
        stream.wait(1)
    with pytest.raises(ValueError, match="branch failed"):
        stream.join()
    ran = []
    stream.put(lambda: ran.append(1))
    stream.wait(0)
    stream.join()
    assert ran == [1]
