"""The core's structure (one-way imports, one blob rule, printable passes) and the semantics fixes of issue 11:
variables declared after a successful trace, returned variables as the forward pass read them, the job's default
data type, and a warning for a predict job reading weights nobody trained."""
import ast
import inspect
import pathlib
import warnings

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab import blob, compiler
from flowlab.runtime import session

FLOWLAB = pathlib.Path(flow.__file__).parent



@pytest.fixture(autouse=True)
def fresh_session():
    flow.clear_default_session()
    yield
    flow.clear_default_session()


# ----------------------------------------------------------------------------------------------------- imports

def _modules():
    mods = {}
    for path in FLOWLAB.rglob("*.py"):
        parts = path.relative_to(FLOWLAB.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


def import_graph():
    """``{module: modules it imports}``, counting imports inside functions too (a lazy import that only hides a
    cycle is still a cycle). Importing a package's own parent is left out: Python loads parents first anyway."""
    mods = _modules()
    graph = {}
    for name, path in mods.items():
        is_package = path.name == "__init__.py"
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module
                found = [f"{module}.{a.name}" if f"{module}.{a.name}" in mods else module for a in node.names]
            else:
                continue
            targets.update(t for t in found if t in mods and t != name and not name.startswith(t + "."))
        graph[name] = targets
    return graph


def cycles(graph):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_cycles():
    assert cycles(import_graph()) == []


def test_the_cycle_check_sees_function_level_imports():
    graph = import_graph()
    graph["flowlab.graph"] = graph["flowlab.graph"] | {"flowlab.ops.math"}     # what graph did before
    assert {"flowlab.graph", "flowlab.ops.math"} <= set().union(*cycles(graph))


def test_core_layers_import_one_way():
    graph = import_graph()
    assert not any(t.startswith("flowlab.ops") for t in graph["flowlab.graph"])
    assert "flowlab.job" not in graph["flowlab.watching"] and "flowlab.job" not in graph["flowlab.delivery"]
    assert "flowlab.job" not in graph["flowlab.blob"] and "flowlab.watching" not in graph["flowlab.blob"]
    assert "flowlab.blob" in graph["flowlab.job"] and "flowlab.blob" in graph["flowlab.watching"]


# ------------------------------------------------------------------------------------------------ one blob rule

def test_job_results_and_watch_handlers_share_one_annotation_rule():
    seen = {}

    def as_numpy(v: tp.Numpy):
        seen["numpy"] = v

    def as_list(v: tp.ListNumpy):
        seen["list"] = v

    def as_blob(v):
        seen["blob"] = v

    @flow.global_function()
    def numpy_job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        flow.watch(x, as_numpy)
        flow.watch(x, as_list)
        flow.watch(x, as_blob)
        return x

    @flow.global_function()
    def list_job(x: tp.Numpy.Placeholder((2,))) -> tp.ListNumpy:
        return x

    @flow.global_function()
    def blob_job(x: tp.Numpy.Placeholder((2,))):
        return x

    x = np.array([1.0, 2.0], np.float32)
    results = {"numpy": numpy_job(x), "list": list_job(x), "blob": blob_job(x).get()}
    flow.sync_default_session()
    for kind in ("numpy", "list", "blob"):
        assert type(results[kind]) is type(seen[kind])
    assert isinstance(seen["blob"], blob.Blob) and np.array_equal(seen["blob"].numpy(), x)
    assert isinstance(seen["list"], list) and np.array_equal(seen["list"][0], x)


def test_job_and_watching_convert_through_blob_only():
    import flowlab.job
    import flowlab.watching
    for module in (flowlab.job, flowlab.watching):
        source = inspect.getsource(module)
        assert "tp.Numpy:" not in source and "is tp.Numpy" not in source and "is tp.ListNumpy" not in source
    assert flowlab.watching.BlobDef is blob.BlobDef and flow.Blob is blob.Blob


def test_converter_rejects_other_annotations():
    with pytest.raises(TypeError, match="annotates x as int, which is not supported; use tp.Numpy"):
        blob.converter(int, "annotates x as int")


# ------------------------------------------------------------------------------------------------------- passes

def test_passes_are_a_printable_list_and_the_plan_says_which_ran():
    assert [p.__name__ for p in compiler.PASSES] == ["prune", "auto_mixed_precision", "order_variables",
                                                     "observers_early", "fuse_activation_stats", "fuse_elementwise",
                                                     "fold_sgd_into_gemm", "write_products_in_layout",
                                                     "snapshot_returned_variables", "group_small_updates",
                                                     "side_stream", "side_by_side", "plan_buffers"]
    described = compiler.describe().splitlines()
    assert len(described) == len(compiler.PASSES) and described[0].startswith("1. prune: ")

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        flow.math.exp(x)               # dead
        return flow.math.relu(x) * 2.0

    plan = job.plan()
    text = str(plan)
    assert [name for name, _ in plan.passes] == [p.__name__ for p in compiler.PASSES]
    assert "# prune: kept 4 of 5 nodes" in text and text.endswith(plan.source)


# ----------------------------------------------------------------------------------------- declared after trace

def test_a_failed_trace_leaves_the_session_untouched():
    @flow.global_function()
    def broken(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        w = flow.get_variable("broken-w", shape=(3, 4))
        return flow.matmul(flow.math.exp(w), x)        # shapes do not fit: the trace fails after get_variable

    with pytest.raises(Exception, match="matmul"):
        broken(np.zeros((2, 3), np.float32))
    assert "broken-w" not in session.default().variables


def test_a_train_job_failing_after_its_forward_pass_declares_nothing():
    @flow.global_function(type="train")
    def nothing_to_train(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        w = flow.get_variable("frozen-w", shape=(3,), trainable=False)
        loss = flow.math.reduce_sum(x * w)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss

    with pytest.raises(Exception, match="nothing would train"):
        nothing_to_train(np.zeros((2, 3), np.float32))
    assert session.default().variables == {}


def test_get_variable_only_records_while_tracing():
    declared_during_trace = []

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        w = flow.get_variable("recorded-w", shape=(3,))
        declared_during_trace.append("recorded-w" in session.default().variables)
        return x + w

    job(np.ones(3, np.float32))
    assert declared_during_trace == [False]
    assert session.default().variables["recorded-w"].declared_by == {"job": False}


# ------------------------------------------------------------------------------------------- returned variables

def _sgd_job():
    @flow.global_function(type="train")
    def step(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(3,), initializer=flow.constant_initializer(1.0))
        loss = flow.math.reduce_sum(x * w)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.005]), momentum=0).minimize(loss)
        return w
    return step


