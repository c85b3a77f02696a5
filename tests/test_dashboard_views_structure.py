"""Dashboard views of a logdir's structure: HParams (sessions table, parallel coordinates, scatter), Projector
(PCA/t-SNE of embeddings, labels, sprite thumbnails, steps) and Graph (layered DAG of a job or a GraphDef).

No browser: the views are built over a ``Store`` of fixture logdirs and their Bokeh models are inspected. Strings from
logs must reach the browser only as text: DataTable cells through ``StringFormatter`` (which renders text), header
titles escaped (SlickGrid writes them as HTML), tooltips without ``{safe}``, Divs escaped.
"""
import base64
import io
import json
import math
import os

import numpy as np
import pytest
from bokeh.embed import json_item
from bokeh.models import DataTable, Div, HoverTool, HTMLTemplateFormatter, StringFormatter
from PIL import Image

import flowlab as flow
from flowlab.dashboard.store import Store
from flowlab.dashboard.views import graph as graph_view
from flowlab.dashboard.views import projector as projector_view
from flowlab.dashboard.views.base import View
from flowlab.dashboard.views.graph import GraphView, Node, graph_data, layered_layout, nodes_from_graph_def
from flowlab.dashboard.views.hparams import HParamsView, axis, label_texts, matches, parallel_coordinates
from flowlab.dashboard.views.projector import ProjectorView, categories, pca
from flowlab.summary import SummaryWriter, encode, proto, read_hparams
from flowlab.summary.writer import EventFileWriter
from flowlab.summary.projector import Projector

tp = flow.typing
HOSTILE = "<script>alert(1)</script>"


def store_of(logdir):
    store = Store(logdir)
    store.poll()
    return store


def assert_text_only(view):
    """Every model of the view's layout keeps log strings as text (see the module docstring)."""
    json.dumps(json_item(view.layout()))                      # the layout serialises as a whole
    for model in view.layout().references():
        if isinstance(model, Div):
            assert "<script" not in model.text and "<b" not in model.text
        if isinstance(model, DataTable):
            for c in model.columns:
                assert isinstance(c.formatter, StringFormatter) and not isinstance(c.formatter,
                                                                                   HTMLTemplateFormatter)
                assert "<" not in c.title and c.field.isidentifier()
        if isinstance(model, HoverTool):
            tooltips = model.tooltips if isinstance(model.tooltips, str) else " ".join(v for _, v in model.tooltips)
            assert "{safe}" not in tooltips


# ------------------------------------------------------------------------------------------------ hparams

@pytest.fixture
def hparams_logdir(tmp_path):
    """Three flowlab sessions (hparams and metrics in the run itself) and one tensorboardX session (a child run)."""
    for name, lr, optimizer, layers, accuracy in (("a", 0.1, "sgd", 1, 0.5), ("b", 0.01, "adam", 2, 0.7),
                                                  ("c", 0.3, "adam", 3, 0.6)):
        with SummaryWriter(tmp_path / name) as w:
            w.add_hparams({"lr": lr, "optimizer": optimizer, "layers": layers}, {"accuracy": accuracy, "loss": 1.0})
            w.add_scalar("accuracy", accuracy + 0.2, 10)          # the last value of a metric counts
            w.add_scalar("loss", 1 - accuracy, 10)
    tensorboardX = pytest.importorskip("tensorboardX")
    with tensorboardX.SummaryWriter(str(tmp_path / "tbx")) as w:
        w.add_hparams({"lr": 0.05, "batch": 64}, {"hparam/accuracy": 0.9}, name="trial")
    return tmp_path


