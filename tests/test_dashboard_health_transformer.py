"""The Health tab on a transformer: a small BERT's attention entropy per head and residual growth per sum
(``<tag>/attention``, ``<tag>/residual`` records) drawn as heatmaps under the run's layer heatmap, on the server and in
the page; the records are drawn with their report's tag, never offered as health tags of their own."""

import numpy as np
import pytest

import flowlab as flow
from flowlab.summary import SummaryWriter
from test_dashboard_health import model, served, view_of  # noqa: F401 (served: a fixture)
from test_dashboard_health import train as train_mlp
from test_health_transformer import watched_bert

STEPS = 6
HEADS = [f"bert-encoder-layer_{i}-attention-self/head_{h}" for i in range(2) for h in range(2)]


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("health_bert")
    flow.clear_default_session()
    with SummaryWriter(root / "bert") as writer:
        reports, _ = watched_bert(STEPS, writer=writer)
    train_mlp(root, "mlp", 0.0, steps=4)            # a plain network beside it: no transformer heatmaps
    flow.clear_default_session()
    return root, reports


def cell_values(heatmap, layer):
    data = heatmap.source.data
    rows = np.asarray(data["bottom"], int)
    return np.asarray(data["hi"])[[heatmap.layers[r] == layer for r in rows]]


def test_the_tab_draws_each_heads_entropy_and_each_sums_growth(logdir):
    root, reports = logdir
    store, view = view_of(root)
    assert list(view.tag.options) == ["health"] and not view.tag.visible      # the parts are no tags to pick
    view.run_a.value, view.run_b.value = "bert", "mlp"
    side = view.sides["A"]
    assert side.parts.visible and set(side.part_maps) == {"attention", "residual"}
    attention, residual = side.part_maps["attention"], side.part_maps["residual"]
    assert [f.name for f in side.parts.children] == ["health-attention-figure:A", "health-residual-figure:A"]
    assert attention.layers == tuple(HEADS)
    assert residual.layers == tuple(reports[-1].residual)
    assert "attention entropy" in attention.figure.title.text and "growth" in residual.figure.title.text
    # the cells are the reports' numbers (each step its own bucket: a short run), on a linear 0..1 scale for entropy
    for i, layer in enumerate(HEADS):
        block, h = layer.rsplit("/head_", 1)
        np.testing.assert_allclose(cell_values(attention, layer), [r.attention[block][int(h)] for r in reports])
    name = residual.layers[-1]
    np.testing.assert_allclose(cell_values(residual, name), [r.residual[name]["growth"] for r in reports])
    assert attention.statistic == "attention_entropy" and attention._linear
    # the plain network's side has none
    assert not view.sides["B"].parts.visible and view.sides["B"].part_maps == {}
    view.run_a.value = "mlp"
    view.update()
    assert not view.sides["A"].parts.visible and view.sides["A"].part_maps == {}


# a heatmap's rows as its y axis names them
ROW_NAMES_JS = """(figure) => { const f = Bokeh.documents[0].get_model_by_name(figure);
    const args = f.left[0].formatter.args, names = args instanceof Map ? args.get("names") : args.names;
    const s = f.renderers[0].data_source; return Array.from(new Set(Array.from(s.data.bottom, (r) => names[r]))); }"""


def test_the_page_shows_the_transformer_heatmaps(served, chromium):
    from dashboard_page import open_dashboard
    url, log = served
    warnings = []
    page, errors = open_dashboard(chromium, f"{url}?tab=health&run=bert&runb=none", warnings=warnings,
                                  viewport={"width": 1600, "height": 1100})
    try:
        page.wait_for_function(f"() => {model('health-attention:A')} != null && "
                               f"{model('health-attention:A')}.data.bottom.length > 0", polling=100, timeout=30000)
        page.wait_for_function(f"() => {model('health-residual:A')} != null", polling=100, timeout=30000)
        assert page.evaluate(ROW_NAMES_JS, "health-attention-figure:A") == HEADS
        assert len(page.evaluate(ROW_NAMES_JS, "health-residual-figure:A")) == 4
        # both drawn in the page, with room for their rows
        for figure in ("health-attention-figure:A", "health-residual-figure:A"):
            assert page.evaluate(f"() => Bokeh.index.find_one({model(figure)}).frame.bbox.height") >= 60
        assert warnings == [] and errors == [], (warnings + errors)[:5]
        log.seek(0)
        assert "Traceback" not in log.read()
    finally:
        page.close()
