"""SummaryWriter / EventFileWriter: TensorBoard's own reader (and server) gets back every kind with the right values;
files are named, framed and flushed as TensorBoard's writers do; bad input fails clearly; crashes lose at most the
record being written."""
import io
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time
import urllib.request

import numpy as np
import pytest
from PIL import Image
from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2
from tensorboard.util.tensor_util import make_ndarray

from flowlab.summary import proto
from flowlab.summary.record import RecordScanner, frame
from flowlab.summary.summary_writer import SummaryWriter
from flowlab.summary.writer import EventFileWriter


def accumulate(run_dir):
    acc = EventAccumulator(str(run_dir), size_guidance={"tensors": 0, "scalars": 0, "images": 0,
                                                         "histograms": 0})
    acc.Reload()
    return acc


def series(acc, tag):
    """[(step, wall_time, ndarray)] of a tag as TensorBoard's accumulator reads it."""
    return [(e.step, e.wall_time, make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)]


def event_files(run_dir):
    return sorted(str(p) for p in run_dir.iterdir() if "tfevents" in p.name)


def raw_events(path):
    """Every Event in a file, read with our scanner (which also reports what is left over)."""
    scanner = RecordScanner()
    with open(path, "rb") as f:
        scanner.feed(f.read())
    return [proto.Event.FromString(r) for r in scanner.read()], scanner


# ------------------------------------------------------------------------------------------------ files and records

def test_file_name_and_first_record(tmp_path):
    before = time.time()
    writer = EventFileWriter(tmp_path, filename_suffix=".v2", flush_secs=1000)
    (path,) = event_files(tmp_path)
    assert raw_events(path)[0][0].file_version == "brain.Event:2"       # on disk before any flush
    writer.close()
    name = os.path.basename(path)
    match = re.fullmatch(rf"events\.out\.tfevents\.(\d{{10}})\.{re.escape(socket.gethostname())}\.{os.getpid()}"
                         rf"\.(\d+)\.v2", name)
    assert match, name
    assert int(before) <= int(match.group(1)) <= time.time()
    (first,), scanner = raw_events(path)
    assert first.file_version == "brain.Event:2" and before <= first.wall_time <= time.time()
    assert scanner.pending_bytes() == 0


def test_clean_close_leaves_only_whole_records(tmp_path):
    with SummaryWriter(tmp_path) as w:
        for i in range(500):
            w.add_scalar("loss", 1.0 / (i + 1), i)
        w.add_histogram("weights", np.random.default_rng(0).normal(size=1000), 1)
        w.add_image("picture", np.random.default_rng(1).random((3, 16, 16)), 1)
    (path,) = event_files(tmp_path)
    events, scanner = raw_events(path)
    assert len(events) == 1 + 500 + 2
    assert os.path.getsize(path) == sum(len(frame(e.SerializeToString())) for e in events)
    assert scanner.pending_bytes() == 0 and scanner.corrupt_records == 0


def test_each_write_holds_whole_records(tmp_path):
    writer = EventFileWriter(tmp_path, flush_secs=0.01, max_queue=16)
    writes, real_file = [], writer._file

    class Recording:               # stands in for the raw file: remembers each write's bytes
        def write(self, data):
            writes.append(bytes(data))
            return real_file.write(data)

        def close(self):
            real_file.close()

    writer._file = Recording()
    for i in range(20000):
        writer.add_scalar("x", float(i), i)
    writer.close()
    assert len(writes) > 1
    for chunk in writes:
        scanner = RecordScanner()
        scanner.feed(chunk)
        assert scanner.read() and scanner.pending_bytes() == 0


def test_writers_in_the_same_second_get_distinct_files(tmp_path):
    writers = [EventFileWriter(tmp_path) for _ in range(5)]
    for w in writers:
        w.close()
    assert len({w.path for w in writers}) == 5 == len(event_files(tmp_path))


