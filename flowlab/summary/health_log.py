"""How a ``flowlab.HealthReport`` is written to an event file (``SummaryWriter.add_health``) and read back.

One report at step ``s`` under a tag prefix ``tag`` (default ``"health"``) is one event holding:

==========================  =======================================================  ==========================
tag                         value                                                    seen in TensorBoard as
==========================  =======================================================  ==========================
``<tag>``                   ``DT_DOUBLE [layers, statistics]``, plugin               (not shown: our plugin)
                            ``flowlab_health``; NaN where a layer has no such
                            statistic (a layer without an activation, a predict job's
                            gradients). Its metadata content is JSON
                            ``{"version": 1, "layers": [...], "statistics": [...]}``
``<tag>/loss``              scalar, when the report has a loss                       a scalar chart
``<tag>/alerts``            text ``[n, 3]`` rows (kind, layer or "", message), only  a table in the Text tab
                            at steps with alerts
``<tag>/<layer>/<what>``    histograms of the layer's ``activation``, ``weight`` and   Histograms/Distributions
                            ``gradient`` (its kernel's), on reports that carry them
==========================  =======================================================  ==========================

TensorBoard (and our tailer) keep the first metadata of a tag, so the layer and statistic names are fixed per tag and
written with a writer's first report of it only: a writer refuses a later report of the same tag with other layers
(a second job writes under another ``tag``). A
reader takes a record's names from the tag's metadata and checks the matrix's shape against them (``decode``).
"""
from __future__ import annotations

import json
from typing import NamedTuple

import numpy as np

from . import encode

PLUGIN = "flowlab_health"
VERSION = 1
HISTOGRAM_KINDS = ("activation", "weight", "gradient")


class HealthRecord(NamedTuple):
    """One report as read from a log: ``matrix[i, j]`` is statistic ``statistics[j]`` of layer ``layers[i]``."""
    layers: tuple
    statistics: tuple
    matrix: np.ndarray


def columns(table):
    """The statistics of a report's table in first-seen order (a layer lacking one gets NaN there)."""
    names = {}
    for row in table.values():
        names.update(dict.fromkeys(row))
    return tuple(names)


def matrix(table, statistics):
    return np.array([[row.get(s, np.nan) for s in statistics] for row in table.values()], np.float64).reshape(
        len(table), len(statistics))


def content(layers, statistics) -> bytes:
    return json.dumps({"version": VERSION, "layers": list(layers), "statistics": list(statistics)}).encode()


def values(report, tag, layout=None):
    """The ``Summary.Value``s of ``report`` (see the module docstring). ``layout``: the ``(layers, statistics)`` this
    tag was first written with (its metadata), or None for a first report."""
    layers = tuple(report.table)
    first = layout is None
    if first:
        layout = (layers, columns(report.table))
    elif layers != layout[0]:
        raise ValueError(f"add_health: tag {tag!r} already holds reports of layers {list(layout[0])}, this report has "
                         f"{list(layers)}; write another job's reports under another tag (tag=...)")
    # the metadata (the names) goes with a tag's first report only: readers keep the first they see, as TensorBoard
    out = [encode.tensor(tag, matrix(report.table, layout[1]), PLUGIN, content(*layout) if first else b"",
                         metadata=first)]
    if report.loss is not None:
        out.append(encode.scalar(f"{tag}/loss", report.loss, metadata=first))
    if report.alerts:
        out.append(encode.text(f"{tag}/alerts", [[a.kind, a.layer or "", a.message] for a in report.alerts]))
    for layer, kinds in (report.histograms or {}).items():
        for what, buckets in kinds.items():
            out.append(encode.histogram_of_buckets(f"{tag}/{layer}/{what}", buckets))
    return out, layout


def decode(array, plugin_content) -> HealthRecord:
    """A ``HealthRecord`` from a ``flowlab_health`` tensor and its tag's metadata content. Raises ValueError for a
    record that does not fit its names (a damaged or foreign log)."""
    try:
        meta = json.loads(plugin_content.decode("utf-8"))
        layers, statistics = tuple(map(str, meta["layers"])), tuple(map(str, meta["statistics"]))
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"health record: metadata content is not a flowlab_health layout ({err})") from None
    array = np.asarray(array, np.float64)
    if array.shape != (len(layers), len(statistics)):
        raise ValueError(f"health record: a matrix of shape {array.shape} for {len(layers)} layers and "
                         f"{len(statistics)} statistics")
    return HealthRecord(layers, statistics, array)
