"""The dashboard's Graph tab: what ``graph_data`` lays out (scopes collapsed, training ops folded away, label-sized
boxes that never overlap, edges going down), the view's controls, and the page as headless Chromium draws it for
the demo's train job (rendered label boxes do not overlap, no console warnings; screenshot in
``artifacts/screenshots/graph.png``)."""
import itertools
import os
import random
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from flowlab.dashboard.store import Store
from flowlab.dashboard.views import graph as graph_view
from flowlab.dashboard.views.graph import GraphView, Node, graph_data, nodes_from_graph_def
from flowlab.summary import SummaryWriter, graph_export

SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"
# Every group of the demo's train job: name scopes, and layers and ops of layers (``hidden_matmul`` is in ``hidden``).
EVERY_SCOPE = {"System", "System/AutoGrad", "System/Seed", "System/AutoGrad/hidden", "System/AutoGrad/hidden_bias",
               "System/AutoGrad/hidden_matmul", "System/AutoGrad/hidden_activation", "System/AutoGrad/output",
               "System/AutoGrad/output_bias", "System/AutoGrad/output_matmul", "hidden", "hidden_bias",
               "hidden/weight", "hidden/bias", "output", "output_bias", "output/weight", "output/bias"}
# ... and their gradient and optimizer ops, which open apart from the forward ops (graph_view.scope_key)
EVERY_SCOPE |= {f"{scope} ({role})" for scope in EVERY_SCOPE for role in ("gradient", "optimizer")}


def demo_nodes():
    """The nodes of the GraphDef ``flowlab demo`` logs: its digits MLP's train job."""
    from flowlab.examples import digits_mlp
    train_job, _ = digits_mlp.build()
    return nodes_from_graph_def(graph_export.graph_def(train_job))


def overlaps(nodes):
    """Pairs of labels whose boxes overlap."""
    boxes = [(x - w / 2, x + w / 2, y - h / 2, y + h / 2)
             for x, y, w, h in zip(nodes["x"], nodes["y"], nodes["w"], nodes["h"])]
    return [(nodes["label"][i], nodes["label"][j]) for (i, a), (j, b) in itertools.combinations(enumerate(boxes), 2)
            if a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]]


def assert_readable(drawing):
    """No two boxes overlap, each box holds its label (monospace), every edge goes down from producer to consumer."""
    nodes, edges = drawing.nodes, drawing.edges
    assert overlaps(nodes) == []
    assert all(w >= len(label) * 0.6 * graph_view.FONT_PX for w, label in zip(nodes["w"], nodes["label"]))
    assert len(set(nodes["label"])) == len(nodes["label"])
    for xs, ys, a, b in zip(edges["xs"], edges["ys"], edges["start"], edges["end"]):
        assert nodes["y"][a] > nodes["y"][b], (nodes["label"][a], nodes["label"][b])
        assert all(y0 > y1 for y0, y1 in zip(ys, ys[1:]))           # down all the way
        assert ys[0] == nodes["y"][a] - nodes["h"][a] / 2 and ys[-1] == nodes["y"][b] + nodes["h"][b] / 2
    assert drawing.heads["x1"] == [xs[-1] for xs in edges["xs"]] and drawing.heads["y1"] == [ys[-1] for ys in
                                                                                             edges["ys"]]


def by_label(drawing):
    return {label: i for i, label in enumerate(drawing.nodes["label"])}


# ------------------------------------------------------------------------------------------------ layout data

@pytest.mark.parametrize("training, expanded", [(False, ()), (False, {"hidden", "output"}), (True, ()),
                                                (True, EVERY_SCOPE)])
def test_demo_graph_boxes_never_overlap_and_edges_go_down(training, expanded):
    assert_readable(graph_data(demo_nodes(), show_training=training, expanded=expanded))


