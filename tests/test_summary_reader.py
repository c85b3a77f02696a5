"""The logdir reader and tailer: same values as TensorBoard's EventAccumulator, robust where TensorBoard is not."""
import inspect
import os

import numpy as np
import pytest
from google.protobuf import json_format

from flowlab.summary import logdir_files, proto
from flowlab.summary.reader import (GRAPH_TAG, Image, LogdirTailer, read_graphs, read_hparams, read_histograms,
                                    read_images, read_scalars, read_tensors, read_text)
from flowlab.summary.record import frame

pea = pytest.importorskip("tensorboard.backend.event_processing.plugin_event_accumulator")
from tensorboard.plugins.hparams import plugin_data_pb2  # noqa: E402
from tensorboard.util import tensor_util  # noqa: E402

# -- writing logs ----------------------------------------------------------------------------------------------------


def event(step=0, wall_time=None, **what):
    return proto.Event(wall_time=1.7e9 + step if wall_time is None else wall_time, step=step, **what)


def version():
    return proto.Event(wall_time=1.7e9, file_version="brain.Event:2")


def summary(*values):
    return proto.Summary(value=list(values))


def value(tag, plugin=None, content=b"", **kind):
    v = proto.Summary.Value(tag=tag, **kind)
    if plugin is not None:
        v.metadata.plugin_data.plugin_name = plugin
        v.metadata.plugin_data.content = content
    return v


def scalar_event(tag, step, x, wall_time=None):
    return event(step, wall_time, summary=summary(value(tag, simple_value=x)))


def tensor(array):
    array = np.asarray(array)
    t = proto.TensorProto()
    t.tensor_shape.dim.extend(proto.TensorShapeProto.Dim(size=n) for n in array.shape)
    if array.dtype.kind in "SO":
        t.dtype = proto.enum_value("tensorboard.DataType", "DT_STRING")
        t.string_val.extend(array.ravel().tolist())
    else:
        t.dtype = proto.enum_value("tensorboard.DataType", {"f": "DT_FLOAT", "d": "DT_DOUBLE"}[array.dtype.char])
        t.tensor_content = array.tobytes()
    return t


def float_tensor_event(tag, step, x, plugin=None, shape=False):
    """A scalar as flowlab's writer (``shape=False``) or TensorFlow's (empty shape) encodes it: DT_FLOAT, float_val."""
    t = proto.TensorProto(dtype=proto.enum_value("tensorboard.DataType", "DT_FLOAT"), float_val=[x])
    if shape:
        t.tensor_shape.SetInParent()
    return event(step, summary=summary(value(tag, plugin, tensor=t)))


def write(path, *events, mode="ab"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, mode) as f:
        f.write(b"".join(frame(e.SerializeToString()) for e in events))


def event_file(logdir, run=".", n=0):
    return os.path.normpath(os.path.join(logdir, run, f"events.out.tfevents.{1700000000 + n}.host.1.{n}"))


def peer_writer(name):
    """The SummaryWriter class of a peer writing TensorBoard logs: tensorboardX, or torch's (imported only here)."""
    if name == "torch":
        return pytest.importorskip("torch.utils.tensorboard").SummaryWriter
    return pytest.importorskip("tensorboardX").SummaryWriter


# -- what TensorBoard reads ------------------------------------------------------------------------------------------


def accumulator(run_dir):
    return pea.EventAccumulator(str(run_dir), size_guidance={pea.TENSORS: 0}).Reload()


def tb_tensors(run_dir, plugin):
    """{tag: [(step, wall_time, ndarray)]} of one plugin, as TensorBoard's EventAccumulator has them."""
    acc = accumulator(run_dir)
    tags = acc.PluginTagToContent(plugin) if plugin in acc.ActivePlugins() else {}
    return {tag: [(e.step, e.wall_time, tensor_util.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)]
            for tag in tags}


