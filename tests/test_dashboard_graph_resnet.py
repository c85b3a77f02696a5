"""The Graph tab on a ResNet-50-sized train job (``flowlab.examples.resnet``: ~1,000 ops with its gradients,
updates and ``watch_health`` statistics), in headless Chromium: it opens within a CI-sized time bound on the 16
residual blocks as collapsed boxes, with no two boxes overlapping and every label inside its box and the frame;
a tapped block opens on its ops; gradients and the optimizer, when shown, fold into a few boxes. Screenshots in
``artifacts/screenshots/graph-resnet50*.png``."""
import re
import time

import pytest

from flowlab.dashboard.views.graph import graph_data, nodes_from_structure
from flowlab.examples import resnet
from flowlab.summary import graph_export
from test_dashboard_graph import SHOTS, assert_readable, drawn_boxes

BLOCKS = resnet.block_names()
CLICK_TO_DRAWN_S = 10.0          # generous for CI on 2 busy cores; benchmarks/data_path.py's graph row measures it
# The boxes' names once the page is idle, and every edge's y coordinates (they must go down).
STATE_JS = """() => { const doc = Bokeh.documents[0];
    const boxes = doc.get_model_by_name("graph-boxes"), fig = doc.get_model_by_name("graph-figure");
    if (!boxes || !fig || !fig.visible || !Bokeh.index.roots.every((v) => v.is_idle)) return null;
    const edges = [...doc.all_models].find((m) => m.constructor.__name__ === "ColumnDataSource" && "xs" in m.data
                                                    && "start" in m.data);
    const d = boxes.data_source.data;
    return {names: [...d.name], kinds: [...d.kind], layers: [...d.layer], roles: [...d.role],
            ys: edges.data.ys.map((ys) => [...ys]), alphas: [...edges.data.alpha], ends: [...edges.data.end],
            note: doc.get_model_by_name("graph-note").text}; }"""


def test_the_builder_has_resnet50s_blocks_names_and_a_real_train_graph():
    job = resnet.train_job(**resnet.SMALL)
    graph = job.graph()
    ops = {}
    for node in graph.nodes:
        ops[node.op.__name__] = ops.get(node.op.__name__, 0) + 1
    assert ops["Conv2d"] == 53 and ops["ConvFilterGrad"] == 53 and ops["BatchNormTrain"] == 53
    assert ops["SGDUpdate"] == 53 + 2 * 53 + 2          # conv weights, BN gamma and beta, fc1001's weight and bias
    assert ops["MovingAverageUpdate"] == 2 * 53         # each BN's moving mean and variance
    assert ops["Add"] == 16 + 16                                 # residual adds; their gradient's accumulations
    names = {node.name for node in graph.nodes}
    assert {"Resnet-conv1", "Resnet-pool1", "Resnet-res2_0_branch1", "Resnet-res4_5_branch2b", "Resnet-res5_2_add",
            "Resnet-pool5", "Resnet-fc1001_matmul"} <= names
    assert not any(f"res{s}_0_branch1" in n for n in names for s in ()) and \
        {f"Resnet-res{s}_0_branch1" for s in (2, 3, 4, 5)} <= names and "Resnet-res2_1_branch1" not in names
    assert len(graph.nodes) > 700
    logits = [n for n in graph.nodes if n.name == "Resnet-fc1001_bias_add"][0].outputs[0]
    assert tuple(logits.shape) == (2, 10)


def test_resnet50_opens_on_its_blocks_and_stays_readable_as_data():
    nodes = nodes_from_structure(graph_export.structure_json(resnet.train_job(**resnet.SMALL)))
    from flowlab.dashboard.views.graph import default_expanded
    expanded = default_expanded(nodes, seps="-/")
    assert expanded == {"Resnet"}
    drawing = graph_data(nodes, expanded=expanded, seps="-/")
    assert_readable(drawing)
    labels = set(drawing.nodes["label"])
    # 3 x (weight, conv, gamma, beta, BN) + 2 relu, add, relu; the projection shortcut adds 5 to a stage's first
    assert {f"{b} (19 ops)" for b in BLOCKS if not b.endswith("_0")} <= labels
    assert {f"res{s}_0 (24 ops)" for s in (2, 3, 4, 5)} <= labels
    assert len(drawing.nodes["label"]) < 30
    shown = graph_data(nodes, expanded=expanded | {"Resnet-res3_0"}, seps="-/")
    assert_readable(shown)
    assert {"res3_0_branch1 (5 ops)", "res3_0_branch2b (6 ops)", "res3_0_add", "res3_0_relu"} <= set(
        shown.nodes["label"])


@pytest.fixture(scope="module")
def resnet_page(tmp_path_factory, request):
    from dashboard_page import flowlab_serve, open_dashboard, resnet_logdir
    logdir, chromium = resnet_logdir(tmp_path_factory, request)
    with flowlab_serve(logdir, tmp_path_factory.mktemp("server") / "stderr.txt") as (url, log):
        warnings = []
        page, errors = open_dashboard(chromium, url, viewport={"width": 1400, "height": 900}, warnings=warnings)
        start = time.perf_counter()
        page.locator(".bk-tab", has_text=re.compile(r"^Graph$")).first.click()
        page.wait_for_function(f"() => {{ const s = ({STATE_JS})(); return s && s.names.length > 0; }}",
                               polling=20, timeout=60000)
        yield dict(page=page, errors=errors, warnings=warnings, seconds=time.perf_counter() - start)
        page.close()