def test_hparams_table_has_one_row_per_session(hparams_logdir):
    view = HParamsView(store_of(hparams_logdir))
    view.update()
    assert view.hparams == ["lr", "optimizer", "layers", "batch"]
    assert view.metrics == ["accuracy", "loss", "hparam/accuracy"]
    data = view.table_source.data
    assert data["run"] == ["a", "b", "c", "tbx/trial"]             # tensorboardX: the session is the child run
    assert [c.title for c in view.table.columns] == ["run", "lr", "optimizer", "layers", "batch", "accuracy",
                                                       "loss", "hparam/accuracy"]
    by_title = {c.title: data[c.field] for c in view.table.columns}
    assert by_title["lr"] == [0.1, 0.01, 0.3, 0.05]
    assert by_title["optimizer"] == ["sgd", "adam", "adam", ""]     # text column, empty where missing
    assert by_title["layers"][:3] == [1.0, 2.0, 3.0] and math.isnan(by_title["layers"][3])
    assert by_title["accuracy"][:3] == [0.7, 0.9, 0.8]              # float32 values shown to 7 digits
    assert by_title["hparam/accuracy"][3] == 0.9
    assert all(c.sortable for c in view.table.columns) and view.table.sortable
    # The same sessions as the one-shot reader finds.
    expected = read_hparams(hparams_logdir)
    assert set(view.sessions) == set(expected)
    for run, session in expected.items():
        assert view.sessions[run]["hparams"] == session["hparams"]
        assert view.sessions[run]["metrics"] == pytest.approx(session["metrics"])
    assert_text_only(view)


def test_hparams_update_follows_new_metric_values_and_sessions(hparams_logdir):
    store = store_of(hparams_logdir)
    view = HParamsView(store)
    view.update()
    with SummaryWriter(hparams_logdir / "a") as w:
        w.add_scalar("accuracy", 0.95, 20)
    with SummaryWriter(hparams_logdir / "d") as w:
        w.add_hparams({"lr": 1.0, "optimizer": "sgd", "layers": 1}, {"accuracy": 0.1, "loss": 2.0})
    store.poll()
    view.update()
    data = view.table_source.data
    assert data["run"] == ["a", "b", "c", "d", "tbx/trial"]
    accuracy = next(c.field for c in view.table.columns if c.title == "accuracy")
    assert data[accuracy][0] == 0.95 and data[accuracy][3] == 0.1


def test_metrics_of_a_group_live_in_the_sessions_child_run_even_at_the_root(tmp_path):
    """Keras' hparams callback: metrics ("validation", "acc") in the run "<session>/validation"; for the logdir's
    root session "." that run is "validation" (TensorBoard normalises the joined path)."""
    experiment = encode.hparams_experiment({"lr": 0.1}, ["acc"])
    data = proto.HParamsPluginData.FromString(experiment.metadata.plugin_data.content)
    data.experiment.metric_infos[0].name.group = "validation"
    experiment.metadata.plugin_data.content = data.SerializeToString()
    writer = EventFileWriter(tmp_path)
    writer.add_summary([experiment, encode.hparams_session_start({"lr": 0.1})], 0, 1.0)
    writer.close()
    with SummaryWriter(tmp_path / "validation") as w:
        w.add_scalar("acc", 0.25, 3)
    assert read_hparams(tmp_path)["."]["metrics"] == {"acc": 0.25}
    view = HParamsView(store_of(tmp_path))
    view.update()
    assert view.table_source.data["run"] == ["."] and view.table_source.data["m0"] == [0.25]


def test_parallel_coordinates_normalise_each_axis():
    assert axis([2.0, 4.0, None, 3.0]) == ([0.0, 1.0, None, 0.5], [(0.0, "2"), (0.5, "3"), (1.0, "4")])
    assert axis([2.0, 4.0])[1] == [(0.0, "2"), (1.0, "4")]
    assert axis([5, 5]) == ([0.5, 0.5], [(0.5, "5")])
    # Categories (strings, booleans, mixes) sit at evenly spaced positions in sorted order.
    assert axis(["sgd", "adam", "rmsprop", "adam"])[0] == [1.0, 0.0, 0.5, 0.0]
    assert axis([True, False])[0] == [1.0, 0.0]
    assert axis(["x", 1.0])[1] == [(0.0, "1.0"), (1.0, "x")]
    assert axis([None, None]) == ([None, None], [])
    sessions = {"a": {"hparams": {"lr": 0.1, "opt": "sgd"}, "metrics": {"acc": 0.5}},
                "b": {"hparams": {"lr": 0.3, "opt": "adam"}, "metrics": {}}}
    xs, ys, axes = parallel_coordinates(sessions, ["a", "b"], [("hparams", "lr"), ("hparams", "opt"),
                                                                ("metrics", "acc")])
    assert xs == [[0, 1, 2], [0, 1, 2]]
    assert ys[0] == [0.0, 1.0, 0.5]
    assert ys[1][:2] == [1.0, 0.0] and math.isnan(ys[1][2])          # a missing metric breaks the line
    assert axes[1].ticks == [(0.0, "adam"), (1.0, "sgd")]