def tb_scalars(run_dir):
    out = {}
    for tag, events in tb_tensors(run_dir, "scalars").items():
        events = sorted(events, key=lambda e: e[0])     # TensorBoard keeps arrival order; we sort by step (stably)
        out[tag] = ([e[0] for e in events], [e[1] for e in events], [e[2].item() for e in events])
    return out


def ours_as_lists(series):
    return {tag: (s.step.tolist(), s.wall_time.tolist(), s.value.tolist()) for tag, s in series.items()}


def run_dirs(logdir):
    """Run name -> directory, for every directory holding event files."""
    return {("." if d == str(logdir) else os.path.relpath(d, logdir).replace(os.sep, "/")): d
            for d, _, files in os.walk(logdir) if any("tfevents" in f for f in files)}


# -- peers' logs -----------------------------------------------------------------------------------------------------


@pytest.fixture(params=["tensorboardX", "torch"])
def peer_log(request, tmp_path):
    """A log with every kind, written by a peer SummaryWriter."""
    SummaryWriter = peer_writer(request.param)
    rng = np.random.default_rng(0)
    with SummaryWriter(str(tmp_path)) as w:
        for step in range(30):
            w.add_scalar("loss", 1.0 / (step + 1), step)
            w.add_scalar("metrics/accuracy", step / 30.0, step)
            if step % 10 == 0:
                w.add_histogram("weights", rng.normal(size=500) * (step + 1), step)
                w.add_histogram("constant", np.full(20, 3.0), step)
                w.add_image("sample", rng.integers(0, 255, (3, 6, 5), dtype=np.uint8), step)
                w.add_text("notes", f"step **{step}** \u00e9", step)
        name = "run_name" if "run_name" in inspect.signature(w.add_hparams).parameters else "name"
        w.add_hparams({"lr": 0.01, "batch": 32, "optimizer": "adam", "nesterov": True},
                      {"hparam/accuracy": 0.75, "hparam/loss": 0.5}, **{name: "trial"})
    return tmp_path


def test_peer_scalars_match_tensorboard(peer_log):
    ours = read_scalars(peer_log)
    assert set(ours) == set(run_dirs(peer_log)) == {".", "trial"}
    for run, directory in run_dirs(peer_log).items():
        assert ours_as_lists(ours.get(run, {})) == tb_scalars(directory)
    series = ours["."]["loss"]
    assert series.step.dtype == np.int64 and series.wall_time.dtype == np.float64 and series.value.dtype == np.float64
    assert series.step.tolist() == list(range(30))


def test_peer_histograms_match_tensorboard(peer_log):
    ours = read_histograms(peer_log)["."]
    theirs = tb_tensors(peer_log, "histograms")
    assert set(ours) == set(theirs) == {"weights", "constant"}
    for tag, events in theirs.items():
        assert ours[tag].step.tolist() == [e[0] for e in events] == [0, 10, 20]
        assert ours[tag].wall_time.tolist() == [e[1] for e in events]
        for buckets, (_, _, tb) in zip(ours[tag].buckets, events):
            assert buckets.dtype == np.float64 and buckets.shape[1] == 3
            np.testing.assert_array_equal(buckets.astype(np.float32), tb)    # TensorBoard rounds to float32
    assert ours["weights"].buckets[0][:, 2].sum() == 500


def test_peer_images_match_tensorboard(peer_log):
    ours = read_images(peer_log)["."]["sample"]
    theirs = tb_tensors(peer_log, "images")["sample"]
    assert ours.step.tolist() == [e[0] for e in theirs] and ours.wall_time.tolist() == [e[1] for e in theirs]
    for image, (_, _, tb) in zip(ours.values, theirs):
        assert isinstance(image, Image) and (image.width, image.height) == (5, 6)
        assert [str(image.width).encode(), str(image.height).encode(), *image.encoded] == tb.tolist()
        assert image.encoded[0].startswith(b"\x89PNG")