def test_flush_makes_data_readable_at_once(tmp_path):
    w = SummaryWriter(tmp_path, flush_secs=1000)
    for i in range(10):
        w.add_scalar("loss", float(i), i)
    w.flush()
    assert [s for s, _, _ in series(accumulate(tmp_path), "loss")] == list(range(10))
    w.add_scalar("loss", 10.0, 10)
    w.flush()
    assert len(series(accumulate(tmp_path), "loss")) == 11
    w.close()


@pytest.mark.parametrize("finish", ["flush", "close"])
def test_flush_and_close_wait_for_watch_handlers_still_writing(tmp_path, finish):
    """A ``-> None`` job returns before its watch handlers have run (on the dispatcher thread); what they write to a
    writer is in the file once the writer is flushed or closed right after the last call."""
    import flowlab as flow
    import flowlab.typing as tp
    flow.clear_default_session()
    w = SummaryWriter(tmp_path, flush_secs=1000)

    def slow_writer(value: tp.Numpy):
        time.sleep(0.05)
        w.add_scalar("watched", float(value.sum()), 0)

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((3,))) -> None:
        flow.watch(x * 2, slow_writer)
    job(np.ones(3, np.float32))
    getattr(w, finish)()
    assert [float(v) for _, _, v in series(accumulate(tmp_path), "watched")] == [6.0]
    w.close()


def test_background_thread_flushes_every_flush_secs(tmp_path):
    w = SummaryWriter(tmp_path, flush_secs=0.1)
    w.add_scalar("loss", 1.0, 0)
    deadline = time.time() + 5
    while not (os.path.getsize(w.file_writer.path) and "loss" in accumulate(tmp_path).Tags()["tensors"]):
        assert time.time() < deadline, "the queued scalar never reached the file"
        time.sleep(0.05)
    w.close()


def test_close_is_idempotent_and_later_writes_fail(tmp_path):
    w = SummaryWriter(tmp_path)
    w.add_scalar("a", 1.0)
    w.close()
    w.close()
    w.flush()
    with pytest.raises(ValueError, match="closed"):
        w.add_scalar("a", 2.0)


def _run_python(code, **kwargs):
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], **kwargs)


def test_writers_left_open_are_flushed_at_exit(tmp_path):
    proc = _run_python(f"""
        from flowlab.summary.summary_writer import SummaryWriter
        w = SummaryWriter({str(tmp_path)!r}, flush_secs=1000)
        for i in range(100):
            w.add_scalar("loss", float(i), i)
        """)
    assert proc.wait(60) == 0
    assert [s for s, _, _ in series(accumulate(tmp_path), "loss")] == list(range(100))


def test_sigkill_loses_at_most_the_record_being_written(tmp_path):
    proc = _run_python(f"""
        from flowlab.summary.writer import EventFileWriter
        w = EventFileWriter({str(tmp_path)!r}, flush_secs=0.01)
        i = 0
        while True:
            w.add_scalar("x", float(i), i)
            i += 1
        """)
    try:
        deadline = time.time() + 60
        while True:
            files = event_files(tmp_path)
            if files and os.path.getsize(files[0]) > 300_000:
                break
            assert time.time() < deadline and proc.poll() is None, "the writer process wrote nothing"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    (path,) = event_files(tmp_path)
    data = open(path, "rb").read()
    events, scanner = raw_events(path)
    assert scanner.corrupt_records == 0
    steps = [e.step for e in events[1:]]
    assert steps == list(range(len(steps))) and len(steps) > 1000
    assert [e.summary.value[0].tensor.float_val[0] for e in events[1:]] == [float(s) for s in steps]
    tail = data[scanner.offset:]                # at most one partial record: a prefix of a single framed record
    if len(tail) >= 8:
        (length,) = struct.unpack("<Q", tail[:8])
        assert len(tail) < 12 + length + 4 and length == len(events[-1].SerializeToString())
    # TensorBoard reads everything up to the last complete record.
    assert [s for s, _, _ in series(accumulate(tmp_path), "x")] == steps


# ------------------------------------------------------------------------------------------------ kinds