def test_scopes_are_collapsed_by_default_and_expand_one_level_at_a_time():
    nodes = demo_nodes()
    drawing = graph_data(nodes)
    rows = by_label(drawing)
    # A layer is one box: its variables (scope hidden/) and its ops (hidden_matmul, hidden_bias_add, ...).
    assert {"hidden (5 ops)", "output (4 ops)"} <= set(rows)
    assert drawing.nodes["kind"][rows["hidden (5 ops)"]] == "scope"
    assert drawing.nodes["name"][rows["hidden (5 ops)"]] == "hidden"
    assert not {"hidden/weight", "hidden_matmul"} & set(drawing.nodes["name"])
    assert drawing.scopes == ["hidden", "output"]
    # The scope's box takes the edges of its ops: in from the reshape, out into the output layer.
    edges = {(drawing.nodes["name"][a], drawing.nodes["name"][b])
             for a, b in zip(drawing.edges["start"], drawing.edges["end"])}
    assert {(a, b) for a, b in edges if "hidden" in (a, b)} == {("Reshape_5", "hidden"), ("hidden", "output")}

    expanded = graph_data(nodes, expanded={"hidden"})
    names = expanded.nodes["name"]
    assert len(names) == len(drawing.nodes["name"]) + 4
    assert {"hidden_matmul", "hidden_bias_add", "hidden_activation"} <= set(names)
    assert {"hidden/weight", "hidden/bias"} <= set(names) and "hidden" not in names
    assert expanded.nodes["label"][names.index("hidden/weight")] == "weight"    # output's weight is still folded
    assert expanded.scopes == ["hidden", "output"]                             # listed: expanded or collapsed

    # With the optimizer shown, hidden's optimizer ops stay in their box until it is expanded in turn; then
    # hidden/weight holds an optimizer scope of its own, one level down.
    assert "hidden (4 optimizer ops)" in by_label(graph_data(nodes, show_training=True, expanded={"hidden"}))
    deep = graph_data(nodes, show_training=True, expanded={"hidden", "hidden (optimizer)"})
    assert "weight (2 optimizer ops)" in by_label(deep) and "weight" in by_label(deep)
    assert {"hidden (optimizer)", "hidden/weight (optimizer)", "output (optimizer)"} <= set(deep.scopes)
    assert graph_data(nodes, show_training=True, expanded={"hidden (optimizer)", "hidden/weight (optimizer)"}
                      ).nodes["name"].count("hidden/weight/momentum") == 1


def test_gradient_and_optimizer_ops_are_folded_away_unless_asked_for():
    nodes = demo_nodes()
    system = [n for n in nodes if n.name.startswith("System/")]
    updates = [n for n in nodes if n.op == "SGDUpdate"]
    assert system and len(updates) == 4
    default = graph_data(nodes, expanded=EVERY_SCOPE)
    assert not {"gradient", "optimizer"} & set(default.nodes["category"])
    assert not [n for n in default.nodes["name"] if n.startswith("System") or n.endswith(("momentum", "Update"))]
    assert "Input_4" in {n.name for n in nodes} and "Input_4" in default.nodes["name"]   # labels: the loss reads it

    shown = graph_data(nodes, show_training=True)
    rows = by_label(shown)
    assert shown.nodes["category"][rows[f"System ({len(system)} gradient ops)"]] == "gradient"
    assert shown.nodes["category"][rows["hidden (4 optimizer ops)"]] == "optimizer"      # momentum + update, x2
    assert shown.nodes["category"][rows["hidden (5 ops)"]] == "scope"                    # the forward scope
    # Every op is somewhere: in its own box or counted in a scope's.
    counts = [int(re.search(r"\((\d+)", label).group(1)) if kind == "scope" else 1
              for label, kind in zip(shown.nodes["label"], shown.nodes["kind"])]
    assert counts == shown.nodes["count"] and sum(counts) == len(nodes)


def test_look_alike_ops_get_distinct_labels_and_their_full_name_on_hover():
    drawing = graph_data(demo_nodes(), show_training=True, expanded=EVERY_SCOPE)
    rows = by_label(drawing)
    assert {"hidden/weight/momentum", "output/weight/momentum"} <= set(rows)     # not two "weight/momentum"
    assert drawing.nodes["name"][rows["hidden/weight/momentum"]] == "hidden/weight/momentum"
    assert drawing.nodes["name"][rows["Matmul_3"]] == "System/AutoGrad/output_matmul/Matmul_3"
    assert len(set(drawing.nodes["label"])) == len(drawing.nodes["label"])
    # A long name keeps its start and end.
    long = [Node("a" * 30 + "/" + "b" * 30, "Op", (), ""), Node("c", "Op", ("a" * 30 + "/" + "b" * 30,), "")]
    label = graph_data(long).nodes["label"][0]
    assert label == "b" * 30                                                 # the shortest distinct suffix
    label = graph_data([Node("x" * 60, "Op", (), "")]).nodes["label"][0]
    assert len(label) == graph_view.MAX_LABEL and label.startswith("x" * 12 + "…")


