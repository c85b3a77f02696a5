"""Remote logdirs: the tailer and readers on fsspec URLs, tested against a real S3-compatible server.

A moto server runs on 127.0.0.1 for this module (``s3_endpoint``, tests/conftest.py); s3fs talks to it over HTTP with
dummy credentials, exactly as it talks to AWS (no client is mocked). Objects cannot be appended to, so a growing log is written the way a sync tool
uploads one: the whole object replaced by a longer one.
"""
import os
import shutil
import struct

import numpy as np
import pytest

from flowlab.summary import proto
from flowlab.summary.reader import read_histograms, read_images, read_scalars, read_text
from flowlab.summary.record import frame
from flowlab.summary.tailer import LogdirTailer

s3fs = pytest.importorskip("s3fs")
boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

CREDENTIALS = dict(key="testing", secret="testing", client_kwargs={"region_name": "us-east-1"})


@pytest.fixture
def bucket(s3_endpoint, request):
    """(name, storage_options, s3fs filesystem) of a fresh bucket on the moto server."""
    name = "logs-" + request.node.name.lower().replace("_", "-")[:40].strip("-")
    boto3.client("s3", endpoint_url=s3_endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket=name)
    options = dict(endpoint_url=s3_endpoint, **CREDENTIALS)
    return name, options, s3fs.S3FileSystem(skip_instance_cache=True, **options)


def version():
    return proto.Event(wall_time=1.7e9, file_version="brain.Event:2")


def scalar_event(tag, step, x):
    return proto.Event(wall_time=1.7e9 + step, step=step,
                       summary=proto.Summary(value=[proto.Summary.Value(tag=tag, simple_value=x)]))


def framed(*events):
    return b"".join(frame(e.SerializeToString()) for e in events)


NAME = "events.out.tfevents.1700000000.host.1.0"


def peer_log(logdir):
    """A log of every common kind written by tensorboardX, the way most logs reach a bucket."""
    SummaryWriter = pytest.importorskip("tensorboardX").SummaryWriter
    rng = np.random.default_rng(0)
    for run in ("train", "eval/a"):
        with SummaryWriter(os.path.join(logdir, run)) as w:
            for step in range(20):
                w.add_scalar("loss", 1.0 / (step + 1), step)
                if step % 5 == 0:
                    w.add_histogram("weights", rng.normal(size=100), step)
                    w.add_image("sample", rng.integers(0, 255, (3, 4, 5), dtype=np.uint8), step)
                    w.add_text("notes", f"step {step}", step)


def upload(fs, local_dir, prefix):
    for d, _, files in os.walk(local_dir):
        for n in files:
            rel = os.path.relpath(os.path.join(d, n), local_dir).replace(os.sep, "/")
            with open(os.path.join(d, n), "rb") as f:
                fs.pipe_file(f"{prefix}/{rel}", f.read())


def plain(x):
    """Series as nested lists, for comparing with ==."""
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (list, tuple)):
        return [plain(y) for y in x]
    return x


def as_lists(runs):
    return {run: {tag: plain(series) for tag, series in tags.items()} for run, tags in runs.items()}


def items(tailer):
    return [(d.run, d.tag, d.kind, d.step, d.value) for d in tailer.poll()]


# -- reading a bucket ----------------------------------------------------------------------------------------------

def test_a_bucket_reads_like_the_same_local_logdir(tmp_path, bucket):
    name, options, fs = bucket
    peer_log(tmp_path)
    upload(fs, tmp_path, f"{name}/exp")
    url = f"s3://{name}/exp/"
    for read in (read_scalars, read_histograms, read_images, read_text):
        remote, local = read(url, storage_options=options), read(tmp_path)
        assert set(remote) == {"train", "eval/a"} and as_lists(remote) == as_lists(local), read.__name__
    t = LogdirTailer(url, storage_options=options)
    assert t.logdir == f"s3://{name}/exp" and t.exists()
    assert not LogdirTailer(f"s3://{name}/nothing-here", storage_options=options).exists()
    assert not LogdirTailer(f"s3://no-such-bucket-{name}", storage_options=options).exists()