def test_scalars_values_steps_walltimes_and_nonfinite(tmp_path):
    values = [0.5, 3, np.float32(0.25), np.array(7.0), np.array([2.5]), True, float("nan"), float("inf"),
              -float("inf"), np.float64(1e-3)]
    with SummaryWriter(tmp_path) as w:
        for i, v in enumerate(values):
            w.add_scalar("metric/value", v, global_step=np.int64(10 * i), walltime=1000.0 + i)
    got = series(accumulate(tmp_path), "metric/value")
    assert [s for s, _, _ in got] == [10 * i for i in range(len(values))]
    assert [t for _, t, _ in got] == [1000.0 + i for i in range(len(values))]
    assert all(a.shape == () and a.dtype == np.float32 for _, _, a in got)
    np.testing.assert_array_equal([a for _, _, a in got],
                                  np.array([float(np.asarray(v).item()) for v in values], np.float32))


def test_metadata_on_every_record_but_scalars_which_repeat_it_every_1000th(tmp_path):
    """TensorBoard keeps a tag's first metadata and ignores repeats; repeating it means a damaged first record no
    longer hides a tag's plugin from a reader that skips damaged records."""
    from flowlab.summary.writer import SCALAR_METADATA_EVERY
    with SummaryWriter(tmp_path) as w:
        for step in range(3):
            w.add_histogram("weights", np.arange(10.0), step)
            w.add_image("picture", np.zeros((1, 2, 2)), step)
            w.add_text("note", "hello", step)
            w.file_writer.add_summary([proto.Summary.Value(tag="other", metadata=proto.SummaryMetadata(
                display_name="first")), proto.Summary.Value(tag="loss2", simple_value=1.0)], step)
        for step in range(2 * SCALAR_METADATA_EVERY + 1):
            w.add_scalar("loss", 1.0, step)
    events, _ = raw_events(event_files(tmp_path)[0])
    with_metadata = {}
    for event in events[1:]:
        for value in event.summary.value:
            with_metadata.setdefault(value.tag, []).append(value.HasField("metadata"))
    for tag in ("weights", "picture", "note", "other"):
        assert with_metadata[tag] == [True, True, True], tag
    assert with_metadata["loss2"] == [False, False, False]
    assert [i for i, has in enumerate(with_metadata["loss"]) if has] == [0, SCALAR_METADATA_EVERY,
                                                                          2 * SCALAR_METADATA_EVERY]
    acc = accumulate(tmp_path)
    assert acc.SummaryMetadata("loss").plugin_data.plugin_name == "scalars"
    assert acc.SummaryMetadata("weights").plugin_data.plugin_name == "histograms"
    assert acc.SummaryMetadata("picture").plugin_data.plugin_name == "images"
    assert acc.SummaryMetadata("note").plugin_data.plugin_name == "text"
    assert len(acc.Tensors("weights")) == 3 and len(acc.Tensors("loss")) == 2 * SCALAR_METADATA_EVERY + 1


def test_histograms(tmp_path):
    rng = np.random.default_rng(0)
    data = rng.normal(size=(50, 40))
    with_nonfinite = np.concatenate([rng.normal(size=97), [np.nan, np.inf, -np.inf]])
    with SummaryWriter(tmp_path) as w:
        w.add_histogram("normal", data, 0)
        w.add_histogram("normal", data * 2, 1, bins=10)
        w.add_histogram("constant", np.full(7, 3.5), 0)
        w.add_histogram("auto", data, 0, bins="auto")
        w.add_histogram("ints", np.arange(100, dtype=np.int32), 0)
        w.add_histogram("anomalous", np.ones(5), 0)
        w.add_histogram("anomalous", with_nonfinite, 1)
        w.add_histogram("anomalous", np.ones(5), 2)
    acc = accumulate(tmp_path)
    (_, _, h0), (_, _, h1) = series(acc, "normal")
    assert h0.shape == (30, 3) and h1.shape == (10, 3) and h0.dtype == np.float64
    assert h0[:, 2].sum() == data.size and h0[0, 0] == data.min() and h0[-1, 1] == data.max()
    np.testing.assert_allclose(np.diff(h0[:, 0]), (data.max() - data.min()) / 30)
    np.testing.assert_array_equal(h0[1:, 0], h0[:-1, 1])
    np.testing.assert_array_equal(h0[:, 2], np.histogram(data, bins=30)[0])
    (_, _, const), = series(acc, "constant")
    assert (const[:, :2] == 3.5).all() and const[:, 2].tolist() == [0] * 29 + [7]
    (_, _, auto), = series(acc, "auto")
    assert auto[:, 2].sum() == data.size
    (_, _, ints), = series(acc, "ints")
    assert ints[:, 2].sum() == 100 and ints[0, 0] == 0 and ints[-1, 1] == 99
    anomalous = series(acc, "anomalous")
    assert [h[:, 2].sum() for _, _, h in anomalous] == [5, 97, 5]
    # NaN/Inf counts appear from the first step that had any, and stay (as zeros) afterwards.
    assert [(s, float(v)) for s, _, v in series(acc, "anomalous/nan_count")] == [(1, 1.0), (2, 0.0)]
    assert [(s, float(v)) for s, _, v in series(acc, "anomalous/inf_count")] == [(1, 2.0), (2, 0.0)]
    assert "normal/nan_count" not in acc.Tags()["tensors"]


