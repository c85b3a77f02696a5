"""``flow.summary.Projector`` with ``label`` / ``x`` whose sample count differs from ``value``'s: OneFlow stored them as
given (its own summary test passes 10 labels and 10 images for 100 points), so flowlab stores them too, keeps them
out of the metadata and sprite that TensorBoard pairs with the points, and its reader and Projector tab say so."""
from pathlib import Path

import numpy as np
import pytest

from flowlab.dashboard.store import Store
from flowlab.dashboard.views.projector import ProjectorView
from flowlab.summary import SummaryWriter, read_projector
from flowlab.summary.projector import Projector, unmatched_note
from test_summary_graph_projector import tensorboard_projector

SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"


def oneflow_test_arrays():
    """The shapes of OneFlow's ``test_summary.py``: 100 points of 100 values, 10 labels, 10 images of 10x10."""
    rng = np.random.default_rng(0)
    value = rng.random((100, 10, 10), dtype=np.float32)
    label = (rng.random(10) * 10).astype(np.int64)
    x = (rng.random((10, 10, 10)) * 255).astype(np.uint8)
    return value, label, x


def write_as_oneflow_does(logdir):
    value, label, x = oneflow_test_arrays()
    projector = Projector(str(logdir))
    projector.create_embedding_projector()
    projector.create_exception_projector()
    projector.exception_projector(value=value, tag="exception_projector", step=1, sample_name="sample",
                                  sample_type="image", x=x)
    projector.embedding_projector(value=value, label=label, tag="embedding_projector", step=1,
                                  sample_name="sample", sample_type="image", x=x)
    return value, label, x


def test_unmatched_label_and_x_are_stored_as_given_and_read_back(tmp_path):
    value, label, x = write_as_oneflow_does(tmp_path)
    exception, embedding = read_projector(tmp_path)
    assert [(e.kind, e.tag, e.step) for e in (exception, embedding)] == \
        [("exception", "exception_projector", 1), ("embedding", "embedding_projector", 1)]
    for e in (exception, embedding):
        np.testing.assert_array_equal(e.tensor, value.reshape(100, 100))
        assert e.sprite is None                           # a sprite would pair image i with point i
        assert e.info["x_count"] == 10
    # the labels as given, dtype and all; no metadata rows, which TensorBoard would need one per point
    assert embedding.labels.dtype == np.int64
    np.testing.assert_array_equal(embedding.labels, label)
    assert embedding.metadata == [] and embedding.info["label_count"] == 10
    # the exception kind still marks each of its 100 points
    assert exception.labels is None and len(exception.metadata) == 100
    assert exception.metadata_header == ["status", "nan_count", "inf_count"]
    np.testing.assert_array_equal(np.load(tmp_path / "embedding_projector_00001" / "samples.npy"), x)
    np.testing.assert_array_equal(np.load(tmp_path / "exception" / "exception_projector_00001" / "samples.npy"), x)
    assert unmatched_note(embedding) == ("10 labels and 10 samples x for 100 points: only one per point can be "
                                         "paired, so the points are shown without them")
    assert unmatched_note(exception).startswith("10 samples x for 100 points")


def test_matched_counts_still_make_metadata_and_sprite_and_replace_stale_labels(tmp_path):
    value, label, x = oneflow_test_arrays()
    projector = Projector(tmp_path)
    projector.embedding_projector(value=value, label=label, tag="emb", step=0, x=x)
    assert read_projector(tmp_path)[0].labels is not None
    projector.embedding_projector(value=value[:10], label=label, tag="emb", step=0, x=x)     # the same step again
    (e,) = read_projector(tmp_path)
    assert e.labels is None and e.metadata == [[str(v)] for v in label] and e.sprite is not None
    assert unmatched_note(e) == ""


def test_tensorboard_serves_the_unmatched_entry(tmp_path):
    write_as_oneflow_does(tmp_path)
    get = tensorboard_projector(tmp_path)

    assert get("/runs") == b'["."]'
    tensor = np.frombuffer(get("/tensor", run=".", name="embedding_projector:00001"), np.float32)
    assert tensor.shape == (100 * 100,)


def test_projector_tab_draws_every_point_and_says_what_it_left_out(tmp_path):
    run = tmp_path / "run"
    with SummaryWriter(run) as w:                       # the run list knows runs by their event files
        w.add_scalar("loss", 1.0, 0)
    write_as_oneflow_does(run)
    store = Store(tmp_path)
    store.poll()
    view = ProjectorView(store)
    view.update()
    assert view.tensor_select.options == ["exception/exception_projector", "embedding_projector"]
    view.tensor_select.value = "embedding_projector"
    assert len(view.source.data["c0"]) == 100
    assert view.source.data["label"] == [""] * 100 and not any(view.source.data["thumb"])
    assert view.note.text.startswith("PCA of 100 points in 100 dimensions")
    assert "10 labels and 10 samples x for 100 points" in view.note.text
    assert "Could not read" not in view.note.text


def test_the_projector_tab_in_a_browser_reads_such_a_run_and_says_so(tmp_path, chromium):
    pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[test]')")
    from dashboard_page import flowlab_serve, open_dashboard
    run = tmp_path / "logs" / "run"
    with SummaryWriter(run) as w:
        w.add_scalar("loss", 1.0, 0)
    write_as_oneflow_does(run)
    warnings = []
    with flowlab_serve(tmp_path / "logs", tmp_path / "serve.log") as (url, _):
        page, errors = open_dashboard(chromium, url + "?tab=projector", warnings=warnings,
                                      viewport={"width": 1300, "height": 820})
        page.wait_for_function("() => Bokeh.documents[0].get_model_by_name('projector-note').text"
                               ".startsWith('PCA of 100 points')", polling=50, timeout=30000)
        note = page.evaluate("() => Bokeh.documents[0].get_model_by_name('projector-note').text")
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "projector-unmatched.png"))
        page.close()
    assert "10 samples x for 100 points: only one per point can be paired" in note, note
    assert errors == [] and warnings == []
