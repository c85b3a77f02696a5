"""CUDA graph replay of plans on CuPy (``flowlab.runtime.cuda_graph``): a replayed job trains exactly as the same job
run eagerly, what a capture freezes is re-checked every call, and plans that cannot be replayed run eagerly and say
why. On NumPy only the switch and the plan's note are checked."""
import ctypes
import sys
import types

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.ops import nn
from flowlab.runtime import backend, session

BATCH, IN, HIDDEN, CLASSES = 16, 12, 8, 4
rng = np.random.default_rng(11)
DATA = [(rng.standard_normal((BATCH, IN)).astype(np.float32), rng.integers(0, CLASSES, BATCH).astype(np.int32))
        for _ in range(6)]


def mlp_job(optimizer=None, dropout=False, watch=None):
    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((BATCH, IN)), y: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
        h = flow.layers.dense(x, HIDDEN, activation=flow.nn.relu, name="h")
        if dropout:
            h = flow.nn.dropout(h, rate=0.5)
        if watch is not None:
            flow.watch(h, watch)
        logits = flow.layers.dense(h, CLASSES, name="out")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        (optimizer or flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9)
         ).minimize(loss)
        return loss
    return train


def train(make_job, graphs, monkeypatch, calls=len(DATA), between=None):
    """Losses and final variables of ``calls`` calls from the same start, with CUDA graphs on or off."""
    monkeypatch.setenv("FLOWLAB_CUDA_GRAPHS", "1" if graphs else "0")
    flow.clear_default_session()
    job = make_job()
    losses = []
    for i, (x, y) in enumerate(DATA[:calls]):
        if between is not None:
            between(i)
        losses.append(job(x, y))
    values = {name: v.numpy() for name, v in session.default().variables.items()}
    return job, np.array(losses), values


def graph_state(job):
    """The plan's ``# cuda_graph: ...`` line (shown whole when an assertion on it fails)."""
    return next(line for line in job.plan().describe_passes().splitlines() if line.startswith("# cuda_graph"))


def assert_same_training(a, b):
    (_, losses_a, values_a), (_, losses_b, values_b) = a, b
    np.testing.assert_allclose(losses_a, losses_b, rtol=1e-6, atol=1e-7)
    assert values_a.keys() == values_b.keys()
    for name in values_a:
        np.testing.assert_allclose(values_a[name], values_b[name], rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.numpy_backend
def test_on_numpy_plans_say_nothing_of_graphs():
    assert backend.current().name == "numpy"
    job = mlp_job()
    job(*DATA[0])
    assert job.plan().replay is None and "cuda_graph" not in str(job.plan())


@pytest.fixture
def gpu():
    backend.use("gpu")
    yield
    backend.use("cpu")


@pytest.mark.gpu
def test_a_replayed_job_trains_exactly_as_the_eager_one(gpu, monkeypatch):
    replayed = train(mlp_job, True, monkeypatch)
    assert "replayed as one CUDA graph (captured 1 time(s))" in graph_state(replayed[0])
    eager = train(mlp_job, False, monkeypatch)
    assert "FLOWLAB_CUDA_GRAPHS=0" in graph_state(eager[0])
    assert_same_training(replayed, eager)
    assert not np.allclose(replayed[1][0], replayed[1][-1])      # it did train


@pytest.mark.gpu
def test_a_learning_rate_that_changes_is_captured_again_and_used(gpu, monkeypatch):
    def job():
        return mlp_job(flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([3], [0.1, 0.01])))
    replayed = train(job, True, monkeypatch)
    assert "captured 2 time(s)" in graph_state(replayed[0])
    assert_same_training(replayed, train(job, False, monkeypatch))


@pytest.mark.gpu
def test_host_arguments_that_change_every_call_end_replay(gpu, monkeypatch):
    def job():   # Adam's bias correction takes the step from the host
        return mlp_job(flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [0.01])))
    replayed = train(job, True, monkeypatch)
    assert "eager: captured 3 times in 3 calls" in graph_state(replayed[0])
    assert_same_training(replayed, train(job, False, monkeypatch))


@pytest.mark.gpu
def test_variables_replaced_between_calls_are_read_from_their_new_arrays(gpu, monkeypatch):
    def load(i):           # a new array for a variable (as a checkpoint load of another shape's array would be)
        if i == 4:
            variable = session.default().variables["h-weight"]
            variable.value = backend.current().asarray(np.full(variable.shape, 0.05, np.float32))
    replayed = train(mlp_job, True, monkeypatch, between=load)
    assert "captured 2 time(s)" in graph_state(replayed[0])
    assert_same_training(replayed, train(mlp_job, False, monkeypatch, between=load))