def _decode(image_tensor):
    width, height, *pngs = make_ndarray(image_tensor).tolist()
    return int(width), int(height), [np.asarray(Image.open(io.BytesIO(p))) for p in pngs]


def test_images(tmp_path):
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (3, 5, 7), dtype=np.uint8)              # CHW
    rgba = rng.integers(0, 256, (5, 7, 4), dtype=np.uint8)             # HWC
    gray = rng.integers(0, 256, (5, 7), dtype=np.uint8)                # HW
    batch = rng.integers(0, 256, (3, 3, 5, 7), dtype=np.uint8)         # NCHW
    with SummaryWriter(tmp_path) as w:
        w.add_image("rgb", rgb, 1)
        w.add_image("rgb_float", rgb / 255.0, 1)
        w.add_image("rgba", rgba, 2, dataformats="HWC")
        w.add_image("gray", gray, 3, dataformats="HW")
        w.add_images("batch", batch, 4)
        w.add_images("batch_float", np.moveaxis(batch, 1, -1).astype(np.float32) / 255, 4, dataformats="NHWC")
    acc = accumulate(tmp_path)

    def only(tag):
        (event,) = acc.Tensors(tag)
        return event.step, _decode(event.tensor_proto)

    expected_rgb = np.moveaxis(rgb, 0, -1)
    step, (width, height, (img,)) = only("rgb")
    assert (step, width, height) == (1, 7, 5)
    np.testing.assert_array_equal(img, expected_rgb)
    np.testing.assert_array_equal(only("rgb_float")[1][2][0], expected_rgb)
    np.testing.assert_array_equal(only("rgba")[1][2][0], rgba)
    np.testing.assert_array_equal(only("gray")[1][2][0], gray)
    for tag in ("batch", "batch_float"):
        step, (width, height, images) = only(tag)
        assert (step, width, height, len(images)) == (4, 7, 5, 3)
        np.testing.assert_array_equal(np.stack(images), np.moveaxis(batch, 1, -1))


def test_text(tmp_path):
    with SummaryWriter(tmp_path) as w:
        w.add_text("notes", "# Title\nsome *markdown* — ünïcode", 3)
        w.add_text("table", [["a", "b"], ["c", "d"]], 4)
    acc = accumulate(tmp_path)
    (step, _, note), = series(acc, "notes")
    assert step == 3 and note.shape == () and note.item().decode() == "# Title\nsome *markdown* — ünïcode"
    (_, _, table), = series(acc, "table")
    assert table.shape == (2, 2) and table[1, 0] == b"c"


def _hparams_content(acc):
    content = acc.PluginTagToContent("hparams")
    return {tag: plugin_data_pb2.HParamsPluginData.FromString(data) for tag, data in content.items()}