def state(page):
    return page.evaluate(STATE_JS)


def assert_edges_go_down(s):
    assert s["ys"] and all(y0 > y1 for ys in s["ys"] for y0, y1 in zip(ys, ys[1:]))


def test_resnet50_opens_on_16_collapsed_blocks_fast_and_without_overlaps(resnet_page):
    page = resnet_page["page"]
    assert resnet_page["seconds"] < CLICK_TO_DRAWN_S, f"Graph tab drawn {resnet_page['seconds']:.1f} s after the click"
    drawn = drawn_boxes(page)                        # labels fit their boxes and the frame; no two boxes overlap
    s = state(page)
    kinds = dict(zip(s["names"], s["kinds"]))
    assert all(kinds.get(f"Resnet-{b}") == "scope" for b in BLOCKS), s["names"]
    labels = [b["label"] for b in drawn["boxes"]]
    assert not any(re.search(r"gradient|optimizer|System|momentum", label) for label in labels)
    assert len(labels) < 30
    assert_edges_go_down(s)
    assert re.match(r"\d+ of \d+ ops in \d+ boxes", s["note"])
    # Each collapsed block shows its worst layer's health (watch_health logged 107 layers, 8 in res3_0: 4 conv,
    # 4 BN).
    layer = dict(zip(s["names"], s["layers"]))
    assert re.fullmatch(r"Resnet-res3_0_branch\w+ \(the worst of 8 layers\)", layer["Resnet-res3_0"])
    assert layer["Resnet-conv1"] == "Resnet-conv1"
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "graph-resnet50.png"), full_page=True)
    assert resnet_page["errors"] == [] and resnet_page["warnings"] == []


def test_a_tapped_block_opens_on_its_ops(resnet_page):
    page = resnet_page["page"]
    drawn = drawn_boxes(page)
    block = next(b for b in drawn["boxes"] if b["name"] == "Resnet-res3_0")
    start = time.perf_counter()
    page.mouse.click(drawn["page"][0] + (block["left"] + block["right"]) / 2,
                     drawn["page"][1] + (block["top"] + block["bottom"]) / 2)
    page.wait_for_function(f"""() => {{ const s = ({STATE_JS})();
        return s && s.names.includes("Resnet-res3_0_branch2b"); }}""", polling=20, timeout=30000)
    assert time.perf_counter() - start < CLICK_TO_DRAWN_S
    page.wait_for_timeout(200)
    drawn_boxes(page)
    s = state(page)
    ops = {f"Resnet-res3_0_{branch}" for branch in ("branch1", "branch2a", "branch2b", "branch2c")} | \
        {"Resnet-res3_0_add", "Resnet-res3_0_relu", "Resnet-res3_0_branch2a_relu", "Resnet-res3_0_branch2b-weight"}
    assert ops <= set(s["names"])                    # the block's ops, each in its own box
    assert dict(zip(s["names"], s["kinds"]))["Resnet-res3_1"] == "scope"              # the others stay collapsed
    assert_edges_go_down(s)
    page.screenshot(path=str(SHOTS / "graph-resnet50-block.png"), full_page=True)
    page.locator("label", has_text=re.compile(r"^Resnet-res3_0$")).locator("input").uncheck()
    page.wait_for_function(f"""() => {{ const s = ({STATE_JS})();
        return s && !s.names.includes("Resnet-res3_0_add"); }}""", polling=20, timeout=30000)
    page.wait_for_timeout(200)
    drawn_boxes(page)
    assert resnet_page["errors"] == [] and resnet_page["warnings"] == []


def test_gradients_and_the_optimizer_fold_into_a_few_boxes(resnet_page):
    page = resnet_page["page"]
    page.locator("label", has_text="show gradients and optimizer").locator("input").check()
    page.wait_for_function(f"""() => {{ const s = ({STATE_JS})();
        return s && s.names.includes("System"); }}""", polling=20, timeout=30000)
    page.wait_for_timeout(200)
    drawn = drawn_boxes(page)
    labels = [b["label"] for b in drawn["boxes"]]
    assert any(re.fullmatch(r"System \(\d+ gradient ops\)", label) for label in labels)
    assert len(labels) < 60
    s = state(page)
    roles = dict(zip(s["names"], s["roles"]))
    optimizer = [i for i, role in enumerate(s["roles"]) if role == "optimizer"]
    assert optimizer and all(s["layers"][i] == "" for i in optimizer)       # no health painted on the optimizer
    # edges into the gradient and optimizer boxes stay faint under the forward graph
    faint = [alpha for alpha, end in zip(s["alphas"], s["ends"]) if roles[s["names"][end]]]
    assert faint and set(faint) == {0.25} and set(s["alphas"]) == {0.25, 1.0}
    page.screenshot(path=str(SHOTS / "graph-resnet50-training.png"), full_page=True)
    page.locator("label", has_text="show gradients and optimizer").locator("input").uncheck()
    page.wait_for_function(f"""() => {{ const s = ({STATE_JS})();
        return s && !s.names.includes("System"); }}""", polling=20, timeout=30000)
    assert resnet_page["errors"] == [] and resnet_page["warnings"] == []


