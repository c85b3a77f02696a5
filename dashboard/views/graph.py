"""The Graph tab: a job's graph as a layered DAG.

Sources, per run: flowlab's ``structure_graph.json`` in the run directory when there is one (one graph per job, as
the store last read it: ``Store.structure_graph``, again whenever the file changes), else the run's last ``GraphDef``
from its event files (``add_graph`` of flowlab, tensorboardX or torch), whose inputs are producer names with an
optional ``^`` (control input) prefix and ``:k`` (output k) suffix, and whose ``_output_shapes`` attr, when present,
gives the output shapes.

What is drawn (``graph_data``, pure): one box per op, except that
- name scopes (the prefixes of op names up to a ``/``; flowlab's structure graph also joins scopes with ``-``), and
  inside them the prefixes up to a ``_`` that do not just number a name (``scopes_of``: ``hidden_matmul`` is in
  ``hidden`` with ``hidden-weight``; ``res2_0_branch2a`` in block ``res2_0``), are collapsed into one box each,
  "scope (N ops)", until expanded (tap the box, or tick the scope in the list). A graph opens with the scopes that
  hold most of its ops expanded (``default_expanded``: OneFlow-Benchmark's ``Resnet`` namespace, so ResNet-50 opens
  on its 16 residual blocks, one box each; a graph of at most ``OPEN_WHOLE`` ops opens whole); a tapped scope of at
  most ``OPEN_WHOLE`` ops opens whole; a scope's gradient and optimizer ops open apart (``scope_key``);
- gradient and optimizer ops (flowlab's ``System/AutoGrad``, ``*Update`` ops, and optimizer state such as momentum,
  read by nothing else) are left out unless asked for; when shown, they fold into scopes of their own, apart from
  the forward ops of the same scope, so that folding does not close a cycle (``hidden`` → ... → ``hidden``);
- variables can be left out too; past ``MAX_NODES`` boxes, only the first ``MAX_NODES`` are drawn.
Labels are the shortest name suffixes that no other box shares (hover shows the full name), drawn in a monospace
font so that each box can be sized to its label. grandalf's Sugiyama layout (the layered layout of Graphviz's dot)
places the boxes top to bottom without overlaps; edges are its routed polylines, with arrowheads.

Health (``flow.watch_health`` reports logged by ``SummaryWriter.add_health``): when the shown graph's run has them,
each box of a layer (``layers_of``: the rule of ``flowlab.health.find_layers``) is drawn over in its layer's state at
the latest report (``layer_states``: NaN/Inf, an alert, healthy; a legend beside the categories') or, chosen in a
menu, in one statistic's colour (the heatmap's scale, ``flowlab.plots.health.color_scale``; a colour bar above the
graph); hover shows the layer's latest statistics, and tapping an op of a layer opens the Health tab on it
(``?tab=health&run=...&layer=...``, in the page; a scope's box still expands). New reports only resend the boxes'
health columns. Without reports the tab is as it was.

Everything from a log reaches the browser as data-source text: tooltip fields (escaped by Bokeh), canvas text and
CheckboxGroup labels (text nodes); the notes are escaped.
"""
from __future__ import annotations

import html
import json
import logging
import re
import threading
from collections import Counter
from itertools import chain
from typing import NamedTuple

import numpy as np
from bokeh.core.properties import value
from bokeh.layouts import column, row
from bokeh.models import (Arrow, BoxZoomTool, CDSView, CheckboxGroup, ColorBar, ColumnDataSource, CustomJS,
                          CustomJSFilter, Div, HoverTool, InlineStyleSheet, Legend, LegendItem, Range1d, Rect, Select,
                          TapTool, VeeHead)
from bokeh.plotting import figure
from grandalf.graphs import Edge, Vertex, graph_core
from grandalf.layouts import SugiyamaLayout

from flowlab.plots.colours import run_colours
from flowlab.plots.figures import ALARM, served, value_labels
from flowlab.plots.health import LINEAR, color_scale, scale_values, value_range
from flowlab.summary import proto
from flowlab.summary.oneflow_api import STRUCTURE_GRAPH_FILE as STRUCTURE_FILE
from flowlab.summary.thinning import NONFINITE

from .base import View

log = logging.getLogger(__name__)

# Boxes laid out at most. grandalf takes 0.03-0.7 s for 300 boxes (a chain to a tangle of training ops), 1-2 s for
# 1,000 (2 cores); past THREAD_BOXES the layout runs in a thread, and scopes are collapsed by default, so only a flat
# graph or many expanded scopes reach this.
MAX_NODES = 300
VARIABLE_OPS = frozenset({"Variable", "VariableV2", "VarHandleOp", "prim::GetAttr"})
TRAINING_SCOPES = frozenset({"System", "gradients"})    # flowlab's autograd and loss seeds; TensorFlow's gradients
_DATA_TYPES = proto.descriptor("tensorboard.AttrValue").fields_by_name["type"].enum_type

# Geometry, in screen pixels at zoom 1. Monospace: a label's width is known here (0.6 em a character in DejaVu Sans
# Mono and Liberation Mono; a little more is kept), so a box can hold its label.
FONT_PX = 11
CHAR_W = 0.62 * FONT_PX
PAD_X, BOX_H = 7, 22
X_SPACE, Y_SPACE = 18, 34       # between boxes of a layer, between layers
MAX_LABEL = 40                  # characters; longer labels keep their start and end
MARGIN = 16                     # around the graph in the plot frame
# The plot frame at most (the legend and toolbar go beside it, within a 1400 px window): ResNet-50's 22-box chain
# of blocks fits at zoom 1, and with its gradient and optimizer boxes (1,315 px wide) at 0.7.
MAX_FRAME = (940, 1280)
MIN_FRAME = (320, 140)
MIN_SCALE = 0.7                 # a large graph is shown shrunk to fit down to this zoom, then it must be panned
DOMINANT_SHARE = 0.5            # a scope holding more than this share of the ops shown opens by default
OPEN_WHOLE = 32                 # a graph, or a tapped scope, of at most this many ops opens whole
THREAD_BOXES = 120               # a page showing more boxes is laid out in a thread, beside the session's IOLoop
TRAINING_EDGE_ALPHA = 0.25      # an edge into or out of a gradient or optimizer box
KEPT_DRAWINGS = 8               # laid-out drawings a view keeps, so that collapsing a scope again is instant
SCOPES_WIDTH, SCOPE_LINES = 960, 4
SCOPES_CSS = (f".bk-input-group.bk-inline{{flex-wrap:wrap;max-height:{SCOPE_LINES * 22}px;overflow-y:auto;"
              "column-gap:14px}.bk-input-group.bk-inline > *:not(:first-child){margin-left:0}")

# Op categories, the first matching rule wins (on the lower-cased op type), and their colours (the one palette).
CATEGORY_RULES = (
    ("input", r"^(input|placeholder|io node)$"),
    ("variable", r"variable|varhandle|getattr|parameter"),
    ("loss", r"loss|entropy|mse|nll"),
    ("matmul/conv", r"matmul|conv|linear|dense|gemm|bmm|einsum"),
    ("activation", r"relu|sigmoid|tanh|softmax|gelu|silu|swish|softplus"),
    ("shape", r"reshape|transpose|concat|split|squeeze|flatten|slice|gather|view|expand|identity|cast|pad|permute"),
)
CATEGORY_COLORS = dict(zip(("input", "variable", "matmul/conv", "activation", "loss", "shape", "gradient", "other",
                            "optimizer", "scope"), run_colours()))