def test_colours_come_by_op_category():
    drawing = graph_data(demo_nodes(), show_training=True, expanded=EVERY_SCOPE)
    colour = dict(zip(drawing.nodes["category"], drawing.nodes["color"]))
    assert set(colour) == {"input", "shape", "variable", "matmul/conv", "other", "activation", "loss", "gradient",
                           "optimizer"}
    assert len(set(colour.values())) == len(colour)
    assert graph_view.category("aten::linear") == "matmul/conv" and graph_view.category("Relu") == "activation"
    assert graph_view.category("SparseSoftmaxCrossEntropy") == "loss"


def test_cycles_self_loops_unknown_inputs_and_repeated_names_are_drawn():
    nodes = [Node("a", "Op", ("c", "zz"), ""), Node("b", "Op", ("a", "b"), ""), Node("c", "Op", ("b",), ""),
             Node("a", "Other", (), ""), Node("lonely", "Op", (), "")]
    drawing = graph_data(nodes)
    assert drawing.nodes["name"] == ["a", "b", "c", "lonely"] and drawing.nodes["op"][0] == "Op"
    assert len(drawing.edges["xs"]) == 3 and overlaps(drawing.nodes) == []
    assert graph_data([]).nodes["name"] == []


def synthetic_net(n_ops, blocks):
    """A network of ``blocks`` scopes of dense layers (weight, bias, matmul, add, relu), skip connections every third
    block, ``n_ops`` ops in all; with ``blocks=0`` the same ops without scopes."""
    nodes, previous, rng = [Node("x", "Input", (), "")], "x", random.Random(0)
    for i in itertools.count():
        scope = f"block{i % blocks}/" if blocks else ""
        p = f"{scope}l{i}_" if blocks else f"l{i}."            # "l0_matmul" would group l0's ops into "l0"
        skip = (rng.choice(nodes).name,) if i % 3 == 2 else ()
        nodes += [Node(p + "weight", "Variable", (), ""), Node(p + "bias", "Variable", (), ""),
                  Node(p + "matmul", "MatMul", (previous, p + "weight"), ""),
                  Node(p + "add", "BiasAdd", (p + "matmul", p + "bias") + skip, ""),
                  Node(p + "relu", "Relu", (p + "add",), "")]
        previous = p + "relu"
        if len(nodes) >= n_ops:
            return nodes[:n_ops]


@pytest.mark.parametrize("n_ops", [300, 1000])
def test_hundreds_of_ops_stay_readable(n_ops):
    flat = synthetic_net(n_ops, blocks=0)
    start = time.perf_counter()
    drawing = graph_data(flat)
    seconds = time.perf_counter() - start
    shown = min(n_ops, graph_view.MAX_NODES)
    assert len(drawing.nodes["name"]) == shown
    assert ("showing the first" in drawing.note) == (n_ops > graph_view.MAX_NODES)
    assert_readable(drawing)
    scoped = graph_data(synthetic_net(n_ops, blocks=12))
    assert len(scoped.nodes["name"]) == 13 and scoped.note == ""                # x and 12 collapsed blocks
    print(f"layout of {shown} boxes ({n_ops} ops, no scopes): {seconds:.2f} s")     # reported, not asserted


# ------------------------------------------------------------------------------------------------ the view

def demo_logdir(logdir):
    """A logdir like ``flowlab demo``'s: one run holding the train job's graph (and a scalar)."""
    from flowlab.examples import digits_mlp
    train_job, _ = digits_mlp.build()
    with SummaryWriter(logdir / "20260101-120000") as writer:
        writer.add_graph(train_job)
        writer.add_scalar("train/loss", 1.0, 0)
    return logdir


XSS = "<img src=x onerror=window.__xss=1>"


def hostile_graph_def():
    """A GraphDef whose op names and types are markup, in a scope of two ops (of 35: it opens collapsed)."""
    from flowlab.summary import proto
    graph = proto.GraphDef()
    graph.node.add(name=f"{XSS}/a", op=XSS)
    graph.node.add(name=f"{XSS}/b", op=XSS, input=[f"{XSS}/a"])
    graph.node.add(name="c", op="Identity", input=[f"{XSS}/b"])
    for i in range(graph_view.OPEN_WHOLE):     # a graph too big to open whole, the scope too small to open
        graph.node.add(name=f"d{i}", op="Const")         # unconnected: packed in rows, within the frame
    return graph.SerializeToString()