# Tick every scope the list shows, as a user ticking them all would (the server answers each tick).
TICK_ALL_JS = """() => { const scopes = Bokeh.documents[0].get_model_by_name("graph-scopes");
    const all = scopes.labels.map((_, i) => i);
    if (scopes.active.length === all.length) return false;
    scopes.active = all;
    return true; }"""
BOX_DATA_JS = """() => { const d = Bokeh.documents[0].get_model_by_name("graph-boxes").data_source.data;
    return {x: [...d.x], y: [...d.y], w: [...d.w], h: [...d.h], label: [...d.label]}; }"""


def test_every_block_opened_is_laid_out_beside_the_ioloop_without_overlaps(resnet_page):
    from test_dashboard_graph import overlaps
    page = resnet_page["page"]
    start = time.perf_counter()
    while page.evaluate(TICK_ALL_JS):               # each tick lists the scopes inside the ones just opened
        page.wait_for_function(f"""() => {{ const s = ({STATE_JS})(); const scopes = Bokeh.documents[0]
            .get_model_by_name("graph-scopes"); return s && !s.note.startsWith("Laying out")
            && scopes.active.length < scopes.labels.length || s && s.names.length > 250; }}""",
                               polling=50, timeout=30000)
        page.wait_for_timeout(300)
    page.wait_for_function(f"() => {{ const s = ({STATE_JS})(); return s && s.names.length > 250 && "
                           "!s.note.startsWith('Laying out'); }", polling=50, timeout=30000)
    assert time.perf_counter() - start < 3 * CLICK_TO_DRAWN_S
    s = state(page)
    assert "Resnet-res4_2_branch2b-weight" in s["names"] and "scope" not in s["kinds"]      # every op in a box
    assert_edges_go_down(s)
    assert overlaps(page.evaluate(BOX_DATA_JS)) == []
    page.locator("label", has_text=re.compile(r"^Resnet$")).locator("input").uncheck()     # and all of it folds
    page.wait_for_function(f"() => {{ const s = ({STATE_JS})(); return s && s.names.includes('Resnet'); }}",
                           polling=50, timeout=30000)
    assert resnet_page["errors"] == [] and resnet_page["warnings"] == []


def test_a_big_layout_runs_in_a_thread_and_only_the_latest_is_shown(tmp_path):
    import threading

    import flowlab as flow
    from flowlab.dashboard.store import Store
    from flowlab.dashboard.views.graph import THREAD_BOXES, GraphView, inner_scopes

    resnet.train_job(**resnet.SMALL).graph()
    flow.summary.Graph(tmp_path / "resnet50").write_structure_graph()
    store = Store(tmp_path)
    store.poll()
    view = GraphView(store)

    class Served:                               # what the view asks of a served document
        session_context = object()
        callbacks = []

        def add_next_tick_callback(self, callback):
            self.callbacks.append(callback)
    served = Served()
    view._served_document = lambda: served
    view.update()
    assert len(view.nodes_source.data["name"]) < THREAD_BOXES and served.callbacks == []    # small: laid out now
    first = list(view.nodes_source.data["name"])
    view.expanded |= inner_scopes(view._parsed[1], "Resnet", "-/")
    view._draw()                                # every block opened whole: 287 boxes, laid out in a thread
    assert view.note.text.startswith("Laying out") and view.nodes_source.data["name"] == first
    for thread in threading.enumerate():
        if thread.name == "graph-layout":
            thread.join(30)
    # (an early block: a drawing keeps at most its first 300 boxes, and the whole net with BN has more)
    view.expanded = {scope for scope in view.expanded if not scope.startswith("Resnet-res2_0")}
    view._draw()                                # the page moved on before the first layout was shown
    for thread in threading.enumerate():
        if thread.name == "graph-layout":
            thread.join(30)
    assert len(served.callbacks) == 2            # in the order the threads finished
    shown = []
    for callback in served.callbacks:
        callback()
        shown.append((list(view.nodes_source.data["name"]), view.note.text))
    latest = [names for names, note in shown if "Resnet-res2_0" in names and "Resnet-res2_1_add" in names]
    assert latest and shown[-1][0] == latest[0]  # the latest layout shows, whenever it comes
    assert not any("Resnet-res2_0_add" in names for names, _ in shown)   # the superseded one never does
    assert not shown[-1][1].startswith("Laying out")
    nodes = nodes_from_structure(graph_export.structure_json(resnet.train_job(**resnet.SMALL)))
    assert_readable(graph_data(nodes, expanded=view.expanded, seps="-/"))
