"""OneFlow's summary API (seed 004): the seed's examples run as a program with only ``import oneflow as flow`` ->
``import flowlab as flow``, and TensorBoard's own reader finds every value in the logdir; misuse fails clearly."""
import io
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboard.util.tensor_util import make_ndarray

import flowlab as flow
from flowlab.errors import ShapeError
from flowlab.summary import oneflow_api

REPO = Path(__file__).resolve().parents[1]

# Seed 004's examples in order, as one program. Changes from the seed: sizes are reduced (placeholders too), random
# images stand in for the cv2 files, the seed's typos are fixed (`value_` fed as `value`, `tag_exception` defined),
# a FlushJob shows flush_summary_writer, and the inputs are saved for the test to compare.
SEED_PROGRAM = """
import numpy as np
import flowlab as flow

logdir = "logs"
func_config = flow.FunctionConfig()
func_config.default_data_type(flow.float)

@flow.global_function(function_config=func_config)
def CreateWriter():
    flow.summary.create_summary_writer(logdir)

CreateWriter()

@flow.global_function(function_config=func_config)
def ScalarJob(
    value: flow.typing.ListNumpy.Placeholder((1,), dtype=flow.float),
    step: flow.typing.ListNumpy.Placeholder((1,), dtype=flow.int64),
    tag: flow.typing.ListNumpy.Placeholder((1000,), dtype=flow.int8),
):
    flow.summary.scalar(value, step, tag)

value = np.array([1], dtype=np.float32)
step = np.array([1], dtype=np.int64)
tag = np.fromstring("scalar", dtype=np.int8)
ScalarJob([value], [step], [tag])

@flow.global_function(function_config=func_config)
def PbJob(
    value: flow.typing.ListNumpy.Placeholder((1500,), dtype=flow.int8),
    step: flow.typing.ListNumpy.Placeholder((1,), dtype=flow.int64),
):
    flow.summary.pb(value, step=step)

i = 2
net = ["vgg16", "resnet50", "mask-rcnn", "yolov3"]
pb = flow.summary.text(net)
value = np.fromstring(str(pb), dtype=np.int8)
step = np.array([i], dtype=np.int64)
PbJob([value], [step])

@flow.global_function(function_config=func_config)
def ImageJob(
    value: flow.typing.ListNumpy.Placeholder(
        shape=(2, 64, 64, 4), dtype=flow.uint8
    ),
    step: flow.typing.ListNumpy.Placeholder((1,), dtype=flow.int64),
    tag: flow.typing.ListNumpy.Placeholder((10,), dtype=flow.int8),
):
    flow.summary.image(value, step, tag)

images = np.random.randint(0, 256, (2, 48, 32, 3)).astype(np.uint8)
images = np.array(images, dtype=np.uint8)
step = np.array([1], dtype=np.int64)
tag = np.fromstring("image", dtype=np.int8)
ImageJob([images], [step], [tag])

@flow.global_function(function_config=func_config)
def HistogramJob(
    value: flow.typing.ListNumpy.Placeholder((20, 20, 20), dtype=flow.float),
    step: flow.typing.ListNumpy.Placeholder((1,), dtype=flow.int64),
    tag: flow.typing.ListNumpy.Placeholder((9,), dtype=flow.int8),
):
    flow.summary.histogram(value, step, tag)

hist_value = np.random.rand(10, 10, 10).astype(np.float32)
step = np.array([1], dtype=np.int64)
tag = np.fromstring("histogram", dtype=np.int8)
HistogramJob([hist_value], [step], [tag])

hparams = {
    flow.summary.HParam("learning_rate", flow.summary.RealRange(1e-2, 1e-1)): 0.02,
    flow.summary.HParam("dense_layers", flow.summary.IntegerRange(2, 7)): 5,
    flow.summary.HParam(
         "optimizer", flow.summary.ValueSet(["adam", "sgd"])
    ): "adam",
    flow.summary.HParam("accuracy", flow.summary.RealRange(1e-2, 1e-1)): 0.001,
    flow.summary.HParam("magic", flow.summary.ValueSet([False, True])): True,
    flow.summary.Metric("loss", float): 0.02,
    "dropout": 0.6,
}

pb2 = flow.summary.hparams(hparams)
value = np.fromstring(str(pb2), dtype=np.int8)
step = np.array([i], dtype=np.int64)
PbJob([value], [step])

graph = flow.summary.Graph(logdir)
graph.write_structure_graph()

projecotr = flow.summary.Projector(logdir)
projecotr.create_embedding_projector()

value_ = np.random.rand(10, 10, 10).astype(np.float32)
label = (np.random.rand(10) * 10).astype(np.int64)
x = (np.random.rand(10, 10, 10) * 255).astype(np.uint8)
sample_name = "sample"
sample_type = "image"
step = 1
tag_embedding = "embedding_projector"
projecotr.embedding_projector(
    value=value_,
    label=label,
    tag=tag_embedding,
    step=step,
    sample_name=sample_name,
    sample_type=sample_type,
    x=x,
)

projecotr = flow.summary.Projector(logdir)
projecotr.create_exception_projector()

exception_value = np.random.rand(10, 10, 10).astype(np.float32)
exception_value[3, 0, 0] = np.nan
exception_value[5, 1, 1] = np.inf
x = (np.random.rand(10, 10, 10) * 255).astype(np.uint8)
sample_name = "sample"
sample_type = "image"
step = 1
tag_exception = "exception_projector"
projecotr.exception_projector(
    value=exception_value,
    tag=tag_exception,
    step=step,
    sample_name=sample_name,
    sample_type=sample_type,
    x=x,
)

@flow.global_function(function_config=func_config)
def FlushJob():
    flow.summary.flush_summary_writer()

FlushJob()
np.savez("inputs.npz", images=images, hist_value=hist_value, embedding=value_, label=label,
         exception_value=exception_value)
print("done")
"""


