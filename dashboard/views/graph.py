"""The Graph tab: a job's graph as a layered DAG.

Sources, per run: flowlab's ``structure_graph.json`` in the run directory when there is one (one graph per job,
read again when its mtime changes), else the run's last ``GraphDef`` from its event files (``add_graph`` of
flowlab, tensorboardX or torch), whose inputs are producer names with an optional ``^`` (control input) prefix and
``:k`` (output k) suffix, and whose ``_output_shapes`` attr, when present, gives the output shapes.

Layout (``layered_layout``, pure): longest-path layers from the sources (every edge goes at least one layer down),
then a few barycenter sweeps down and up to order each layer so that fewer edges cross. A graph of more than
``MAX_NODES`` nodes is collapsed by name scope (the deepest scope level that leaves at most ``MAX_NODES`` groups).
Nodes are coloured by op type; edges are Bézier curves; hover shows name, op, outputs (shapes, dtypes) and, for
flowlab jobs, the source line. Names reach the browser only as tooltip fields (escaped by Bokeh) and canvas text.
"""
from __future__ import annotations

import html
import json
import os
import re
from heapq import heapify, heappop, heappush
from typing import NamedTuple

from bokeh.layouts import column, row
from bokeh.models import CheckboxGroup, ColumnDataSource, Div, HoverTool, LabelSet, Select
from bokeh.plotting import figure
from google.protobuf.message import DecodeError

from flowlab.summary import proto

from .base import View
from .projector import categories

STRUCTURE_FILE = "structure_graph.json"
MAX_NODES = 500
MAX_LABELED = 100               # node names are drawn beside the nodes up to this many nodes
VARIABLE_OPS = frozenset({"Variable", "VariableV2", "VarHandleOp", "prim::GetAttr"})
_DATA_TYPES = proto.descriptor("tensorboard.AttrValue").fields_by_name["type"].enum_type


class Node(NamedTuple):
    name: str
    op: str
    inputs: tuple           # producer node names
    outputs: str            # shapes and dtypes, as text
    source: str = ""        # where a flowlab job created it


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
        outputs = layer.get("config", {}).get("outputs", [])
        text = "; ".join(f"{o.get('name', '')}: {tuple(o.get('shape', []))} {o.get('dtype', '')}" for o in outputs)
        out.append(Node(layer["name"], layer.get("class_name", ""),
                        tuple(dict.fromkeys(layer.get("inbound_nodes", []))), text, layer.get("source") or ""))
    return out


# ------------------------------------------------------------------------------------------------------ layout

def layered_layout(nodes: list, edges: list, sweeps: int = 3) -> dict:
    """``{node: (layer, position)}`` for a DAG given as node names and ``(producer, consumer)`` edges.

    Layers: longest path from the sources (sources on layer 0, each edge at least one layer down). Edges to unknown
    nodes and self-loops are ignored; on a cycle, the edge that closes it (against the nodes' given order) is.
    Positions: 0, 1, ... within a layer, ordered by barycenter sweeps (mean centred position of a node's neighbours
    in the layers above, then below), which removes most crossings; ties keep the previous order.
    """
    index = {n: i for i, n in enumerate(nodes)}
    edges = [(a, b) for a, b in dict.fromkeys(edges) if a in index and b in index and a != b]
    succ = {n: [] for n in nodes}
    pred = {n: [] for n in nodes}
    for a, b in edges:
        succ[a].append(b)
        pred[b].append(a)
    # A topological order (Kahn, earliest given node first); a cycle is broken at its earliest remaining node.
    waiting = {n: len(pred[n]) for n in nodes}
    ready = [index[n] for n in nodes if waiting[n] == 0]
    heapify(ready)
    rank, done = {}, set()
    while len(rank) < len(nodes):
        if not ready:
            heappush(ready, min(index[n] for n in nodes if n not in done))
        n = nodes[heappop(ready)]
        if n in done:
            continue
        done.add(n)
        rank[n] = len(rank)
        for m in succ[n]:
            waiting[m] -= 1
            if waiting[m] == 0 and m not in done:
                heappush(ready, index[m])
    forward_pred = {n: [a for a in pred[n] if rank[a] < rank[n]] for n in nodes}
    forward_succ = {n: [b for b in succ[n] if rank[b] > rank[n]] for n in nodes}
    layer = {}
    for n in sorted(nodes, key=rank.get):
        layer[n] = max((layer[a] + 1 for a in forward_pred[n]), default=0)

    layers = [[] for _ in range(max(layer.values(), default=-1) + 1)]
    for n in nodes:
        layers[layer[n]].append(n)

    def centred():
        return {n: i - (len(members) - 1) / 2 for members in layers for i, n in enumerate(members)}

    def sweep(order, neighbours):
        for k in order:
            x = centred()
            bary = {n: sum(x[m] for m in neighbours[n]) / len(neighbours[n]) if neighbours[n] else x[n]
                    for n in layers[k]}
            layers[k] = sorted(layers[k], key=lambda n: (bary[n], x[n]))

    for _ in range(sweeps):
        sweep(range(1, len(layers)), forward_pred)
        sweep(range(len(layers) - 2, -1, -1), forward_succ)
    sweep(range(1, len(layers)), forward_pred)
    return {n: (k, i) for k, members in enumerate(layers) for i, n in enumerate(members)}


