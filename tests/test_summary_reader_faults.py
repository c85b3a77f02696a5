"""Damaged event files: what a reader recovers, how fast, and how fairly.

Every test damages a real log (flipped bytes, inserted junk, zero-filled stretches) and compares what the tailer
reads against the undamaged log's own records: a damaged record may be lost, nothing else may be.
"""
import os
import struct
import time

import numpy as np
import pytest

from flowlab.summary import proto
from flowlab.summary.record import HEADER, RecordScanner, _masked_length_crcs, frame, masked_crc, next_record
from flowlab.summary.tailer import LogdirTailer


def version():
    return proto.Event(wall_time=1.7e9, file_version="brain.Event:2")


def scalar_event(tag, step, x):
    return proto.Event(wall_time=1.7e9 + step, step=step,
                       summary=proto.Summary(value=[proto.Summary.Value(tag=tag, simple_value=x)]))


def histogram_event(tag, step):
    h = proto.HistogramProto(min=0, max=step + 1, num=step + 1, bucket_limit=[0.5, step + 1.0], bucket=[1, step])
    return proto.Event(wall_time=1.7e9 + step, step=step,
                       summary=proto.Summary(value=[proto.Summary.Value(tag=tag, histo=h)]))


def event_path(logdir, run=".", n=0):
    path = os.path.join(logdir, run, f"events.out.tfevents.{1700000000 + n}.host.1.{n}")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


def scalar_log(n, tags=("loss", "acc")):
    return [version()] + [scalar_event(tags[i % len(tags)], i, i * 0.25) for i in range(n)]


def points(items):
    """(tag, step, value) of every scalar the tailer gave, columnar or not, in file order per tag."""
    out = []
    for d in items:
        if d.kind != "scalar":
            continue
        if isinstance(d.step, np.ndarray):
            out += zip([d.tag] * len(d.step), d.step.tolist(), d.value.tolist())
        else:
            out.append((d.tag, d.step, d.value))
    return sorted(out)


def scanner_points(data):
    """The same from ``RecordScanner``, the plain reference reader, on the same bytes."""
    scanner = RecordScanner()
    scanner.feed(data)
    out = []
    for payload in scanner.read():
        ev = proto.Event.FromString(payload)
        out += [(v.tag, ev.step, v.simple_value) for v in ev.summary.value if v.WhichOneof("value") == "simple_value"]
    return sorted(out), scanner


# -- the vectorised search ---------------------------------------------------------------------------------------

def test_length_checksums_match_crc32c():
    rng = np.random.default_rng(0)
    lengths = np.concatenate([rng.integers(0, 2**32, 5000, dtype=np.uint64), [0, 1, 2**31, 2**32 - 1]])
    expected = [masked_crc(struct.pack("<Q", int(x))) for x in lengths]
    assert _masked_length_crcs(lengths.astype(np.uint32)).tolist() == expected


@pytest.mark.parametrize("seed", range(40))
def test_next_record_agrees_with_the_reference_scanner(tmp_path, seed):
    """Random records with random damage (flipped bytes, junk, zeros, cut lengths): the tailer keeps exactly what
    RecordScanner keeps, and counts the same damaged stretches and skipped bytes."""
    rng = np.random.default_rng(seed)
    framed = [frame(e.SerializeToString()) for e in scalar_log(int(rng.integers(20, 300)))]
    for _ in range(int(rng.integers(1, 12))):
        i = int(rng.integers(len(framed)))
        r = bytearray(framed[i])
        how = rng.integers(4)
        if how == 0:
            r[int(rng.integers(len(r)))] ^= 1 << int(rng.integers(8))
        elif how == 1:
            r[int(rng.integers(len(r))):int(rng.integers(len(r)))] = rng.bytes(int(rng.integers(1, 300)))
        elif how == 2:
            r += bytes(int(rng.integers(1, 100)))
        else:
            r[0:8] = struct.pack("<Q", int(rng.integers(0, 2**40)))
        framed[i] = bytes(r)
    data = b"".join(framed)
    want, scanner = scanner_points(data)
    with open(event_path(tmp_path), "wb") as f:
        f.write(data)
    t = LogdirTailer(tmp_path)
    assert points(t.poll(columnar=True)) == want
    st = t.stats()
    assert (st["records_skipped"], st["bytes_skipped"]) == (scanner.corrupt_records, scanner.skipped_bytes)