def run_program(program, cwd, device="cpu"):
    # the parent's environment (packages it finds through PYTHONPATH), flowlab from this checkout
    env = dict(os.environ, FLOWLAB_DEVICE=device,
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(program)], cwd=cwd, capture_output=True,
                            text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    return result


def accumulate(run_dir):
    acc = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    acc.Reload()
    return acc


def values(acc, tag):
    return [(e.step, make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)]


@pytest.fixture(scope="module")
def seed_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("seed004")
    result = run_program(SEED_PROGRAM, cwd)
    return cwd, result, accumulate(cwd / "logs"), np.load(cwd / "inputs.npz")


def test_seed_program_runs_and_writes_tensorboard_event_files(seed_run):
    cwd, result, acc, _ = seed_run
    assert result.stdout.strip() == "done"
    names = os.listdir(cwd / "logs")
    assert [n for n in names if n.startswith("events.out.tfevents.")]     # one writer: one file for every job
    assert len([n for n in names if "tfevents" in n]) == 1
    assert not [n for n in names if n.startswith(".tmp")]
    assert set(acc.Tags()["tensors"]) >= {"scalar", "text", "image", "histogram", "loss",
                                          "_hparams_/experiment", "_hparams_/session_start_info"}
    # The seed's own hparams sit outside their range: accepted, with one warning naming the hparam.
    assert result.stderr.count("hparam 'accuracy' = 0.001 lies outside its domain") == 1


def test_seed_scalar(seed_run):
    _, _, acc, _ = seed_run
    ((step, value),) = values(acc, "scalar")
    assert step == 1 and value == np.float32(1.0)
    assert list(flow.summary.read_scalars(seed_run[0] / "logs")["."]["scalar"].value) == [1.0]   # flowlab's reader
    assert acc.SummaryMetadata("scalar").plugin_data.plugin_name == "scalars"


def test_seed_text(seed_run):
    _, _, acc, _ = seed_run
    ((step, value),) = values(acc, "text")
    assert step == 2
    assert [s.decode() for s in value] == ["vgg16", "resnet50", "mask-rcnn", "yolov3"]
    assert acc.SummaryMetadata("text").plugin_data.plugin_name == "text"