def test_parallel_coordinates_and_scatter_in_the_view(hparams_logdir):
    view = HParamsView(store_of(hparams_logdir))
    view.update()
    lines = view.lines_source.data
    assert lines["run"] == ["a", "b", "c", "tbx/trial"] and len(lines["xs"][0]) == 7
    lr_axis = [line[0] for line in lines["ys"]]
    # lr spans 0.01...0.3, a factor of 30: a log axis
    assert lr_axis == pytest.approx([math.log(10) / math.log(30), 0.0, 1.0, math.log(5) / math.log(30)])
    assert label_texts(view.parallel.xaxis[0]) == {0: "lr (log)", 1: "optimizer", 2: "layers", 3: "batch",
                                                            4: "accuracy", 5: "loss", 6: "hparam/accuracy"}
    # Scatter: numeric hparam against a metric, sessions without that metric left out.
    assert (view.x_select.value, view.y_select.value) == ("lr", "accuracy")
    scatter = view.scatter_source.data
    assert scatter["run"] == ["a", "b", "c"] and scatter["x"] == pytest.approx([-1, -2, math.log10(0.3)])
    assert scatter["xtext"] == ["0.1", "0.01", "0.3"] and view.scatter.xaxis[0].axis_label.text == "lr (log scale)"
    assert scatter["y"] == pytest.approx([0.7, 0.9, 0.8])
    # A categorical hparam goes to 0, 1, ... with its values as tick labels.
    view.x_select.value = "optimizer"
    view.y_select.value = "loss"
    scatter = view.scatter_source.data
    assert scatter["x"] == [1.0, 0.0, 0.0] and scatter["xtext"] == ["sgd", "adam", "adam"]
    assert label_texts(view.scatter.xaxis[0]) == {0: "adam", 1: "sgd"}
    assert scatter["y"] == pytest.approx([0.5, 0.3, 0.4])
    assert view.scatter.xaxis[0].axis_label.text == "optimizer"


def test_hparams_filter_by_regex_over_runs_and_values(hparams_logdir):
    view = HParamsView(store_of(hparams_logdir))
    view.update()
    view.filter.value = "optimizer=adam"
    assert view.table_source.data["run"] == ["b", "c"]
    assert view.lines_source.data["run"] == ["b", "c"] and view.scatter_source.data["run"] == ["b", "c"]
    view.filter.value = "^tbx"
    assert view.table_source.data["run"] == ["tbx/trial"]
    view.filter.value = "lr=0.(1|3)$"
    assert view.table_source.data["run"] == ["a", "c"]
    view.filter.value = "[a"                                   # not a regex: searched as plain text
    assert view.table_source.data["run"] == []
    assert view.note.text == "0 of 4 sessions"
    assert matches("", "x", {}) and not matches("y", "x", {"a": 1})


def test_hparams_hostile_strings_stay_text(tmp_path):
    with SummaryWriter(os.path.join(tmp_path, HOSTILE)) as w:      # the "/" in it makes the run a nested path
        w.add_hparams({HOSTILE: HOSTILE, "lr": 0.1}, {HOSTILE: 1.0})
    view = HParamsView(store_of(tmp_path))
    view.update()
    data = view.table_source.data
    assert data["run"] == [HOSTILE]
    assert HOSTILE in [v[0] for v in data.values()]                 # the value itself, as text for the formatter
    titles = [c.title for c in view.table.columns]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in titles       # SlickGrid parses header titles as HTML
    assert view.x_select.options[0] == HOSTILE                      # <option> labels are DOM text
    assert_text_only(view)


# ------------------------------------------------------------------------------------------------ projector