def test_peer_text_matches_tensorboard(peer_log):
    [(tag, ours)] = read_text(peer_log)["."].items()
    theirs = tb_tensors(peer_log, "text")[tag]
    assert ours.step.tolist() == [e[0] for e in theirs]
    for text, (_, _, tb) in zip(ours.values, theirs):
        assert np.asarray(text).tolist() == np.vectorize(lambda b: b.decode("utf-8"), otypes=[object])(tb).tolist()
    assert np.asarray(ours.values[1]).ravel()[0] == "step **10** \u00e9"


def test_peer_hparams_match_tensorboard(peer_log):
    [(run, got)] = read_hparams(peer_log).items()
    assert run == "trial"
    directory = run_dirs(peer_log)[run]
    content = accumulator(directory).PluginTagToContent("hparams")
    tb = {tag: json_format.MessageToDict(plugin_data_pb2.HParamsPluginData.FromString(c),
                                         preserving_proto_field_name=True) for tag, c in content.items()}
    assert got["hparams"] == tb["_hparams_/session_start_info"]["session_start_info"]["hparams"]
    assert got["hparams"] == {"lr": 0.01, "batch": 32.0, "optimizer": "adam", "nesterov": True}
    assert got["experiment"] == tb["_hparams_/experiment"]["experiment"]
    assert got["status"] == "STATUS_SUCCESS"
    tb_metrics = {tag: values[-1] for tag, (_, _, values) in tb_scalars(directory).items()}
    assert got["metrics"] == tb_metrics and set(tb_metrics) == {"hparam/accuracy", "hparam/loss"}


def test_tailer_kinds_and_plugins_agree_with_tensorboard(peer_log):
    items = LogdirTailer(peer_log).poll()
    acc = accumulator(peer_log)
    for d in items:
        if d.run == "." and d.tag in acc.summary_metadata:
            assert d.plugin == acc.SummaryMetadata(d.tag).plugin_data.plugin_name
    assert {d.kind for d in items} == {"scalar", "histogram", "image", "text", "hparams"}


# -- encodings -------------------------------------------------------------------------------------------------------


def legacy_and_modern_logs(logdir):
    """The same scalars, histograms and images, legacy-encoded in run "legacy" and as tensors in "modern"."""
    rng = np.random.default_rng(1)
    legacy, modern = [version()], [version()]
    png = b"\x89PNG\r\n\x1a\n-fake-image-"
    for step in range(4):
        first = step == 0
        x = float(np.float32(rng.normal()))
        legacy.append(scalar_event("loss", step, x))
        modern.append(event(step, summary=summary(value("loss", "scalars" if first else None,
                                                        tensor=tensor(np.float32(x))))))
        h = proto.HistogramProto(min=-1.5, max=2.5, num=6, sum=1.0, sum_squares=9.0,
                                 bucket_limit=[-2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 1.7976931348623157e308],
                                 bucket=[0, 1, 2, 0, 3, step, 0])
        legacy.append(event(step, summary=summary(value("hist", histo=h))))
        nz = [i for i, c in enumerate(h.bucket) if c]
        edges = [h.min, *h.bucket_limit[nz[0]:nz[-1]], h.max]
        rows = np.array([edges[:-1], edges[1:], h.bucket[nz[0]:nz[-1] + 1]], np.float64).T
        modern.append(event(step, summary=summary(value("hist", "histograms" if first else None,
                                                        tensor=tensor(rows)))))
        legacy.append(event(step, summary=summary(value("img", image=proto.Summary.Image(
            width=7, height=3, colorspace=3, encoded_image_string=png + bytes([step]))))))
        modern.append(event(step, summary=summary(value("img", "images" if first else None, tensor=tensor(
            np.array([b"7", b"3", png + bytes([step])], object))))))
    write(event_file(logdir, "legacy"), *legacy)
    write(event_file(logdir, "modern"), *modern)