def test_seed_image_pixels(seed_run):
    _, _, acc, inputs = seed_run
    ((step, value),) = values(acc, "image")
    assert step == 1 and acc.SummaryMetadata("image").plugin_data.plugin_name == "images"
    width, height, *pngs = value
    assert (int(width), int(height)) == (32, 48) and len(pngs) == 2
    for png, expected in zip(pngs, inputs["images"]):
        np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(png))), expected)


def test_seed_histogram_counts(seed_run):
    _, _, acc, inputs = seed_run
    ((step, buckets),) = values(acc, "histogram")
    data = inputs["hist_value"].astype(np.float64).ravel()
    assert step == 1 and buckets.shape == (30, 3)
    assert buckets[:, 2].sum() == data.size
    counts, edges = np.histogram(data, bins=30, range=(data.min(), data.max()))
    np.testing.assert_array_equal(buckets[:, 2], counts)
    np.testing.assert_allclose(buckets[[0, -1], [0, 1]], [data.min(), data.max()])


def test_seed_hparams(seed_run):
    cwd, _, acc, _ = seed_run
    content = acc.PluginTagToContent("hparams")
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    infos = {info.name: info for info in experiment.hparam_infos}
    assert set(infos) == {"learning_rate", "dense_layers", "optimizer", "accuracy", "magic", "dropout"}
    assert (infos["learning_rate"].domain_interval.min_value, infos["learning_rate"].domain_interval.max_value) \
        == (1e-2, 1e-1)
    assert (infos["dense_layers"].domain_interval.min_value, infos["dense_layers"].domain_interval.max_value) \
        == (2, 7)
    assert [v.string_value for v in infos["optimizer"].domain_discrete.values] == ["adam", "sgd"]
    assert [v.bool_value for v in infos["magic"].domain_discrete.values] == [False, True]
    assert not infos["dropout"].HasField("domain_interval") and not infos["dropout"].HasField("domain_discrete")
    assert [m.name.tag for m in experiment.metric_infos] == ["loss"]

    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert {k: v.WhichOneof("kind") for k, v in start.hparams.items()} == {
        "learning_rate": "number_value", "dense_layers": "number_value", "optimizer": "string_value",
        "accuracy": "number_value", "magic": "bool_value", "dropout": "number_value"}
    assert start.hparams["learning_rate"].number_value == 0.02
    assert start.hparams["dense_layers"].number_value == 5
    assert start.hparams["optimizer"].string_value == "adam"
    assert start.hparams["accuracy"].number_value == 0.001
    assert start.hparams["magic"].bool_value is True
    assert start.hparams["dropout"].number_value == 0.6
    assert flow.summary.read_hparams(cwd / "logs")["."]["metrics"] == {"loss": pytest.approx(0.02)}
    ((step, loss),) = values(acc, "loss")                  # the Metric's value, as the scalar hparams reads
    assert step == 2 and loss == np.float32(0.02)


def test_seed_graph(seed_run):
    cwd, _, acc, _ = seed_run
    document = json.loads((cwd / "logs" / "structure_graph.json").read_text())
    jobs = {job["name"]: job for job in document["jobs"]}
    assert set(jobs) == {"CreateWriter", "ScalarJob", "PbJob", "ImageJob", "HistogramJob"}
    (write,) = [layer for layer in jobs["ScalarJob"]["layers"] if layer["class_name"] == "WriteScalar"]
    assert write["inbound_nodes"] == jobs["ScalarJob"]["input_layers"]
    graph = acc.Graph()
    ops = {node.name: node.op for node in graph.node}
    assert ops["CreateWriter/" + jobs["CreateWriter"]["layers"][0]["name"]] == "CreateSummaryWriter"
    assert sorted(op for name, op in ops.items() if name.startswith("ImageJob/")) == ["Input"] * 3 + ["WriteImage"]