def test_a_train_job_returns_the_variable_its_forward_pass_read():
    step = _sgd_job()
    x = np.ones((2, 3), np.float32)
    first, second = step(x), step(x)
    assert np.allclose(first, 1.0)                 # OneFlow: the value this step read, not 0.99 after its update
    assert np.allclose(second, 0.99)
    assert np.allclose(session.default().variables["w"].value, 0.98)


def test_jobs_returning_no_variable_get_no_copy():
    @flow.global_function(type="train")
    def step(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(3,), initializer=flow.constant_initializer(1.0))
        loss = flow.math.reduce_sum(x * w)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.005]), momentum=0).minimize(loss)
        return loss

    step(np.ones((2, 3), np.float32))
    assert ".copy()" not in step.plan().source and not step.plan().snapshots
    assert ".copy()" in _sgd_job().plan().source


# ------------------------------------------------------------------------------------------- default data type

def test_default_data_type_is_the_dtype_of_variables_without_one():
    config = flow.FunctionConfig()
    config.default_data_type(flow.double)

    @flow.global_function(function_config=config)
    def job(x: tp.Numpy.Placeholder((2, 3), dtype=flow.double)) -> tp.Numpy:
        w = flow.get_variable("w64", shape=(3,), initializer=flow.ones_initializer())
        k = flow.get_variable("k32", shape=(3,), dtype=flow.float32, initializer=flow.ones_initializer())
        h = flow.layers.dense(x, 4, name="d64")
        return h + flow.math.reduce_sum(x * w) + flow.math.reduce_sum(flow.cast(k, flow.double))

    out = job(np.ones((2, 3), np.float64))
    variables = session.default().variables
    assert out.dtype == np.float64
    assert variables["w64"].dtype == np.float64 and variables["d64-weight"].dtype == np.float64
    assert variables["k32"].dtype == np.float32      # an explicit dtype wins

    @flow.global_function()
    def plain(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        return x + flow.get_variable("w32", shape=(3,))
    plain(np.ones(3, np.float32))
    assert variables["w32"].dtype == np.float32      # another job keeps float32


# ---------------------------------------------------------------------------------------- untrained predict vars

def _train_and_predict(predict_name):
    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        loss = flow.math.reduce_mean(flow.layers.dense(x, 2, name="encoder"))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss

    @flow.global_function()
    def predict(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        return flow.layers.dense(x, 2, name=predict_name)

    x = np.ones((4, 3), np.float32)
    train(x)
    return predict, x


def test_a_misspelt_layer_in_a_predict_job_warns_with_close_names():
    predict, x = _train_and_predict("encodr")
    with pytest.warns(UserWarning) as caught:
        predict(x)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "predict job predict" in message and "'encodr-weight': did you mean 'encoder-weight'" in message
    assert "'encodr-bias': did you mean 'encoder-bias'" in message
    assert caught[0].filename == __file__           # points at the user's call


def test_a_predict_job_sharing_the_trained_weights_does_not_warn():
    predict, x = _train_and_predict("encoder")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        predict(x)


def test_a_predict_only_program_does_not_warn():
    @flow.global_function()
    def predict(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        return flow.layers.dense(x, 2, name="random_features")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        predict(np.ones((4, 3), np.float32))


def test_a_predict_job_whose_weights_were_initialised_then_loaded_does_not_warn(tmp_path):
    predict, x = _train_and_predict("encoder")
    flow.train.CheckPoint().save(str(tmp_path / "ckpt"))

    @flow.global_function()
    def other(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        return flow.layers.dense(x, 2, name="decoder")
    flow.train.CheckPoint().init()                  # every variable fresh, 'decoder' included...
    saved = {name: np.array(v.value) for name, v in flow.runtime.session.default().variables.items()}
    flow.checkpoint.save(str(tmp_path / "all"))
    flow.train.CheckPoint().load(str(tmp_path / "all"))   # ...then set from a checkpoint, in place
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        other(x)
    assert set(saved) >= {"decoder-weight", "decoder-bias"}