def view_of(logdir):
    store = Store(logdir)
    store.poll()
    view = GraphView(store)
    view.update()
    return view


def test_view_expands_a_tapped_scope_and_collapses_it_from_the_list(tmp_path):
    view = view_of(demo_logdir(tmp_path))
    assert view.figure.visible and view.controls.visible and view.scopes_row.visible
    # 13 forward ops (<= OPEN_WHOLE): the graph opens whole; unticked in the list, its scopes collapse.
    assert view.scopes.labels == ["hidden", "output"] and view.scopes.active == [0, 1]
    assert {"hidden_matmul", "output/weight"} <= set(view.nodes_source.data["name"])
    view.scopes.active = []
    data = view.nodes_source.data
    assert {"hidden", "output"} <= set(data["name"]) and view.expanded == set()
    view.nodes_source.selected.indices = [data["name"].index("hidden")]        # what a tap does
    assert "hidden/weight" in view.nodes_source.data["name"] and view.expanded == {"hidden"}
    assert view.nodes_source.selected.indices == [] and view.scopes.active == [0]
    view.nodes_source.selected.indices = [view.nodes_source.data["name"].index("hidden_matmul")]   # an op: nothing
    assert view.expanded == {"hidden"}
    view.training.active = [0]
    assert "System" in view.nodes_source.data["name"]
    # System holds 9 ops (<= OPEN_WHOLE): a tap opens it whole, its scopes of two ops or more too.
    view.nodes_source.selected.indices = [view.nodes_source.data["name"].index("System")]
    assert view.expanded == {"hidden"} | {f"{scope} (gradient)" for scope in (
        "System", "System/AutoGrad", "System/AutoGrad/hidden_matmul", "System/AutoGrad/output_matmul",
        "System/AutoGrad/hidden", "System/AutoGrad/output")}
    assert "System/AutoGrad/hidden_matmul/Matmul_6" in view.nodes_source.data["name"]
    view.scopes.active = [i for i, s in enumerate(view.scopes.labels) if s == "hidden"]     # untick System
    assert view.expanded == {"hidden"}                                  # and with it the scopes inside
    assert "System" in view.nodes_source.data["name"]
    view.training.active = []
    assert not any(n.startswith("System") for n in view.nodes_source.data["name"])
    nodes = demo_nodes()
    shown = len([n for n in nodes if not (n.name.startswith("System") or n.name.endswith(("momentum", "Update")))])
    # inputs, reshape, hidden's 5 ops, output (collapsed) and the loss; 9 edges
    assert view.note.text == f"{shown} of {len(nodes)} ops in 10 boxes (1 collapsed name scope), 9 edges (from " \
                             "GraphDef)"


def test_the_graph_menu_lists_the_runs_the_run_list_shows(tmp_path):
    view = view_of(demo_logdir(tmp_path))
    assert [label for _, label in view.select.options] == ["20260101-120000"]
    view.runs = SimpleNamespace(shows=lambda run: False)            # the run unchecked in the run list
    view.update()
    assert view.select.options == [] and not (view.figure.visible or view.controls.visible)
    assert view.note.text == "None of the checked runs has a graph: check more runs in the run list."
    view.runs = SimpleNamespace(shows=lambda run: True)
    view.update()
    assert view.figure.visible and "hidden_matmul" in view.nodes_source.data["name"]


def test_a_damaged_graph_or_none_shows_one_line_and_no_plot(tmp_path):
    empty = view_of(tmp_path / "empty")
    assert empty.note.text == "No graph in this logdir yet."
    assert not (empty.figure.visible or empty.controls.visible or empty.scopes_row.visible)

    with SummaryWriter(tmp_path / "bad") as w:
        w.file_writer.add_graph_def(b"\x0a\xff\xff\xff\xff<script>")          # a GraphDef cut short
    with SummaryWriter(tmp_path / "structure") as w:
        w.file_writer.add_graph_def(b"")
    (tmp_path / "structure" / "structure_graph.json").write_text(
        '{"jobs": [{"name": "<b>job</b>", "layers": [{"name": 3, "inbound_nodes": [{}]}]}, "not a job"]}')
    view = view_of(tmp_path)
    notes = {}
    for value, label in view.select.options:
        view.select.value = value
        notes[label] = view.note.text
        assert not view.figure.visible and view.controls.visible and "\n" not in view.note.text
    assert notes["bad"].startswith("Could not read the graph of bad: DecodeError")
    assert notes["structure: <b>job</b>"].startswith("Could not read the graph of structure: ValueError")
    assert "<" not in "".join(notes.values())