def test_hparams_in_the_same_run(tmp_path):
    with SummaryWriter(tmp_path) as w:
        for step in range(3):
            w.add_scalar("loss", 1.0 / (step + 1), step)
        trial = w.add_hparams({"lr": 0.01, "layers": 3, "optimizer": "adam", "batch_norm": True},
                              {"hparam/accuracy": 0.5, "hparam/loss": 0.7},
                              hparam_domain_discrete={"optimizer": ["adam", "sgd"]})
        assert trial is w
        w.add_hparams({"lr": 0.01, "layers": 3, "optimizer": "adam", "batch_norm": True},
                      {"hparam/accuracy": 0.75}, global_step=10)
        w.add_scalar("hparam/loss", 0.25, 11)
    acc = accumulate(tmp_path)
    content = _hparams_content(acc)
    assert set(content) == {"_hparams_/experiment", "_hparams_/session_start_info", "_hparams_/session_end_info"}
    experiment = content["_hparams_/experiment"].experiment
    infos = {i.name: i for i in experiment.hparam_infos}
    assert {name: api_pb2.DataType.Name(i.type) for name, i in infos.items()} == {
        "lr": "DATA_TYPE_FLOAT64", "layers": "DATA_TYPE_FLOAT64", "optimizer": "DATA_TYPE_STRING",
        "batch_norm": "DATA_TYPE_BOOL"}
    assert [v.string_value for v in infos["optimizer"].domain_discrete.values] == ["adam", "sgd"]
    assert [m.name.tag for m in experiment.metric_infos] == ["hparam/accuracy", "hparam/loss"]
    start = content["_hparams_/session_start_info"].session_start_info
    assert start.hparams["lr"].number_value == 0.01 and start.hparams["layers"].number_value == 3
    assert start.hparams["optimizer"].string_value == "adam" and start.hparams["batch_norm"].bool_value is True
    end = content["_hparams_/session_end_info"].session_end_info
    assert end.status == api_pb2.STATUS_SUCCESS and end.end_time_secs >= start.start_time_secs
    assert [(s, float(v)) for s, _, v in series(acc, "hparam/accuracy")] == [(0, 0.5), (10, 0.75)]
    assert [(s, float(v)) for s, _, v in series(acc, "hparam/loss")] == [(0, pytest.approx(0.7)), (11, 0.25)]
    assert len(series(acc, "loss")) == 3             # the curves share the run


def test_hparams_run_name_failure_status_and_misuse(tmp_path):
    with pytest.raises(RuntimeError):
        with SummaryWriter(tmp_path) as w:
            trial = w.add_hparams({"lr": 0.1}, {"acc": 0.5}, run_name="trial-1")
            assert trial.logdir == str(tmp_path / "trial-1")
            with pytest.raises(ValueError, match="already holds the hparams"):
                trial.add_hparams({"lr": 0.2}, {"acc": 0.5})
            with pytest.raises(ValueError, match=r"\['other'\] were not in"):
                trial.add_hparams({"lr": 0.1}, {"other": 0.5})
            raise RuntimeError("training diverged")
    assert not any(tag.startswith("_hparams_/") for tag in accumulate(tmp_path).Tags()["tensors"])
    content = _hparams_content(accumulate(tmp_path / "trial-1"))
    assert content["_hparams_/session_end_info"].session_end_info.status == api_pb2.STATUS_FAILURE


def test_add_scalars_writes_one_run_per_key(tmp_path):
    with SummaryWriter(tmp_path) as w:
        for step in range(3):
            w.add_scalars("loss/compare", {"train": step, "valid": 2 * step}, step)
    for key, factor in (("train", 1), ("valid", 2)):
        got = series(accumulate(tmp_path / f"loss_compare_{key}"), "loss/compare")
        assert [(s, float(v)) for s, _, v in got] == [(s, float(factor * s)) for s in range(3)]