def test_a_growing_object_is_read_by_byte_range(bucket):
    """Each poll fetches only what the object gained since the last one; a record cut by the upload waits."""
    name, options, fs = bucket
    key = f"{name}/run1/{NAME}"
    head = framed(version(), *[scalar_event("loss", s, s * 0.5) for s in range(100)])
    fs.pipe_file(key, head)
    t = LogdirTailer(f"s3://{name}", storage_options=options)
    assert [d.step for d in t.poll() if d.kind == "scalar"] == list(range(100))
    assert t.stats()["bytes_read"] == len(head)
    assert t.poll() == [] and t.stats()["bytes_read"] == len(head)        # unchanged: nothing fetched
    more = framed(*[scalar_event("loss", s, s * 0.5) for s in range(100, 110)])
    cut = len(more) - 7
    fs.pipe_file(key, head + more[:cut])                # the object replaced by a longer one, its last record cut
    assert [d.step for d in t.poll()] == list(range(100, 109))
    assert t.stats()["bytes_read"] == len(head) + cut
    fs.pipe_file(key, head + more)
    assert [(d.run, d.step, d.value) for d in t.poll()] == [("run1", 109, 54.5)]
    assert t.stats()["bytes_read"] == len(head) + len(more)
    assert t.stats()["records_skipped"] == 0 and t.stats()["errors"] == {}


def test_runs_appear_with_their_first_object(bucket):
    name, options, fs = bucket
    t = LogdirTailer(f"s3://{name}/logs", storage_options=options)
    assert not t.exists() and t.poll() == [] and t.stats()["runs"] == 0
    fs.pipe_file(f"{name}/logs/{NAME}", framed(version(), scalar_event("a", 1, 1.0)))
    assert t.exists() and items(t) == [(".", "a", "scalar", 1, 1.0)]
    fs.pipe_file(f"{name}/logs/exp/b/{NAME}", framed(version(), scalar_event("a", 7, 7.0)))
    fs.pipe_file(f"{name}/logs/exp/notes.txt", b"not an event file")
    fs.pipe_file(f"{name}/logs-other/{NAME}", framed(version(), scalar_event("x", 9, 9.0)))    # a sibling prefix
    assert items(t) == [("exp/b", "a", "scalar", 7, 7.0)]
    assert t.stats()["runs"] == 2 and t.stats()["files"] == 2


def test_deleted_and_shrunk_objects(bucket):
    name, options, fs = bucket
    keep, doomed = f"{name}/{NAME}", f"{name}/{NAME[:-1]}1"
    fs.pipe_file(keep, framed(version(), scalar_event("a", 1, 1.0), scalar_event("a", 2, 2.0)))
    fs.pipe_file(doomed, framed(version(), scalar_event("b", 1, 1.0)))
    t = LogdirTailer(f"s3://{name}", storage_options=options)
    assert len(t.poll()) == 3
    fs.rm(doomed)
    fs.pipe_file(keep, framed(version(), scalar_event("a", 9, 9.0)))       # replaced by a shorter object
    reread, *rest = t.poll()        # first what the consumer drops (the steps the object gave), then the object again
    assert reread.kind == "reread" and reread.value["spans"] == {"a": (1, 2)}
    assert [(d.tag, d.step) for d in rest] == [("a", 9)]
    st = t.stats()
    assert st["errors"] == {f"s3://{doomed}": "vanished"} and st["files"] == 1 and st["resets"] == 1


# -- damage ----------------------------------------------------------------------------------------------------------

def test_damaged_objects_read_like_damaged_local_files(tmp_path, bucket):
    name, options, fs = bucket
    rng = np.random.default_rng(4)
    records = [frame(e.SerializeToString()) for e in [version()] + [scalar_event("x", s, s) for s in range(2000)]]
    for i in rng.integers(1, len(records), 30):
        r = bytearray(records[i])
        r[int(rng.integers(len(r)))] ^= 0x40
        records[i] = bytes(r)
    records.insert(500, rng.bytes(300_000))                                  # a stretch of junk
    data = b"".join(records) + struct.pack("<Q", 10**12)                    # and a corrupt length at the end
    os.makedirs(tmp_path / "run")
    with open(tmp_path / "run" / NAME, "wb") as f:
        f.write(data)
    fs.pipe_file(f"{name}/run/{NAME}", data)
    local, remote = LogdirTailer(tmp_path), LogdirTailer(f"s3://{name}", storage_options=options)
    assert items(remote) == items(local)
    keys = ("records_read", "records_skipped", "bytes_read", "bytes_skipped")
    assert [remote.stats()[k] for k in keys] == [local.stats()[k] for k in keys]
    assert remote.stats()["records_skipped"] >= 20


def test_junk_object_beyond_the_budget_is_read_over_several_polls(bucket, monkeypatch):
    name, options, fs = bucket
    monkeypatch.setattr(LogdirTailer, "resync_budget", 1 << 20)
    junk = np.random.default_rng(5).bytes(3 << 20)
    fs.pipe_file(f"{name}/a/{NAME}", junk + framed(scalar_event("x", 1, 1.0)))
    fs.pipe_file(f"{name}/b/{NAME}", framed(version(), scalar_event("y", 2, 2.0)))
    t = LogdirTailer(f"s3://{name}", storage_options=options)
    assert [(d.run, d.step) for d in t.poll()] == [("b", 2)] and t.stats()["deferred"] == 1
    got = []
    for _ in range(10):
        got += [(d.run, d.step) for d in t.poll()]
        if not t.stats()["deferred"]:
            break
    assert got == [("a", 1)] and t.stats()["bytes_skipped"] == len(junk)