# ------------------------------------------------------------------------------------------------ in Chromium

IDLE_JS = "() => Bokeh.index.roots.every((v) => v.is_idle)"
# Each box as the page draws it, in canvas pixels, with its label's width measured in the font the page draws it in.
BOXES_JS = """() => {
    const doc = Bokeh.documents[0];
    const fig = doc.get_model_by_name("graph-figure"), labels = doc.get_model_by_name("graph-labels");
    const d = doc.get_model_by_name("graph-boxes").data_source.data;
    const {x_scale, y_scale, bbox} = Bokeh.index.get_one(fig).frame;
    const size = labels.glyph.text_font_size;
    const font = typeof size === "string" ? size : size.value;
    const ctx = document.createElement("canvas").getContext("2d");
    ctx.font = `${font} monospace`;
    const boxes = Array.from(d.x, (x, i) => ({
        left: x_scale.compute(x - d.w[i] / 2), right: x_scale.compute(x + d.w[i] / 2),
        top: y_scale.compute(d.y[i] + d.h[i] / 2), bottom: y_scale.compute(d.y[i] - d.h[i] / 2),
        label: d.label[i], name: d.name[i], text: ctx.measureText(d.label[i]).width}));
    const page = Bokeh.index.get_one(fig).el.getBoundingClientRect();
    return {boxes, font, visible: fig.visible && labels.visible, page: [page.x, page.y],
            frame: {left: bbox.left, right: bbox.right, top: bbox.top, bottom: bbox.bottom}};
}"""


def drawn_boxes(page):
    state = page.evaluate(BOXES_JS)
    assert state["visible"] and state["boxes"]
    boxes, frame = state["boxes"], state["frame"]
    for b in boxes:
        assert b["text"] + 4 <= b["right"] - b["left"], f"label {b['label']!r} wider than its box"
        assert frame["left"] <= b["left"] and b["right"] <= frame["right"], f"{b['label']!r} cut at the frame's edge"
        assert frame["top"] <= b["top"] and b["bottom"] <= frame["bottom"], f"{b['label']!r} cut at the frame's edge"
    overlapping = [(a["label"], b["label"]) for a, b in itertools.combinations(boxes, 2)
                   if a["left"] < b["right"] and b["left"] < a["right"] and a["top"] < b["bottom"]
                   and b["top"] < a["bottom"]]
    assert overlapping == []
    return state


@pytest.fixture(scope="module")
def graph_page(tmp_path_factory, request):
    from jupyter_page import CHROMIUM
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"needs Debian's chromium at {CHROMIUM} (.ci/run installs it: apt-get install -y chromium)")
    pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install -e '.[test]')")
    from dashboard_page import flowlab_serve, open_dashboard
    chromium = request.getfixturevalue("chromium")
    import flowlab as flow
    flow.clear_default_session()
    logdir = demo_logdir(tmp_path_factory.mktemp("logs"))
    with SummaryWriter(logdir / XSS) as writer:              # sorts after the demo's run: not shown at first
        writer.file_writer.add_graph_def(hostile_graph_def())
    with flowlab_serve(logdir, tmp_path_factory.mktemp("server") / "stderr.txt") as (url, log):
        warnings = []
        page, errors = open_dashboard(chromium, url, viewport={"width": 1400, "height": 900}, warnings=warnings)
        page.locator(".bk-tab", has_text=re.compile(r"^Graph$")).first.click()
        page.wait_for_function("""() => { const fig = Bokeh.documents[0].get_model_by_name("graph-figure");
            return fig && fig.visible && Bokeh.index.roots.every((v) => v.is_idle); }""", polling=50)
        yield dict(page=page, errors=errors, warnings=warnings, log=log)
        page.close()