def test_legacy_and_tensor_encodings_read_the_same(tmp_path):
    legacy_and_modern_logs(tmp_path)
    scalars, histograms, images = read_scalars(tmp_path), read_histograms(tmp_path), read_images(tmp_path)
    assert ours_as_lists(scalars["legacy"]) == ours_as_lists(scalars["modern"])
    assert ours_as_lists(scalars["legacy"]) == tb_scalars(tmp_path / "legacy") == tb_scalars(tmp_path / "modern")
    a, b = histograms["legacy"]["hist"], histograms["modern"]["hist"]
    assert a.step.tolist() == b.step.tolist() == [0, 1, 2, 3]
    for x, y in zip(a.buckets, b.buckets):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a.buckets[0], [[-1.5, -1.0, 1], [-1.0, 0.0, 2], [0.0, 1.0, 0], [1.0, 2.5, 3]])
    np.testing.assert_array_equal(a.buckets[1][-1], [2.0, 2.5, 1])
    a, b = images["legacy"]["img"], images["modern"]["img"]
    assert a.step.tolist() == b.step.tolist() and a.wall_time.tolist() == b.wall_time.tolist()
    assert a.values == b.values
    assert a.values[2] == Image(7, 3, [b"\x89PNG\r\n\x1a\n-fake-image-\x02"])


def test_float_tensor_scalars_match_tensorboard(tmp_path):
    """Scalars as flowlab's and TensorFlow's writers encode them (decoded column-wise) read as TensorBoard reads them;
    the same bytes under a tag of another plugin stay tensors. A tag that never had metadata ("bare": its first
    record lost) is inferred from its values, a scalar here; TensorBoard never shows such a tag."""
    events = [version()]
    for step in range(40):
        first = step == 0
        events += [float_tensor_event("flowlab", step, step * 0.25, "scalars" if first else None),
                   float_tensor_event("tf", step, -step * 1.5, "scalars" if first else None, shape=True),
                   float_tensor_event("custom", step, step, "custom" if first else None),
                   float_tensor_event("bare", step, step)]
        if step % 9 == 0:
            events.append(scalar_event("legacy", step, step))
    write(event_file(tmp_path), *events)
    ours = read_scalars(tmp_path)["."]
    bare = ours.pop("bare")
    assert ours_as_lists(ours) == tb_scalars(tmp_path) and set(ours) == {"flowlab", "tf", "legacy"}
    assert ours["tf"].value.tolist() == [-s * 1.5 for s in range(40)]
    assert bare.step.tolist() == bare.value.tolist() == list(range(40))
    tensors = read_tensors(tmp_path)["."]
    assert set(tensors) == {"custom"} and tensors["custom"].plugin == "custom"
    itemwise = LogdirTailer(tmp_path).poll()
    assert sorted(normalized(LogdirTailer(tmp_path).poll(columnar=True))) == sorted(normalized(itemwise))


def test_plugin_tensors_graphs_and_session_logs(tmp_path):
    pr = np.arange(12, dtype=np.float32).reshape(2, 6)
    graph = proto.GraphDef(node=[proto.NodeDef(name="x", op="Placeholder"), proto.NodeDef(name="y", op="Relu",
                                                                                         input=["x"])])
    write(event_file(tmp_path), version(),
          event(1, summary=summary(value("pr", "pr_curves", b"\x08\x05", tensor=tensor(pr)))),
          event(2, summary=summary(value("pr", tensor=tensor(pr * 2)))),
          event(3, summary=summary(value("raw", tensor=tensor(np.full((2, 2), 4.5))))),
          event(0, graph_def=graph.SerializeToString()),
          event(4, session_log=proto.SessionLog(status=proto.enum_value("tensorboard.SessionLog.SessionStatus",
                                                                        "CHECKPOINT"), checkpoint_path="/ckpt")))
    tensors = read_tensors(tmp_path)["."]
    assert tensors["pr"].plugin == "pr_curves" and tensors["pr"].plugin_content == b"\x08\x05"
    np.testing.assert_array_equal(tensors["pr"].values[1], pr * 2)
    assert tensors["raw"].plugin == "" and tensors["raw"].values[0].tolist() == [[4.5, 4.5], [4.5, 4.5]]
    theirs = tb_tensors(tmp_path, "pr_curves")["pr"]
    for ours, (_, _, tb) in zip(tensors["pr"].values, theirs):
        np.testing.assert_array_equal(ours, tb)
    assert read_graphs(tmp_path) == {".": [graph.SerializeToString()]}
    assert accumulator(tmp_path).SerializedGraph() == graph.SerializeToString()
    [log] = [d for d in LogdirTailer(tmp_path).poll() if d.kind == "session_log"]
    assert log.value == {"status": "CHECKPOINT", "msg": "", "checkpoint_path": "/ckpt"} and log.step == 4
    assert {d.tag for d in LogdirTailer(tmp_path).poll() if d.kind == "graph"} == {GRAPH_TAG}