def test_next_record_finds_incomplete_records_and_stops_where_told():
    tail = frame(b"x" * 100)
    buf = os.urandom(5000) + tail[:50]            # a record still being written: its header checks out
    assert next_record(buf, 0, len(buf)) == 5000
    assert next_record(buf, 0, 1000) == 1000      # not found before the limit: the limit
    assert next_record(b"\x00" * 30, 0, 30) == 30 - HEADER + 1


# -- speed: linear in the damaged bytes --------------------------------------------------------------------------

def _timed_poll(logdir):
    t = LogdirTailer(logdir)
    start = time.perf_counter()
    items = t.poll(columnar=True)
    return time.perf_counter() - start, items, t.stats()


@pytest.mark.parametrize("junk", ["random", "zeros", "text"])
def test_eight_mib_of_junk_reads_fast(tmp_path, junk):
    size = 8 << 20
    data = {"random": np.random.default_rng(0).bytes(size), "zeros": bytes(size),
            "text": (b"not an event file at all\n" * (size // 25 + 1))[:size]}[junk]
    with open(event_path(tmp_path), "wb") as f:
        f.write(frame(version().SerializeToString()) + data + frame(scalar_event("x", 7, 1.0).SerializeToString()))
    elapsed, items, st = _timed_poll(tmp_path)
    assert points(items) == [("x", 7, 1.0)]
    assert st["bytes_skipped"] == size and st["records_skipped"] == 1 and st["deferred"] == 0
    # The target is 0.5 s on a quiet machine; the bound leaves room for four other developers on two cores (the
    # per-byte loop this replaced took ~18 s).
    assert elapsed < 2.0, f"8 MiB of {junk} took {elapsed:.2f} s"


@pytest.fixture(scope="module")
def hundred_thousand_records():
    """(framed records, their (tag, step, value)) of a 100k-record scalar log, built once for the module."""
    events = scalar_log(100_000, tags=("loss",))
    return [frame(e.SerializeToString()) for e in events], [("loss", e.step, e.summary.value[0].simple_value)
                                                           for e in events[1:]]


@pytest.mark.parametrize("where", ["data", "length", "anywhere"])
def test_scattered_damage_is_linear(tmp_path, where, hundred_thousand_records):
    """100k records with every 100th damaged: each loses itself only, and the read costs about what a clean one
    does (it was quadratic: 56-74 s)."""
    rng = np.random.default_rng(1)
    framed, expected = hundred_thousand_records
    framed = list(framed)
    damaged = set(range(1, len(framed), 100))
    for i in damaged:
        r = bytearray(framed[i])
        at = {"data": len(r) - 6, "length": 2, "anywhere": int(rng.integers(len(r)))}[where]
        r[at] ^= 0x5A
        framed[i] = bytes(r)
    with open(event_path(tmp_path), "wb") as f:
        f.write(b"".join(framed))
    elapsed, items, st = _timed_poll(tmp_path)
    assert points(items) == sorted(p for i, p in enumerate(expected, 1) if i not in damaged)
    assert st["records_skipped"] == len(damaged)
    assert elapsed < 3.0, f"{elapsed:.2f} s"


# -- fairness: a file of junk never holds up the others ----------------------------------------------------------

def test_junk_beyond_the_budget_waits_for_later_polls(tmp_path, monkeypatch):
    monkeypatch.setattr(LogdirTailer, "resync_budget", 1 << 20)
    junk = np.random.default_rng(2).bytes(5 << 20)
    with open(event_path(tmp_path, "a-junk"), "wb") as f:          # read first: runs go in name order
        f.write(frame(version().SerializeToString()) + junk + frame(scalar_event("x", 1, 1.0).SerializeToString()))
    healthy = event_path(tmp_path, "b-healthy")
    with open(healthy, "wb") as f:
        f.write(b"".join(frame(e.SerializeToString()) for e in scalar_log(10)))
    t = LogdirTailer(tmp_path)
    first = t.poll()
    assert {d.run for d in first if d.kind == "scalar"} == {"b-healthy"}
    assert t.stats()["deferred"] == 1
    got, polls = [], 1
    while t.stats()["deferred"]:
        with open(healthy, "ab") as f:                              # the healthy run goes on meanwhile
            f.write(frame(scalar_event("loss", 100 + polls, 0.5).SerializeToString()))
        items = t.poll()
        assert ("b-healthy", 100 + polls) in [(d.run, d.step) for d in items]
        got += [(d.run, d.step) for d in items if d.run == "a-junk" and d.kind == "scalar"]
        polls += 1
        assert polls < 20
    assert polls >= 5 and got == [("a-junk", 1)]
    st = t.stats()
    assert st["bytes_skipped"] == len(junk) and st["records_skipped"] == 1


def test_damage_read_in_small_chunks_matches_one_read(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    framed = [frame(e.SerializeToString()) for e in scalar_log(3000)]
    for i in rng.integers(1, len(framed), 40):
        r = bytearray(framed[i])
        r[int(rng.integers(len(r)))] ^= 0xFF
        framed[i] = bytes(r) + rng.bytes(int(rng.integers(0, 50)))
    with open(event_path(tmp_path), "wb") as f:
        f.write(b"".join(framed))
    whole = LogdirTailer(tmp_path)
    expected = points(whole.poll())
    monkeypatch.setattr(type(LogdirTailer(tmp_path)._files), "chunk_size", 777)
    chunked = LogdirTailer(tmp_path)
    assert points(chunked.poll()) == expected
    keys = ("records_read", "records_skipped", "bytes_skipped")
    assert [chunked.stats()[k] for k in keys] == [whole.stats()[k] for k in keys]


# -- one damaged record loses at most that record, for every kind --------------------------------------------------

from collections import Counter  # noqa: E402

from flowlab.summary.decode import Image  # noqa: E402
from flowlab.summary.plugin_inference import infer_plugin  # noqa: E402

DT_FLOAT, DT_DOUBLE, DT_STRING = 1, 2, 7


def _tensor(array, dtype):
    t = proto.TensorProto(dtype=dtype)
    t.tensor_shape.dim.extend(proto.TensorShapeProto.Dim(size=n) for n in np.shape(array))
    if dtype == DT_STRING:
        t.string_val.extend(np.asarray(array, object).ravel().tolist())
    else:
        t.tensor_content = np.asarray(array, {DT_FLOAT: "<f4", DT_DOUBLE: "<f8"}[dtype]).tobytes()
    return t


def _tf_value(tag, plugin, tensor, first, content=b""):
    v = proto.Summary.Value(tag=tag, tensor=tensor)
    if first:                                   # TensorFlow's FileWriter keeps metadata on a tag's first value only
        v.metadata.plugin_data.plugin_name = plugin
        v.metadata.plugin_data.content = content
    return v


def _wav(i):
    return b"RIFF" + struct.pack("<I", 36) + b"WAVEfmt " + bytes([i]) * 8


def tf_style_events(steps=12):
    """Every kind in TensorFlow 2's tensor encodings, metadata only on each tag's first value."""
    rng = np.random.default_rng(5)
    events = [version()]
    for step in range(steps):
        first = step == 0
        values = [
            _tf_value("loss", "scalars", _tensor(np.float32(1.0 / (step + 1)), DT_FLOAT), first),
            _tf_value("weights", "histograms", _tensor(rng.normal(size=(4, 3)), DT_DOUBLE), first),
            _tf_value("sample", "images", _tensor([b"6", b"5", b"\x89PNG\r\n\x1a\n" + rng.bytes(20),
                                                   b"\xff\xd8\xff" + rng.bytes(9)], DT_STRING), first),
            _tf_value("notes", "text", _tensor(f"step {step}".encode(), DT_STRING), first, b"\x08\x00"),
            _tf_value("table", "text", _tensor([[b"a", b"b"], [b"c", str(step).encode()]], DT_STRING), first),
            _tf_value("speech", "audio", _tensor([[_wav(step), b"label"]], DT_STRING), first),
        ]
        for v in values:                        # one value per event, as tf.summary writes them
            events.append(proto.Event(wall_time=1.7e9 + step, step=step, summary=proto.Summary(value=[v])))
    return events


def _peer_log(logdir, writer):
    rng = np.random.default_rng(6)
    if writer == "tensorboardX":
        from tensorboardX import SummaryWriter
    else:
        from flowlab.summary import SummaryWriter
    with SummaryWriter(str(logdir)) as w:
        for step in range(12):
            w.add_scalar("loss", 1.0 / (step + 1), step)
            w.add_histogram("weights", rng.normal(size=50), step)
            w.add_image("sample", rng.integers(0, 255, (3, 4, 5), dtype=np.uint8), step)
            w.add_text("notes", f"step {step}", step)
    (name,) = [n for n in os.listdir(logdir) if "tfevents" in n]
    with open(os.path.join(logdir, name), "rb") as f:
        return f.read()


def _split_records(data):
    out, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        out.append(data[pos:pos + HEADER + length + 4])
        pos += HEADER + length + 4
    return out


def _key(value):
    if isinstance(value, Image):
        return (value.width, value.height, tuple(value.encoded))
    if isinstance(value, np.ndarray):
        return (value.shape, tuple(value.ravel().tolist()))
    if isinstance(value, list):
        return tuple(value)
    return value


def read_items(logdir):
    """Every item the tailer gives, as comparable tuples (run, tag, kind, plugin, step, value)."""
    return Counter((d.run, d.tag, d.kind, d.plugin, d.step, _key(d.value)) for d in LogdirTailer(logdir).poll())


@pytest.mark.parametrize("writer", ["tensorflow-style", "flowlab", "tensorboardX"])
def test_one_flipped_byte_loses_at_most_its_record(tmp_path, writer):
    """150 trials per writer, half of them damaging the first record of a tag (the one carrying its metadata):
    whatever is lost belongs to the damaged record, and everything read is what the undamaged log holds."""
    if writer == "tensorboardX":
        pytest.importorskip("tensorboardX")
    if writer == "tensorflow-style":
        records = [frame(e.SerializeToString()) for e in tf_style_events()]
    else:
        records = _split_records(_peer_log(tmp_path / "written", writer))
    events = [proto.Event.FromString(r[HEADER:-4]) for r in records]
    firsts, seen = [], set()
    for i, ev in enumerate(events):
        for v in ev.summary.value:
            if v.tag not in seen:
                seen.add(v.tag)
                firsts.append(i)
    logdir = tmp_path / "log"
    path = event_path(logdir)
    with open(path, "wb") as f:
        f.write(b"".join(records))
    clean = read_items(logdir)
    assert {k[2] for k in clean} >= {"scalar", "histogram", "image", "text"}
    rng = np.random.default_rng(7)
    whole_tags_lost = 0
    for trial in range(150):
        victim = int(rng.choice(firsts)) if trial % 2 else int(rng.integers(len(records)))
        damaged = bytearray(records[victim])
        damaged[int(rng.integers(len(damaged)))] ^= 1 << int(rng.integers(8))
        with open(path, "wb") as f:
            f.write(b"".join(records[:victim]) + bytes(damaged) + b"".join(records[victim + 1:]))
        got = read_items(logdir)
        assert not got - clean, f"trial {trial}: items that the undamaged log does not hold"
        lost = clean - got
        allowed = {(v.tag, events[victim].step) for v in events[victim].summary.value}
        assert {(k[1], k[4]) for k in lost} <= allowed, f"trial {trial}: lost {sorted(lost)[:3]}"
        whole_tags_lost += len(lost) > len(events[victim].summary.value)
    assert whole_tags_lost == 0


def test_a_tag_without_metadata_takes_the_plugin_another_run_gave_it(tmp_path):
    """A custom plugin cannot be inferred from values; the same tag in another run names it, content and all."""
    pr = np.arange(12, dtype=np.float32).reshape(2, 6)
    for run, first in (("a", True), ("b", False)):     # run b lost its first record: no metadata left
        events = [version()] + [proto.Event(step=s, summary=proto.Summary(value=[
            _tf_value("pr", "pr_curves", _tensor(pr * s, DT_FLOAT), first and s == 0, b"\x08\x05")]))
            for s in range(3)]
        with open(event_path(tmp_path, run), "wb") as f:
            f.write(b"".join(frame(e.SerializeToString()) for e in events))
    got = {(d.run, d.step): (d.kind, d.plugin, d.plugin_content) for d in LogdirTailer(tmp_path).poll()}
    assert set(got.values()) == {("tensor", "pr_curves", b"\x08\x05")} and len(got) == 6


def test_real_metadata_replaces_an_inference(tmp_path):
    """A tag inferred from its values takes the plugin of metadata that comes later (a restarted writer's file)."""
    first = [version()] + [proto.Event(step=s, summary=proto.Summary(value=[
        proto.Summary.Value(tag="t", tensor=_tensor(np.float32(s), DT_FLOAT))])) for s in range(2)]
    second = [version(), proto.Event(step=5, summary=proto.Summary(value=[
        _tf_value("t", "custom", _tensor(np.float32(5), DT_FLOAT), True, b"c")]))]
    with open(event_path(tmp_path, ".", 1), "wb") as f:
        f.write(b"".join(frame(e.SerializeToString()) for e in first))
    with open(event_path(tmp_path, ".", 2), "wb") as f:
        f.write(b"".join(frame(e.SerializeToString()) for e in second))
    got = [(d.step, d.kind, d.plugin) for d in LogdirTailer(tmp_path).poll()]
    assert got == [(0, "scalar", "scalars"), (1, "scalar", "scalars"), (5, "tensor", "custom")]


@pytest.mark.parametrize("tensor, plugin", [
    (_tensor(np.float32(1.5), DT_FLOAT), "scalars"),
    (_tensor(np.float64(1.5), DT_DOUBLE), "scalars"),
    (_tensor(np.zeros((5, 3)), DT_DOUBLE), "histograms"),
    (_tensor(np.zeros((0, 3)), DT_FLOAT), "histograms"),
    (_tensor(np.zeros((5, 4)), DT_DOUBLE), ""),
    (_tensor(np.zeros(3), DT_FLOAT), ""),
    (_tensor([b"3", b"2", b"\x89PNG\r\n\x1a\nxx"], DT_STRING), "images"),
    (_tensor([b"3", b"2", b"GIF89a..", b"RIFF\0\0\0\0WEBPVP8 "], DT_STRING), "images"),
    (_tensor([b"3", b"2", b"not an image"], DT_STRING), "text"),
    (_tensor([b"3", b"2"], DT_STRING), "text"),
    (_tensor([[_wav(1), b"x"], [_wav(2), b""]], DT_STRING), "audio"),
    (_tensor(b"hello", DT_STRING), "text"),
    (_tensor([[b"a", b"b"]], DT_STRING), "text"),
])
def test_plugins_inferred_from_values(tensor, plugin):
    assert infer_plugin(proto.Summary.Value(tag="x", tensor=tensor)) == plugin


# -- declared shapes that disagree with their data (memory bombs) ----------------------------------------------------

def bomb_tensor(dims, **values):
    t = proto.TensorProto(dtype=1, **values)                 # DT_FLOAT
    for d in dims:
        t.tensor_shape.dim.add(size=d)
    return t


def tensor_event(tag, step, t):
    return proto.Event(wall_time=1.7e9 + step, step=step, summary=proto.Summary(value=[proto.Summary.Value(
        tag=tag, tensor=t, metadata=proto.SummaryMetadata(plugin_data=proto.SummaryMetadata.PluginData(
            plugin_name="flowlab_tensor")))]))


def test_a_declared_shape_must_agree_with_the_data_or_the_record_is_skipped(tmp_path):
    """Issue 29: a record declaring 2^40 elements raised MemoryError out of poll() (the records after it were lost
    for good); a 70-byte record of shape [8192, 8192] with one value cost 512 MiB. Both are skipped and counted like
    a bad CRC, and every valid record after them is read, at no more memory than the log's size."""
    import tracemalloc
    bombs = [tensor_event("huge", 1, bomb_tensor([1 << 20, 1 << 20], float_val=[1.0])),            # 2^40 elements
             tensor_event("square", 2, bomb_tensor([8192, 8192], float_val=[1.0])),               # 512 MiB filled
             tensor_event("raw", 3, bomb_tensor([8192, 8192], tensor_content=b"\0" * 8)),           # too few bytes
             tensor_event("negative", 4, bomb_tensor([-1, 4], float_val=[1.0] * 4))]
    good = tensor_event("ok", 5, bomb_tensor([2, 2], float_val=[1.0, 2.0, 3.0, 4.0]))
    framed = [frame(e.SerializeToString()) for e in [version(), *bombs, good, *scalar_log(10)[1:]]]
    assert len(framed[2]) < 100                             # the [8192, 8192] bomb is a record of under 100 bytes
    with open(event_path(tmp_path), "wb") as f:
        f.write(b"".join(framed))
    t = LogdirTailer(tmp_path)
    tracemalloc.start()
    try:
        items = t.poll()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 48 << 20          # the 32 MiB read buffer and little else; was 512 MiB, or MemoryError
    tensors = [(d.tag, d.step, d.value.tolist()) for d in items if d.kind == "tensor"]
    assert tensors == [("ok", 5, [[1.0, 2.0], [3.0, 4.0]])]
    assert points(items) == sorted((["loss", "acc"][i % 2], i, i * 0.25) for i in range(10))
    st = t.stats()
    assert st["records_skipped"] == len(bombs) and st["values_skipped"] == 0 and st["bytes_skipped"] == 0
    assert st["records_read"] == len(framed)


def test_tensor_to_array_refuses_a_shape_its_data_does_not_fill():
    from flowlab.summary.decode import ShapeMismatch, tensor_to_array
    with pytest.raises(ShapeMismatch, match=r"declares 67,108,864 elements.*has 1"):
        tensor_to_array(bomb_tensor([8192, 8192], float_val=[1.0]))
    assert tensor_to_array(bomb_tensor([], float_val=[])).tolist() == 0.0       # TensorFlow's empty rank-0 zero
    assert tensor_to_array(bomb_tensor([0])).shape == (0,)