def test_tensorboardx_and_flowlab_write_the_same_scalars(tmp_path):
    from tensorboardX import SummaryWriter as TensorboardXWriter
    values = [0.1, 2.5, -3.0, 1e-7, float("nan"), 12345.678]
    for directory, writer_class in (("ours", SummaryWriter), ("tbx", TensorboardXWriter)):
        with writer_class(str(tmp_path / directory)) as w:
            for step, value in enumerate(values):
                w.add_scalar("loss", value, step * 5, walltime=100.0 + step)
    ours, theirs = (series(accumulate(tmp_path / d), "loss") for d in ("ours", "tbx"))
    assert [(s, t) for s, t, _ in ours] == [(s, t) for s, t, _ in theirs] == [(5 * i, 100.0 + i)
                                                                              for i in range(len(values))]
    np.testing.assert_array_equal([float(v) for _, _, v in ours], [float(v) for _, _, v in theirs])


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_tensorboard_server_lists_every_kind_and_the_hparams_session(tmp_path):
    with SummaryWriter(tmp_path / "trial") as w:
        w.add_scalar("loss", 0.5, 1)
        w.add_histogram("weights", np.arange(10.0), 1)
        w.add_image("picture", np.zeros((3, 4, 4)), 1)
        w.add_text("note", "hi", 1)
        w.add_hparams({"lr": 0.1, "optimizer": "adam"}, {"hparam/accuracy": 0.5})
        w.add_hparams({"lr": 0.1, "optimizer": "adam"}, {"hparam/accuracy": 0.9}, global_step=5)
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(tmp_path),
                               "--host", "localhost", "--port", str(port), "--load_fast", "false",
                               "--reload_interval", "0", "--reload_task", "blocking"],    # load once, then serve
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://localhost:{port}/data/"

    def get(path, body=None):
        request = urllib.request.Request(url + path, data=body and json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(request, timeout=30).read())

    try:
        deadline = time.time() + 60
        while True:
            try:
                tags = {plugin: get(f"plugin/{plugin}/tags") for plugin in ("scalars", "histograms", "images",
                                                                             "text")}
                break
            except OSError:
                assert time.time() < deadline and server.poll() is None, "TensorBoard did not start"
                time.sleep(0.2)
        assert set(tags["scalars"]["trial"]) == {"loss", "hparam/accuracy"}
        assert set(tags["histograms"]["trial"]) == {"weights"} and set(tags["images"]["trial"]) == {"picture"}
        assert tags["text"]["trial"] == ["note"]
        groups = get("plugin/hparams/session_groups", {
            "experimentName": "", "startIndex": 0, "sliceSize": 10, "colParams": [],
            "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"]})
        (group,) = groups["sessionGroups"]
        assert group["hparams"] == {"lr": 0.1, "optimizer": "adam"}
        (session,) = group["sessions"]
        assert session["status"] == "STATUS_SUCCESS"
        (metric,) = session["metricValues"]
        assert metric["name"]["tag"] == "hparam/accuracy" and metric["trainingStep"] == 5
        assert metric["value"] == pytest.approx(0.9)
    finally:
        server.kill()
        server.wait()


# ------------------------------------------------------------------------------------------------ bad input