# -- incremental reading ---------------------------------------------------------------------------------------------


def normalized(items):
    """Items as plain comparable tuples, columnar scalars expanded into one tuple per value."""
    out = []
    for d in items:
        if isinstance(d.step, np.ndarray):
            out += [(d.run, d.tag, d.kind, s, w, v, d.plugin) for s, w, v in
                    zip(d.step.tolist(), d.wall_time.tolist(), d.value.tolist())]
        else:
            v = d.value.tolist() if isinstance(d.value, np.ndarray) else d.value
            out.append((d.run, d.tag, d.kind, d.step, d.wall_time, v, d.plugin))
    return out


def mixed_records():
    return [version(), scalar_event("a", 0, 1.0), scalar_event("a", 1, 2.0),
            event(1, summary=summary(value("t", "text", tensor=tensor(np.array([b"hi"], object))))),
            event(2, summary=summary(value("s", "scalars", tensor=tensor(np.float32(3.0))))),
            scalar_event("b" * 200, 2, -1.0), scalar_event("a", 300, 4.0), scalar_event("a", -5, 5.0),
            float_tensor_event("s", 3, 6.0), float_tensor_event("s", 4, 7.0, shape=True),
            float_tensor_event("u", 5, 8.0)]


def test_truncation_at_every_byte_is_retried(tmp_path):
    stream = b"".join(frame(e.SerializeToString()) for e in mixed_records())
    path = event_file(tmp_path)
    expected = normalized(write_bytes(path, stream).poll())
    assert [(tag, step, x) for _, tag, kind, step, _, x, _ in expected if kind == "scalar"] == [
        ("a", 0, 1.0), ("a", 1, 2.0), ("s", 2, 3.0), ("b" * 200, 2, -1.0), ("a", 300, 4.0), ("a", -5, 5.0),
        ("s", 3, 6.0), ("s", 4, 7.0), ("u", 5, 8.0)]    # "u" never had metadata: a scalar by its value
    for cut in range(len(stream) + 1):
        with open(path, "wb") as f:
            f.write(stream[:cut])
        t = LogdirTailer(tmp_path)
        first = t.poll()
        with open(path, "ab") as f:
            f.write(stream[cut:])
        got = normalized(first) + normalized(t.poll())
        assert got == expected, cut
        assert t.stats()["records_skipped"] == 0 and t.stats()["records_read"] == len(mixed_records())


def write_bytes(path, data):
    """Write ``data`` as the whole file; a fresh tailer on its directory."""
    with open(path, "wb") as f:
        f.write(data)
    return LogdirTailer(os.path.dirname(path))


def test_columnar_and_itemwise_polls_agree(tmp_path):
    write(event_file(tmp_path), *mixed_records())
    itemwise = LogdirTailer(tmp_path).poll()
    assert not any(isinstance(d.step, np.ndarray) for d in itemwise)
    assert sorted(normalized(LogdirTailer(tmp_path).poll(columnar=True))) == sorted(normalized(itemwise))
    assert [d.kind for d in LogdirTailer(tmp_path).poll(kinds={"text"})] == ["text"]