# -- configuration and failures ------------------------------------------------------------------------------------

def test_credentials_and_endpoint_from_the_aws_environment(bucket, monkeypatch):
    """What the README tells users: no storage_options, the usual AWS variables."""
    name, options, fs = bucket
    fs.pipe_file(f"{name}/{NAME}", framed(version(), scalar_event("a", 3, 3.0)))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", options["endpoint_url"])
    assert read_scalars(f"s3://{name}")["."]["a"].value.tolist() == [3.0]


def test_an_unreachable_store_is_reported_not_raised(bucket):
    """The server goes away and comes back on the same port: polls report it, keep what they know, then go on."""
    name, _, _ = bucket
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    options = dict(endpoint_url=f"http://{host}:{port}",                       # failing calls kept short
                   config_kwargs={"connect_timeout": 1, "retries": {"max_attempts": 1}}, **CREDENTIALS)
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    key = f"{name}/{NAME}"
    fs.pipe_file(key, framed(version(), scalar_event("a", 1, 1.0)))
    t = LogdirTailer(f"s3://{name}", storage_options=options)
    assert len(t.poll()) == 1
    server.stop()
    try:
        assert t.poll() == [] and not t.exists()
        assert set(t.stats()["errors"]) == {f"s3://{name}"} and t.stats()["files"] == 1     # known files kept
    finally:
        server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        server.start()
    try:
        # moto keeps its buckets in the process, so the restarted server still has this one.
        fs.pipe_file(key, framed(version(), scalar_event("a", 1, 1.0), scalar_event("a", 2, 2.0)))
        assert [d.step for d in t.poll()] == [2] and t.stats()["errors"] == {}
    finally:
        server.stop()


def test_other_fsspec_urls_and_bad_ones(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    mem = fsspec.filesystem("memory")
    mem.pipe_file(f"/flowlab-test-{os.getpid()}/run/{NAME}", framed(version(), scalar_event("m", 4, 4.0)))
    try:
        t = LogdirTailer(f"memory://flowlab-test-{os.getpid()}/")
        assert t.exists() and items(t) == [("run", "m", "scalar", 4, 4.0)]
    finally:
        mem.rm(f"/flowlab-test-{os.getpid()}", recursive=True)
    os.makedirs(tmp_path / "r")
    shutil.copyfile(__file__, tmp_path / "r" / "notes.txt")
    with open(tmp_path / "r" / NAME, "wb") as f:
        f.write(framed(version(), scalar_event("f", 5, 5.0)))
    t = LogdirTailer(f"file://{tmp_path}/")
    assert t.logdir == str(tmp_path) and items(t) == [("r", "f", "scalar", 5, 5.0)]    # file:// is a local path
    with pytest.raises(ValueError, match="expected a local path or an fsspec URL"):
        LogdirTailer("nosuchprotocol://x/y")


def test_the_store_reads_projector_and_structure_graph_assets_from_s3(bucket, tmp_path):
    """The dashboard's store (its provider) finds a run's projector config and structure graph in the same listing as
    its event files, reads them through s3fs, sprites included, and reads them again when an object is replaced."""
    import json

    from flowlab.dashboard.store import Store
    from flowlab.summary.summary_writer import SummaryWriter
    name, options, fs = bucket
    rng = np.random.default_rng(0)
    with SummaryWriter(tmp_path / "train") as w:
        w.add_scalar("loss", 1.0, 0)
        w.add_embedding(rng.normal(size=(4, 3)), metadata=list("abcd"), label_img=rng.random((4, 3, 6, 6)), tag="f")
    (tmp_path / "train" / "structure_graph.json").write_text(json.dumps({"jobs": [{"name": "train"}]}))
    upload(fs, tmp_path, f"{name}/logs")
    store = Store(f"s3://{name}/logs", storage_options=options)
    store.poll()
    (embedding,) = store.projectors()["train"].value
    assert embedding.metadata == [[c] for c in "abcd"] and embedding.sprite.startswith(f"{name}/logs/train/")
    sprite = store.sprite("train", embedding)
    assert sprite == fs.cat_file(embedding.sprite) and sprite.startswith(b"\x89PNG")
    version, jobs = store.structure_graph("train")
    assert jobs == [{"name": "train"}] and version is not None
    jobs = [{"name": "a"}, {"name": "b"}]
    fs.pipe_file(f"{name}/logs/train/structure_graph.json", json.dumps({"jobs": jobs}).encode())
    before = store.version
    store.poll()
    assert store.structure_graph("train")[1] == jobs and store.version > before