BAD_CALLS = [
    (lambda w: w.add_scalar(3, 1.0), TypeError, r"tag must be a str, got int 3"),
    (lambda w: w.add_scalar("", 1.0), ValueError, r"tag must be a non-empty str"),
    (lambda w: w.add_scalar("x", "1.0"), TypeError, r"scalar_value must be a real number, got str '1.0'"),
    (lambda w: w.add_scalar("x", np.array([1.0, 2.0])), ValueError,
     r"scalar_value must be a single number .* got an array of shape \(2,\)"),
    (lambda w: w.add_scalar("x", 1 + 2j), TypeError, r"scalar_value must be a real number, got complex"),
    (lambda w: w.add_scalar("x", np.array(["a"])), TypeError, r"scalar_value must be a real number, got an array "
                                                              r"of dtype <U1"),
    (lambda w: w.add_scalar("x", 1.0, global_step=1.5), TypeError, r"global_step must be an int, got float"),
    (lambda w: w.add_scalar("x", 1.0, global_step=2**64), ValueError, r"global_step must fit in 64 bits \(int64\), got 18446744073709551616"),
    (lambda w: w.add_scalars("m", [1.0]), TypeError, r"tag_scalar_dict must be a dict"),
    (lambda w: w.add_scalars("m", {"a": "b"}), TypeError, r"tag_scalar_dict\['a'\] must be a real number"),
    (lambda w: w.add_histogram("h", ["a", "b"]), TypeError, r"values must hold real numbers, got an array of "
                                                           r"dtype <U1"),
    (lambda w: w.add_histogram("h", [1.0, 2.0], bins=0), ValueError, r"bins must be a positive int"),
    (lambda w: w.add_histogram("h", [1.0, 2.0], bins="nonsense"), ValueError, r"bins='nonsense'"),
    (lambda w: w.add_image("i", np.zeros((3, 4, 4), np.int32)), TypeError,
     r"img must be uint8 \(0..255\) or floating point \(0..1\), got dtype int32"),
    (lambda w: w.add_image("i", np.zeros((5, 4, 4))), ValueError, r"img of shape \(5, 4, 4\) with "
                                                                  r"dataformats='CHW' has 5 channels; expected 1, 3"),
    (lambda w: w.add_image("i", np.zeros((4, 4))), ValueError,
     r"img has shape \(4, 4\) \(2 axes\), but dataformats='CHW' describes 3 axes"),
    (lambda w: w.add_image("i", np.full((3, 4, 4), 2.0)), ValueError,
     r"floating-point pixels must lie in \[0, 1\], got min 2.0, max 2.0"),
    (lambda w: w.add_image("i", np.full((3, 4, 4), np.nan)), ValueError, r"must lie in \[0, 1\]"),
    (lambda w: w.add_image("i", np.zeros((3, 4, 4)), dataformats="CXY"), ValueError, r"dataformats must name"),
    (lambda w: w.add_image("i", np.zeros((1, 3, 4, 4)), dataformats="NCHW"), ValueError, r"dataformats must name"),
    (lambda w: w.add_images("i", np.zeros((0, 3, 4, 4))), ValueError,
     r"imgs has shape \(0, 3, 4, 4\) with dataformats='NCHW': N is 0; expected at least one image"),
    (lambda w: w.add_text("t", 5), TypeError, r"text_string must be a str or an array of str, got int"),
    (lambda w: w.add_hparams({"lr": None}, {}), TypeError,
     r"hparam 'lr' must be a bool, int, float or str, got NoneType None"),
    (lambda w: w.add_hparams({"layers": [1, 2]}, {}), TypeError, r"hparam 'layers' must be .* got list"),
    (lambda w: w.add_hparams({"lr": 0.1}, {"acc": "high"}), TypeError,
     r"metric_dict\['acc'\] must be a real number, got str"),
    (lambda w: w.add_hparams({"lr": 0.1}, {}, hparam_domain_discrete={"lr": [0.1, "x"]}), TypeError,
     r"hparam_domain_discrete\['lr'\] holds str 'x', but hparam 'lr' is float"),
    (lambda w: w.add_hparams([("lr", 0.1)], {}), TypeError, r"hparam_dict and metric_dict must be dicts"),
]


@pytest.mark.parametrize("call, error, message", BAD_CALLS)
def test_bad_input_fails_clearly_and_writes_nothing(tmp_path, call, error, message):
    with SummaryWriter(tmp_path) as w:
        with pytest.raises(error, match=message):
            call(w)
        w.add_scalar("after", 1.0)                  # the writer is still usable
    events, _ = raw_events(event_files(tmp_path)[0])
    assert [v.tag for e in events[1:] for v in e.summary.value] == ["after"]


def test_logdir_that_is_a_file(tmp_path):
    path = tmp_path / "not-a-dir"
    path.write_text("x")
    with pytest.raises(NotADirectoryError, match=r"logdir .*not-a-dir' exists and is not a directory"):
        SummaryWriter(path)
    with pytest.raises(NotADirectoryError, match=r"cannot write an event file in logdir .*not-a-dir/run'"):
        SummaryWriter(path / "run")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_logdir_that_is_not_writable(tmp_path):
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(PermissionError, match="cannot write an event file in logdir"):
            SummaryWriter(tmp_path / "run")
    finally:
        tmp_path.chmod(0o700)