def test_flipped_bytes_lose_only_that_record(tmp_path):
    records = [version()] + [scalar_event("x", i, float(i)) for i in range(10)]
    framed = [frame(e.SerializeToString()) for e in records]
    victim = 5
    start = sum(map(len, framed[:victim]))
    path = event_file(tmp_path)
    for offset in range(len(framed[victim])):
        stream = bytearray(b"".join(framed))
        stream[start + offset] ^= 0x5A
        t = write_bytes(path, bytes(stream))
        steps = read_scalars(tmp_path)["."]["x"].step.tolist()
        assert steps == [i for i in range(10) if i != victim - 1], offset
        t.poll()
        assert t.stats()["records_skipped"] == 1 and t.stats()["bytes_skipped"] == len(framed[victim])
    # TensorBoard's reader stops at the damaged record.
    assert tb_scalars(tmp_path)["x"][0] == list(range(victim - 1))


def test_garbage_between_records_and_at_the_end(tmp_path):
    path = event_file(tmp_path)
    write(path, version(), scalar_event("x", 1, 1.0))
    with open(path, "ab") as f:
        f.write(b"\x07" * 100)
    t = LogdirTailer(tmp_path)
    assert [d.step for d in t.poll()] == [1]
    write(path, scalar_event("x", 2, 2.0))
    assert [d.step for d in t.poll()] == [2]
    assert t.stats()["records_skipped"] == 1 and t.stats()["bytes_skipped"] == 100


def test_new_files_and_runs_appear_on_later_polls(tmp_path):
    t = LogdirTailer(tmp_path / "logs")
    assert t.poll() == [] and t.stats()["runs"] == 0
    write(event_file(tmp_path / "logs", ".", 1), version(), scalar_event("a", 1, 1.0))
    assert [(d.run, d.step) for d in t.poll()] == [(".", 1)]
    write(event_file(tmp_path / "logs", ".", 2), version(), scalar_event("a", 2, 2.0))
    write(event_file(tmp_path / "logs", "exp/b", 0), version(), scalar_event("a", 7, 7.0))
    write(os.path.join(tmp_path, "logs", "exp", "notes.txt"), version())        # not an event file
    assert [(d.run, d.step) for d in t.poll()] == [(".", 2), ("exp/b", 7)]
    write(event_file(tmp_path / "logs", ".", 1), scalar_event("a", 3, 3.0))     # the older file grows again
    assert [(d.run, d.step) for d in t.poll()] == [(".", 3)]
    assert t.stats()["runs"] == 2 and t.stats()["files"] == 3


def test_following_a_live_writer(tmp_path):
    t, got = LogdirTailer(tmp_path), []
    with peer_writer("tensorboardX")(str(tmp_path), flush_secs=3600) as w:
        for step in range(50):
            w.add_scalar("loss", step * 0.5, step)
            if step % 10 == 0:
                w.add_histogram("h", np.arange(step + 3.0), step)
            if step % 7 == 0:
                w.flush()
                got += normalized(t.poll())
        assert len(got) > 40                    # most of it arrived while the writer was still open
    got += normalized(t.poll())
    assert got == normalized(LogdirTailer(tmp_path).poll())
    assert [x[3] for x in got if x[1] == "loss"] == list(range(50))


def test_infinite_and_string_hparams(tmp_path):
    info = proto.HParamsPluginData()
    info.session_start_info.hparams["clip"].number_value = float("inf")
    info.session_start_info.hparams["act"].string_value = "relu"
    info.session_start_info.hparams["flag"].bool_value = False
    write(event_file(tmp_path), version(), event(0, summary=summary(
        value("_hparams_/session_start_info", "hparams", info.SerializeToString()))))
    assert read_hparams(tmp_path)["."]["hparams"] == {"clip": float("inf"), "act": "relu", "flag": False}


def test_files_are_read_in_name_order(tmp_path):
    write(event_file(tmp_path, ".", 2), version(), scalar_event("a", 5, 2.0))
    write(event_file(tmp_path, ".", 1), version(), scalar_event("a", 4, 1.0))
    assert [d.step for d in LogdirTailer(tmp_path).poll()] == [4, 5]


def test_unchanged_logdir_polls_read_nothing(tmp_path, monkeypatch):
    legacy_and_modern_logs(tmp_path)
    t = LogdirTailer(tmp_path)
    assert t.poll()
    before = t.stats()

    def no_open(*args, **kwargs):
        raise AssertionError("an unchanged file was opened")

    monkeypatch.setattr(logdir_files, "open", no_open, raising=False)
    assert t.poll() == [] and t.poll(columnar=True) == []
    assert t.stats() == before