@pytest.mark.gpu
def test_watched_tensors_reach_their_handlers_from_the_replayed_graph_on_the_calls_due(gpu, monkeypatch):
    def run(graphs):
        seen = {"every": [], "diff": []}

        def keep(v: tp.Numpy):
            seen["every"].append(v)

        def keep_diff(v: tp.Numpy):
            seen["diff"].append(v)

        def job():
            @flow.global_function(type="train")
            def train(x: tp.Numpy.Placeholder((BATCH, IN)),
                      y: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
                h = flow.layers.dense(x, HIDDEN, activation=flow.nn.relu, name="h")
                flow.watch(h, keep)
                logits = flow.layers.dense(h, CLASSES, name="out")
                flow.watch_diff(logits, keep_diff)
                loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
                flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
                return loss
            return train
        result = train(job, graphs, monkeypatch)
        return result, seen
    (replayed, seen), (eager, want) = run(True), run(False)
    assert "replayed as one CUDA graph (captured 1 time(s))" in graph_state(replayed[0])
    assert_same_training(replayed, eager)
    for kind in ("every", "diff"):
        assert len(seen[kind]) == len(want[kind]) == len(DATA)
        for got, expected in zip(seen[kind], want[kind]):
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    assert not np.allclose(seen["every"][0], seen["every"][-1])     # each call's own values, not one buffer


@pytest.mark.gpu
def test_plans_that_cannot_be_replayed_run_eagerly_and_say_why(gpu, monkeypatch):
    job, _, _ = train(lambda: mlp_job(dropout=True), True, monkeypatch, calls=3)
    assert "draws random numbers: runs eagerly" in graph_state(job)


@pytest.mark.gpu
@pytest.mark.parametrize("momentum", [0, 0.9])
def test_watch_health_is_replayed_and_reports_what_the_eager_plan_reports(gpu, monkeypatch, momentum):
    def run(graphs):
        reports = []

        def health_job():
            @flow.global_function(type="train")
            def train_job(x: tp.Numpy.Placeholder((BATCH, IN)),
                          y: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
                logits = flow.layers.dense(flow.layers.dense(x, HIDDEN, activation=flow.nn.relu, name="h"), CLASSES,
                                           name="out")
                loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
                flow.watch_health(reports.append, histogram_every=2)
                flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=momentum
                                   ).minimize(loss)
                return loss
            return train_job
        trained = train(health_job, graphs, monkeypatch)
        flow.sync_default_session()
        return trained, reports
    (replayed, got), (eager, want) = run(True), run(False)
    assert "replayed as one CUDA graph (captured 1 time(s))" in graph_state(replayed[0])
    assert_same_training(replayed, eager)
    assert [r.step for r in got] == [r.step for r in want] == list(range(len(DATA)))
    for a, b in zip(got, want):
        assert a.table.keys() == b.table.keys() and a.loss == pytest.approx(b.loss, rel=1e-6)
        for layer in a.table:
            assert a.table[layer] == pytest.approx(b.table[layer], rel=1e-5, abs=1e-9), (a.step, layer)
        assert (a.histograms is None) == (b.histograms is None) == (a.step % 2 != 0)
        for layer, kinds in (a.histograms or {}).items():
            for what, buckets in kinds.items():
                np.testing.assert_allclose(buckets, b.histograms[layer][what], rtol=1e-6, atol=1e-9)
    assert got[0].table["h"] != got[-1].table["h"]          # each call's own numbers, not one buffer's


@pytest.mark.gpu
def test_an_op_that_reads_the_device_on_the_host_cannot_be_captured_and_runs_eagerly(gpu, monkeypatch):
    cross_entropy = nn.SparseSoftmaxCrossEntropy.forward

    def syncing(xp, labels, logits, **kw):
        float(logits.sum())              # a host synchronisation: forbidden while a stream is captured
        return cross_entropy(xp, labels, logits, **kw)
    monkeypatch.setattr(nn.SparseSoftmaxCrossEntropy, "forward", staticmethod(syncing))
    replayed = train(mlp_job, True, monkeypatch)
    assert "eager: cannot be captured" in graph_state(replayed[0])
    assert_same_training(replayed, train(mlp_job, False, monkeypatch))


class _StandInCupy:
    """Just enough of CuPy's API for GraphReplay's bookkeeping on the host: captures and launches are counted,
    nothing runs (what runs on a GPU is checked by the tests above)."""

    def __init__(self):
        self.launches, self.captures = 0, 0
        outer = self

        class Stream:
            def __init__(self, non_blocking=False):
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def begin_capture(self):
                outer.captures += 1

            def end_capture(self):
                return type("Graph", (), {"launch": lambda graph, stream=None: outer.launched()})()

            def record(self):
                return type("Event", (), {"synchronize": lambda event: None})()

        self.copies = []        # (destination, source, bytes) of every copy captured: each launch makes them
        self.cuda = type("cuda", (), {"Stream": Stream, "get_current_stream": staticmethod(lambda: Stream()),
                                      "MemoryPool": lambda: type("Pool", (), {"malloc": None})(),
                                      "using_allocator": staticmethod(lambda malloc: Stream())})
        self.cuda.runtime = types.SimpleNamespace(memcpyDeviceToHost=2,
                                                  memcpyAsync=lambda dst, src, n, kind, stream: self.copies.append(
                                                      (dst, src, n)))
        Stream.ptr = 0

    on_launch = None

    def launched(self):
        self.launches += 1
        if self.on_launch is not None:
            self.on_launch()
        for dst, src, n in self.copies:
            ctypes.memmove(dst, src, n)

    @staticmethod
    def empty(shape, dtype):
        return type("Buffer", (), {"set": lambda buffer, array: None})()


def test_replay_bookkeeping_captures_again_on_changes_and_gives_up_when_they_never_stop():
    from flowlab.runtime.cuda_graph import GraphReplay
    cupy, lr = _StandInCupy(), {"value": 0.1}
    variable = type("Variable", (), {"value": object()})()
    out = type("Out", (), {"get": lambda self: "host copy"})()
    emitted, put = [], []
    replay = GraphReplay(cupy, [lambda step: {"lr": lr["value"]}], [variable],
                         schedule=[(2, None, None), (1, None, lambda step, copy: put.append((step, copy)))])
    pinned = [np.zeros(1), np.zeros(1)]               # what the graph's copies fill: the launch's number
    cupy.on_launch = lambda: [p.fill(cupy.launches) for p in pinned]

    def run_device(feeds, step, emit):
        emit(0, pinned[0], step)
        emit(1, pinned[1], step)
        return (out,)

    def call(step):
        return replay(lambda feeds, step, emit: ("eager",), run_device, [np.zeros(3)], step,
                      lambda k, copy, step: emitted.append((k, step, copy)))
    assert call(0) == ("eager",) and cupy.captures == 0               # call 1: eager
    assert [call(s) for s in (1, 2, 3)] == [("host copy",)] * 3 and (cupy.captures, cupy.launches) == (1, 3)
    assert [(k, step) for k, step, _ in emitted] == [(0, 2)]          # every=2: only step 2's delivery
    assert emitted[0][2]() == [2]
    # a put delivery gets every call's copy; each launch takes what the last one handed on before overwriting it
    assert [step for step, _ in put] == [1, 2, 3] and [copy()[0] for _, copy in put] == [1, 2, 3]
    lr["value"] = 0.01                                                 # a schedule moves on: one new capture
    call(4)
    variable.value = object()                                          # a checkpoint load: another
    call(5)
    assert (cupy.captures, cupy.launches) == (3, 5) and "captured 3 time(s)" in replay.state
    lr["value"] = 0.001                                                # a third change within 50 calls: eager
    assert call(6) == ("eager",) and replay.state.startswith("eager: captured 3 times in 5 calls")
    assert call(7) == ("eager",) and cupy.captures == 3


class _HostBacked:
    """A stand-in device vector: a NumPy view whose memory the stand-in's copies read (``data.ptr``), in the
    allocation ``data.mem``."""

    def __init__(self, array, allocation):
        self.dtype, self.ndim, self.size, self.nbytes, self.flags = (array.dtype, array.ndim, array.size,
                                                                     array.nbytes, array.flags)
        self.data = types.SimpleNamespace(ptr=array.ctypes.data, mem=allocation)


def test_small_vectors_of_one_allocation_are_copied_out_together_and_each_delivery_gets_its_calls_values(
        monkeypatch):
    """``stage_small`` (statistics and histograms in a CUDA graph): the vectors of one allocation (``Results``)
    leave in one copy, a vector of its own in another; each delivery gets its own slice of its own call, on its
    calls, even when taken after later launches."""
    from flowlab.runtime.cuda_graph import GraphReplay
    monkeypatch.setitem(sys.modules, "cupyx", types.SimpleNamespace(empty_pinned=lambda shape, dtype: np.zeros(
        shape, dtype)))
    cupy = _StandInCupy()
    results, fresh = np.zeros(10), np.zeros(4)       # what the graph's kernels write: the launch's number
    cupy.on_launch = lambda: (results.fill(cupy.launches), fresh.fill(-cupy.launches))
    got = {"a": [], "b": [], "c": []}
    replay = GraphReplay(cupy, [], [], schedule=[(1, None, lambda step, copy: got["a"].append((step, copy))),
                                                 (2, None, lambda step, copy: got["b"].append((step, copy))),
                                                 (1, None, None)])
    out = type("Out", (), {"get": lambda self: "loss"})()

    def run_device(feeds, step, emit):
        emit(0, replay.stage_small(_HostBacked(results[0:3], "results")), step)
        emit(1, replay.stage_small(_HostBacked(results[5:10], "results")), step)
        emit(2, replay.stage_small(_HostBacked(fresh, "fresh")), step)
        return (out,)

    def emit(k, copy, step):
        got["c"].append((step, copy))
    for step in range(5):
        replay(lambda feeds, step, emit: ("eager",), run_device, [np.zeros(1)], step, emit)
    assert sorted(n for _, _, n in cupy.copies) == [4 * 8, 10 * 8]     # two copies: one an allocation
    # launches 1..4 ran steps 1..4 (step 0 was eager); every copy is taken after all of them
    assert [(step, copy().tolist()) for step, copy in got["a"]] == [(s, [s] * 3) for s in (1, 2, 3, 4)]
    assert [(step, copy().tolist()) for step, copy in got["b"]] == [(s, [s] * 5) for s in (2, 4)]
    assert [(step, copy().tolist()) for step, copy in got["c"]] == [(s, [-s] * 4) for s in (1, 2, 3, 4)]