def test_pca_matches_a_numpy_reference_up_to_sign():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 6)) * [5, 3, 1, 0.5, 0.2, 0.1] + 7
    coords, explained = pca(x, 3)
    centred = x - x.mean(0)
    values, vectors = np.linalg.eigh(np.cov(centred, rowvar=False))
    order = np.argsort(values)[::-1]
    reference = centred @ vectors[:, order[:3]]
    for j in range(3):
        sign = np.sign(coords[:, j] @ reference[:, j])
        np.testing.assert_allclose(coords[:, j], sign * reference[:, j], atol=1e-9)
    np.testing.assert_allclose(explained, values[order[:3]] / values.sum())
    # Fewer dimensions than components: the missing ones are 0; NaN is drawn as 0, not propagated.
    small, ratio = pca(np.array([[0.0, 1.0], [2.0, np.nan], [4.0, 5.0]]), 3)
    assert np.isfinite(small).all() and (small[:, 2] == 0).all() and ratio[2] == 0


def test_categories_colour_labels_numeric_ones_in_numeric_order():
    category, colors = categories(["10", "2", "2", "x"])
    assert category == ["10", "2", "2", "x"] and colors[1] == colors[2] != colors[0]
    category, colors = categories(["10", "2", "9"])
    assert colors == [colors[0], colors[1], colors[2]] and len(set(colors)) == 3
    assert categories(["10", "2"])[1] == list(reversed(categories(["2", "10"])[1]))    # 2 < 10: first colour
    assert categories(["10", "2"])[1][1] == categories(["a"])[1][0]
    many = [str(i % 30) for i in range(300)] + ["0"] * 5
    category, colors = categories(many)
    assert len(set(category)) == 20 and "other" in category and colors[category.index("other")] == "#bbbbbb"


@pytest.fixture
def projector_logdir(tmp_path):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 255, (10, 6, 5), dtype=np.uint8)
    tensors = {}
    projector = Projector(tmp_path / "emb")
    for step in (1, 2):
        tensors[step] = rng.normal(size=(10, 4)).astype(np.float32)
        projector.embedding_projector(value=tensors[step], label=np.arange(10) % 3, tag="feat", step=step, x=images)
    return tmp_path, tensors, images


def test_projector_view_pca_labels_thumbnails_and_steps(projector_logdir):
    logdir, tensors, images = projector_logdir
    view = ProjectorView(store_of(logdir))
    view.update()
    assert view.run_select.options == ["emb"] and view.tensor_select.options == ["feat"]
    assert view.step_select.options == ["1", "2"] and view.step_select.value == "2"     # the latest step first
    data = view.source.data
    coords, explained = pca(tensors[2], 2)
    np.testing.assert_allclose(np.array([data["c0"], data["c1"]]).T, coords, rtol=1e-6, atol=1e-6)
    assert data["label"] == [str(i % 3) for i in range(10)]
    assert data["color"][0] == data["color"][3] != data["color"][1]
    assert view.front.xaxis[0].axis_label.startswith(f"PC1 ({explained[0]:.1%}")
    # One thumbnail per point, cut from the sprite: the image of that sample.
    assert len(data["thumb"]) == 10 and all(t.startswith("data:image/png;base64,") for t in data["thumb"])
    thumb = np.asarray(Image.open(io.BytesIO(base64.b64decode(data["thumb"][7].split(",", 1)[1]))))
    np.testing.assert_array_equal(thumb, images[7])
    assert "@thumb" in view.hover.tooltips and "{safe}" not in view.hover.tooltips
    # Another step, then 3-D: two linked projections sharing component 2.
    view.step_select.value = "1"
    np.testing.assert_allclose(view.source.data["c0"], pca(tensors[1], 2)[0][:, 0], rtol=1e-6, atol=1e-6)
    view.dims_select.value = "3-D"
    coords3 = pca(tensors[1], 3)[0]
    np.testing.assert_allclose(view.source.data["c2"], coords3[:, 2], rtol=1e-6, atol=1e-6)
    assert view.side.visible and view.side.y_range is view.front.y_range
    assert_text_only(view)


def test_projector_rereads_its_config_when_it_changes(projector_logdir):
    logdir, _, _ = projector_logdir
    view = ProjectorView(store_of(logdir))
    view.update()
    assert view.step_select.value == "2"
    Projector(logdir / "emb").embedding_projector(value=np.eye(3), label=["p", "q", "r"], tag="feat", step=3)
    os.utime(logdir / "emb" / "projector_config.pbtxt", ns=(0, 10**18))      # mtime surely differs
    view.store.poll()                                   # the store reads the changed config again
    view.update()
    assert view.step_select.options == ["1", "2", "3"] and view.step_select.value == "3"   # follows the latest
    assert view.source.data["label"] == ["p", "q", "r"] and view.source.data["thumb"] == ["", "", ""]
    assert view.hover.tooltips == [("label", "@label")]