def test_deleted_and_truncated_files(tmp_path):
    keep, doomed = event_file(tmp_path, ".", 1), event_file(tmp_path, ".", 2)
    write(keep, version(), scalar_event("a", 1, 1.0), scalar_event("a", 2, 2.0))
    write(doomed, version(), scalar_event("b", 1, 1.0))
    t = LogdirTailer(tmp_path)
    assert len(t.poll()) == 3
    os.remove(doomed)
    write(keep, version(), scalar_event("a", 9, 9.0), mode="wb")      # truncated and rewritten, shorter
    reread, *rest = t.poll()        # first what the consumer drops (the steps the file gave), then the file again
    assert reread.kind == "reread" and reread.value["spans"] == {"a": (1, 2)} and "truncated" in reread.value["reason"]
    assert [(d.tag, d.step) for d in rest] == [("a", 9)]
    stats = t.stats()
    assert stats["errors"] == {doomed: "vanished"} and stats["files"] == 1 and stats["resets"] == 1
    write(doomed, version(), scalar_event("b", 5, 5.0))                # it comes back: a new file
    assert [(d.tag, d.step) for d in t.poll()] == [("b", 5)] and t.stats()["errors"] == {}


def test_permission_denied_file_is_reported_and_retried(tmp_path):
    path = event_file(tmp_path)
    write(path, version(), scalar_event("a", 1, 1.0))
    os.chmod(path, 0)
    try:
        if os.access(path, os.R_OK):
            pytest.skip("running as a user that can read a chmod 000 file (root)")
        t = LogdirTailer(tmp_path)
        assert t.poll() == []
        assert "PermissionError" in t.stats()["errors"][path]
    finally:
        os.chmod(path, 0o644)
    assert [d.step for d in t.poll()] == [1] and t.stats()["errors"] == {}


def test_unreadable_file_is_reported_and_retried(tmp_path, monkeypatch):
    """The same as above for any user: opening the file fails the way it does without permission."""
    path = event_file(tmp_path)
    write(path, version(), scalar_event("a", 1, 1.0))
    write(event_file(tmp_path, "other"), version(), scalar_event("b", 2, 2.0))

    def denied(name, *args, **kwargs):
        if name == path:
            raise PermissionError(13, "Permission denied", name)
        return open(name, *args, **kwargs)

    monkeypatch.setattr(logdir_files, "open", denied, raising=False)
    t = LogdirTailer(tmp_path)
    assert [(d.run, d.step) for d in t.poll()] == [("other", 2)]
    assert t.stats()["errors"] == {path: "PermissionError: Permission denied"}
    monkeypatch.undo()
    assert [(d.run, d.step) for d in t.poll()] == [(".", 1)] and t.stats()["errors"] == {}


def test_undecodable_records_and_values_are_skipped(tmp_path):
    path = event_file(tmp_path)
    bad_shape = proto.TensorProto(dtype=1, float_val=[1.0, 2.0])     # a shape that disagrees with its data
    bad_shape.tensor_shape.dim.add(size=3)
    bad_shape.tensor_shape.dim.add(size=-7)
    not_a_scalar = proto.TensorProto(dtype=1, float_val=[1.0, 2.0])  # a consistent shape, but two values
    not_a_scalar.tensor_shape.dim.add(size=2)
    with open(path, "wb") as f:
        f.write(frame(version().SerializeToString()) + frame(b"\xff\xff\xff")
                + frame(event(1, summary=summary(value("s", "scalars", tensor=bad_shape))).SerializeToString())
                + frame(event(1, summary=summary(value("s", "scalars", tensor=not_a_scalar))).SerializeToString())
                + frame(scalar_event("ok", 2, 2.0).SerializeToString()))
    t = LogdirTailer(tmp_path)
    assert [(d.tag, d.step) for d in t.poll()] == [("ok", 2)]
    # the undecodable bytes and the record whose shape disagrees are skipped records; the two-value scalar a value
    assert t.stats()["records_skipped"] == 2 and t.stats()["values_skipped"] == 1