def collapse(nodes: list, max_nodes: int, sep: str) -> tuple[list, str]:
    """At most ``max_nodes`` nodes: grouped by the deepest name-scope level that leaves few enough groups (a group
    of one keeps its node), else the first ``max_nodes``. Returns (nodes, a note saying what was done or "")."""
    if len(nodes) <= max_nodes:
        return nodes, ""
    depth = max(len(n.name.split(sep)) for n in nodes)
    for d in range(depth - 1, 0, -1):
        groups: dict[str, list] = {}
        for n in nodes:
            groups.setdefault(sep.join(n.name.split(sep)[:d]), []).append(n)
        if len(groups) <= max_nodes:
            break
    else:
        kept = {n.name for n in nodes[:max_nodes]}
        return ([n._replace(inputs=tuple(i for i in n.inputs if i in kept)) for n in nodes[:max_nodes]],
                f"showing the first {max_nodes} of {len(nodes)} nodes")
    group_of = {}
    for key, members in groups.items():
        for n in members:
            group_of[n.name] = members[0].name if len(members) == 1 else key
    out = []
    for key, members in groups.items():
        name = group_of[members[0].name]
        inputs = tuple(dict.fromkeys(group_of[i] for n in members for i in n.inputs
                                     if i in group_of and group_of[i] != name))
        if len(members) == 1:
            out.append(members[0]._replace(inputs=inputs))
        else:
            out.append(Node(name, "(scope)", inputs, f"{len(members)} nodes"))
    return out, f"{len(nodes)} nodes grouped by name scope into {len(out)}"


def graph_data(nodes: list, show_variables: bool = True, sep: str = "/", max_nodes: int = MAX_NODES):
    """(node columns, edge columns, note) to draw: variables dropped unless shown, large graphs collapsed, layers
    going down the page (y = -layer), each layer centred on x = 0."""
    if not show_variables:
        hidden = {n.name for n in nodes if n.op in VARIABLE_OPS}
        nodes = [n._replace(inputs=tuple(i for i in n.inputs if i not in hidden)) for n in nodes
                 if n.name not in hidden]
    nodes, note = collapse(nodes, max_nodes, sep)
    known = {n.name for n in nodes}
    edges = [(i, n.name) for n in nodes for i in n.inputs if i in known]
    place = layered_layout([n.name for n in nodes], edges)
    width = {}
    for layer, _ in place.values():
        width[layer] = width.get(layer, 0) + 1
    xy = {name: (pos - (width[layer] - 1) / 2, float(-layer)) for name, (layer, pos) in place.items()}
    op_category, colors = categories([n.op for n in nodes])
    node_data = {"x": [xy[n.name][0] for n in nodes], "y": [xy[n.name][1] for n in nodes],
                 "name": [n.name for n in nodes],
                 "short": [sep.join(n.name.split(sep)[-2:]) for n in nodes],       # "hidden-weight", not "weight"
                 "op": [n.op for n in nodes], "op_group": op_category, "color": colors,
                 "outputs": [n.outputs for n in nodes], "source": [n.source for n in nodes]}
    edge_data = {k: [] for k in ("x0", "y0", "x1", "y1", "cx0", "cy0", "cx1", "cy1")}
    for a, b in edges:
        (x0, y0), (x1, y1) = xy[a], xy[b]
        if place[a][0] >= place[b][0]:              # the edge that closed a cycle: it cannot go down, leave it out
            continue
        middle = (y0 + y1) / 2
        for key, v in zip(edge_data, (x0, y0, x1, y1, x0, middle, x1, middle)):
            edge_data[key].append(v)
    return node_data, edge_data, note


# ------------------------------------------------------------------------------------------------------ the view

