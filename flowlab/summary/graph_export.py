"""A traced job as a picture: OneFlow's structure-graph JSON and a TensorBoard ``GraphDef``.

Both describe every node of the job's graph (``job.graph()``: forward ops, gradients, updates, summary writes), in the
graph's order, which is topological, except the watch statistics ops (``Op.observes``: ``watch_health``'s, ``watch(...,
stats=True)``'s): flowlab adds those when a watched job compiles, so a graph written before the job first ran and one
written after are the same, and nothing reads their outputs but the watch.

``structure_json(job)`` -> one JSON-able dict per job::

    {"class_name": "Job", "name": "train_job", "type": "train",
     "input_layers": ["Input_0"], "output_layers": ["loss"],
     "layers": [{"class_name": "MatMul", "name": "hidden_matmul",
                 "config": {"transpose_b": true, "outputs": [{"name": "hidden_matmul/out_0", "shape": [8, 16],
                                                              "dtype": "float32"}]},
                 "inbound_nodes": ["Input_0", "hidden-weight"], "inputs": ["Input_0/out_0", "hidden-weight/out"],
                 "source": "train.py:12"}, ...]}

``inbound_nodes`` and ``inputs`` follow the op's inputs in order (producer node names and logical blob names);
``config`` holds the op's attributes that JSON can carry plus its outputs' shapes and dtypes.

``graph_def(job)`` -> serialised ``GraphDef`` bytes for ``Event.graph_def``. OneFlow joins name scopes with ``-``
(``mlp-hidden-weight``, ``System-AutoGrad-...``); TensorBoard groups nodes by ``/``, so node names turn ``-`` into
``/`` there. Each ``NodeDef`` carries ``op`` = the op class, ``input`` = producer names (``name:i`` for an output
other than the first), attrs ``_output_shapes``, ``dtype`` and the op's simple attributes. ``jobs_graph_def(jobs)``
puts several jobs in one ``GraphDef``, one top-level group per job.
"""
from __future__ import annotations

import numbers

import numpy as np

from . import proto


def _graph(job):
    """A ``Graph`` from a job function (traced now if it never was) or a ``Graph`` itself."""
    return job.graph() if callable(getattr(job, "graph", None)) else job


def _nodes(graph):
    """The nodes drawn: all but the watch statistics ops (see the module docstring)."""
    return [node for node in graph.nodes if not node.op.observes]


def _json_value(value):
    """``value`` as plain JSON data, or ``None`` when it has no faithful JSON form (arrays, schedules, functions)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        return value if np.isfinite(value) else None    # JSON has no NaN/Inf
    if isinstance(value, str):
        return value
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return np.dtype(value).name
    if isinstance(value, (tuple, list)):
        items = [_json_value(v) for v in value]
        return None if any(v is None for v in items) else items
    return None


def _outputs(node):
    return [{"name": t.logical_blob_name, "shape": list(t.shape), "dtype": t.dtype.name} for t in node.outputs]


def structure_json(job) -> dict:
    """The structure graph of one job (see the module docstring)."""
    graph = _graph(job)
    layers = []
    for node in _nodes(graph):
        config = {key: v for key, v in ((key, _json_value(value)) for key, value in node.attrs.items())
                  if v is not None}
        config["outputs"] = _outputs(node)
        layers.append({"class_name": node.op.__name__, "name": node.name, "config": config,
                       "inbound_nodes": [t.node.name for t in node.inputs],
                       "inputs": [t.logical_blob_name for t in node.inputs],
                       "source": node.source})
    return {"class_name": "Job", "name": graph.name, "type": "train" if graph.is_train else "predict",
            "input_layers": [t.node.name for t in graph.placeholders],
            "output_layers": [t.node.name for t in graph.outputs],
            "layers": layers}


# ------------------------------------------------------------------------------------------------------ GraphDef

_DT_BY_NUMPY = {np.dtype(k): v for k, v in {
    "float32": "DT_FLOAT", "float64": "DT_DOUBLE", "float16": "DT_HALF", "int8": "DT_INT8", "uint8": "DT_UINT8",
    "int16": "DT_INT16", "uint16": "DT_UINT16", "int32": "DT_INT32", "uint32": "DT_UINT32", "int64": "DT_INT64",
    "uint64": "DT_UINT64", "bool": "DT_BOOL", "complex64": "DT_COMPLEX64", "complex128": "DT_COMPLEX128"}.items()}


def _data_type(dtype):
    name = _DT_BY_NUMPY.get(np.dtype(dtype))
    return proto.enum_value("tensorboard.DataType", name) if name else 0     # 0 = DT_INVALID: no TF equivalent


def _shape(shape):
    out = proto.TensorShapeProto()
    out.dim.extend(proto.TensorShapeProto.Dim(size=int(n)) for n in shape)
    return out


def _attr(value):
    """An ``AttrValue`` for a simple attribute, or ``None`` (TensorBoard shows these in the node's info card)."""
    if isinstance(value, np.dtype):
        return proto.AttrValue(type=_data_type(value))
    value = _json_value(value)
    if isinstance(value, bool):
        return proto.AttrValue(b=value)
    if isinstance(value, int):
        return proto.AttrValue(i=value)
    if isinstance(value, float):
        return proto.AttrValue(f=value)
    if isinstance(value, str):
        return proto.AttrValue(s=value.encode("utf-8"))
    if isinstance(value, list) and all(type(v) is int for v in value):
        return proto.AttrValue(list=proto.AttrValue.ListValue(i=value))
    return None


def tensorboard_names(graph) -> dict[str, str]:
    """flowlab node name -> GraphDef node name: scopes joined by ``/``; a name that would clash keeps its own."""
    out, used = {}, set()
    for node in _nodes(graph):
        name = node.name.replace("-", "/")
        if name in used:
            name = node.name
        used.add(name)
        out[node.name] = name
    return out


def graph_def_message(job, prefix="", out=None):
    """The ``GraphDef`` message of a job (``graph_def`` serialises it): its nodes, names starting with ``prefix``,
    added to ``out`` when given."""
    graph = _graph(job)
    names = {key: prefix + name for key, name in tensorboard_names(graph).items()}
    out = proto.GraphDef() if out is None else out
    for node in _nodes(graph):
        node_def = out.node.add(name=names[node.name], op=node.op.__name__)
        node_def.input.extend(names[t.node.name] + (f":{t.index}" if t.index else "") for t in node.inputs)
        if node.device_tag:
            node_def.device = str(node.device_tag)
        for key, value in node.attrs.items():
            attr = _attr(value)
            if attr is not None and key not in ("_output_shapes", "dtype"):
                node_def.attr[key].CopyFrom(attr)
        if node.outputs:
            node_def.attr["_output_shapes"].list.shape.extend(_shape(t.shape) for t in node.outputs)
            node_def.attr["dtype"].type = _data_type(node.outputs[0].dtype)
    return out


def graph_def(job) -> bytes:
    """The serialised ``GraphDef`` of a job, for ``Event.graph_def`` (``EventFileWriter.add_graph_def``)."""
    return graph_def_message(job).SerializeToString()


def jobs_graph_def(jobs) -> bytes:
    """Several jobs in one serialised ``GraphDef``, each job's nodes under ``<job name>/`` (TensorBoard keeps one
    graph per run: the last one written)."""
    out = proto.GraphDef()
    for job in jobs:
        graph_def_message(job, f"{_graph(job).name}/", out)
    return out.SerializeToString()
