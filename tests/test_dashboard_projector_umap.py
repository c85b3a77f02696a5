"""The Projector's reductions off the IOLoop: UMAP (when umap-learn is installed) separates clusters, the methods on
offer follow the installed packages, a newer choice supersedes a reduction still running, and — in a real server and
headless Chromium — choosing UMAP redraws the points while the server keeps answering other requests (UMAP's first
call compiles numba code for ~15 s: it must not hold the IOLoop)."""
import os
import urllib.request
from concurrent.futures import Future

import numpy as np
import pytest
from bokeh.document import Document

from flowlab.dashboard.store import Store
from flowlab.dashboard.views import projector as projector_view
from flowlab.dashboard.views.projector import ProjectorView
from flowlab.summary import SummaryWriter

HOSTILE = "<script>alert(1)</script>"


def two_clusters(n=60, d=20, seed=0):
    """``n`` points around each of two centres far apart in ``d`` dimensions, and their labels."""
    rng = np.random.default_rng(seed)
    points = np.concatenate([rng.normal(0, 1, (n, d)), rng.normal(8, 1, (n, d))])
    return points, np.array(["a"] * n + ["b"] * n)


def nearest_centroid_accuracy(coords, labels):
    """The share of points nearer their own cluster's centroid than the other's."""
    names = sorted(set(labels))
    centroids = np.array([coords[labels == name].mean(axis=0) for name in names])
    nearest = np.argmin(np.linalg.norm(coords[:, None] - centroids[None], axis=2), axis=1)
    return float(np.mean(np.array(names)[nearest] == labels))


def embedding_logdir(path, n=60):
    points, labels = two_clusters(n)
    with SummaryWriter(path / "run") as w:
        w.add_embedding(points, metadata=list(labels), tag="features")
    return path


def view_of(logdir):
    store = Store(logdir)
    store.poll()
    view = ProjectorView(store)
    view.update()
    return view


# ------------------------------------------------------------------------------------------------------ the method

def test_umap_separates_two_clusters_the_same_way_every_time():
    pytest.importorskip("umap", reason="needs umap-learn (pip install -e '.[test]')")
    points, labels = two_clusters()
    coords = projector_view.umap(points, 2)
    assert coords.shape == (120, 2) and np.isfinite(coords).all()
    assert nearest_centroid_accuracy(coords, labels) == 1.0
    np.testing.assert_array_equal(projector_view.umap(points, 2), coords)         # seeded
    assert projector_view.umap(points, 3).shape == (120, 3)
    assert projector_view.umap(points[:3], 2).shape == (3, 2)                    # too few for a neighbour graph


def test_the_methods_offered_follow_the_installed_packages(tmp_path, monkeypatch):
    logdir = embedding_logdir(tmp_path, n=8)
    monkeypatch.setattr(projector_view, "UMAP_AVAILABLE", False)
    monkeypatch.setattr(projector_view, "TSNE_AVAILABLE", True)
    view = view_of(logdir)
    assert view.method_select.options == ["PCA", "t-SNE"]
    assert view.front.xaxis[0].axis_label.startswith("PC1")
    monkeypatch.setattr(projector_view, "TSNE_AVAILABLE", False)
    assert view_of(logdir).method_select.options == ["PCA"]
    monkeypatch.setattr(projector_view, "UMAP_AVAILABLE", True)
    monkeypatch.setattr(projector_view, "TSNE_AVAILABLE", True)
    assert view_of(logdir).method_select.options == ["PCA", "t-SNE", "UMAP"]


def test_umap_outside_a_server_is_drawn_at_once(tmp_path):
    pytest.importorskip("umap", reason="needs umap-learn (pip install -e '.[test]')")
    view = view_of(embedding_logdir(tmp_path))
    assert "UMAP" in view.method_select.options
    view.method_select.value = "UMAP"
    coords = np.array([view.source.data["c0"], view.source.data["c1"]]).T
    assert nearest_centroid_accuracy(coords, np.array(view.source.data["label"])) == 1.0
    assert view.front.xaxis[0].axis_label == "UMAP 1" and view.note.text.startswith("UMAP of 120 points")


# ------------------------------------------------------------------------------------------- off the IOLoop, faked

class FakeWorkers:
    """Stands in for ``WORKERS``: each submit is a Future the test completes."""

    def __init__(self):
        self.submitted = []

    def submit(self, method, matrix, k):
        future = Future()
        self.submitted.append((method, future))
        return future


def served(view):
    """A document that reports being served (so reductions go to the workers), and a function running the
    callbacks queued on its next ticks as the server's IOLoop would."""
    doc = Document()
    doc.add_root(view.layout())
    doc._session_context = lambda: True         # what a server session's document has: a context

    def run_next_ticks():
        for callback in list(doc.session_callbacks):
            doc.remove_next_tick_callback(callback)
            callback.callback()
    return doc, run_next_ticks