def test_projector_exception_kind_and_hostile_labels(tmp_path):
    with SummaryWriter(tmp_path) as w:
        w.add_embedding(np.arange(12.0).reshape(4, 3), metadata=[(HOSTILE, str(i)) for i in range(4)],
                        metadata_header=[HOSTILE, "i"], tag="h")
    value = np.ones((3, 2))
    value[1, 0] = np.nan
    Projector(tmp_path).exception_projector(value=value, tag="grads", step=5)
    view = ProjectorView(store_of(tmp_path))
    view.update()
    assert view.run_select.value == "." and view.tensor_select.options == ["h", "exception/grads"]
    assert view.label_select.options == [HOSTILE, "i"]
    assert view.source.data["label"] == [HOSTILE] * 4              # escaped by Bokeh in the tooltip
    view.tensor_select.value = "exception/grads"
    assert view.label_select.value == "status" or view.label_select.options[0] == "status"
    assert view.source.data["label"] == ["finite", "nan", "finite"]
    assert np.isfinite(view.source.data["c0"]).all() and "NaN: 1" in view.note.text
    assert_text_only(view)


def test_tsne_is_offered_only_with_scikit_learn(projector_logdir, monkeypatch):
    logdir, tensors, _ = projector_logdir
    monkeypatch.setattr(projector_view, "TSNE_AVAILABLE", False)
    monkeypatch.setattr(projector_view, "UMAP_AVAILABLE", False)
    assert ProjectorView(store_of(logdir)).method_select.options == ["PCA"]
    pytest.importorskip("sklearn")
    monkeypatch.undo()
    view = ProjectorView(store_of(logdir))
    view.update()
    assert view.method_select.options[:2] == ["PCA", "t-SNE"]
    view.method_select.value = "t-SNE"
    assert len(view.source.data["c0"]) == 10 and np.isfinite(view.source.data["c1"]).all()
    assert view.front.xaxis[0].axis_label == "t-SNE 1"


# ------------------------------------------------------------------------------------------------ graph

def layers_of(centres):
    """Each box's layer (0 at the top) and its position in the layer, from ``layered_layout``'s centres."""
    rows = sorted({y for _, y in centres})
    place = [(rows.index(y), x) for x, y in centres]
    return [(layer, sorted(x for k, x in place if k == layer).index(x)) for layer, x in place]


def crossings(place, edges):
    """Pairs of edges between the same two adjacent layers that cross."""
    count = 0
    for i, (a, b) in enumerate(edges):
        for c, d in edges[i + 1:]:
            if place[a][0] == place[c][0] and place[b][0] == place[d][0] and place[b][0] == place[a][0] + 1:
                count += (place[a][1] - place[c][1]) * (place[b][1] - place[d][1]) < 0
    return count


def test_layered_layout_puts_sources_first_and_every_edge_downward():
    a, b, c, d, e = range(5)
    edges = [(a, c), (b, c), (c, d), (a, e), (d, e)]
    centres, routes = layered_layout([(40, 20)] * 5, edges)
    place = layers_of(centres)
    assert place[a][0] == place[b][0] == 0
    assert place[e][0] == 3                                     # longest path a-c-d-e, not the short edge a-e
    assert all(place[u][0] < place[v][0] for u, v in edges)
    assert sorted(p for layer, p in place if layer == 0) == [0, 1]
    # Routes run from the producer's centre to the consumer's, through a point per layer crossed.
    assert routes[3][0] == centres[a] and routes[3][-1] == centres[e] and len(routes[3]) == 4