def _tint(colour, share=0.22):
    """``colour`` at ``share`` over white, opaque: a box's fill that reads the same on a light or a dark page, under
    dark label text."""
    rgb = [int(colour[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(255 - share * (255 - c)):02x}" for c in rgb)


CATEGORY_TINTS = {category: _tint(colour) for category, colour in CATEGORY_COLORS.items()}


class Node(NamedTuple):
    name: str
    op: str
    inputs: tuple           # producer node names
    outputs: str            # shapes and dtypes, as text
    source: str = ""        # where a flowlab job created it


class Box(NamedTuple):
    """One box to draw: an op, or a collapsed scope (``name`` is then the scope's path)."""
    kind: str               # "op" or "scope"
    name: str
    op: str
    category: str
    count: int              # ops inside
    outputs: str
    source: str
    role: str               # "", "gradient" or "optimizer"


class Drawing(NamedTuple):
    nodes: dict             # node columns: x, y (centre), w, h, label, name, kind, count (ops), op, ..., role
    edges: dict             # edge columns: xs, ys (polylines, first point at the producer), start, end (node rows),
                            # alpha (faint when a gradient or optimizer box is at either end)
    heads: dict             # arrowhead columns: x0, y0 -> x1, y1 (the last segment of each edge), alpha
    bounds: tuple           # (left, right, bottom, top) of everything drawn
    scopes: list            # the scopes the page lists: expanded ones and those shown collapsed
    note: str


# ------------------------------------------------------------------------------------------------------ parsing

def _producer(name: str) -> str:
    """A NodeDef input as its producer's name: no ``^`` control prefix, no ``:k`` output suffix."""
    return re.sub(r":\d+$", "", name[1:] if name.startswith("^") else name)


def _shape(shape) -> str:
    if shape.unknown_rank:
        return "?"
    dims = ["?" if d.size < 0 else str(d.size) for d in shape.dim]
    return f"({dims[0]},)" if len(dims) == 1 else "(" + ", ".join(dims) + ")"


def _dtype(node) -> str:
    """The node's ``dtype`` (or TensorFlow's ``T``) attr as ``float``, ``int64``, ...; "" when it has none."""
    for key in ("dtype", "T"):
        if key in node.attr and node.attr[key].type:
            value = _DATA_TYPES.values_by_number.get(node.attr[key].type)
            return value.name.removeprefix("DT_").lower() if value is not None else str(node.attr[key].type)
    return ""


def nodes_from_graph_def(data: bytes) -> list[Node]:
    """The nodes of a serialised ``GraphDef``."""
    out = []
    for n in proto.GraphDef.FromString(data).node:
        shapes = [_shape(s) for s in n.attr["_output_shapes"].list.shape] if "_output_shapes" in n.attr else []
        dtype = _dtype(n)
        out.append(Node(n.name, n.op, tuple(dict.fromkeys(_producer(i) for i in n.input)),
                        "; ".join(f"{s} {dtype}".strip() for s in shapes) or dtype))
    return out


def nodes_from_structure(job: dict) -> list[Node]:
    """The nodes of one job of flowlab's structure graph (``graph_export.structure_json``)."""
    out = []
    for layer in job.get("layers", []):
        inbound = layer.get("inbound_nodes", [])
        if not isinstance(layer["name"], str) or not all(isinstance(i, str) for i in inbound):
            raise ValueError(f"a layer's name or inbound_nodes are not text: {layer['name']!r}"[:200])
        outputs = layer.get("config", {}).get("outputs", [])
        text = "; ".join(f"{o.get('name', '')}: {tuple(o.get('shape', []))} {o.get('dtype', '')}" for o in outputs)
        out.append(Node(layer["name"], str(layer.get("class_name", "")), tuple(dict.fromkeys(inbound)), text,
                        str(layer.get("source") or "")))
    return out


# ------------------------------------------------------------------------------------------------------ grouping

def scopes_of(name: str, seps: str) -> list[str]:
    """The groups holding ``name``, outermost first: its name scopes (``a/b/c`` -> ``["a", "a/b"]``) and, inside each
    part, the prefixes that end before a ``_`` (``res2_0_branch2a_relu`` -> ``res2_0``, ``res2_0_branch2a``,
    ``res2_0_branch2a``'s ``_relu`` being the op). A ``_`` followed by digits alone numbers a name rather than
    ending one (``Dense_3_matmul`` is in ``Dense_3``, never ``Dense``; ``Input_0`` is in nothing): OneFlow names a
    layer's ops ``<layer>_<op>``, and real networks their blocks ``<stage>_<i>_<branch>``."""
    out = []
    for i, c in enumerate(name):
        if i == 0 or name[i - 1] in seps or name[i - 1] == "_":
            continue
        if c in seps:
            out.append(name[:i])
        elif c == "_":
            token = re.match(r"[^_" + re.escape(seps) + r"]*", name[i + 1:]).group(0)
            if token and not token.isdigit():
                out.append(name[:i])
    return out


def category(op: str) -> str:
    """The colour category of an op type (``CATEGORY_RULES``), "other" when no rule matches."""
    op = op.lower().rsplit("::", 1)[-1]
    return next((name for name, rule in CATEGORY_RULES if re.search(rule, op)), "other")


def training_roles(nodes: list, seps: str) -> dict:
    """``{name: "gradient" | "optimizer"}`` for the ops that only training needs: gradients (``System/...``,
    ``gradients/...``, ``*Grad`` ops), optimizer updates (``*Update``, TensorFlow's ``Apply*``), and sources
    (no inputs: momentum and other optimizer state) that only those ops read."""
    role = {}
    for n in nodes:
        if re.search(r"Update$|^(Resource)?Apply", n.op):
            role[n.name] = "optimizer"
        elif re.split(f"[{re.escape(seps)}]", n.name, maxsplit=1)[0] in TRAINING_SCOPES or n.op.endswith("Grad"):
            role[n.name] = "gradient"
    readers: dict[str, set] = {}
    for n in nodes:
        for i in n.inputs:
            readers.setdefault(i, set()).add(role.get(n.name, ""))
    for n in nodes:
        roles = readers.get(n.name, {""})
        if not n.inputs and n.name not in role and "" not in roles:
            role[n.name] = "optimizer" if "optimizer" in roles else "gradient"
    return role


def scope_key(scope: str, role="") -> str:
    """How ``expanded`` and the scope list name a scope's ops of one role: ``scope`` for the forward ops,
    ``"scope (optimizer)"`` for its optimizer ops (opened apart: ResNet-50's 16 blocks' optimizer boxes in one row
    would be 3,700 px wide, so they stay in one box until that box is tapped)."""
    return f"{scope} ({role})" if role else scope


def split_scope_key(key: str) -> tuple[str, str]:
    """``scope_key`` undone: ``(scope, role)``."""
    found = re.fullmatch(r"(.*) \((gradient|optimizer)\)", key, re.DOTALL)
    return (found.group(1), found.group(2)) if found else (key, "")


def shown_nodes(nodes: list, show_variables=True, show_training=False, seps="/") -> tuple[list, dict]:
    """(the nodes drawn, in boxes of their own or in scopes; ``training_roles``)."""
    roles = training_roles(nodes, seps)
    first: dict[str, Node] = {}
    for n in nodes:
        first.setdefault(n.name, n)                         # a repeated name (a damaged graph): its first node
    kept = [n for n in first.values()
            if (show_variables or n.op not in VARIABLE_OPS) and (show_training or n.name not in roles)]
    return kept, roles


def visible_graph(nodes: list, show_variables=True, show_training=False, expanded=(), seps="/",
                  max_nodes=MAX_NODES):
    """(boxes, edges as (producer row, consumer row) pairs, scopes to list, note): ``nodes`` grouped for drawing
    (see the module docstring)."""
    kept, roles = shown_nodes(nodes, show_variables, show_training, seps)
    # Each op's box: its outermost collapsed scope (split by role), else the op itself. An op named as a group is in
    # it (the convolution ``conv1`` with ``conv1-weight`` and ``conv1_relu``).
    chains = {n.name: scopes_of(n.name, seps) for n in kept}
    groups = set(chain.from_iterable(chains.values()))
    members, opened = {}, set()
    for n in kept:
        key, role = ("op", n.name, ""), roles.get(n.name, "")
        for scope in chains[n.name] + ([n.name] if n.name in groups else []):
            if scope_key(scope, role) not in expanded:
                key = ("scope", scope, role)
                break
            opened.add(scope_key(scope, role))
        members.setdefault(key, []).append(n)
    # A scope of one op: the op says more.
    members = {(("op", g[0].name, "") if k[0] == "scope" and len(g) == 1 else k): g for k, g in members.items()}
    key_of = {n.name: key for key, group in members.items() for n in group}
    listed = opened | {scope_key(key[1], key[2]) for key in members if key[0] == "scope"}
    note = ""
    keys = list(members)
    if len(keys) > max_nodes:
        note = f"showing the first {max_nodes} of {len(keys)} boxes: collapse scopes or hide variables to see more"
        keys = keys[:max_nodes]
    row_of = {key: i for i, key in enumerate(keys)}
    boxes = []
    for key in keys:
        group = members[key]
        if key[0] == "op":
            n = group[0]
            role = roles.get(n.name, "")
            boxes.append(Box("op", n.name, n.op, role or category(n.op), 1, n.outputs, n.source, role))
        else:
            role = key[2]
            ops = sorted({n.op for n in group})
            boxes.append(Box("scope", key[1], "name scope (tap to expand)", role or "scope", len(group),
                             f"{len(group)} ops: " + ", ".join(ops[:8]) + (", ..." if len(ops) > 8 else ""), "",
                             role))
    edges = {(row_of[key_of[i]], row_of[key_of[n.name]]) for n in kept for i in n.inputs
             if i in key_of and key_of[i] in row_of and key_of[n.name] in row_of and key_of[i] != key_of[n.name]}
    return boxes, sorted(edges), sorted(listed), note


def default_expanded(nodes: list, show_variables=True, show_training=False, seps="/") -> set:
    """The scopes a graph opens with. A graph of at most ``OPEN_WHOLE`` forward ops opens whole; a bigger one opens
    any scope holding more than ``DOMINANT_SHARE`` of the ops shown (a model wrapped in one namespace, as
    OneFlow-Benchmark's ``Resnet``), level after level, and keeps the rest collapsed (so ResNet-50 opens on its stem,
    16 residual blocks and classifier, each block one box)."""
    kept, roles = shown_nodes(nodes, show_variables, show_training, seps)
    forward = [n for n in kept if n.name not in roles]
    if len(forward) <= OPEN_WHOLE:
        sizes = Counter(chain.from_iterable(scopes_of(n.name, seps) + [n.name] for n in forward))
        return {group for group, size in sizes.items() if size > 1}
    expanded: set[str] = set()
    while True:
        boxes = visible_graph(nodes, show_variables, show_training, expanded, seps, max_nodes=len(nodes))[0]
        total = sum(b.count for b in boxes)
        dominant = {b.name for b in boxes if b.kind == "scope" and not b.role and b.count > DOMINANT_SHARE * total}
        if not dominant:
            return expanded
        expanded |= dominant


def inner_scopes(nodes: list, key: str, seps: str, show_variables=True, show_training=False) -> set:
    """The ``scope_key``s of the groups of two ops or more inside the scope box ``key`` (its ops' ``scopes_of``
    deeper than it, among the ops of its role that are shown): what opening that box whole expands."""
    scope, role = split_scope_key(key)
    kept, roles = shown_nodes(nodes, show_variables, show_training, seps)
    sizes: Counter = Counter()
    for n in kept:
        groups = scopes_of(n.name, seps)
        if roles.get(n.name, "") == role and scope in groups:
            sizes.update(groups[groups.index(scope) + 1:] + [n.name])   # an op named as a group is in it
    return {scope_key(group, role) for group, size in sizes.items() if size > 1}


def labels(boxes: list, seps: str) -> list[str]:
    """Each box's label: the shortest suffix of its name, cut at a scope boundary, that no other box's label is
    (scopes add "(N ops)"), middle-shortened past ``MAX_LABEL`` characters unless that would repeat a label."""
    starts = [[0] + [i + 1 for i, c in enumerate(b.name) if c in seps and i + 1 < len(b.name)] for b in boxes]
    tails = ["" if b.kind == "op" else f" ({b.count}{' ' + b.role if b.role else ''} ops)" for b in boxes]
    level = [len(s) - 1 for s in starts]                    # index into starts: the shortest suffix first

    def text(i):
        return boxes[i].name[starts[i][level[i]]:] + tails[i]

    while True:
        seen: dict[str, list] = {}
        for i in range(len(boxes)):
            seen.setdefault(text(i), []).append(i)
        longer = [i for same in seen.values() if len(same) > 1 for i in same if level[i] > 0]
        if not longer:
            break
        for i in longer:
            level[i] -= 1
    full = [text(i) for i in range(len(boxes))]
    short = [t if len(t) <= MAX_LABEL else t[:12] + "…" + t[-(MAX_LABEL - 13):] for t in full]
    counts = Counter(short)
    return [f if counts[s] > 1 else s for f, s in zip(full, short)]


# ------------------------------------------------------------------------------------------------------ layout

class _Size:
    """A box as grandalf sees it: it reads ``w`` and ``h`` and writes the centre to ``xy``."""

    def __init__(self, w, h):
        self.w, self.h, self.xy = w, h, (0.0, 0.0)


class _Route:
    """An edge as grandalf sees it: it writes the points the edge goes through."""

    def setpath(self, pts):
        self.pts = pts


class _Sugiyama(SugiyamaLayout):
    def _detect_alignment_conflicts(self):
        super()._detect_alignment_conflicts()
        self.conflicts = set(self.conflicts)    # grandalf looks pairs up in this list: seconds at a thousand nodes

    def setxy(self):
        """grandalf's coordinates, then boxes pushed apart along each layer: the average of Brandes and Köpf's four
        alignments keeps the order but not always the spacing of boxes of different widths."""
        super().setxy()
        for layer in self.layers:
            previous = None
            for v in sorted(layer, key=lambda v: self.grx[v].pos):
                if previous is not None:
                    least = previous.view.xy[0] + (previous.view.w + v.view.w) / 2 + self.xspace
                    if v.view.xy[0] < least:
                        v.view.xy = (least, v.view.xy[1])
                previous = v


def _components(n: int, edges: list) -> list[list[int]]:
    """Connected components of ``range(n)``, in order of their first member (grandalf lays out one at a time)."""
    parent = list(range(n))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i
    for a, b in edges:
        parent[root(a)] = root(b)
    out: dict[int, list] = {}
    for i in range(n):
        out.setdefault(root(i), []).append(i)
    return list(out.values())


def layered_layout(sizes: list, edges: list) -> tuple[list, list]:
    """(centres, routes) for boxes of ``sizes`` (w, h) and ``(producer, consumer)`` edges between their indices:
    grandalf's Sugiyama layout of each connected component (y grows downwards, layer by layer; a cycle's closing
    edge goes up), components packed left to right in rows. ``routes[k]`` are the points edge k passes through,
    from the producer's centre to the consumer's."""
    edges = [(a, b) for a, b in dict.fromkeys(edges) if a != b]
    vertices = [Vertex(i) for i in range(len(sizes))]
    for v, (w, h) in zip(vertices, sizes):
        v.view = _Size(w, h)
    links = [Edge(vertices[a], vertices[b]) for a, b in edges]
    for e in links:
        e.view = _Route()
    centres, routes = [None] * len(sizes), [None] * len(edges)
    wrap = max(1000, max((w for w, _ in sizes), default=0))
    x, y, row_h = 0.0, 0.0, 0.0
    components = _components(len(sizes), edges)
    component_of = {i: c for c, members in enumerate(components) for i in members}
    edges_of = [[] for _ in components]
    for k, (a, _) in enumerate(edges):
        edges_of[component_of[a]].append(k)
    for members, mine in zip(components, edges_of):
        if len(members) > 1:
            sug = _Sugiyama(graph_core([vertices[i] for i in members], [links[k] for k in mine]))
            sug.xspace, sug.yspace = X_SPACE, Y_SPACE
            sug.dw, sug.dh = 4, BOX_H                       # routing points of long edges take little room
            sug.init_all(optimize=True)                     # optimize: sources sit just above their first reader
            sug.draw()
        points = [vertices[i].view.xy for i in members] + [p for k in mine for p in links[k].view.pts]
        left = min(min(vertices[i].view.xy[0] - sizes[i][0] / 2 for i in members), min(p[0] for p in points))
        right = max(max(vertices[i].view.xy[0] + sizes[i][0] / 2 for i in members), max(p[0] for p in points))
        top = min(vertices[i].view.xy[1] - sizes[i][1] / 2 for i in members)
        bottom = max(vertices[i].view.xy[1] + sizes[i][1] / 2 for i in members)
        if x > 0 and x + right - left > wrap:               # next row
            x, y, row_h = 0.0, y + row_h + Y_SPACE, 0.0
        dx, dy = x - left, y - top
        for i in members:
            cx, cy = vertices[i].view.xy
            centres[i] = (cx + dx, cy + dy)
        for k in mine:
            routes[k] = [(px + dx, py + dy) for px, py in links[k].view.pts]
        x += right - left + 2 * X_SPACE
        row_h = max(row_h, bottom - top)
    return centres, routes


def graph_data(nodes: list, show_variables=True, show_training=False, expanded=(), seps="/",
               max_nodes=MAX_NODES) -> Drawing:
    """What to draw for ``nodes``, in Bokeh's coordinates (y up, the graph going down from y = 0; one unit is a
    screen pixel at zoom 1)."""
    boxes, pairs, scopes, note = visible_graph(nodes, show_variables, show_training, expanded, seps, max_nodes)
    texts = labels(boxes, seps)
    sizes = [(round(len(t) * CHAR_W) + 2 * PAD_X, BOX_H) for t in texts]
    centres, routes = layered_layout(sizes, pairs)
    xy = [(x, -y) for x, y in centres]
    node_data = {"x": [p[0] for p in xy], "y": [p[1] for p in xy], "w": [s[0] for s in sizes],
                 "h": [s[1] for s in sizes], "label": texts, "name": [b.name for b in boxes],
                 "kind": [b.kind for b in boxes], "count": [b.count for b in boxes], "op": [b.op for b in boxes],
                 "category": [b.category for b in boxes], "color": [CATEGORY_COLORS[b.category] for b in boxes],
                 "tint": [CATEGORY_TINTS[b.category] for b in boxes],
                 "outputs": [b.outputs for b in boxes], "source": [b.source for b in boxes],
                 "role": [b.role for b in boxes]}
    edge_data = {"xs": [], "ys": [], "start": [], "end": [], "alpha": []}
    heads = {"x0": [], "y0": [], "x1": [], "y1": [], "alpha": []}
    for (a, b), route in zip(pairs, routes):
        pts = [(px, -py) for px, py in route]
        # Leave the producer by its bottom (top, going up) and enter the consumer by its top (bottom).
        down_out = 1 if pts[1][1] <= pts[0][1] else -1
        down_in = 1 if pts[-1][1] <= pts[-2][1] else -1
        pts[0] = (xy[a][0], xy[a][1] - down_out * sizes[a][1] / 2)
        pts[-1] = (xy[b][0], xy[b][1] + down_in * sizes[b][1] / 2)
        edge_data["xs"].append([p[0] for p in pts])
        edge_data["ys"].append([p[1] for p in pts])
        edge_data["start"].append(a)
        edge_data["end"].append(b)
        # Edges into gradient and optimizer boxes (every block feeds them) stay faint under the forward graph.
        alpha = TRAINING_EDGE_ALPHA if boxes[a].role or boxes[b].role else 1.0
        edge_data["alpha"].append(alpha)
        for key, v in zip(heads, (*pts[-2], *pts[-1], alpha)):
            heads[key].append(v)
    xs = [x + d * w / 2 for (x, _), (w, _) in zip(xy, sizes) for d in (-1, 1)] + list(chain(*edge_data["xs"]))
    ys = [y + d * h / 2 for (_, y), (_, h) in zip(xy, sizes) for d in (-1, 1)] + list(chain(*edge_data["ys"]))
    bounds = (min(xs), max(xs), min(ys), max(ys)) if xs else (0.0, 1.0, -1.0, 0.0)
    return Drawing(node_data, edge_data, heads, bounds, scopes, note)


# ------------------------------------------------------------------------------------------------------ health

# A layer's state at its latest report (the legend's order) and its colour: NaN/Inf in its tensors (or a "nan" alert
# naming it), another alert naming it, neither. Boxes of a layer are filled with a stronger tint than the category
# tints and outlined thicker, so they read apart from the category colours of the other boxes.
HEALTH_COLORS = {"NaN/Inf": ALARM, "alert": "#e69f00", "healthy": "#009e73"}
HEALTH_TINTS = {state: _tint(colour, 0.45) for state, colour in HEALTH_COLORS.items()}
BY_HEALTH = "health"                # the colour menu's first choice: by state; the others are statistics
STATISTIC_ALPHA = 0.5               # a statistic's colour over the box: Viridis' dark end stays under readable labels
HEALTH_COLUMNS = ("layer", "h_fill", "h_line", "h_fill_alpha", "h_line_alpha", "h_value", "h_status", "h_activation",
                  "h_weights", "h_gradient", "h_batch_norm")
# The hover's rows of a layer's statistics: a statistic goes in the row its name starts with, named without that
# start, else in the row GROUP_OF names (the activation's by default).
STATISTIC_ROWS = (("h_activation", "act_"), ("h_weights", "weight_"), ("h_gradient", "grad_"),
                  ("h_batch_norm", "moving_"))
GROUP_OF = {"dead_fraction": "h_activation", "update_ratio": "h_weights", "batch_mean_gap": "h_batch_norm",
            "batch_var_ratio": "h_batch_norm", "rows_touched": "h_weights", "touched_fraction": "h_weights",
            "stale_rows": "h_weights", "stale_fraction": "h_weights"}
# Rows only some layers have (a batch norm's): left empty where every statistic of the row is missing, so the hover
# of a convolution is not a line of dashes as wide as the page.
SPARSE_ROWS = frozenset({"h_batch_norm"})
# Boxes of a layer hover with the health rows, the others without (a tooltip cannot leave out rows that are empty).
BASE_TOOLTIPS = [("name", "@name"), ("op", "@op"), ("outputs", "@outputs"), ("source", "@source")]
HEALTH_TOOLTIPS = BASE_TOOLTIPS + [("layer", "@layer"), ("health", "@h_status"), ("activation", "@h_activation"),
                                   ("weights", "@h_weights"), ("gradient", "@h_gradient"),
                                   ("batch norm", "@h_batch_norm")]


class LayerHealth(NamedTuple):
    """A run's latest health report, as the Graph tab colours it."""
    step: int
    layers: tuple
    statistics: tuple
    matrix: np.ndarray      # [layers, statistics]
    alerts: dict            # layer -> the kinds of the alerts naming it at ``step``


def layers_of(names, layers) -> list[str]:
    """Each node name's layer, "" for none: the longest of ``layers`` that the name equals or starts with followed by
    ``_`` or ``-`` (``flowlab.health.find_layers``: ``hidden_matmul`` and ``hidden-weight`` are ``hidden``'s,
    ``hidden_2_matmul`` is ``hidden_2``'s). Names are compared with scopes joined by ``-``, as flowlab names nodes
    (a GraphDef joins them by ``/``: ``mlp/hidden/weight`` is ``mlp-hidden``'s)."""
    ordered = sorted(((layer.replace("/", "-"), layer) for layer in layers), key=lambda pair: -len(pair[0]))
    out = []
    for name in names:
        key = name.replace("/", "-")
        out.append(next((layer for joined, layer in ordered
                         if key == joined or key.startswith((joined + "_", joined + "-"))), ""))
    return out


def layers_inside(names, layers) -> list[list[str]]:
    """Each name's ``layers`` that lie inside it as a scope (``Resnet-res3_0`` holds ``Resnet-res3_0_branch2a``:
    the name followed by ``_``, ``-`` or ``/``), compared with scopes joined by ``-`` as ``layers_of`` does."""
    joined = [(layer.replace("/", "-"), layer) for layer in layers]
    out = []
    for name in names:
        key = name.replace("/", "-")
        out.append([layer for j, layer in joined if j.startswith((key + "_", key + "-"))])
    return out


def layer_states(health: LayerHealth) -> dict:
    """``{layer: state}`` (a key of ``HEALTH_COLORS``) at the report's step."""
    counts = [j for j, s in enumerate(health.statistics) if s in NONFINITE]
    out = {}
    for i, layer in enumerate(health.layers):
        kinds = health.alerts.get(layer, ())
        nonfinite = bool(counts) and np.nansum(health.matrix[i, counts]) > 0
        out[layer] = "NaN/Inf" if nonfinite or "nan" in kinds else "alert" if kinds else "healthy"
    return out


def _statistic_row(statistic):
    """``(hover row, name in it)`` of a statistic (``STATISTIC_ROWS``)."""
    for key, start in STATISTIC_ROWS:
        if statistic.startswith(start):
            return key, statistic.removeprefix(start)
    return GROUP_OF.get(statistic, "h_activation"), statistic


def _number(v) -> str:
    return f"{v:.3g}" if np.isfinite(v) else "–" if np.isnan(v) else str(v)


def health_columns(names, health: LayerHealth | None, color_by=BY_HEALTH, scopes=None) -> dict:
    """The boxes' ``HEALTH_COLUMNS`` for boxes named ``names``: each box of a layer coloured by its state, or by the
    statistic ``color_by`` (``h_value``, for ``color_scale``), with its layer's latest statistics as text; a collapsed
    scope (those ``scopes`` marks true, or any name when it is None) shows its worst layer; boxes of no layer (all of
    them when ``health`` is None) are left undrawn."""
    n = len(names)
    columns = {"layer": [""] * n, "h_fill": ["#ffffff"] * n, "h_line": ["#ffffff"] * n,
               "h_fill_alpha": np.zeros(n), "h_line_alpha": np.zeros(n), "h_value": np.full(n, np.nan),
               "h_status": [""] * n, **{key: [""] * n for key, _ in STATISTIC_ROWS}}
    if health is None:
        return columns
    row_of = {layer: i for i, layer in enumerate(health.layers)}
    states = layer_states(health)
    by_statistic = color_by in health.statistics
    values = scale_values(color_by, health.matrix[:, health.statistics.index(color_by)]) if by_statistic else None
    texts = {}
    for layer, i in row_of.items():
        rows = {key: [] for key, _ in STATISTIC_ROWS}
        for j, statistic in enumerate(health.statistics):
            key, name = _statistic_row(statistic)
            rows[key].append((name, health.matrix[i, j]))
        rows = {key: [] if key in SPARSE_ROWS and all(np.isnan(v) for _, v in row) else
                [f"{name} {_number(v)}" for name, v in row] for key, row in rows.items()}
        kinds = health.alerts.get(layer, ())
        status = states[layer] + (f" ({', '.join(kinds)})" if kinds else "")
        texts[layer] = {"h_status": f"{status} at step {health.step}", **{k: " · ".join(v) for k, v in rows.items()}}
    severity = {state: i for i, state in enumerate(HEALTH_COLORS)}         # NaN/Inf first
    inside = layers_inside(names, health.layers)
    if scopes is not None:
        inside = [layers if scope else [] for layers, scope in zip(inside, scopes)]
    for k, layer in enumerate(layers_of(names, health.layers)):
        if not layer and inside[k]:
            # A collapsed scope (a residual block) shows its worst layer: NaN/Inf, else an alert, else (coloured by
            # a statistic) the largest value.
            layer = min(inside[k], key=lambda name: (severity[states[name]], -values[row_of[name]]
                                                     if by_statistic and np.isfinite(values[row_of[name]]) else 0))
            columns["layer"][k] = f"{layer} (the {'largest' if by_statistic else 'worst'} of {len(inside[k])} " \
                                  f"layers)"
        elif not layer:
            continue
        else:
            columns["layer"][k] = layer
        state = states[layer]
        columns["h_fill"][k], columns["h_line"][k] = HEALTH_TINTS[state], HEALTH_COLORS[state]
        columns["h_fill_alpha"][k] = STATISTIC_ALPHA if by_statistic else 1.0
        columns["h_line_alpha"][k] = 1.0
        if by_statistic:
            columns["h_value"][k] = values[row_of[layer]]
        for key, text in texts[layer].items():
            columns[key][k] = text
    return columns


# ------------------------------------------------------------------------------------------------------ the view

# Labels keep to their boxes at any zoom: the font follows the zoom (box sizes are in data units, text in pixels).
ZOOM_JS = """
const scale = Math.min(fig.frame_width / (fig.x_range.end - fig.x_range.start),
                       fig.frame_height / (fig.y_range.end - fig.y_range.start));
if (!(scale > 0 && Number.isFinite(scale))) return;
labels.glyph.text_font_size = {value: `${(font * scale).toFixed(2)}px`};
labels.visible = font * scale >= 4;
"""
# The rows of the boxes of a layer, and of the others.
LAYER_ROWS_JS = "return source.data.layer.map((layer) => layer !== '')"
OTHER_ROWS_JS = "return source.data.layer.map((layer) => layer === '')"
# Tapping an op of a layer opens the Health tab on that layer, keeping the rest of the page's URL state.
HEALTH_TAP_JS = """
const i = source.selected.indices[0];
if (i == null || source.data.kind[i] !== "op" || !source.data.layer[i]) return;
const url = new URL(window.location.href);
url.searchParams.set("tab", "health");
url.searchParams.set("run", JSON.parse(select.value)[0]);
url.searchParams.set("layer", source.data.layer[i]);
window.location.assign(url.toString());
"""


class GraphView(View):
    title = "Graph"
    # Filled before it joins the page: its boxes, frame size and ranges arrive in the message that adds the figure,
    # not in some 30 patches each laying the page out again (ResNet-50's: 1.4 s -> 0.x s).
    fill_before_shown = True

    def __init__(self, store):
        super().__init__(store)
        self._graph_defs: dict[str, bytes] = {}     # run -> last GraphDef
        self._structure: dict[str, tuple] = {}      # run -> (version, [job dicts]) of structure_graph.json
        self._versions: dict[str, int] = {}         # run -> bumped when either source changes
        self._choices: dict[str, tuple] = {}        # Select value -> (run, job index or None for the GraphDef)
        self.expanded: set[str] = set()             # name scopes shown op by op
        self._opened_for = None                     # the graph (Select value) that ``expanded`` belongs to
        self._seps = "/"                            # the shown graph's scope separators
        self._parsed = None                         # ((choice, version), nodes, seps, source, error) of the graph
        self._drawings: dict = {}                   # the last few drawings by what they show, newest last
        self.shown = None
        self._health: dict[tuple, tuple] = {}       # (run, tag) -> (step, layers, statistics, matrix) of the latest
        self._alerts: dict[tuple, tuple] = {}       # (run, health tag) -> (step, rows) of the latest alerts
        self._painted = None                        # what the boxes' health columns show (``_health_now``)

        self.select = Select(title="Graph", options=[], width=360)
        self.variables = CheckboxGroup(labels=["show variables"], active=[0])
        self.training = CheckboxGroup(labels=["show gradients and optimizer"], active=[], name="graph-training")
        # Dozens of scopes (ResNet-50's blocks) wrap into a few lines, scrolled past SCOPE_LINES of them.
        self.scopes = CheckboxGroup(labels=[], active=[], inline=True, name="graph-scopes", width=SCOPES_WIDTH,
                                    stylesheets=[InlineStyleSheet(css=SCOPES_CSS)])
        self.select.on_change("value", lambda attr, old, new: self._select_changed())
        self.variables.on_change("active", lambda attr, old, new: self._draw())
        self.training.on_change("active", lambda attr, old, new: self._draw())
        self.scopes.on_change("active", lambda attr, old, new: self._scopes_changed())

        self.color_by = Select(title="Colour layers by", options=[], value=BY_HEALTH, width=200, visible=False,
                               name="graph-color-by")
        self.color_by.on_change("value", lambda attr, old, new: self._paint_health())

        self.nodes_source = ColumnDataSource({k: [] for k in ("x", "y", "w", "h", "label", "name", "kind", "count",
                                                               "op", "category", "color", "tint", "outputs",
                                                               "source", "role") + HEALTH_COLUMNS})
        self.edges_source = ColumnDataSource({k: [] for k in ("xs", "ys", "start", "end", "alpha")})
        self.heads_source = ColumnDataSource({k: [] for k in ("x0", "y0", "x1", "y1", "alpha")})
        self.figure = figure(frame_width=MIN_FRAME[0], frame_height=MIN_FRAME[1], x_range=Range1d(0, 1),
                             y_range=Range1d(-1, 0), tools="pan,wheel_zoom,reset", output_backend="canvas",
                             name="graph-figure", visible=False)
        self.figure.multi_line(xs="xs", ys="ys", source=self.edges_source, line_color="#888888", line_width=1.2,
                               line_alpha="alpha")
        self.figure.add_layout(Arrow(source=self.heads_source, x_start="x0", y_start="y0", x_end="x1", y_end="y1",
                                     line_alpha=0, end=VeeHead(size=8, fill_color="#888888", line_color="#888888",
                                                fill_alpha="alpha", line_alpha="alpha")))
        boxes = self.figure.rect(x="x", y="y", width="w", height="h", source=self.nodes_source, fill_color="tint",
                                 line_color="color", line_width=1.5, legend_field="category",
                                 nonselection_fill_alpha=1.0, nonselection_line_alpha=1.0, name="graph-boxes")
        # Layer boxes drawn over in their health, under the labels, and the other boxes again, unseen, for their
        # own hover. Each takes its rows in the page, as the data comes (a filter set from here could name rows of
        # the last graph while the page holds the next one's).
        self.health_glyph = Rect(x="x", y="y", width="w", height="h", fill_color="h_fill", line_color="h_line",
                                 fill_alpha="h_fill_alpha", line_alpha="h_line_alpha", line_width=3)
        self.health_boxes = self.figure.add_glyph(self.nodes_source, self.health_glyph,
                                                  nonselection_glyph=self.health_glyph, visible=False,
                                                  view=CDSView(filter=CustomJSFilter(code=LAYER_ROWS_JS)),
                                                  name="graph-health")
        self.plain_boxes = self.figure.add_glyph(self.nodes_source, Rect(x="x", y="y", width="w", height="h",
                                                                         fill_alpha=0, line_alpha=0),
                                                 view=CDSView(filter=CustomJSFilter(code=OTHER_ROWS_JS)))
        self.labels = self.figure.text(x="x", y="y", text="label", source=self.nodes_source, text_align="center",
                                       text_baseline="middle", text_font=value("monospace"), text_color="#222222",
                                       text_font_size=f"{FONT_PX}px", nonselection_text_alpha=1.0, name="graph-labels")
        self.figure.add_tools(BoxZoomTool(match_aspect=True), TapTool(renderers=[boxes]),
                              HoverTool(renderers=[self.plain_boxes], tooltips=BASE_TOOLTIPS),
                              HoverTool(renderers=[self.health_boxes], tooltips=HEALTH_TOOLTIPS))
        self.nodes_source.selected.on_change("indices", lambda attr, old, new: self._tapped(new))
        self.nodes_source.selected.js_on_change("indices", CustomJS(args=dict(source=self.nodes_source,
                                                                              select=self.select), code=HEALTH_TAP_JS))
        zoom = CustomJS(args=dict(fig=self.figure, labels=self.labels, font=FONT_PX), code=ZOOM_JS)
        for r in (self.figure.x_range, self.figure.y_range):
            r.js_on_change("start", zoom)
            r.js_on_change("end", zoom)
        legend = self.figure.legend[0]
        legend.label_text_font_size = "8pt"
        legend.glyph_height = legend.glyph_width = 14
        legend.spacing, legend.padding, legend.margin = 0, 4, 4
        self.figure.add_layout(legend, "right")
        # Outside the frame, so that neither covers a box: the states' legend beside the categories' one, or the
        # chosen statistic's colour bar above the graph. The legend's swatches are glyphs of one row that draw
        # nothing (NaN) in the plot.
        items = []
        for state, colour in HEALTH_COLORS.items():
            swatch = self.figure.add_glyph(ColumnDataSource({"x": [np.nan], "y": [np.nan]}), Rect(
                x="x", y="y", width=1, height=1, fill_color=HEALTH_TINTS[state], line_color=colour, line_width=3))
            items.append(LegendItem(label=state, renderers=[swatch]))
        self.health_legend = Legend(items=items, title="layer health", title_text_font_size="8pt",
                                    title_text_font_style="bold", label_text_font_size="8pt", glyph_height=14,
                                    glyph_width=14, spacing=0, padding=4, margin=4, visible=False,
                                    name="graph-health-legend")
        self.figure.add_layout(self.health_legend, "right")
        # One colour bar per kind of scale: BokehJS keeps a colour bar's first scale when its mapper is replaced.
        self.color_bars = {}
        for linear in (True, False):
            mapper, ticker = color_scale(linear)
            self.color_bars[linear] = ColorBar(
                color_mapper=mapper, ticker=ticker, orientation="horizontal", width=260, height=10, padding=4,
                margin=2, title_text_font_size="8pt", title_text_font_style="bold", major_label_text_font_size="7pt",
                label_standoff=4, formatter=value_labels(),
                visible=False, name=f"graph-color-bar-{'linear' if linear else 'log'}")
            self.figure.add_layout(self.color_bars[linear], "above")
        self.figure.axis.visible = False
        self.figure.grid.visible = False
        self.figure.outline_line_color = None
        self.note = Div(text="No graph in this logdir yet.", name="graph-note")
        self.health_note = Div(text="", visible=False, name="graph-health-note")
        self.scopes_row = column(Div(text="Expanded name scopes (tap a scope's box to expand it):"), self.scopes,
                                 visible=False)
        self.controls = row(self.select, column(self.variables, self.training), self.color_by, visible=False)
        self._layout = column(self.controls, self.note, self.health_note, self.scopes_row, self.figure)

    def layout(self):
        return self._layout

    # ---------------------------------------------------------------------------------------------- store → graphs
    def update(self):
        changed = set()
        for series in self.store.series("graph"):
            d = self.delta(series)
            if d.values:
                self._graph_defs[series.run] = d.values[-1]      # TensorBoard shows a run's last graph too
                changed.add(series.run)
        for run in self._graph_defs:
            version, jobs = self.store.structure_graph(run)
            if version != self._structure.get(run, (None,))[0]:
                self._structure[run] = (version, jobs)
                changed.add(run)
        for run in changed:
            self._versions[run] = self._versions.get(run, 0) + 1
        self._sync_select()         # also when only the run list's choice changed
        self._follow_health()
        self._draw()
        self._paint_health()

    def _sync_select(self):
        self._choices = {}
        options = []
        for run in sorted(run for run in self._graph_defs if self.runs.shows(run)):
            jobs = self._structure.get(run, (None, []))[1]
            for i, job in (enumerate(jobs) if jobs else [(None, None)]):
                value = json.dumps([run, i])                # values are our own encoding, labels are text
                self._choices[value] = (run, i)
                label = run if job is None else f"{run}: {job.get('name', i)}"
                options.append((value, label))
        if self.select.options != options:
            self.select.options = options
        if options and self.select.value not in self._choices:
            self.select.value = options[0][0]

    # ---------------------------------------------------------------------------------------------- page events
    def _select_changed(self):
        self._draw()                                        # another graph: it opens on its default_expanded

    def _tapped(self, indices):
        if not indices:
            return
        data = self.nodes_source.data
        i = indices[0]
        self.nodes_source.selected.indices = []
        if i < len(data["kind"]) and data["kind"][i] == "scope" and self._parsed and self._parsed[1]:
            key = scope_key(data["name"][i], data["role"][i])
            self.expanded.add(key)
            if data["count"][i] <= OPEN_WHOLE:
                self.expanded |= inner_scopes(self._parsed[1], key, self._seps, 0 in self.variables.active,
                                              0 in self.training.active)
            self._draw()

    def _scopes_changed(self):
        ticked = {self.scopes.labels[i] for i in self.scopes.active}
        unticked = set(self.scopes.labels) - ticked
        # collapsing a scope collapses the scopes inside it (of the same role) too
        closed = {split_scope_key(key) for key in unticked}

        def inside_closed(key):
            scope, role = split_scope_key(key)
            return any((outer, role) in closed for outer in scopes_of(scope, self._seps))
        expanded = {s for s in (self.expanded | ticked) - unticked if not inside_closed(s)}
        if expanded != self.expanded:
            self.expanded = expanded
            self._draw()

    # ---------------------------------------------------------------------------------------------- health
    def _follow_health(self):
        """Keep each health series' latest report and each health tag's latest alerts (only what is new is read)."""
        for series in self.store.series("health"):
            d = self.delta(series)
            key = (series.run, series.tag)
            if d.reset:
                self._health.pop(key, None)
            grid = series.grid
            if d.values and grid is not None:
                self._health[key] = (int(d.steps[-1]), grid.layers, grid.statistics, np.asarray(d.values[-1]))
        wanted = {(run, f"{tag}/alerts") for run, tag in self._health}
        for series in self.store.series("text"):
            if (series.run, series.tag) in wanted:
                d = self.delta(series)
                key = (series.run, series.tag.removesuffix("/alerts"))
                if d.reset:
                    self._alerts.pop(key, None)
                if d.values:
                    self._alerts[key] = (int(d.steps[-1]), d.values[-1])

    def _health_now(self, names):
        """``(what the boxes should show, LayerHealth or None)`` for the shown graph's boxes ``names``: the latest
        report of its run's health tag whose layers own the most boxes (a run may log several jobs' reports)."""
        choice = self._choices.get(self.select.value)
        best = None
        if choice is not None and len(names):
            for (run, tag), (step, layers, statistics, matrix) in sorted(self._health.items()):
                if run == choice[0]:
                    owned = sum(1 for layer in layers_of(names, layers) if layer)
                    if owned and (best is None or owned > best[0]):
                        best = (owned, run, tag, step, layers, statistics, matrix)
        if best is None:
            return None, None
        _, run, tag, step, layers, statistics, matrix = best
        alerts = {}
        alert_step, rows = self._alerts.get((run, tag), (None, None))
        rows = np.asarray(rows, dtype=object)
        if alert_step == step and rows.ndim == 2 and rows.shape[1] >= 2:     # (kind, layer, message) rows
            for kind, layer in rows[:, :2]:
                alerts.setdefault(str(layer), []).append(str(kind))
        alerts = {layer: tuple(kinds) for layer, kinds in alerts.items()}
        color_by = self.color_by.value if self.color_by.value in statistics else BY_HEALTH
        painted = (self.shown, tag, step, matrix.tobytes(), sorted(alerts.items()), color_by)
        return painted, LayerHealth(step, layers, statistics, matrix, alerts)

    def _paint_health(self):
        """Bring the boxes' health up to date: only their health columns are sent, and only when they changed."""
        names = self.nodes_source.data["name"]
        painted, health = self._health_now(names)
        if painted != self._painted:
            self._painted = painted
            self.nodes_source.data.update(self._health_columns(self.nodes_source.data, health))

    def _health_columns(self, nodes, health):
        """``health_columns`` of the boxes ``nodes`` (node columns), with the menu, legend, colour bar, hover and
        note to match; only forward scopes show the layers inside them (not an optimizer's box)."""
        names = nodes["name"]
        scopes = [kind == "scope" and not role for kind, role in zip(nodes["kind"], nodes["role"])]
        shown = health is not None
        self.color_by.visible = self.health_boxes.visible = self.health_note.visible = shown
        if not shown:
            self.health_legend.visible = False
            for bar in self.color_bars.values():
                bar.visible = False
            return health_columns(names, None)
        options = [(BY_HEALTH, "health (alerts, NaN/Inf)")] + [(s, s) for s in health.statistics]
        if self.color_by.options != options:
            self.color_by.options = options
        if self.color_by.value not in health.statistics:
            self.color_by.value = BY_HEALTH
        statistic = self.color_by.value if self.color_by.value in health.statistics else None
        linear = statistic in LINEAR
        self.health_legend.visible = statistic is None
        for kind, bar in self.color_bars.items():
            bar.visible = statistic is not None and kind == linear
        columns = health_columns(names, health, statistic or BY_HEALTH, scopes)
        if statistic is None:
            self.health_glyph.update(fill_color="h_fill", line_color="h_line")
        else:
            bar = self.color_bars[linear]
            low, high = value_range(columns["h_value"], linear)
            bar.color_mapper.update(low=low, high=high)
            bar.title = statistic
            colour = {"field": "h_value", "transform": bar.color_mapper}
            self.health_glyph.update(fill_color=colour, line_color=colour)
        state_of = layer_states(health)
        drawn = set()                       # the layers of the boxes: their own, or those inside a collapsed scope
        for layer, inside in zip(columns["layer"], layers_inside(names, health.layers)):
            drawn.update([layer] if layer in state_of else inside if layer else [])
        states = Counter(state_of[layer] for layer in drawn)
        counts = ", ".join(f"{states[state]} {state}" for state in HEALTH_COLORS if states[state])
        self.health_note.text = html.escape(
            f"Layers coloured by {statistic or 'their health'} at step {health.step} ({counts}). "
            f"Tap an op of a layer to open its trend in the Health tab.")
        return columns

    # ---------------------------------------------------------------------------------------------- drawing
    def _draw(self):
        choice = self._choices.get(self.select.value)
        if choice is None:
            self.shown = None
            self._show(None, "None of the checked runs has a graph: check more runs in the run list."
                       if self._graph_defs else "No graph in this logdir yet.")
            return
        run, job = choice
        show_variables, show_training = 0 in self.variables.active, 0 in self.training.active
        key = (choice, self._versions.get(run))
        if self._parsed is None or self._parsed[0] != key:
            try:
                if job is None:
                    parsed = nodes_from_graph_def(self._graph_defs[run]), "/", "GraphDef", None
                else:
                    parsed = nodes_from_structure(self._structure[run][1][job]), "-/", STRUCTURE_FILE, None
            except Exception as e:          # a damaged or foreign graph must not take the tab down
                log.warning("graph of %s: %s: %s", run, type(e).__name__, e, exc_info=True)
                parsed = None, "/", "", " ".join(f"Could not read the graph of {run}: {type(e).__name__}: {e}"
                                                 .split())[:300]
            self._parsed = (key, *parsed)
            self._drawings.clear()
        _, nodes, seps, source, error = self._parsed
        self._seps = seps
        if nodes is not None and self._opened_for != choice:
            self.expanded = default_expanded(nodes, show_variables, show_training, seps)
            self._opened_for = choice
        shown = (key, show_variables, show_training, frozenset(self.expanded))
        if shown == self.shown:
            return
        self.shown = shown
        if nodes is None:
            self._show(None, error)
            return
        drawing = self._drawings.pop(shown, None)
        if drawing is not None:
            self._laid_out(shown, drawing)
            return
        expanded = frozenset(self.expanded)

        def lay_out():
            try:
                return graph_data(nodes, show_variables, show_training, expanded, seps)
            except Exception as e:          # a graph the layout cannot take must not take the tab down either
                log.warning("graph of %s: %s: %s", run, type(e).__name__, e, exc_info=True)
                return " ".join(f"Could not draw the graph of {run}: {type(e).__name__}: {e}".split())[:300]
        doc = self._served_document()
        if doc is None or \
                len(visible_graph(nodes, show_variables, show_training, expanded, seps)[0]) <= THREAD_BOXES:
            self._laid_out(shown, lay_out())
            return
        # grandalf takes ~0.7 s for 300 boxes: laid out beside the session's IOLoop, which every session shares
        self.note.text = html.escape(f"Laying out the graph of {run}…")
        threading.Thread(target=lambda: (lambda drawing: doc.add_next_tick_callback(
            lambda: self._laid_out(shown, drawing)))(lay_out()), name="graph-layout", daemon=True).start()

    def _served_document(self):
        """The session's document when a server serves it (a layout can then finish on a later IOLoop turn)."""
        doc = self.figure.document
        return doc if served(doc) else None

    def _laid_out(self, shown, drawing):
        """Show ``drawing`` (or the error text in its place) made for ``shown``, unless the page has moved on."""
        if shown != self.shown:
            return
        if isinstance(drawing, str):
            self._show(None, drawing)
            return
        self._drawings[shown] = drawing                     # toggling back to a view redraws no layout
        while len(self._drawings) > KEPT_DRAWINGS:
            del self._drawings[next(iter(self._drawings))]
        n_boxes, n_scopes = len(drawing.nodes["kind"]), drawing.nodes["kind"].count("scope")
        summary = (f"{sum(drawing.nodes['count'])} of {len(self._parsed[1])} ops in {n_boxes} boxes ({n_scopes} "
                   f"collapsed name scope{'s' * (n_scopes != 1)}), {len(drawing.edges['xs'])} edges (from "
                   f"{self._parsed[3]})")
        self._show(drawing, summary + (f"; {drawing.note}" if drawing.note else ""))

    def _show(self, drawing, note):
        """Fill the page with ``drawing``, or show only the one-line ``note`` when there is none."""
        self.note.text = html.escape(note)
        self.controls.visible = bool(self.select.options)
        self.figure.visible = drawing is not None
        if drawing is None:
            self.scopes_row.visible = False
            self._painted = None
            self._health_columns({"name": [], "kind": [], "role": []}, None)    # hides the health menu, legend, note
            for source in (self.nodes_source, self.edges_source, self.heads_source):
                source.data = {k: [] for k in source.data}
            return
        self.scopes.labels = drawing.scopes
        self.scopes.active = [i for i, s in enumerate(drawing.scopes) if s in self.expanded]
        self.scopes_row.visible = bool(drawing.scopes)
        self._painted, health = self._health_now(drawing.nodes["name"])
        self.nodes_source.data = drawing.nodes | self._health_columns(drawing.nodes, health)
        self.edges_source.data = drawing.edges
        self.heads_source.data = drawing.heads
        # The frame fits the graph at zoom 1 when it can, else shrinks it down to MIN_SCALE and shows its top.
        left, right, bottom, top = drawing.bounds
        width, height = right - left + 2 * MARGIN, top - bottom + 2 * MARGIN
        scale = max(MIN_SCALE, min(1.0, MAX_FRAME[0] / width, MAX_FRAME[1] / height))
        frame_w = round(min(max(width * scale, MIN_FRAME[0]), MAX_FRAME[0]))
        frame_h = round(min(max(height * scale, MIN_FRAME[1]), MAX_FRAME[1]))
        self.figure.frame_width, self.figure.frame_height = frame_w, frame_h
        centre, span_x, span_y = (left + right) / 2, frame_w / scale, frame_h / scale
        for r, start, end in ((self.figure.x_range, centre - span_x / 2, centre + span_x / 2),
                              (self.figure.y_range, top + MARGIN - span_y, top + MARGIN)):
            r.update(start=start, end=end, reset_start=start, reset_end=end)
        self.labels.glyph.text_font_size = f"{FONT_PX * scale:.2f}px"
        self.labels.visible = True