def test_a_newer_choice_supersedes_a_reduction_still_running(tmp_path, monkeypatch):
    monkeypatch.setattr(projector_view, "UMAP_AVAILABLE", True)
    monkeypatch.setattr(projector_view, "TSNE_AVAILABLE", True)
    workers = FakeWorkers()
    monkeypatch.setattr(projector_view, "WORKERS", workers)
    view = ProjectorView(Store(embedding_logdir(tmp_path, n=8)))
    doc, run_next_ticks = served(view)
    view.store.poll()
    view.update()                                       # a small PCA: drawn at once, on the loop
    assert workers.submitted == [] and view.front.xaxis[0].axis_label.startswith("PC1")
    pca_c0 = list(view.source.data["c0"])

    view.method_select.value = "UMAP"
    assert view.note.text == "computing UMAP of 16 points…"
    assert view.source.data["c0"] == pca_c0                     # the points shown stay meanwhile
    (_, umap_future), = workers.submitted
    umap_future.set_running_or_notify_cancel()                  # started: it cannot be cancelled any more

    view.method_select.value = "t-SNE"                          # supersedes it
    assert [m for m, _ in workers.submitted] == ["UMAP", "t-SNE"]
    tsne_future = workers.submitted[1][1]
    umap_future.set_result((np.full((16, 2), 7.0), None))
    run_next_ticks()
    assert view.note.text == "computing t-SNE of 16 points…" and view.source.data["c0"] == pca_c0

    tsne_future.set_running_or_notify_cancel()
    tsne_future.set_exception(ValueError(f"{HOSTILE}\nsecond line"))
    run_next_ticks()                                            # the error, escaped, on one line
    assert view.note.text == "t-SNE failed: ValueError: &lt;script&gt;alert(1)&lt;/script&gt;"

    view.method_select.value = "UMAP"                           # computed before: drawn at once from the cache
    assert len(workers.submitted) == 2
    assert view.source.data["c0"] == [7.0] * 16 and view.front.xaxis[0].axis_label == "UMAP 1"

    view.method_select.value = "PCA"                            # a pending reduction nobody waits for is cancelled
    view.method_select.value = "t-SNE"
    waiting = workers.submitted[2][1]
    view.method_select.value = "PCA"
    assert waiting.cancelled() and view.front.xaxis[0].axis_label.startswith("PC1")


# ------------------------------------------------------------------------------------- a real server and browser

CHROMIUM = "/usr/bin/chromium"


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"needs Debian's chromium at {CHROMIUM}")
def test_choosing_umap_in_the_page_redraws_the_points_while_the_server_answers_others(tmp_path, chromium):
    pytest.importorskip("umap", reason="needs umap-learn (pip install -e '.[test]')")
    from dashboard_page import open_dashboard

    from flowlab.dashboard.server import ServerThread
    logdir = embedding_logdir(tmp_path, n=150)
    server = ServerThread(logdir, port=0)
    try:
        warnings = []
        page, errors = open_dashboard(chromium, server.url + "?tab=projector", warnings=warnings)
        points_js = """() => { const d = Bokeh.documents[0];
            const s = [...d.all_models].find((m) => m.constructor.__name__ === "ColumnDataSource" && m.data.thumb);
            const f = [...d.all_models].find((m) => m.constructor.__name__ === "Figure" && m.visible);
            return {c0: [...s.data.c0], c1: [...s.data.c1], label: [...s.data.label],
                    axis: f.below[0].axis_label, note: d.get_model_by_name("projector-note").text}; }"""
        page.wait_for_function(f"() => ({points_js})().c0.length === 300", polling=50, timeout=30000)
        before = page.evaluate(points_js)
        assert before["axis"].startswith("PC1")

        (session,) = server.server._tornado.get_sessions("/")        # this page's document, on the server
        note = session.document.get_model_by_name("projector-note")
        page.locator("select", has=page.locator("option[value=UMAP]")).select_option("UMAP")
        page.wait_for_function("() => Bokeh.documents[0].get_model_by_name('projector-note').text"
                               ".startsWith('computing UMAP')", polling=20, timeout=20000)
        # Another page's request, answered while the reduction runs: the note still says so once it is answered.
        with urllib.request.urlopen(server.url + "?tab=scalars", timeout=60) as response:
            assert response.status == 200 and b"<script" in response.read()
        assert note.text.startswith("computing UMAP"), "the request waited for the reduction"

        page.wait_for_function(f"() => ({points_js})().axis === 'UMAP 1'", polling=100, timeout=180000)
        after = page.evaluate(points_js)
        assert after["c0"] != before["c0"] and after["note"].startswith("UMAP of 300 points")
        coords = np.array([after["c0"], after["c1"]]).T
        assert nearest_centroid_accuracy(coords, np.array(after["label"])) == 1.0
        assert errors == [] and warnings == []
        page.close()
    finally:
        server.stop()
