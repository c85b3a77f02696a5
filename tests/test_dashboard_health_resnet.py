"""The Health tab with ResNet-50's 107 layers (53 conv, 53 batch norm, fc1001; ``flowlab.examples.resnet`` under
``flow.watch_health``), in headless Chromium: every layer has a heatmap row tall enough for its label, every label fits left of the cells, and the
alert table's layer column holds the longest layer name. Screenshot in ``artifacts/screenshots/health-resnet50.png``.
"""

import pytest

from flowlab.examples import resnet
from test_dashboard_graph import SHOTS

# The heatmap of run A as the page draws it: its rows (layer labels) and where the cells start, and the text widths
# of its labels and of the alert table's layer cells, measured in the fonts the page draws them in.
GEOMETRY_JS = """() => {
    const doc = Bokeh.documents[0];
    const fig = doc.get_model_by_name("health-heatmap-figure:A");
    if (!fig || !Bokeh.index.roots.every((v) => v.is_idle)) return null;
    const view = Bokeh.index.get_one(fig), axis = fig.left[0];
    const names = axis.formatter.args.names;
    const size = axis.major_label_text_font_size;
    const ctx = document.createElement("canvas").getContext("2d");
    const px = typeof size === "string" ? size : size.value;
    ctx.font = `${axis.major_label_text_font_style} ${px} ${axis.major_label_text_font}`;
    const table = doc.get_model_by_name("health-alert-table:A");
    const find = (root) => [...root.querySelectorAll(".slick-cell.l3"), ...[...root.querySelectorAll("*")]
        .flatMap((el) => el.shadowRoot ? find(el.shadowRoot) : [])];
    const cells = find(document);
    const measure = document.createElement("canvas").getContext("2d");
    const widths = cells.map((c) => {
        measure.font = getComputedStyle(c).font;
        return measure.measureText(c.textContent).width; });
    const column = table.columns.find((c) => c.field === "layer");
    return {layers: names.length, frame: {left: view.frame.bbox.left, height: view.frame.bbox.height},
            label: Math.max(...names.map((n) => ctx.measureText(n).width)), font: ctx.font,
            table: table.visible, column: column.width, cells: widths.length, cell_text: Math.max(0, ...widths)};
}"""


@pytest.fixture(scope="module")
def health_page(tmp_path_factory, request):
    from dashboard_page import flowlab_serve, open_dashboard, resnet_logdir
    # update_ratio_high so low that every layer alerts: the table lists the longest layer names
    logdir, chromium = resnet_logdir(tmp_path_factory, request, health_thresholds={"update_ratio_high": 1e-9})
    with flowlab_serve(logdir, tmp_path_factory.mktemp("server") / "stderr.txt") as (url, log):
        warnings = []
        page, errors = open_dashboard(chromium, f"{url}?tab=health", viewport={"width": 1400, "height": 900},
                                      warnings=warnings)
        page.wait_for_function(f"() => ({GEOMETRY_JS})() !== null", polling=50, timeout=60000)
        page.wait_for_timeout(300)
        yield dict(page=page, errors=errors, warnings=warnings)
        page.close()


def test_107_layers_each_get_a_readable_row_and_an_uncut_label(health_page):
    page = health_page["page"]
    g = page.evaluate(GEOMETRY_JS)
    assert g["layers"] == 107
    font_px = float(g["font"].split("px")[0].split()[-1]) if "px" in g["font"] else 11.0
    assert g["frame"]["height"] / g["layers"] >= font_px + 2, g            # rows no shorter than their labels
    assert g["label"] + 6 <= g["frame"]["left"], g                          # the longest label left of the cells
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "health-resnet50.png"), full_page=True)
    assert health_page["errors"] == [] and health_page["warnings"] == []


def test_the_alert_tables_layer_column_holds_the_longest_layer_name(health_page):
    page = health_page["page"]
    g = page.evaluate(GEOMETRY_JS)
    assert g["table"] and g["cells"] > 0, g
    assert g["cell_text"] + 8 <= g["column"], g                             # "Resnet-res5_2_branch2b" was cut
    assert health_page["errors"] == [] and health_page["warnings"] == []


def test_the_saved_heatmap_of_54_layers_keeps_every_name_whole(health_page, chromium):
    """``heatmap_svg`` (what a saved notebook shows of a ``HealthPanel``): ResNet-50's names ran past the SVG's
    left edge at a fixed 100 px; its rows shrink past 32 layers but stay taller than their text."""
    import numpy as np

    from flowlab.plots.health import heatmap_svg
    from flowlab.summary.thinning import HealthGrid

    nodes = resnet.train_job(**resnet.SMALL).graph().nodes
    layers = [n.name for n in nodes if n.op.__name__ == "Conv2d"] + ["Resnet-fc1001"]
    grid = HealthGrid(layers, ["grad_norm"], 10)
    grid.extend([0, 1, 2], np.random.default_rng(0).random((3, len(layers), 1)) + 0.1)
    page = chromium.new_page()
    page.set_content(heatmap_svg(grid, "grad_norm"))
    boxes = page.evaluate("""() => [...document.querySelectorAll("svg text")].map((t) => {
        const b = t.getBBox(); return {text: t.textContent, x: b.x, y: b.y, h: b.height}; })""")
    page.close()
    names = [b for b in boxes if b["text"] in layers]
    assert len(names) == 54
    assert min(b["x"] for b in names) >= 0, [b for b in names if b["x"] < 0][:3]
    rows = sorted(names, key=lambda b: b["y"])
    assert all(b["y"] + b["h"] <= c["y"] + 0.5 for b, c in zip(rows, rows[1:]))      # no label over the next
