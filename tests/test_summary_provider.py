"""LogdirProvider: the one reader of a logdir (event data, projector and structure-graph assets, and TensorBoard-style
one-shot queries), the same on a local path and an fsspec URL (memory:// here; s3:// in test_remote_logdir)."""
import json
import os

import numpy as np
import pytest

from flowlab.summary import reader
from flowlab.summary.logdir_files import UnsafePath
from flowlab.summary.oneflow_api import STRUCTURE_GRAPH_FILE
from flowlab.summary.projector import CONFIG_FILE, read_projector
from flowlab.summary.provider import LogdirProvider
from flowlab.summary.summary_writer import SummaryWriter

N = 2000
SPIKE, NAN = 1234, 777
JOBS = [{"name": "train", "ops": []}, {"name": "eval", "ops": []}]


def loss(step):
    return np.where(step == SPIKE, 1e6, np.where(step == NAN, np.nan, 1.0 / (1 + step)))


@pytest.fixture
def logdir(tmp_path):
    rng = np.random.default_rng(0)
    with SummaryWriter(tmp_path / "train") as w:
        for step in range(N):
            w.add_scalar("loss", float(loss(np.int64(step))), step)
        for step in range(30):
            w.add_histogram("weights", rng.normal(size=100), step)
        for step in range(20):
            w.add_image("sample", rng.integers(0, 255, (3, 4, 5), dtype=np.uint8), step)
            w.add_text("notes", f"step {step}", step)
        w.add_embedding(rng.normal(size=(9, 4)), metadata=list("abcdefghi"),
                        label_img=rng.random((9, 3, 8, 8)), tag="feat")
    (tmp_path / "train" / STRUCTURE_GRAPH_FILE).write_text(json.dumps({"jobs": JOBS + ["not a job"]}))
    with SummaryWriter(tmp_path / "eval") as w:
        w.add_scalar("loss", 0.5, 0)
    return tmp_path


def upload(local, fs, prefix):
    for d, _, files in os.walk(local):
        for n in files:
            rel = os.path.relpath(os.path.join(d, n), local).replace(os.sep, "/")
            with open(os.path.join(d, n), "rb") as f:
                fs.pipe_file(f"{prefix}/{rel}", f.read())


def test_one_shot_queries_agree_with_the_readers_and_keep_spikes_and_nans(logdir):
    provider = LogdirProvider(logdir)
    full = reader.read_scalars(logdir)
    assert provider.list_runs() == ["eval", "train"]
    listed = provider.list_scalars()
    assert listed["train"]["loss"].count == N and listed["train"]["loss"].max_step == N - 1
    assert listed["eval"]["loss"].count == 1

    thin = provider.read_scalars(downsample=100)["train"]["loss"]
    assert 25 <= len(thin.step) <= 100 and np.all(np.diff(thin.step) > 0)
    assert {0, N - 1, SPIKE, NAN} <= set(thin.step.tolist())                 # ends, the spike and the NaN stay
    np.testing.assert_array_equal(thin.value, full["train"]["loss"].value[thin.step])   # the values, unchanged
    whole = provider.read_scalars(downsample=N)["train"]["loss"]
    np.testing.assert_array_equal(whole.step, full["train"]["loss"].step)

    tensors = provider.read_tensors(downsample=5)["train"]
    histograms = reader.read_histograms(logdir)["train"]["weights"]
    assert tensors["weights"].kind == "histogram" and tensors["weights"].step.tolist() == [0, 7, 14, 22, 29]
    for step, buckets in zip(tensors["weights"].step, tensors["weights"].values):
        np.testing.assert_array_equal(buckets, histograms.buckets[step])
    assert tensors["notes"].kind == "text" and tensors["notes"].values[-1] == "step 19"
    assert set(provider.list_tensors()["train"]) == {"weights", "notes"}

    blobs = provider.read_blob_sequences(downsample=3)["train"]["sample"]
    images = reader.read_images(logdir)["train"]["sample"]
    assert blobs.kind == "image" and blobs.step.tolist() == [0, 10, 19]       # evenly spread, the last kept
    assert [b.encoded for b in blobs.values] == [images.values[s].encoded for s in (0, 10, 19)]
    assert provider.list_blob_sequences()["train"]["sample"].count == 20

    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="downsample must be an int"):
            provider.read_tensors(downsample=bad)
    with pytest.raises(ValueError, match="at least 4"):
        provider.read_scalars(downsample=3)


def test_assets_come_from_the_same_listing_and_change_their_signature(logdir):
    provider = LogdirProvider(logdir)
    assert provider.projector_signatures() == {}                  # nothing listed before the first poll
    provider.poll()
    signatures = provider.projector_signatures()
    assert list(signatures) == ["train"] and list(provider.structure_signatures()) == ["train"]
    (embedding,) = provider.read_projector("train")
    (expected,) = read_projector(logdir / "train")
    np.testing.assert_array_equal(embedding.tensor, expected.tensor)
    assert embedding.metadata == expected.metadata and embedding.sprite == expected.sprite
    assert provider.read_sprite("train", embedding) == (logdir / "train" / os.path.relpath(
        embedding.sprite, logdir / "train")).read_bytes()
    assert provider.read_structure_graph("train") == JOBS          # the dicts only
    assert provider.read_structure_graph("eval") == []              # none there

    with SummaryWriter(logdir / "train") as w:
        w.add_embedding(np.eye(3), tag="more")
    provider.poll()
    assert provider.projector_signatures()["train"] != signatures["train"]
    assert [e.tag for e in provider.read_projector("train")] == ["feat", "more"]
    (logdir / "train" / STRUCTURE_GRAPH_FILE).write_text("[1, 2]")    # no structure graph: no jobs, no error
    assert provider.read_structure_graph("train") == []
    os.remove(logdir / "train" / CONFIG_FILE)
    provider.poll()
    assert provider.projector_signatures() == {}


def test_an_fsspec_logdir_gives_the_same_assets(logdir):
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    upload(logdir, fs, "/provider-test")
    try:
        remote, local = LogdirProvider("memory://provider-test"), LogdirProvider(logdir)
        remote.poll()
        local.poll()
        assert list(remote.projector_signatures()) == ["train"]
        (r,), (lo,) = remote.read_projector("train"), local.read_projector("train")
        np.testing.assert_array_equal(r.tensor, lo.tensor)
        assert r.metadata == lo.metadata and r.sprite.endswith("/train/" + os.path.relpath(lo.sprite, logdir / "train"))
        assert remote.read_sprite("train", r) == local.read_sprite("train", lo)
        assert remote.read_structure_graph("train") == JOBS
        assert remote.read_scalars(downsample=100)["train"]["loss"].step.tolist() == \
            local.read_scalars(downsample=100)["train"]["loss"].step.tolist()

        directory = remote._tailer.files.directory("train")
        with pytest.raises(UnsafePath, match="climbs out"):
            directory.read("../eval/x", "metadata_path", 10)
        with pytest.raises(UnsafePath, match="absolute"):
            directory.read("/etc/passwd", "metadata_path", 10)
        with pytest.raises(UnsafePath, match="at most 10 are read"):
            directory.read(CONFIG_FILE, "the config", 10)
        signature = remote.projector_signatures()["train"]
        fs.pipe_file("/provider-test/train/" + CONFIG_FILE, fs.cat_file("/provider-test/train/" + CONFIG_FILE) + b"\n")
        remote.poll()
        assert remote.projector_signatures()["train"] != signature      # a replaced object: a new signature
    finally:
        fs.rm("/provider-test", recursive=True)
