"""The writer under faults, each real: bad calls (rejected at once, never breaking what was accepted), damaged
records (one lost record per damage, for every kind), sub-run names that try to leave the logdir, a full disk (a
tmpfs mounted here when we are root) and a file-size limit (RLIMIT_FSIZE in a subprocess: EFBIG from the kernel),
SIGTERM (a real subprocess), and inputs that used to fail deep inside NumPy or protobuf. Logs are read back with
TensorBoard's own reader and with flowlab's."""
import errno
import math
import os
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import pytest
from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
from tensorboard.util.tensor_util import make_ndarray

import flowlab as flow
from flowlab.summary import (encode, oneflow_api, proto, read_histograms, read_hparams, read_images, read_scalars,
                             read_tensors, read_text)
from flowlab.summary.record import RecordScanner
from flowlab.summary.summary_writer import SummaryWriter
from flowlab.summary.writer import SCALAR_METADATA_EVERY, EventFileWriter


def accumulate(run_dir):
    acc = EventAccumulator(str(run_dir), size_guidance={"tensors": 0, "scalars": 0, "images": 0,
                                                         "histograms": 0})
    acc.Reload()
    return acc


def tb_steps(run_dir, tag):
    return [e.step for e in accumulate(run_dir).Tensors(tag)]


def event_files(run_dir):
    return sorted(p.path for p in os.scandir(run_dir) if "tfevents" in p.name)


def whole_records(path):
    """(events, scanner) of one file: every record must be whole and valid."""
    scanner = RecordScanner()
    with open(path, "rb") as f:
        scanner.feed(f.read())
    events = [proto.Event.FromString(r) for r in scanner.read()]
    assert scanner.corrupt_records == 0 and scanner.pending_bytes() == 0, path
    return events, scanner


def run_python(code, **kwargs):
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


# ------------------------------------------------------------------------------------------------ bad calls

BAD = "bad\ud800"           # a lone surrogate: a str Python accepts and UTF-8 (protobuf) refuses

BAD_CALLS = [
    (lambda w: w.add_scalar(BAD, 1.0, 0), ValueError,
     r"tag must be text that can be written as UTF-8, got 'bad\\ud800' with '\\ud800' at index 3"),
    (lambda w: w.file_writer.add_scalar(BAD, 1.0, 0), ValueError, r"tag must be text that can be written as UTF-8"),
    (lambda w: w.add_scalars(BAD, {"a": 1.0}), ValueError, r"main_tag must be text"),
    (lambda w: w.add_scalars("m", {BAD: 1.0}), ValueError, r"tag_scalar_dict key must be text"),
    (lambda w: w.add_histogram(BAD, [1.0, 2.0]), ValueError, r"tag must be text"),
    (lambda w: w.add_image(BAD, np.zeros((1, 2, 2))), ValueError, r"tag must be text"),
    (lambda w: w.add_images(BAD, np.zeros((1, 1, 2, 2))), ValueError, r"tag must be text"),
    (lambda w: w.add_text(BAD, "x"), ValueError, r"tag must be text"),
    (lambda w: w.add_text("t", "text " + BAD), ValueError, r"text_string strings must be text"),
    (lambda w: w.add_text("t", ["ok", BAD]), ValueError, r"text_string strings must be text"),
    (lambda w: w.add_hparams({BAD: 1.0}, {}), ValueError, r"hparam name must be text"),
    (lambda w: w.add_hparams({"opt": BAD}, {}), ValueError, r"hparam 'opt' must be text"),
    (lambda w: w.add_hparams({"lr": 0.1}, {BAD: 1.0}), ValueError, r"metric tag must be text"),
    (lambda w: w.add_embedding(np.eye(3), tag=BAD), ValueError, r"tag must be text"),
    (lambda w: w.add_embedding(np.eye(3), metadata=["a", BAD, "c"]), ValueError, r"metadata labels must be text"),
    (lambda w: w.add_embedding(np.eye(2), metadata=[["a", "b"], ["c", BAD]], metadata_header=["x", "y"]),
     ValueError, r"metadata labels must be text"),
    (lambda w: w.add_hparams({"lr": 0.1}, {}, run_name=BAD), ValueError, r"run_name must be text"),
    (lambda w: w.add_hparams({"opt": "a"}, {}, hparam_domain_discrete={"opt": ["a", BAD]}), ValueError,
     r"hparam 'opt' must be text"),
    (lambda w: w.file_writer.add_summary([proto.Summary.Value(tag="ok", simple_value=1.0)], step=2**63),
     ValueError, r"step must fit in 64 bits \(int64\), got 9223372036854775808"),
    (lambda w: w.file_writer.add_scalar("x", 1.0, np.uint64(2**64 - 1)), ValueError,
     r"step must fit in 64 bits \(int64\), got 18446744073709551615"),
    (lambda w: w.file_writer.add_scalar("x", 1.0, 0, wall_time="now"), TypeError,
     r"wall_time must be a real number, got str 'now'"),
    (lambda w: w.add_scalar("x", 10 ** 400), ValueError,
     r"scalar_value must be a real number within float64's range .* got int 1000.*000 \(401 characters\)"),
    (lambda w: w.add_scalar("x", 1.0, walltime=-10 ** 400), ValueError, r"walltime must be a real number within"),
    (lambda w: w.add_scalars("m", {"a": 10 ** 400}), ValueError, r"tag_scalar_dict\['a'\] must be a real number "
                                                                  r"within float64's range"),
    (lambda w: w.add_hparams({"lr": 0.1}, {"acc": 10 ** 400}), ValueError, r"metric_dict\['acc'\] must be a real"),
    (lambda w: w.add_histogram("h", [1.0, 2.0], bins=10 ** 8), ValueError,
     r"bins=100000000 asks for 100,000,000 buckets; at most 65,536"),
    (lambda w: w.add_histogram("h", np.r_[np.linspace(0, 1e-6, 1000), 1e9], bins="fd"), ValueError,
     r"bins='fd' asks for about 1.0e\+16 buckets; at most 65,536"),
    (lambda w: w.add_images("i", np.zeros((0, 3, 4, 4))), ValueError,
     r"imgs has shape \(0, 3, 4, 4\) with dataformats='NCHW': N is 0; expected at least one image"),
    (lambda w: w.add_images("i", np.zeros((2, 4, 0, 3)), dataformats="NHWC"), ValueError,
     r"imgs has shape \(2, 4, 0, 3\) with dataformats='NHWC': W is 0"),
    (lambda w: w.add_image("i", np.zeros((3, 0, 4))), ValueError, r"img has shape \(3, 0, 4\) .*: H is 0"),
]