def wait_for_names(page, check):
    page.wait_for_function(f"""() => {{ const names = Bokeh.documents[0].get_model_by_name("graph-boxes")
        .data_source.data.name; return ({check}) && Bokeh.index.roots.every((v) => v.is_idle); }}""", polling=50)
    page.wait_for_timeout(200)


def test_demo_graph_labels_do_not_overlap_in_the_page(graph_page):
    page = graph_page["page"]
    state = drawn_boxes(page)
    labels = [b["label"] for b in state["boxes"]]
    assert "hidden_matmul" in labels and not any(label.startswith("System") for label in labels)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "graph.png"), full_page=True)
    # Zoomed out, the labels shrink with their boxes.
    zoom = """(factor) => { const fig = Bokeh.documents[0].get_model_by_name("graph-figure");
        for (const r of [fig.x_range, fig.y_range]) {
            const middle = (r.reset_start + r.reset_end) / 2, half = (r.reset_end - r.reset_start) / 2 * factor;
            r.setv({start: middle - half, end: middle + half});
        } }"""
    page.evaluate(zoom, 2)
    page.wait_for_function(IDLE_JS, polling=50)
    zoomed = drawn_boxes(page)
    assert float(zoomed["font"].removesuffix("px")) == pytest.approx(float(state["font"].removesuffix("px")) / 2,
                                                                     rel=0.02)
    page.evaluate(zoom, 1)
    page.wait_for_function(IDLE_JS, polling=50)
    assert drawn_boxes(page)["font"] == state["font"]
    assert graph_page["errors"] == [] and graph_page["warnings"] == []


def test_tapping_a_scope_expands_it_and_the_list_collapses_it(graph_page):
    page = graph_page["page"]
    page.locator("label", has_text=re.compile(r"^hidden$")).locator("input").uncheck()     # opened whole at first
    wait_for_names(page, '!names.includes("hidden/weight") && names.includes("hidden")')
    state = drawn_boxes(page)
    hidden = next(b for b in state["boxes"] if b["name"] == "hidden")
    page.mouse.click(state["page"][0] + (hidden["left"] + hidden["right"]) / 2,
                     state["page"][1] + (hidden["top"] + hidden["bottom"]) / 2)
    wait_for_names(page, 'names.includes("hidden/weight")')
    drawn_boxes(page)
    page.locator("label", has_text="show gradients and optimizer").locator("input").check()
    wait_for_names(page, 'names.includes("System")')
    state = drawn_boxes(page)
    labels = {b["label"] for b in state["boxes"]}
    assert "hidden (4 optimizer ops)" in labels and any(re.fullmatch(r"System \(\d+ gradient ops\)", s) for s in labels)
    page.screenshot(path=str(SHOTS / "graph-training.png"), full_page=True)
    page.locator("label", has_text=re.compile(r"^hidden$")).locator("input").uncheck()
    wait_for_names(page, '!names.includes("hidden/weight") && names.includes("hidden")')
    drawn_boxes(page)
    assert graph_page["errors"] == [] and graph_page["warnings"] == []


def test_markup_in_a_graph_stays_text(graph_page):
    page = graph_page["page"]
    page.evaluate("""(run) => { const select = [...Bokeh.documents[0].all_models].find((m) =>
        m.constructor.__name__ === "Select" && m.title === "Graph");
        select.value = select.options.find(([value, label]) => label === run)[0]; }""", XSS)
    wait_for_names(page, f'names.includes({XSS!r})')
    state = drawn_boxes(page)
    scope = next(b for b in state["boxes"] if b["name"] == XSS)
    page.mouse.move(state["page"][0] + (scope["left"] + scope["right"]) / 2,
                    state["page"][1] + (scope["top"] + scope["bottom"]) / 2)     # its tooltip
    page.wait_for_timeout(300)
    page.mouse.click(state["page"][0] + (scope["left"] + scope["right"]) / 2,
                     state["page"][1] + (scope["top"] + scope["bottom"]) / 2)    # expanded: listed, ops drawn
    wait_for_names(page, f'names.includes({XSS + "/a"!r})')
    assert page.locator("label", has_text=XSS).count() == 1                  # the scope list shows it as text
    assert page.evaluate("() => window.__xss") is None
    assert graph_page["errors"] == [] and graph_page["warnings"] == []