class GraphView(View):
    title = "Graph"

    def __init__(self, store):
        super().__init__(store)
        self._graph_defs: dict[str, bytes] = {}     # run -> last GraphDef
        self._structure: dict[str, tuple] = {}      # run -> (mtime, [job dicts]) of structure_graph.json
        self._versions: dict[str, int] = {}         # run -> bumped when either source changes
        self._choices: dict[str, tuple] = {}        # Select value -> (run, job index or None for the GraphDef)
        self.shown = None

        self.select = Select(title="Graph", options=[], width=360)
        self.variables = CheckboxGroup(labels=["show variables"], active=[0])
        self.select.on_change("value", lambda attr, old, new: self._draw())
        self.variables.on_change("active", lambda attr, old, new: self._draw())

        self.nodes_source = ColumnDataSource({k: [] for k in ("x", "y", "name", "short", "op", "op_group", "color",
                                                               "outputs", "source")})
        self.edges_source = ColumnDataSource({k: [] for k in ("x0", "y0", "x1", "y1", "cx0", "cy0", "cx1", "cy1")})
        self.figure = figure(width=1000, height=640, tools="pan,wheel_zoom,box_zoom,reset", output_backend="canvas")
        self.figure.bezier(x0="x0", y0="y0", x1="x1", y1="y1", cx0="cx0", cy0="cy0", cx1="cx1", cy1="cy1",
                           source=self.edges_source, line_color="#999999", line_alpha=0.6)
        circles = self.figure.scatter(x="x", y="y", source=self.nodes_source, size=12, color="color",
                                      line_color="#333333", legend_field="op_group")
        self.figure.add_tools(HoverTool(renderers=[circles], tooltips=[
            ("name", "@name"), ("op", "@op"), ("outputs", "@outputs"), ("source", "@source")]))
        self.labels = LabelSet(x="x", y="y", text="short", source=self.nodes_source, x_offset=8, y_offset=-4,
                               text_font_size="7pt")
        self.figure.add_layout(self.labels)
        legend = self.figure.legend[0]
        legend.label_text_font_size = "8pt"
        self.figure.add_layout(legend, "right")
        self.figure.axis.visible = False
        self.figure.grid.visible = False
        self.note = Div(text="No graph in this logdir yet.")
        self._layout = column(row(self.select, self.variables), self.note, self.figure)

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
            path = os.path.join(self.store.logdir, *run.split("/"), STRUCTURE_FILE)
            try:
                mtime = os.stat(path).st_mtime_ns
            except OSError:
                mtime = None
            if mtime != self._structure.get(run, (None,))[0]:
                self._structure[run] = (mtime, self._read_structure(path) if mtime is not None else [])
                changed.add(run)
        if changed:
            for run in changed:
                self._versions[run] = self._versions.get(run, 0) + 1
            self._sync_select()
            self._draw()

    @staticmethod
    def _read_structure(path):
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f).get("jobs", [])
        except (OSError, ValueError, AttributeError):   # written atomically, so only a foreign file fails here
            return []

    def _sync_select(self):
        self._choices = {}
        options = []
        for run in sorted(self._graph_defs):
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

    # ---------------------------------------------------------------------------------------------- drawing
    def _draw(self):
        choice = self._choices.get(self.select.value)
        show_variables = 0 in self.variables.active
        if choice is None:
            self.nodes_source.data = {k: [] for k in self.nodes_source.data}
            self.edges_source.data = {k: [] for k in self.edges_source.data}
            self.note.text = "No graph in this logdir yet."
            self.shown = None
            return
        run, job = choice
        shown = (choice, self._versions.get(run), show_variables)
        if shown == self.shown:
            return
        self.shown = shown
        try:
            if job is None:
                nodes, sep = nodes_from_graph_def(self._graph_defs[run]), "/"
            else:
                nodes, sep = nodes_from_structure(self._structure[run][1][job]), "-"   # flowlab's scope joiner
        except (DecodeError, KeyError, TypeError, AttributeError) as e:
            self.note.text = html.escape(f"Could not read the graph of {run}: {type(e).__name__}: {e}")
            return
        node_data, edge_data, note = graph_data(nodes, show_variables, sep)
        self.nodes_source.data = node_data
        self.edges_source.data = edge_data
        self.labels.visible = len(node_data["name"]) <= MAX_LABELED
        source = "structure_graph.json" if job is not None else "GraphDef"
        self.note.text = html.escape(f"{len(node_data['name'])} nodes, {len(edge_data['x0'])} edges (from {source})"
                                     + (f"; {note}" if note else ""))