@pytest.mark.parametrize("call, error, message", BAD_CALLS)
def test_a_bad_call_is_rejected_at_once_and_loses_nothing_accepted(tmp_path, call, error, message):
    """It used to be accepted and then broke every later call, flush() and close(), losing what was queued."""
    w = SummaryWriter(tmp_path, flush_secs=1000)
    for i in range(1000):
        w.add_scalar("before", float(i), i)
    with pytest.raises(error, match=message):
        call(w)
    for i in range(10):
        w.add_scalar("after", float(i), i)
    w.flush()
    w.close()
    assert tb_steps(tmp_path, "before") == list(range(1000))
    assert tb_steps(tmp_path, "after") == list(range(10))
    events, _ = whole_records(event_files(tmp_path)[0])
    assert {v.tag for e in events[1:] for v in e.summary.value} == {"before", "after"}
    scalars = read_scalars(tmp_path)["."]
    assert scalars["before"].value.tolist() == [float(i) for i in range(1000)]
    assert set(scalars) == {"before", "after"}
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == []     # no sub-run was started


def test_a_refused_first_value_leaves_the_plugin_metadata_to_the_next(tmp_path):
    with SummaryWriter(tmp_path) as w:
        with pytest.raises(TypeError, match="scalar_value must be a real number"):
            w.add_scalar("loss", "high", 0)
        with pytest.raises(ValueError, match="global_step must fit in 64 bits"):
            w.add_scalar("loss", 1.0, 2 ** 63)
        w.add_scalar("loss", 1.0, 1)
        with pytest.raises(ValueError, match="step must fit"):
            w.file_writer.add_summary([encode.scalar("acc", 0.5)], step=-2 ** 63 - 1)
        w.file_writer.add_summary([encode.scalar("acc", 0.5)], step=1)
    events, _ = whole_records(event_files(tmp_path)[0])
    assert [v.HasField("metadata") for e in events[1:] for v in e.summary.value] == [True, True]
    scalars = read_scalars(tmp_path)["."]
    assert scalars["loss"].step.tolist() == [1] and scalars["acc"].step.tolist() == [1]
    assert accumulate(tmp_path).SummaryMetadata("loss").plugin_data.plugin_name == "scalars"


