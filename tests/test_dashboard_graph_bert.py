"""The Graph tab on the small BERT encoder's train job (``flowlab.examples.bert.pretrain_job``): it opens on one
collapsed box per encoder layer (the model's ``bert`` and ``bert-encoder`` namespaces hold most ops and open by
default), with no two boxes overlapping and every edge going down; a tapped layer opens on its attention,
intermediate and output scopes. On the data (``graph_data``) and in headless Chromium."""
import re

import pytest

import flowlab as flow
from flowlab.dashboard.views.graph import default_expanded, graph_data, nodes_from_structure
from flowlab.examples import bert
from flowlab.summary import graph_export
from test_dashboard_graph import assert_readable, drawn_boxes
from test_dashboard_graph_resnet import STATE_JS, assert_edges_go_down, state

LAYERS = 3
SMALL = dict(batch_size=4, seq_length=16, max_predictions=3, vocab_size=40, hidden=16, layers=LAYERS, heads=2)


def test_the_encoder_opens_on_one_collapsed_box_per_layer():
    flow.clear_default_session()
    nodes = nodes_from_structure(graph_export.structure_json(bert.pretrain_job(**SMALL)))
    flow.clear_default_session()
    expanded = default_expanded(nodes, seps="-/")
    assert expanded == {"bert", "bert-encoder"}
    drawing = graph_data(nodes, expanded=expanded, seps="-/")
    assert_readable(drawing)                          # no overlaps, labels inside boxes, edges going down
    kinds = dict(zip(drawing.nodes["name"], drawing.nodes["kind"]))
    layers = [name for name in drawing.nodes["name"] if re.fullmatch(r"bert-encoder-layer_\d+", name)]
    assert layers == [f"bert-encoder-layer_{i}" for i in range(LAYERS)]
    assert all(kinds[name] == "scope" for name in layers)
    counts = {label for label in drawing.nodes["label"] if label.startswith("layer_")}
    assert len(counts) == LAYERS and len({re.search(r"\((\d+) ops\)", c).group(1) for c in counts}) == 1  # alike
    assert not any(name.startswith("bert-encoder-layer_") and name not in layers for name in drawing.nodes["name"])
    assert {"bert-embeddings", "bert-pooler"} <= {n for n, k in kinds.items() if k == "scope"}
    assert len(drawing.nodes["name"]) < 30
    # a layer opened: its attention, intermediate and output scopes, collapsed, the other layers still one box each
    shown = graph_data(nodes, expanded=expanded | {"bert-encoder-layer_1"}, seps="-/")
    assert_readable(shown)
    kinds = dict(zip(shown.nodes["name"], shown.nodes["kind"]))
    assert {f"bert-encoder-layer_1-{part}" for part in ("attention", "intermediate", "output")} <= set(kinds)
    assert kinds["bert-encoder-layer_0"] == kinds["bert-encoder-layer_2"] == "scope"


@pytest.fixture(scope="module")
def bert_page(tmp_path_factory, request):
    import os

    from jupyter_page import CHROMIUM
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"needs Debian's chromium at {CHROMIUM}")
    pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[test]')")
    chromium = request.getfixturevalue("chromium")
    from dashboard_page import flowlab_serve, open_dashboard
    from flowlab.summary import SummaryWriter
    flow.clear_default_session()
    logdir = tmp_path_factory.mktemp("logs")
    with SummaryWriter(logdir / "bert") as writer:
        job = bert.pretrain_job(health_writer=writer, **SMALL)
        examples = bert.pretraining_examples(8, seq_length=16, vocab_size=40, max_predictions=3)
        for batch in bert.batches(examples, 4):
            job(*batch)
        flow.summary.Graph(logdir / "bert").write_structure_graph()
    flow.clear_default_session()
    with flowlab_serve(logdir, tmp_path_factory.mktemp("server") / "stderr.txt") as (url, log):
        warnings = []
        page, errors = open_dashboard(chromium, url, viewport={"width": 1400, "height": 900}, warnings=warnings)
        page.locator(".bk-tab", has_text=re.compile(r"^Graph$")).first.click()
        page.wait_for_function(f"() => {{ const s = ({STATE_JS})(); return s && s.names.length > 0; }}",
                               polling=20, timeout=60000)
        yield dict(page=page, errors=errors, warnings=warnings)
        page.close()


def test_the_page_draws_one_box_per_layer_without_overlaps(bert_page):
    page = bert_page["page"]
    drawn = drawn_boxes(page)                        # labels fit their boxes and the frame; no two boxes overlap
    s = state(page)
    kinds = dict(zip(s["names"], s["kinds"]))
    assert [n for n in s["names"] if re.fullmatch(r"bert-encoder-layer_\d+", n)] == [
        f"bert-encoder-layer_{i}" for i in range(LAYERS)]
    assert all(kinds[f"bert-encoder-layer_{i}"] == "scope" for i in range(LAYERS))
    assert len(drawn["boxes"]) < 30
    assert_edges_go_down(s)
    # each layer's box shows its worst layer's health (watch_health logged 8 layers in each)
    layer = dict(zip(s["names"], s["layers"]))
    assert re.fullmatch(r"bert-encoder-layer_0-\S+ \(the worst of 8 layers\)", layer["bert-encoder-layer_0"])
    assert bert_page["errors"] == [] and bert_page["warnings"] == []
