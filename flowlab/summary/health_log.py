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
``<tag>/attention``         transformers (``HealthReport.attention``): a               (not shown: our plugin)
                            ``flowlab_health`` matrix ``[heads, 1]``, one row per
                            head ``<block>/head_<h>``, statistic
                            ``attention_entropy``
``<tag>/residual``          transformers (``HealthReport.residual``): a               (not shown: our plugin)
                            ``flowlab_health`` matrix ``[sums, 3]``, statistics
                            ``stream_norm``, ``growth``, ``branch_ratio``
==========================  =======================================================  ==========================

The two transformer tags are health records of their own (same plugin, same layout rules), so every reader of
health records (``read_health``, the dashboard's store, the tailer) takes them as they are; ``attention_of`` and
``residual_of`` turn their records back into a report's ``attention`` and ``residual`` dicts, and ``PARTS`` names
the suffixes (the Health tab draws them beside their report's tag).

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
ATTENTION, RESIDUAL = "attention", "residual"
PARTS = (ATTENTION, RESIDUAL)            # a report's transformer records: tags ``<tag>/attention``, ``<tag>/residual``
ATTENTION_STATISTIC = "attention_entropy"
RESIDUAL_STATISTICS = ("stream_norm", "growth", "branch_ratio")
HEAD = "/head_"                          # an attention record's rows: ``<block>/head_<h>``


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


def values(report, tag, layouts=None):
    """The ``Summary.Value``s of ``report`` (see the module docstring) and the ``{tag: (layers, statistics)}`` layouts
    they were written with. ``layouts``: those a writer's earlier reports fixed (their tags' metadata), by tag."""
    layouts = dict(layouts or {})
    tables = [(tag, report.table)]
    if report.attention:
        tables.append((f"{tag}/{ATTENTION}", {f"{block}{HEAD}{h}": {ATTENTION_STATISTIC: float(e)}
                                              for block, heads in report.attention.items()
                                              for h, e in enumerate(heads)}))
    if report.residual:
        tables.append((f"{tag}/{RESIDUAL}", {name: {s: float(row[s]) for s in RESIDUAL_STATISTICS}
                                             for name, row in report.residual.items()}))
    out, first_report = [], tag not in layouts
    for name, table in tables:
        layers, layout = tuple(table), layouts.get(name)
        first = layout is None
        if first:
            layout = layouts[name] = (layers, columns(table))
        elif layers != layout[0]:
            raise ValueError(f"add_health: tag {name!r} already holds reports of layers {list(layout[0])}, this report "
                             f"has {list(layers)}; write another job's reports under another tag (tag=...)")
        # the metadata (the names) goes with a tag's first report only: readers keep the first they see, as TensorBoard
        out.append(encode.tensor(name, matrix(table, layout[1]), PLUGIN, content(*layout) if first else b"",
                                 metadata=first))
    if report.loss is not None:
        out.append(encode.scalar(f"{tag}/loss", report.loss, metadata=first_report))
    if report.alerts:
        out.append(encode.text(f"{tag}/alerts", [[a.kind, a.layer or "", a.message] for a in report.alerts]))
    for layer, kinds in (report.histograms or {}).items():
        for what, buckets in kinds.items():
            out.append(encode.histogram_of_buckets(f"{tag}/{layer}/{what}", buckets))
    return out, layouts


def attention_of(record):
    """``{block: [normalized entropy per head]}`` (a report's ``attention``) from a ``<tag>/attention`` record."""
    out = {}
    for row, value in zip(record.layers, record.matrix[:, record.statistics.index(ATTENTION_STATISTIC)]):
        block = row.rpartition(HEAD)[0]
        out.setdefault(block, []).append(float(value))
    return out


def residual_of(record):
    """``{sum: {"stream_norm", "growth", "branch_ratio"}}`` (a report's ``residual``) from a ``<tag>/residual``
    record."""
    return {name: {s: float(v) for s, v in zip(record.statistics, row)}
            for name, row in zip(record.layers, record.matrix)}


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