def test_seed_projectors(seed_run):
    cwd, _, _, inputs = seed_run
    embedding, exception = flow.summary.read_projector(cwd / "logs")
    assert (embedding.kind, embedding.tag, embedding.step) == ("embedding", "embedding_projector", 1)
    np.testing.assert_array_equal(embedding.tensor, inputs["embedding"].reshape(10, 100))
    assert embedding.metadata == [[str(v)] for v in inputs["label"]] and embedding.metadata_header is None
    assert Image.open(embedding.sprite).size == (40, 40)               # 10 images of 10x10 in a 4x4 grid
    assert embedding.info["sample_name"] == "sample" and embedding.info["sample_type"] == "image"
    assert (exception.kind, exception.tag, exception.step) == ("exception", "exception_projector", 1)
    np.testing.assert_array_equal(exception.tensor, inputs["exception_value"].reshape(10, 100))   # NaN/Inf kept
    assert (exception.info["nan_count"], exception.info["inf_count"]) == (1, 1)
    assert exception.metadata_header == ["status", "nan_count", "inf_count"]
    assert [row[0] for row in exception.metadata] == ["finite"] * 3 + ["nan", "finite", "inf"] + ["finite"] * 4


@pytest.mark.gpu
def test_seed_program_on_the_gpu(tmp_path):
    run_program(SEED_PROGRAM, tmp_path, device="gpu")
    acc = accumulate(tmp_path / "logs")
    inputs = np.load(tmp_path / "inputs.npz")
    assert values(acc, "scalar")[0][1] == np.float32(1.0)
    assert values(acc, "histogram")[0][1][:, 2].sum() == inputs["hist_value"].size
    png = values(acc, "image")[0][1][2]
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(png))), inputs["images"][0])


# ------------------------------------------------------------------------------------------------ in one process

@pytest.fixture(autouse=True)
def no_writer():
    oneflow_api.close_summary_writer()
    yield
    oneflow_api.close_summary_writer()


def _tag(name):
    return np.frombuffer(name.encode(), dtype=np.int8)


def make_writer_job(logdir):
    @flow.global_function()
    def CreateWriter():
        flow.summary.create_summary_writer(logdir)
    return CreateWriter


def test_summaries_inside_a_train_job_with_constant_tags(tmp_path):
    make_writer_job(tmp_path)()
    tp = flow.typing

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((4, 3)), step: tp.Numpy.Placeholder((1,), dtype=flow.int64)) -> tp.Numpy:
        w = flow.get_variable("w", shape=(3, 1), initializer=flow.ones_initializer())
        loss = flow.math.reduce_mean(flow.matmul(x, w) ** 2)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.01]), momentum=0).minimize(loss)
        flow.summary.scalar(loss, step, "train/loss")      # a str tag: a constant of the job
        flow.summary.histogram(w, step, "w")
        return loss

    x = np.ones((4, 3), np.float32)
    losses = [float(train(x, np.array([s], np.int64))) for s in range(3)]
    oneflow_api.current_writer().flush()
    acc = accumulate(tmp_path)
    assert [(s, float(v)) for s, v in values(acc, "train/loss")] == [(s, pytest.approx(v)) for s, v in
                                                                     enumerate(losses)]
    assert [s for s, _ in values(acc, "w")] == [0, 1, 2]


def test_create_summary_writer_keeps_one_file_per_logdir(tmp_path):
    make_writer_job(tmp_path / "a")()
    first = oneflow_api.current_writer()
    make_writer_job(tmp_path / "a")()
    assert oneflow_api.current_writer() is first
    make_writer_job(tmp_path / "b")()
    assert oneflow_api.current_writer().logdir == str(tmp_path / "b")
    assert len(os.listdir(tmp_path / "a")) == 1 and len(os.listdir(tmp_path / "b")) == 1


def test_summary_op_without_a_writer_names_create_summary_writer():
    @flow.global_function()
    def ScalarJob(value: flow.typing.Numpy.Placeholder((1,)),
                  step: flow.typing.Numpy.Placeholder((1,), dtype=flow.int64)):
        flow.summary.scalar(value, step, "loss")

    with pytest.raises(oneflow_api.NoSummaryWriterError, match="create_summary_writer"):
        ScalarJob(np.ones(1, np.float32), np.ones(1, np.int64))