# -- restarts --------------------------------------------------------------------------------------------------------

START = proto.enum_value("tensorboard.SessionLog.SessionStatus", "START")


def start(step):
    return event(step, session_log=proto.SessionLog(status=START))


@pytest.mark.parametrize("files", [1, 2])
def test_session_start_purges_like_tensorboard(tmp_path, files):
    first = [version(), start(0)] + [scalar_event("a", s, s) for s in range(10)] + [
        event(s, summary=summary(value("t", "scalars" if s == 0 else None, tensor=tensor(np.float32(s)))))
        for s in range(10)]
    second = [version(), start(6)] + [scalar_event("a", s, 100 + s) for s in range(6, 8)]
    write(event_file(tmp_path, ".", 1), *first)
    write(event_file(tmp_path, ".", files), *second)
    ours = read_scalars(tmp_path)["."]
    assert ours_as_lists(ours) == tb_scalars(tmp_path)
    assert ours["a"].value.tolist() == [0, 1, 2, 3, 4, 5, 106, 107] and ours["t"].step.tolist() == list(range(6))
    purges = [d for d in LogdirTailer(tmp_path).poll() if d.kind == "purge"]
    assert [(d.run, d.step, d.value) for d in purges] == [(".", 6, None)]       # the first START purges nothing


@pytest.mark.parametrize("encoding", ["plain", "tensor"])
def test_out_of_order_steps_purge_like_tensorboard(tmp_path, encoding):
    """Files without ``brain.Event:2`` purge by tag when the step goes back (TensorBoard's older rule)."""
    def point(tag, step, x):
        if encoding == "plain":
            return scalar_event(tag, step, x)
        return event(step, summary=summary(value(tag, "scalars", tensor=tensor(np.float32(x)))))

    events = [point(tag, s, s) for s in range(1, 10) for tag in ("a", "b")]
    events += [point("a", 4, 40.0), point("a", 5, 50.0), point("b", 10, 10.0)]
    write(event_file(tmp_path), *events)
    ours = read_scalars(tmp_path)["."]
    assert ours_as_lists(ours) == tb_scalars(tmp_path)
    assert ours["a"].step.tolist() == [1, 2, 3, 4, 5] and ours["a"].value.tolist() == [1, 2, 3, 40, 50]
    assert ours["b"].step.tolist() == list(range(1, 11))
    purges = [d for d in LogdirTailer(tmp_path).poll() if d.kind == "purge"]
    assert [(d.step, d.value) for d in purges] == [(4, ("a",))]


def test_versioned_files_do_not_purge_on_steps_going_back(tmp_path):
    write(event_file(tmp_path), version(), *[scalar_event("a", s, s) for s in (1, 2, 3, 2, 4)])
    ours = read_scalars(tmp_path)["."]
    assert ours_as_lists(ours) == tb_scalars(tmp_path)
    assert ours["a"].step.tolist() == [1, 2, 2, 3, 4] and ours["a"].value.tolist() == [1, 2, 2, 3, 4]
    assert not [d for d in LogdirTailer(tmp_path).poll() if d.kind == "purge"]


def test_large_log_in_small_chunks_matches_one_read(tmp_path, monkeypatch):
    events = [version()]
    for s in range(2000):
        events.append(scalar_event(f"tag{s % 7}", s, s * 0.5))
        if s % 97 == 0:
            events.append(event(s, summary=summary(value("h", histo=proto.HistogramProto(
                min=0, max=1, bucket_limit=[0.5, 1.0], bucket=[1, s])))))
    write(event_file(tmp_path), *events)
    whole = normalized(LogdirTailer(tmp_path).poll())
    monkeypatch.setattr(LogdirTailer, "chunk_size", 333)
    assert normalized(LogdirTailer(tmp_path).poll()) == whole
