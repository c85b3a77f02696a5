"""Graph export (OneFlow's structure JSON, a GraphDef TensorBoard opens) and the projector layout (appended per
step, exception tensors kept exactly, served by TensorBoard's projector plugin, read back by ``read_projector``)."""
import json
import os

import numpy as np
import pytest
from PIL import Image
from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
from tensorboard.plugins import base_plugin
from tensorboard.plugins.projector import projector_plugin
from werkzeug.test import Client
from werkzeug.wrappers import Response

import flowlab as flow
from flowlab.summary import SummaryWriter, graph_export, oneflow_api, proto, read_projector
from flowlab.summary.projector import Projector, write_embedding

tp = flow.typing


def mlp_job():
    @flow.global_function(type="train")
    def mlp_job(x: tp.Numpy.Placeholder((8, 4)), y: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
        hidden = flow.layers.dense(x, 16, activation=flow.nn.relu, name="hidden")
        logits = flow.layers.dense(hidden, 3, name="out")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss
    return mlp_job


def graph_of(logdir):
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return acc.Graph()


@pytest.fixture(autouse=True)
def no_writer():
    yield
    oneflow_api.close_summary_writer()


# ------------------------------------------------------------------------------------------------ graphs

def test_structure_json_of_an_mlp():
    document = graph_export.structure_json(mlp_job())
    assert document["class_name"] == "Job" and document["name"] == "mlp_job" and document["type"] == "train"
    layers = {layer["name"]: layer for layer in document["layers"]}
    x_input, y_input = document["input_layers"]
    matmul = layers["hidden_matmul"]
    assert matmul["class_name"] == "MatMul"
    assert matmul["inbound_nodes"] == [x_input, "hidden-weight"]
    assert matmul["inputs"] == [f"{x_input}/out_0", "hidden-weight/out"]
    assert matmul["config"]["transpose_b"] is True
    assert matmul["config"]["outputs"] == [{"name": "hidden_matmul/out_0", "shape": [8, 16], "dtype": "float32"}]
    assert matmul["source"].startswith(__file__)
    assert layers["hidden_bias_add"]["inbound_nodes"] == ["hidden_matmul", "hidden-bias"]
    assert layers["hidden_activation"] == {**layers["hidden_activation"], "class_name": "Relu",
                                           "inbound_nodes": ["hidden_bias_add"]}
    assert layers["out_matmul"]["inbound_nodes"] == ["hidden_activation", "out-weight"]
    assert layers["hidden-weight"]["config"]["shape"] == [16, 4]
    assert layers[x_input]["config"]["outputs"][0]["shape"] == [8, 4]
    # Every node is there (gradients and updates too), each input produced by an earlier layer.
    seen = set()
    for layer in document["layers"]:
        assert set(layer["inbound_nodes"]) <= seen
        seen.add(layer["name"])
    assert any(layer["class_name"] == "SGDUpdate" for layer in document["layers"])
    json.dumps(document, allow_nan=False)


def test_graph_def_opens_in_tensorboard(tmp_path):
    job = mlp_job()
    with SummaryWriter(tmp_path) as writer:
        writer.add_graph(job)
    nodes = {node.name: node for node in graph_of(tmp_path).node}
    assert len(nodes) == len(job.graph().nodes)
    matmul = nodes["hidden_matmul"]
    x_input = job.graph().placeholders[0].op_name
    assert matmul.op == "MatMul" and list(matmul.input) == [x_input, "hidden/weight"]   # "-" scopes -> "/"
    assert [d.size for d in matmul.attr["_output_shapes"].list.shape[0].dim] == [8, 16]
    assert matmul.attr["transpose_b"].b is True
    assert matmul.attr["dtype"].type == 1                                    # DT_FLOAT
    assert nodes["hidden/weight"].op == "Variable"
    assert list(nodes["hidden_bias_add"].input) == ["hidden_matmul", "hidden/bias"]
    # A node's second output is named "<node>:1", as in TensorFlow's graphs.
    loss_node = next(n for n in job.graph().nodes if n.op.__name__ == "SparseSoftmaxCrossEntropy")
    grads = [node for node in nodes.values() if f"{loss_node.name}:1" in node.input]
    assert grads and grads[0].name.startswith("System/AutoGrad/")
    assert all(inp.split(":")[0] in nodes for node in nodes.values() for inp in node.input)


def test_write_structure_graph_covers_every_job(tmp_path):
    job = mlp_job()

    @flow.global_function()
    def predict(x: tp.Numpy.Placeholder((2, 4))) -> tp.Numpy:
        return flow.layers.dense(x, 16, activation=flow.nn.relu, name="hidden")

    path = flow.summary.Graph(tmp_path).write_structure_graph()
    assert path == os.path.join(tmp_path, "structure_graph.json")
    document = json.loads(open(path).read())
    assert [j["name"] for j in document["jobs"]] == ["mlp_job", "predict"]
    assert document["jobs"][0] == graph_export.structure_json(job)
    assert sorted(os.listdir(tmp_path))[-1] == "structure_graph.json"     # no temporary file left behind
    names = {node.name for node in graph_of(tmp_path).node}
    assert {"mlp_job/hidden_matmul", "predict/hidden_matmul", "predict/hidden/weight"} <= names


def test_write_structure_graph_uses_the_open_writer_of_its_logdir(tmp_path):
    @flow.global_function()
    def CreateWriter():
        flow.summary.create_summary_writer(tmp_path)
    CreateWriter()
    flow.summary.Graph(tmp_path).write_structure_graph()
    assert len([n for n in os.listdir(tmp_path) if "tfevents" in n]) == 1
    assert [node.op for node in graph_of(tmp_path).node] == ["CreateSummaryWriter"]
    (data,) = flow.summary.read_graphs(tmp_path)["."]                     # flowlab's reader finds it too
    assert [node.name for node in proto.GraphDef.FromString(data).node] == ["CreateWriter/CreateSummaryWriter_0"]


# ------------------------------------------------------------------------------------------------ projector

def test_embeddings_append_per_step(tmp_path):
    projector = Projector(tmp_path).create_embedding_projector()
    rng = np.random.default_rng(0)
    steps = {}
    for step in (1, 2):
        steps[step] = rng.random((10, 3, 4), dtype=np.float32)
        projector.embedding_projector(value=steps[step], label=np.arange(10) + step, tag="emb", step=step,
                                      sample_name="digits", sample_type="image",
                                      x=rng.integers(0, 255, (10, 6, 5), dtype=np.uint8))
    config = (tmp_path / "projector_config.pbtxt").read_text()
    assert config.count("embeddings {") == 2 and 'tensor_name: "emb:00001"' in config and "emb:00002" in config
    read = read_projector(tmp_path)
    assert [(e.tag, e.step, e.kind) for e in read] == [("emb", 1, "embedding"), ("emb", 2, "embedding")]
    for e in read:
        np.testing.assert_array_equal(e.tensor, steps[e.step].reshape(10, 12))
        assert e.metadata == [[str(i + e.step)] for i in range(10)]
        image = Image.open(e.sprite)
        assert image.size == (4 * 5, 4 * 6) and image.mode == "L"       # 10 images of w5 x h6 in a 4x4 grid
    # Writing a step again replaces that entry only.
    projector.embedding_projector(value=np.zeros((2, 2)), tag="emb", step=1)
    assert [(e.step, e.tensor.shape) for e in read_projector(tmp_path)] == [(2, (10, 12)), (1, (2, 2))]


def test_sprite_layout_and_colour():
    images = np.zeros((5, 2, 3, 3), np.uint8)
    for i in range(5):
        images[i] = i + 1
    from flowlab.summary.projector import sprite
    grid = sprite(images)
    assert grid.shape == (3 * 2, 3 * 3, 3)
    assert [grid[r * 2, c * 3, 0] for r in range(3) for c in range(3)] == [1, 2, 3, 4, 5, 0, 0, 0, 0]


def test_exception_projector_round_trip_keeps_nan_and_inf(tmp_path):
    value = np.arange(24, dtype=np.float32).reshape(4, 2, 3)
    value[1, 0, 0] = np.nan
    value[2, 1, 2] = -np.inf
    value[3, 0, 1] = np.nan
    value[3, 0, 2] = np.inf
    Projector(tmp_path).exception_projector(value=value, tag="grads", step=7, sample_name="s", sample_type="text",
                                            x=np.array(["a", "b", "c", "d"]))
    (e,) = read_projector(tmp_path)
    assert (e.kind, e.tag, e.step) == ("exception", "grads", 7)
    np.testing.assert_array_equal(e.tensor, value.reshape(4, 6))           # NaN and ±Inf where they were
    assert e.metadata_header == ["status", "nan_count", "inf_count"]
    assert e.metadata == [["finite", "0", "0"], ["nan", "1", "0"], ["inf", "0", "1"], ["nan+inf", "1", "1"]]
    assert (e.info["nan_count"], e.info["inf_count"], e.info["shape"]) == (2, 2, [4, 2, 3])
    assert e.sprite is None
    directory = tmp_path / "exception" / "grads_00007"
    assert list(np.load(directory / "samples.npy")) == ["a", "b", "c", "d"]
    # TensorBoard's projector cannot place NaN: its TSV holds 0 there.
    tsv = np.loadtxt(directory / "tensors.tsv", delimiter="\t")
    assert np.isfinite(tsv).all() and tsv[1, 0] == 0 and tsv[0, 1] == 1


def tensorboard_projector(logdir):
    """``get(route, **query)``: the body of an HTTP 200 answer of TensorBoard's own projector plugin over ``logdir``."""
    apps = projector_plugin.ProjectorPlugin(
        base_plugin.TBContext(logdir=str(logdir), data_provider=None)).get_plugin_apps()

    def get(route, **query):
        response = Client(apps[route], Response).get(route, query_string=query)
        assert response.status_code == 200, response.get_data()
        return response.get_data()
    return get


def test_tensorboard_projector_plugin_serves_every_step(tmp_path):
    projector = Projector(tmp_path)
    for step in (0, 1):
        projector.embedding_projector(value=np.full((3, 2), step, np.float32), label=["a", "b", "c"],
                                      tag="emb", step=step)
    projector.exception_projector(value=np.array([[np.nan, 1.0]]), tag="emb", step=0)
    get = tensorboard_projector(tmp_path)

    assert json.loads(get("/runs")) == ["."]
    names = [e["tensorName"] for e in json.loads(get("/info", run="."))["embeddings"]]
    assert names == ["emb:00000", "emb:00001", "exception/emb:00000"]
    for step in (0, 1):
        tensor = np.frombuffer(get("/tensor", run=".", name=f"emb:{step:05d}"), np.float32)
        np.testing.assert_array_equal(tensor, np.full(6, step))
        assert get("/metadata", run=".", name=f"emb:{step:05d}") == b"a\nb\nc\n"
    np.testing.assert_array_equal(np.frombuffer(get("/tensor", run=".", name="exception/emb:00000"), np.float32),
                                  [0, 1])


def test_summary_writer_add_embedding(tmp_path):
    mat = np.random.default_rng(1).normal(size=(6, 5)).astype(np.float32)
    label_img = np.linspace(0, 1, 6 * 3 * 4 * 2).reshape(6, 3, 4, 2)       # NCHW floats in [0, 1]
    with SummaryWriter(tmp_path) as writer:
        writer.add_embedding(mat, metadata=[(i, f"n{i}") for i in range(6)], label_img=label_img, global_step=3,
                             tag="feat", metadata_header=["index", "name"])
        writer.add_embedding(mat[:2], metadata=["x", "y"])
    feat, default = read_projector(tmp_path)
    assert (feat.tag, feat.step, default.tag, default.step) == ("feat", 3, "default", 0)
    np.testing.assert_array_equal(feat.tensor, mat)
    assert feat.metadata_header == ["index", "name"] and feat.metadata[2] == ["2", "n2"]
    sprite = np.asarray(Image.open(feat.sprite))
    assert sprite.shape == (3 * 4, 3 * 2, 3)                               # 3x3 grid of 4 high, 2 wide, RGB
    np.testing.assert_array_equal(sprite[:4, :2], np.rint(label_img[0].transpose(1, 2, 0) * 255))
    assert default.metadata == [["x"], ["y"]] and default.metadata_header is None


@pytest.mark.parametrize("call, error, message", [
    (lambda d: write_embedding(d, np.zeros(3)), ValueError, r"mat must be a matrix \[n, d\]"),
    (lambda d: write_embedding(d, np.zeros((3, 2)), metadata=["a"]), ValueError, "metadata has 1 rows but there are 3"),
    (lambda d: write_embedding(d, np.zeros((2, 2)), metadata=[(1, 2), (3, 4)], metadata_header=["a"]), ValueError,
     "metadata_header has 1 names but the metadata has 2 columns"),
    (lambda d: write_embedding(d, np.zeros((2, 2)), tag=""), TypeError, "tag must be a non-empty str"),
    (lambda d: write_embedding(d, np.zeros((2, 2)), step=-1), ValueError, "step must be >= 0"),
    (lambda d: write_embedding(d, np.zeros((2, 2)), label_img=np.zeros((2, 8, 8))), ValueError,
     r"label_img must be \[n, c, h, w\]"),
    (lambda d: Projector(d).embedding_projector(value=np.array(["a"])), TypeError, "value must hold real numbers"),
    (lambda d: Projector(d).exception_projector(), TypeError, "value is required"),
])
def test_projector_bad_input_fails_clearly_and_lists_nothing(tmp_path, call, error, message):
    with pytest.raises(error, match=message):
        call(tmp_path)
    assert read_projector(tmp_path) == []