def test_hparams_helpers_and_add_event_check_their_text(tmp_path):
    with pytest.raises(ValueError, match=r"display_name must be text that can be written as UTF-8"):
        flow.summary.HParam("lr", display_name=BAD)
    with pytest.raises(TypeError, match=r"description must be a str or None, got int 3"):
        flow.summary.Metric("acc", description=3)
    from tensorboard.compat.proto import event_pb2
    w = EventFileWriter(tmp_path)
    with pytest.raises(TypeError, match=r"event must be a tensorboard.Event message, got dict"):
        w.add_event({"step": 1})
    w.add_event(event_pb2.Event(step=3, file_version="brain.Event:2"))     # TensorBoard's own class is fine
    w.close()
    events, _ = whole_records(w.path)
    assert [e.step for e in events] == [0, 3]


def test_bins_over_the_cap_fail_before_the_data_is_touched(tmp_path):
    class Untouchable:
        def __array__(self, *args, **kwargs):
            raise AssertionError("the data was read")
    with SummaryWriter(tmp_path) as w:
        t0 = time.perf_counter()
        with pytest.raises(ValueError, match="asks for 100,000,000 buckets"):
            w.add_histogram("h", Untouchable(), bins=10 ** 8)
        assert time.perf_counter() - t0 < 0.5
        w.add_histogram("h", np.arange(10.0), bins=65536)       # the cap itself is allowed


def test_histograms_of_values_near_float64s_limits(tmp_path):
    """NumPy refuses these ranges ("Too many bins for data range"): max - min overflows, or spans a few ulps."""
    huge = np.array([-1.7e308, 1.7e308, 0.0, 1.0, -1.0, np.inf, np.nan])
    tiny = np.array([1.0, np.nextafter(1.0, 2.0), 1.0])
    with SummaryWriter(tmp_path) as w:
        w.add_histogram("huge", huge, 0)
        w.add_histogram("huge", huge, 1, bins=4)
        w.add_histogram("huge", huge, 2, bins="sturges")
        w.add_histogram("tiny", tiny, 0)
    acc = accumulate(tmp_path)
    first, four, sturges = (make_ndarray(e.tensor_proto) for e in acc.Tensors("huge"))
    for buckets in (first, four, sturges):
        assert np.isfinite(buckets).all()
        assert buckets[0, 0] == -1.7e308 and buckets[-1, 1] == 1.7e308
        assert buckets[:, 2].sum() == 5                          # NaN and Inf are counted apart
        assert (np.diff(buckets[:, 0]) >= 0).all()
    assert len(first) == 30 and len(four) == 4
    np.testing.assert_array_equal(four[:, 2], [1, 1, 2, 1])      # -1.7e308 | -1 | 0, 1 | 1.7e308
    assert four[1, 1] == 0.0 and four[2, 0] == 0.0
    (tiny_buckets,) = (make_ndarray(e.tensor_proto) for e in acc.Tensors("tiny"))
    assert tiny_buckets[:, 2].sum() == 3 and tiny_buckets[0, 0] == 1.0 and tiny_buckets[-1, 1] == tiny[1]
    hist = read_histograms(tmp_path)["."]["huge"]
    np.testing.assert_array_equal(hist.buckets[1], four)
    scalars = read_scalars(tmp_path)["."]
    assert scalars["huge/nan_count"].value.tolist() == [1.0, 1.0, 1.0]


def test_oneflow_histogram_op_of_values_near_float64s_limits(tmp_path):
    oneflow_api.close_summary_writer()

    @flow.global_function()
    def CreateWriter():
        flow.summary.create_summary_writer(str(tmp_path))

    @flow.global_function()
    def Scalar(value: flow.typing.Numpy.Placeholder((1,)), step: flow.typing.Numpy.Placeholder((1,),
                                                                                            dtype=flow.int64)):
        flow.summary.scalar(value, step, "loss")

    @flow.global_function()
    def Histogram(value: flow.typing.Numpy.Placeholder((3,), dtype=flow.double)):
        flow.summary.histogram(value, 5, "h")

    @flow.global_function()
    def Flush():
        flow.summary.flush_summary_writer()

    try:
        CreateWriter()
        for i in range(100):
            Scalar(np.array([float(i)], np.float32), np.array([i], np.int64))
        Histogram(np.array([-1.7e308, 0.0, 1.7e308]))      # NumPy's "Too many bins for data range" before
        Scalar(np.array([100.0], np.float32), np.array([100], np.int64))
        Flush()
    finally:
        oneflow_api.close_summary_writer()
    assert tb_steps(tmp_path, "loss") == list(range(101))
    (buckets,) = read_histograms(tmp_path)["."]["h"].buckets
    assert buckets[:, 2].sum() == 3 and buckets[-1, 1] == 1.7e308