@pytest.mark.parametrize("make_job, message", [
    (lambda: _job3(flow.summary.scalar, (1,), flow.float, tag_dtype=flow.int32),
     r"tag must be an int8 tensor .*got int32"),
    (lambda: _job3(flow.summary.scalar, (3,), flow.float), r"value must have exactly 1 element, got shape \(3,\)"),
    (lambda: _job3(flow.summary.scalar, (1,), flow.float, step_dtype=flow.float),
     "step must be an integer"),
    (lambda: _job3(flow.summary.image, (2, 8, 8, 3), flow.float), r"value must be uint8 images \(N, H, W, C\)"),
    (lambda: _job3(flow.summary.image, (2, 8, 8, 2), flow.uint8), r"C = 1, 3 or 4, got uint8 .*\(2, 8, 8, 2\)"),
    (lambda: _job3(flow.summary.image, (8, 8, 3), flow.uint8), r"\(N, H, W, C\)"),
    (lambda: _job3(flow.summary.histogram, (4,), flow.int8, tag_dtype=flow.uint8), "tag must be an int8"),
])
def test_bad_inputs_fail_while_tracing_with_the_user_line(make_job, message):
    job, feeds = make_job()
    with pytest.raises(ShapeError, match=message) as info:
        job(*feeds)
    assert "test_summary_oneflow.py" in str(info.value)


def _job3(op, value_shape, value_dtype, step_dtype=flow.int64, tag_dtype=flow.int8):
    tp = flow.typing

    @flow.global_function()
    def job(value: tp.Numpy.Placeholder(value_shape, dtype=value_dtype),
            step: tp.Numpy.Placeholder((1,), dtype=step_dtype),
            tag: tp.Numpy.Placeholder((3,), dtype=tag_dtype)):
        op(value, step, tag)
    feeds = [np.zeros(d.shape, d.dtype) for d in job.arg_defs]
    return job, feeds


def test_pb_rejects_what_is_not_a_text_format_summary(tmp_path):
    make_writer_job(tmp_path)()

    @flow.global_function()
    def PbJob(value: flow.typing.ListNumpy.Placeholder((100,), dtype=flow.int8),
              step: flow.typing.ListNumpy.Placeholder((1,), dtype=flow.int64)):
        flow.summary.pb(value, step=step)

    with pytest.raises(ValueError, match="not a text-format Summary"):
        PbJob([_tag("hello world")], [np.zeros(1, np.int64)])
    with pytest.raises(ShapeError, match="int8 tensor of a text-format Summary"):
        @flow.global_function()
        def BadPb(value: flow.typing.Numpy.Placeholder((4,), dtype=flow.uint8)):
            flow.summary.pb(value, step=0)
        BadPb(np.zeros(4, np.uint8))


def test_text_and_hparams_helpers_check_their_input():
    assert str(flow.summary.text(["a", "b"])).startswith("value {\n  tag: \"text\"")
    with pytest.raises(TypeError, match="non-empty list of str"):
        flow.summary.text([1, 2])
    HParam, summary = flow.summary.HParam, flow.summary
    with pytest.raises(TypeError, match="'layers' has domain IntegerRange\\(2, 7\\): its value must be an int"):
        summary.hparams({HParam("layers", summary.IntegerRange(2, 7)): 2.5})
    with pytest.raises(ValueError, match="'opt': 'adma' is not one of \\['adam', 'sgd'\\]"):
        summary.hparams({HParam("opt", summary.ValueSet(["adam", "sgd"])): "adma"})
    with pytest.raises(TypeError, match="its value must be a str"):
        summary.hparams({HParam("opt", summary.ValueSet(["adam", "sgd"])): 1})
    with pytest.raises(TypeError, match="metric 'loss' must have a number"):
        summary.hparams({summary.Metric("loss", float): "low"})
    with pytest.raises(TypeError, match="bool, int, float or str"):
        summary.hparams({"layers": [1, 2]})
    with pytest.raises(ValueError, match="min_value <= max_value"):
        summary.RealRange(1.0, 0.5)
    with pytest.raises(TypeError, match="all str, all bool or all numbers"):
        summary.ValueSet([True, "x"])
    with pytest.warns(UserWarning, match="'rate' = 5.0 lies outside its domain RealRange\\(0, 1\\)"):
        summary.hparams({HParam("rate", summary.RealRange(0, 1)): 5.0})
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # once per hparam and value
        summary.hparams({HParam("rate", summary.RealRange(0, 1)): 5.0})