def test_layered_layout_orders_layers_to_remove_crossings():
    edges = [(0, 5), (1, 4), (2, 3)]                            # in the given order, every pair crosses
    assert crossings([(k // 3, k % 3) for k in range(6)], edges) == 3
    place = layers_of(layered_layout([(40, 20)] * 6, edges)[0])
    assert crossings(place, edges) == 0
    rng = np.random.default_rng(3)
    edges = list({(int(i), int(j)) for i, j in rng.integers(0, 30, (60, 2)) if i < j})
    centres, _ = layered_layout([(40, 20)] * 30, edges)
    assert all(centres[u][1] < centres[v][1] for u, v in edges)     # y grows downwards


def test_layered_layout_survives_cycles_self_loops_and_nothing():
    centres, routes = layered_layout([(40, 20)] * 3, [(0, 1), (1, 2), (2, 0), (1, 1)])
    assert centres[0][1] < centres[1][1] < centres[2][1]         # the closing edge 2->0 goes up
    assert len(routes) == 3 and routes[2][0] == centres[2] and routes[2][-1] == centres[0]
    assert layered_layout([], []) == ([], [])


def mlp_job():
    @flow.global_function(type="train")
    def mlp_job(x: tp.Numpy.Placeholder((8, 4)), y: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
        hidden = flow.layers.dense(x, 16, activation=flow.nn.relu, name="hidden")
        logits = flow.layers.dense(hidden, 3, name="out")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss
    return mlp_job


def expand_every_scope(view):
    """Tick every scope the view lists until it lists no new ones."""
    while len(view.scopes.active) < len(view.scopes.labels):
        view.scopes.active = list(range(len(view.scopes.labels)))


def test_graph_view_of_a_flowlab_job(tmp_path):
    job = mlp_job()
    flow.summary.Graph(tmp_path / "mlp").write_structure_graph()
    view = GraphView(store_of(tmp_path))
    view.update()
    assert [label for _, label in view.select.options] == ["mlp: mlp_job"]      # from structure_graph.json
    graph = job.graph()
    data = view.nodes_source.data
    assert "hidden_matmul" in data["name"] and "hidden" in view.expanded      # a small graph opens whole
    view.scopes.active = []
    data = view.nodes_source.data
    assert "hidden" in data["name"] and data["kind"][data["name"].index("hidden")] == "scope"      # "hidden-..."
    assert not any(name.startswith("System") for name in data["name"])        # gradients: folded away
    view.training.active = [0]
    expand_every_scope(view)
    data = view.nodes_source.data
    assert sorted(data["name"]) == sorted(n.name for n in graph.nodes)
    i = data["name"].index("hidden_matmul")
    assert data["op"][i] == "MatMul" and data["outputs"][i] == "hidden_matmul/out_0: (8, 16) float32"
    assert data["source"][i].startswith(__file__)
    y = dict(zip(data["name"], data["y"]))
    assert y["hidden-weight"] > y["hidden_matmul"] and y["hidden_matmul"] < y[graph.placeholders[0].op_name]
    edges = view.edges_source.data
    n_edges = sum(len(set(t.node.name for t in n.inputs)) for n in graph.nodes)
    assert len(edges["xs"]) == n_edges and all(ys[0] > ys[-1] for ys in edges["ys"])
    colors = dict(zip(data["category"], data["color"]))
    assert len(set(colors.values())) == len(colors)                  # one colour per op category
    # Hiding variables removes them and their edges.
    view.variables.active = []
    hidden = view.nodes_source.data
    assert "hidden-weight" not in hidden["name"] and "Variable" not in hidden["op"]
    assert len(hidden["name"]) == len(data["name"]) - sum(n.op.__name__ == "Variable" for n in graph.nodes)
    assert_text_only(view)


def tensorboard_x_graph_def(tmp_path, nodes):
    """A GraphDef built with tensorboardX's own messages and written by its file writer (as its add_graph does)."""
    tensorboardX = pytest.importorskip("tensorboardX")
    from tensorboardX.proto import event_pb2, graph_pb2
    graph = graph_pb2.GraphDef()
    for name, op, inputs, shapes in nodes:
        node = graph.node.add(name=name, op=op, input=inputs)
        for shape in shapes or []:
            output = node.attr["_output_shapes"].list.shape.add()
            for size in shape:
                output.dim.add(size=size)
        node.attr["T"].type = 1
    with tensorboardX.SummaryWriter(str(tmp_path)) as w:
        w._get_file_writer().add_event(event_pb2.Event(graph_def=graph.SerializeToString()))
    return graph


def test_graph_view_of_a_tensorboardx_graph_def(tmp_path):
    tensorboard_x_graph_def(tmp_path / "tbx", [
        ("input/x", "IO Node", [], [[8, 4]]),
        ("net/linear/weight", "prim::GetAttr", [], [[3, 4]]),
        ("net/linear", "aten::linear", ["input/x", "net/linear/weight:0"], [[8, 3], [-1]]),
        ("net/split", "Split", ["net/linear"], [[8, 1], [8, 2]]),
        ("output/y", "IO Node", ["net/split:1", "^net/linear"], None),
    ])
    view = GraphView(store_of(tmp_path))
    view.update()
    assert [label for _, label in view.select.options] == ["tbx"]
    assert view.expanded == {"net", "net/linear"}                              # a small graph opens whole
    view.scopes.active = []
    assert view.nodes_source.data["name"] == ["input/x", "net", "output/y"]     # a scope of one op shows the op
    assert view.note.text == "5 of 5 ops in 3 boxes (1 collapsed name scope), 2 edges (from GraphDef)"
    expand_every_scope(view)
    data = view.nodes_source.data
    assert data["name"] == ["input/x", "net/linear/weight", "net/linear", "net/split", "output/y"]
    assert data["label"] == ["x", "weight", "linear", "split", "y"]
    assert data["outputs"][2] == "(8, 3) float; (?,) float"
    y = dict(zip(data["name"], data["y"]))
    assert y["input/x"] == y["net/linear/weight"] > y["net/linear"] > y["net/split"] > y["output/y"]
    assert len(view.edges_source.data["xs"]) == 5            # "^net/linear" and "net/split:1" name their producers
    assert view.note.text == "5 of 5 ops in 5 boxes (0 collapsed name scopes), 5 edges (from GraphDef)"
    view.variables.active = []                               # torch's parameters are prim::GetAttr nodes
    assert "net/linear/weight" not in view.nodes_source.data["name"]


def test_graph_from_a_hand_built_graph_def_with_hostile_names(tmp_path):
    graph = proto.GraphDef()
    graph.node.add(name=HOSTILE, op=HOSTILE)
    graph.node.add(name="b", op="Identity", input=[f"^{HOSTILE}"])
    nodes = nodes_from_graph_def(graph.SerializeToString())
    assert nodes == [Node(HOSTILE, HOSTILE, (), ""), Node("b", "Identity", (HOSTILE,), "")]
    writer = EventFileWriter(tmp_path / HOSTILE.replace("/", "_"))
    writer.add_graph_def(graph.SerializeToString())
    writer.close()
    view = GraphView(store_of(tmp_path))
    view.update()
    data = view.nodes_source.data
    assert data["name"] == [HOSTILE, "b"] and data["op"][0] == HOSTILE      # hover fields, escaped by Bokeh
    assert view.labels.visible and view.labels.glyph.text == "label"  # canvas text
    assert_text_only(view)


def test_graph_data_hides_variables_and_caps_large_graphs():
    nodes = [Node("w", "Variable", (), ""), Node("x", "Input", (), ""), Node("m", "MatMul", ("x", "w"), "")]
    drawing = graph_data(nodes, show_variables=False)
    assert drawing.nodes["name"] == ["x", "m"] and len(drawing.edges["xs"]) == 1 and drawing.note == ""
    big = [Node(f"scope{i % 3}/n{i}", "Op", (), "") for i in range(graph_view.MAX_NODES + 1)]
    drawing = graph_data(big)
    assert drawing.nodes["name"] == ["scope0", "scope1", "scope2"] and drawing.note == ""    # collapsed scopes
    drawing = graph_data(big, expanded={"scope0", "scope1", "scope2"})
    assert len(drawing.nodes["name"]) == graph_view.MAX_NODES and "showing the first" in drawing.note


def test_views_are_views_with_titles():
    for cls, title in ((HParamsView, "HParams"), (ProjectorView, "Projector"), (GraphView, "Graph")):
        assert issubclass(cls, View) and cls.title == title


def test_an_empty_logdir_says_what_is_missing(tmp_path):
    store = store_of(tmp_path / "later")
    for cls, text in ((HParamsView, "No hparams"), (ProjectorView, "No embeddings"), (GraphView, "No graph")):
        view = cls(store)
        view.update()
        assert view.note.text.startswith(text)
        assert_text_only(view)