# ------------------------------------------------------------------------------------------------ damaged records

def _records(data):
    """(offset, length of data) of every framed record in a clean file."""
    out, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        out.append((pos, length))
        pos += 12 + length + 4
    return out


def _damage_first_record_of_each_tag(path):
    data = bytearray(open(path, "rb").read())
    seen, damaged = set(), 0
    for offset, length in _records(bytes(data)):
        event = proto.Event.FromString(bytes(data[offset + 12:offset + 12 + length]))
        tags = {v.tag for v in event.summary.value} - seen
        if tags:
            seen |= tags
            data[offset + 12 + length // 2] ^= 0x55            # inside the payload: its CRC no longer matches
            damaged += 1
    open(path, "wb").write(bytes(data))
    return damaged


def test_a_damaged_first_record_loses_only_that_record(tmp_path):
    """The first record of a tag was the only one with its plugin: damaging it lost the whole tag."""
    n, rng = 20, np.random.default_rng(0)
    with SummaryWriter(tmp_path) as w:
        for step in range(n):
            w.add_histogram("weights", rng.normal(size=100), step)
            w.add_image("picture", rng.random((3, 4, 4)), step)
            w.add_text("note", f"step {step}", step)
            w.file_writer.add_summary([encode.tensor("raw", np.arange(3) + step, "my_plugin", b"c")],
                                      step)
        for step in range(3 * SCALAR_METADATA_EVERY):
            w.add_scalar("loss", float(step), step)
    (path,) = event_files(tmp_path)
    assert _damage_first_record_of_each_tag(path) == 5
    later = list(range(1, n))
    assert read_histograms(tmp_path)["."]["weights"].step.tolist() == later
    assert read_images(tmp_path)["."]["picture"].step.tolist() == later
    assert read_text(tmp_path)["."]["note"].values == [f"step {s}" for s in later]
    raw = read_tensors(tmp_path)["."]["raw"]
    assert raw.step.tolist() == later and raw.plugin == "my_plugin" and raw.plugin_content == b"c"
    # Scalars repeat their metadata every SCALAR_METADATA_EVERY values: a reader that takes a tag's plugin only
    # from metadata loses at most the values before the next one (flowlab's reader may infer it sooner).
    loss = read_scalars(tmp_path)["."]["loss"].step.tolist()
    assert loss[-(2 * SCALAR_METADATA_EVERY):] == list(range(SCALAR_METADATA_EVERY, 3 * SCALAR_METADATA_EVERY))
    assert 1 not in loss or loss == list(range(1, 3 * SCALAR_METADATA_EVERY))


def test_hparams_records_each_carry_their_metadata(tmp_path):
    with SummaryWriter(tmp_path) as w:
        w.add_hparams({"lr": 0.1, "opt": "adam"}, {"acc": 0.5})
        for step in range(5):
            w.add_scalar("acc", 0.5 + step / 10, step)
    (path,) = event_files(tmp_path)
    events, _ = whole_records(path)
    values = [v for e in events[1:] for v in e.summary.value if v.tag.startswith("_hparams_/")]
    assert [v.tag for v in values] == ["_hparams_/experiment", "_hparams_/session_start_info",
                                       "_hparams_/session_end_info"]
    assert all(v.metadata.plugin_data.plugin_name == "hparams" for v in values)
    session = read_hparams(tmp_path)["."]
    assert session["hparams"] == {"lr": 0.1, "opt": "adam"}


# ------------------------------------------------------------------------------------------------ names as paths

ESCAPES = ["../outside", "a/../../outside", "/tmp/outside", "..", ".", "a//b", "a/", "a\0b", "a\nb", "..\\outside"]


@pytest.mark.parametrize("key", ESCAPES)
def test_add_scalars_keys_never_leave_the_logdir(tmp_path, key):
    logdir = tmp_path / "logs"
    with SummaryWriter(logdir) as w:
        w.add_scalars("m", {"fine": 1.0}, 0)
        with pytest.raises(ValueError, match=r"tag_scalar_dict key .* must name a run directory inside the logdir"):
            w.add_scalars("m", {"other": 2.0, key: 1.0}, 1)         # nothing of this call is written
        w.add_scalars("m", {"fine": 3.0}, 2)
    assert sorted(os.listdir(tmp_path)) == ["logs"]
    assert sorted(p.name for p in logdir.iterdir() if p.is_dir()) == ["m_fine"]
    assert tb_steps(logdir / "m_fine", "m") == [0, 2]


def test_add_scalars_main_tag_and_key_combined_cannot_escape(tmp_path):
    logdir = tmp_path / "logs"
    with SummaryWriter(logdir) as w:
        with pytest.raises(ValueError, match=r"key 'x/../../../outside' \(run directory 'm_x/../../../outside'\)"):
            w.add_scalars("m", {"x/../../../outside": 1.0})
        w.add_scalars("m", {"nested/run": 2.0})                 # '/' nests runs, as in torch
    assert sorted(os.listdir(tmp_path)) == ["logs"]
    assert tb_steps(logdir / "m_nested" / "run", "m") == [0]


@pytest.mark.parametrize("run_name", ESCAPES + ["../" * 20 + "etc"])
def test_hparams_run_name_never_leaves_the_logdir(tmp_path, run_name):
    logdir = tmp_path / "logs"
    with SummaryWriter(logdir) as w:
        with pytest.raises(ValueError, match=r"run_name must name a run directory inside the logdir"):
            w.add_hparams({"lr": 0.1}, {"acc": 0.5}, run_name=run_name)
        w.add_hparams({"lr": 0.2}, {"acc": 0.7}, run_name="trial/1")
    assert sorted(os.listdir(tmp_path)) == ["logs"]
    assert [p.name for p in logdir.iterdir() if p.is_dir()] == ["trial"]
    assert read_hparams(logdir)["trial/1"]["hparams"] == {"lr": 0.2}


def test_a_symlink_inside_the_logdir_does_not_lead_runs_out(tmp_path):
    logdir, outside = tmp_path / "logs", tmp_path / "outside"
    logdir.mkdir()
    outside.mkdir()
    (logdir / "m_link").symlink_to(outside)
    with SummaryWriter(logdir) as w:
        with pytest.raises(ValueError, match=r"leads outside the logdir .* through a symbolic link"):
            w.add_scalars("m", {"link": 1.0})
        with pytest.raises(ValueError, match=r"leads outside the logdir"):
            w.add_hparams({"lr": 0.1}, {}, run_name="m_link/x")
    assert os.listdir(outside) == []


def test_tags_never_become_paths(tmp_path):
    """Tags travel inside records; the one place a tag names a directory (the projector) quotes it."""
    logdir = tmp_path / "logs"
    with SummaryWriter(logdir) as w:
        for tag in ["../../outside", "/abs", "a\0b"]:
            w.add_scalar(tag, 1.0)
            w.add_embedding(np.eye(3), tag=tag)
    assert sorted(os.listdir(tmp_path)) == ["logs"]
    assert set(read_scalars(logdir)["."]) == {"../../outside", "/abs", "a\0b"}
    root = os.path.realpath(logdir) + os.sep
    for entry in os.scandir(logdir):
        assert os.path.realpath(entry.path).startswith(root)


def test_filename_suffix_and_logdir_with_nul_are_refused_clearly(tmp_path):
    with pytest.raises(ValueError, match="filename_suffix must be a str without '/' or NUL"):
        EventFileWriter(tmp_path, filename_suffix="a\0b")
    with pytest.raises(ValueError, match="logdir must be a path without NUL characters"):
        SummaryWriter(str(tmp_path) + "/a\0b")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------------ write errors

FSIZE_CHILD = """
import os, resource, signal, sys, warnings
from flowlab.summary.writer import EventFileWriter
from flowlab.summary.summary_writer import SummaryWriter
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)          # the kernel then fails the write with EFBIG
warnings.simplefilter("always")
_, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
logdir, limit, pending = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
w = SummaryWriter(logdir, flush_secs=0.05)
w.file_writer._max_pending = pending
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
accepted, refused = [], []
for step in range(20000):
    try:
        w.add_scalar("x", float(step), step)
        accepted.append(step)
    except OSError as e:
        refused.append(step)
        if len(refused) == 1:
            print("REFUSED", e, flush=True)
try:
    w.flush()
    print("FLUSHED WHILE FULL", flush=True)
except OSError as e:
    print("FLUSH", e.errno, e, flush=True)
try:
    w.add_histogram("h", [1.0, 2.0, 3.0], 0)           # still accepted while bytes wait, if under the limit
    print("HISTOGRAM ACCEPTED", flush=True)
except OSError as e:
    print("HISTOGRAM REFUSED", e, flush=True)
resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # space returns
w.flush()
w.close()
print("ACCEPTED", accepted[0], accepted[-1], len(accepted), flush=True)
print("REFUSED_COUNT", len(refused), refused[0] if refused else -1, flush=True)
"""


def _run_fsize_child(logdir, limit, pending):
    proc = subprocess.run([sys.executable, "-c", FSIZE_CHILD, str(logdir), str(limit), str(pending)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, proc.stderr


def test_file_size_limit_then_recovery_keeps_every_accepted_event(tmp_path):
    """RLIMIT_FSIZE makes the kernel fail writes past the limit with EFBIG, cutting a record short; the writer
    keeps the rest, retries from that byte once the limit is raised, and loses nothing."""
    stdout, stderr = _run_fsize_child(tmp_path, 100_000, 64 << 20)
    (path,) = event_files(tmp_path)
    assert f"FLUSH {errno.EFBIG} [Errno {errno.EFBIG}] cannot write event file (File too large); " in stdout
    assert "bytes of accepted events are kept in memory and retried every 0.05 s" in stdout
    assert repr(path) in stdout                                     # the error names the file
    assert "REFUSED_COUNT 0" in stdout and "ACCEPTED 0 19999 20000" in stdout and "HISTOGRAM ACCEPTED" in stdout
    assert f"event file {path!r}: writing works again" in stderr      # warnings at failure and at recovery
    assert f"RuntimeWarning: [Errno {errno.EFBIG}] cannot write event file" in stderr
    events, _ = whole_records(path)                # the record cut at the limit was completed, byte for byte
    assert os.path.getsize(path) > 100_000
    assert tb_steps(tmp_path, "x") == list(range(20000)) and tb_steps(tmp_path, "h") == [0]
    assert read_scalars(tmp_path)["."]["x"].value.tolist() == [float(s) for s in range(20000)]


def test_file_size_limit_refuses_new_events_beyond_max_pending_bytes(tmp_path):
    stdout, _ = _run_fsize_child(tmp_path, 50_000, 20_000)
    (path,) = event_files(tmp_path)
    assert f"REFUSED [Errno {errno.EFBIG}] event file cannot be written (File too large) and " in stdout
    assert "(max_pending_bytes=20,000); this event was not accepted: " + repr(path) in stdout
    assert "HISTOGRAM REFUSED" in stdout
    accepted = int(stdout.split("\nACCEPTED ")[1].split()[2])
    refused = int(stdout.split("REFUSED_COUNT ")[1].split()[0])
    assert accepted + refused == 20000 and refused > 10000
    whole_records(path)
    steps = tb_steps(tmp_path, "x")
    assert len(steps) == accepted == len(set(steps))                # exactly what was accepted, no more
    assert "h" not in accumulate(tmp_path).Tags()["tensors"]
    assert steps == sorted(steps) and steps[:100] == list(range(100))


def _mount_tmpfs(path, size):
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", f"flowlab-test-{uuid.uuid4().hex[:8]}",
                           str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")


def _fill(path):
    """Write zeros into ``path`` until the file system is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as e:
        assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)


def test_full_disk_then_space_returns(tmp_path):
    """A real ENOSPC: a 1 MiB tmpfs filled up, then space freed."""
    mount = tmp_path / "small"
    _mount_tmpfs(mount, "1m")
    try:
        w = SummaryWriter(mount / "run", flush_secs=0.05)
        filler = mount / "filler"
        _fill(filler)
        with pytest.warns(RuntimeWarning, match=r"No space left on device"):
            for step in range(5000):
                w.add_scalar("x", float(step), step)
            with pytest.raises(OSError, match=r"\[Errno 28\] cannot write event file \(No space left on device\); "
                                              r"[\d,]+ bytes of accepted events are kept") as info:
                w.flush()
        assert info.value.errno == errno.ENOSPC and info.value.filename == w.file_writer.path
        w.add_histogram("h", [1.0, 2.0], 0)             # accepted while failing
        os.remove(filler)                               # space returns
        with pytest.warns(RuntimeWarning, match="writing works again"):
            w.flush()
        w.close()
        whole_records(w.file_writer.path)
        assert tb_steps(mount / "run", "x") == list(range(5000))
        assert read_histograms(mount / "run")["."]["h"].step.tolist() == [0]
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_close_while_the_disk_is_full_says_what_was_lost(tmp_path):
    mount = tmp_path / "small"
    _mount_tmpfs(mount, "256k")
    try:
        w = EventFileWriter(mount, flush_secs=1000)
        _fill(mount / "filler")
        with pytest.warns(RuntimeWarning, match="No space left on device"):
            for step in range(10000):
                w.add_scalar("x", float(step), step)
            with pytest.raises(OSError, match=r"event file closed with [\d,]+ bytes of accepted events that could "
                                              r"not be written \(No space left on device\); they are lost"):
                w.close()
        w.close()                                       # closed for good: no second error
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


# ------------------------------------------------------------------------------------------------ SIGTERM

def _wait_for_line(proc, prefix, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if line.startswith(prefix):
            return line
        assert line or proc.poll() is None, f"child ended: {proc.stderr.read()}"
    raise AssertionError(f"no {prefix!r} from the child")


def test_sigterm_writes_out_every_queued_event(tmp_path):
    """SIGTERM used to lose everything queued (up to ~5k events); now it flushes like exit, then the process ends
    as SIGTERM ends it."""
    proc = run_python(f"""
        import time
        import numpy as np
        from flowlab.summary.summary_writer import SummaryWriter
        w = SummaryWriter({str(tmp_path)!r}, flush_secs=1000, max_queue=100000)
        for i in range(5000):
            w.add_scalar("loss", float(i), i)
        w.add_histogram("h", np.arange(10.0), 7)
        print("QUEUED", flush=True)
        time.sleep(60)
        """)
    try:
        _wait_for_line(proc, "QUEUED")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == -signal.SIGTERM                   # terminated by the signal, as without the hook
    finally:
        proc.kill()
    whole_records(event_files(tmp_path)[0])
    assert tb_steps(tmp_path, "loss") == list(range(5000)) and tb_steps(tmp_path, "h") == [7]
    assert read_scalars(tmp_path)["."]["loss"].value.tolist() == [float(i) for i in range(5000)]


def test_sigterm_while_the_caller_is_held_back_by_a_full_queue(tmp_path):
    """The handler runs on the main thread, possibly inside the writer's locks (back-pressure): it must neither
    deadlock nor write a partial record."""
    proc = run_python(f"""
        from flowlab.summary.writer import EventFileWriter
        w = EventFileWriter({str(tmp_path)!r}, flush_secs=1000, max_queue=16)
        i = 0
        while True:
            w.add_scalar("x", float(i), i)
            if i == 20000:
                print("RUNNING", flush=True)
            i += 1
        """)
    try:
        _wait_for_line(proc, "RUNNING")
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == -signal.SIGTERM
    finally:
        proc.kill()
    events, _ = whole_records(event_files(tmp_path)[0])
    steps = [e.step for e in events[1:]]
    assert len(steps) > 20000 and steps == list(range(len(steps)))


def test_sigterm_leaves_a_users_handler_alone(tmp_path):
    proc = run_python(f"""
        import signal, sys, time
        def handler(signum, frame):
            print("USER HANDLER", flush=True)
            sys.exit(3)                             # a normal exit: atexit closes the writer
        signal.signal(signal.SIGTERM, handler)
        from flowlab.summary.summary_writer import SummaryWriter
        w = SummaryWriter({str(tmp_path)!r}, flush_secs=1000)
        assert signal.getsignal(signal.SIGTERM) is handler
        for i in range(100):
            w.add_scalar("loss", float(i), i)
        print("QUEUED", flush=True)
        time.sleep(60)
        """)
    try:
        _wait_for_line(proc, "QUEUED")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 3
        assert proc.stdout.read().startswith("USER HANDLER")
    finally:
        proc.kill()
    assert tb_steps(tmp_path, "loss") == list(range(100))


def test_writers_opened_off_the_main_thread_install_nothing(tmp_path):
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import signal, threading
        from flowlab.summary.writer import EventFileWriter
        t = threading.Thread(target=lambda: EventFileWriter({str(tmp_path)!r}).close())
        t.start(); t.join()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        EventFileWriter({str(tmp_path)!r}).close()
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        """)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
