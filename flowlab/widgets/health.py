"""``HealthPanel``: a live notebook view of a network's health, the handler of ``flow.watch_health``.

What it shows (every figure from ``flowlab.plots.health``, the plot layer the dashboard's Health tab uses too): a
statistic selector, a ``HealthHeatmap`` of layers × steps for that statistic, the trend of one layer's statistic
(the layer clicked in the heatmap; before any click, the first layer with an alert, else the first layer) and,
below it at the panel's width, the alert list: a count per kind, then every kind of the run (the one seen last
first), each with one row for each of its first layers (its steps, how often, the newest message in full). A
transformer's reports (``HealthReport.attention``) add a compact heatmap under the main one: each head's normalized
attention entropy over steps (0 collapsed, 1 uniform; one row a head, or, past ``ATTENTION_ROWS`` heads, one row a
block holding its lowest head's: the head nearest collapse), on a fixed 0…1 scale.

Where the work happens: when the panel is ``flow.watch_health``'s only consumer on the host, a call only records
its statistics and the panel takes them in bulk (``health_block``: ``flowlab.health.HealthBlock``, the tables of
many calls as one array and their alerts, made when a block is full or when the panel asks, ``health_source``,
before each refresh and whenever it is read). Otherwise (with a writer, on a GPU) ``panel(report)`` takes one
report a call and only records: under a short data lock it keeps the report's table and alerts. Either way the
refresh thread (``_live``) folds the tables in bulk into a ``HealthGrid`` (the run's steps in at most
``max_steps`` buckets, losing no extreme; one report at a time would cost the job ~100 µs a step) and sends at most
``refresh_hz`` updates a second, each holding only the grid's buckets that changed. Being that cheap (a few µs),
``panel(report)`` says so (``delivered_inline``) and ``flow.watch_health`` calls it on the job's thread as each
report is made, sparing a hand-off to the dispatcher thread; its errors (as ``health_block``'s) still surface at the
next job call.

The page sends nothing back to the kernel (see ``live``), so the statistic selector and the click on a layer act in
the page: the panel sends every statistic of every bucket (one ``cells`` source, a row per bucket and layer, bucket
by bucket so that new steps append rows), and a small script (``_PAGE_JS``) fills the heatmap and the trend from it
for the statistic and layer chosen there, again whenever new rows arrive. The choice survives the document being
rebuilt at the end of a cell (it is kept in the page under the panel's key). The static copy a saved notebook keeps
shows the panel's own choice: ``statistic`` (default ``grad_norm``) and the default layer.

Outside a notebook (or with ``mode="terminal"``) it prints an alert's line the first time its kind fires for its
layer (a broken net repeats the same alerts every step) and, at most every ``TERMINAL_TABLE_PERIOD`` seconds, one
line with the statistic of each layer and the alerts counted so far.
"""
from __future__ import annotations

import html
import sys
import threading
import time
import uuid
import weakref
from collections import Counter, deque
from collections.abc import Callable

import numpy as np
from bokeh.layouts import column, row
from bokeh.models import ColumnDataSource, CustomJS, Div, Select

from ..health import STATISTICS, TRANSFORMER_STATISTICS, HealthReport
from ..plots import finite_extent, fit_range, fit_trend, heading, trend_figure, trend_source
from ..plots.figures import ALARM
from ..plots.health import LINEAR, AlertGroups, HealthHeatmap, heatmap_svg, share_steps
from ..summary.thinning import HealthGrid
from ..summary import health_log
from ..summary.health_log import ATTENTION_STATISTIC
from ._live import DEFAULT_HZ, LiveView, Refresher, check_hz, resolve_mode
from .live import LiveDocument

WAITING = '<span style="color:#777">HealthPanel: waiting for the first health report…</span>'
DEFAULT_STATISTIC = "grad_norm"
FOLD_EVERY = 256               # reports kept before they are folded into the grid (bounded without a refresher)
ALERTS_KEPT = 500              # the newest alerts kept as ``alerts`` (the counts and the list cover every alert)
ALERT_LAYERS_SHOWN = 4         # layers of a kind listed with their message; the rest are named in one line
PAD = "padding:0 8px 3px 0"   # an alert table cell's
TERMINAL_TABLE_PERIOD = 5.0    # seconds between per-layer lines in a terminal
ATTENTION_ROWS = 32            # heads drawn a row each; more (BERT-base: 144) are drawn a row per block

# Fills the heatmap and the trend from the cells for the statistic and layer chosen in the page. One script, called
# on document_ready (``event`` "ready"), a new statistic ("select"), a tap in the heatmap ("tap") and new data. An
# update changes two sources (``cells``, then ``meta``): their "data" events are folded into one drawing, in a
# microtask that runs once the whole update is applied.
_PAGE_JS = """
const chosen = (globalThis.__flowlab_health_choice ??= new Map());
const choice = chosen.get(key) ?? {};
chosen.set(key, choice);
if (event === "data") {
  const pending = (globalThis.__flowlab_health_pending ??= new WeakSet());    // this view's cells source
  if (pending.has(cells)) return;
  pending.add(cells);
  queueMicrotask(() => { pending.delete(cells); draw(); });
  return;
}
if (event === "ready") {
  if (choice.statistic && choice.statistic !== select.value && select.options.includes(choice.statistic))
    select.value = choice.statistic;        // the choice made before the document was rebuilt
} else if (event === "select") {
  choice.statistic = select.value;
} else if (event === "tap") {
  const picked = heat.selected.indices;
  if (picked.length === 0) return;
  choice.layer = heat.data.bottom[picked[0]];   // a cell's row is its layer
  heat.selected.indices = [];               // no dimmed cells: the trend's title says which layer is shown
}
draw();

function draw() {
const stat = select.value, d = cells.data, n = d.row.length;
const linear = linear_statistics.includes(stat);
const hi = d["hi|" + stat], lo = d["lo|" + stat], mean = d["mean|" + stat];
const step = meta.data.step.length ? meta.data.step[0] : null;
const mapper = linear ? linear_mapper : log_mapper;
const layers = names.length;
heat.data = {                               // the columns of plots.health's HealthHeatmap (see HEATMAP_COLUMNS)
  left: d.first, right: d.right, right_fill: Array.from(d.right, (r, i) => i + layers < n ? d.right[i + layers] : r),
  bottom: d.row, top: Array.from(d.row, (r) => r + 1),
  value: Array.from(hi, (v) => v > 0 ? v : v === 0 ? 1e-300 : NaN), linear_value: hi, lo, mean, hi,
  first: d.first, last: d.last, nonfinite: d.nonfinite};
const bad = [];
for (let i = 0; i < n; i++) if (d.nonfinite[i] > 0) bad.push(i);
alarms.data = {left: bad.map((i) => d.first[i]), right: bad.map((i) => d.right[i]), bottom: bad.map((i) => d.row[i]),
               top: bad.map((i) => d.row[i] + 1)};
// the scale fits the finite values (positive ones on the log scale, where a zero is drawn pink), as in Python
let low = Infinity, high = -Infinity, zeros = false;
for (const v of hi) {
  if (!Number.isFinite(v)) continue;
  if (!linear && v <= 0) { zeros ||= v === 0; continue; }
  low = Math.min(low, v); high = Math.max(high, v);
}
if (low > high) [low, high] = [linear ? 0 : 1e-3, 1];
else if (high <= low) [low, high] = !linear ? [low / 2, high * 2] : low >= 0 ? [0, high || 1] : [low - 0.5, high + 0.5];
if (mapper.low !== low || mapper.high !== high) { mapper.low = low; mapper.high = high; }
if (glyph.fill_color.transform !== mapper)
  glyph.fill_color = {field: linear ? "linear_value" : "value", transform: mapper};
log_bar.visible = !linear;
linear_bar.visible = linear;
heat_figure.title.text = `${stat}: ${meanings[stat] ?? ""}` + (step === null ? "" : `  (to step ${step})`) +
  (zeros ? "  (pink: 0)" : "") + (choice.layer === undefined ? "  · click a row for its trend" : "");
const rows_of = (l) => { const r = []; for (let i = 0; i < n; i++) if (d.row[i] === l) r.push(i); return r; };
let layer = choice.layer ?? (meta.data.default_layer.length ? meta.data.default_layer[0] : 0);
let rows = rows_of(layer);
if (choice.layer === undefined && !rows.some((i) => Number.isFinite(mean[i]))) {
  // a statistic only some layers have (a batch norm's moving statistics): the first layer that has it
  const having = d.row[Array.from(mean).findIndex((v) => Number.isFinite(v))];
  if (having !== undefined) { layer = having; rows = rows_of(layer); }
}
const pick = (column) => Float64Array.from(rows, (i) => column[i]);
const m = pick(mean);
trend.data = {step: pick(d.first), end: pick(d.end), mean: m, lower: m, upper: m, min: pick(lo), max: pick(hi),
              nonfinite: pick(d.nonfinite), mark: Float64Array.from(rows, (i) => d.nonfinite[i] > 0 ? 1 : NaN)};
// the hint goes in the heatmap's wide title: beside a long layer name (ResNet-50's "Resnet-res5_2_branch2b") the
// trend's narrow title was cut by the alert list
trend_figure.title.text = `layer ${names[layer]}: ${stat}`;
trend_axis.axis_label = stat;
// The value range, set here with the data, as Python sets the other panels' (plots.figures.fit_range): an auto range
// is recomputed inside a paint, which then asks for another paint and a layout. Every finite value drawn is inside;
// it moves only when they leave it or fill under half of it, and is fitted afresh for another layer or statistic.
let low_v = Infinity, high_v = -Infinity;
for (const column of [trend.data.min, trend.data.max, m])
  for (const v of column) if (Number.isFinite(v)) { low_v = Math.min(low_v, v); high_v = Math.max(high_v, v); }
if (low_v <= high_v) {
  const shown = `${stat}|${layer}`, y = trend_figure.y_range;
  const [start, end] = sticky(trend_figure.__flowlabShown === shown ? [y.start, y.end] : null, low_v, high_v);
  trend_figure.__flowlabShown = shown;
  if (y.start !== start || y.end !== end) y.setv({start, end});
}
}

// plots.data.sticky_range (pad 0.05, headroom 0.25, fill 0.5), for an axis without a fixed start
function sticky(current, lo, hi) {
  let span = hi - lo;
  if (!(span > 0)) {
    span = Math.abs(hi) * 0.1 || 1.0;
    [lo, hi] = [lo - 0.5 * span, hi + 0.5 * span];
  }
  const tight = [lo - 0.05 * span, hi + 0.05 * span];
  if (current === null) return tight;
  const [c0, c1] = current;
  if (c0 <= lo && hi <= c1) return span >= 0.5 * (c1 - c0) ? current : tight;
  let n0 = lo >= c0 ? c0 : tight[0] - 0.25 * span;
  let n1 = hi <= c1 ? c1 : tight[1] + 0.25 * span;
  if (lo >= 0 && n0 < 0) n0 = Math.max(n0, Math.min(tight[0], 0));
  if (hi <= 0 && n1 > 0) n1 = Math.min(n1, Math.max(tight[1], 0));
  if (span < 0.5 * (n1 - n0)) {
    if (lo >= c0) n0 = tight[0];
    if (hi <= c1) n1 = tight[1];
  }
  return [n0, n1];
}
"""


def _trend_extent(columns):
    """``(lo, hi)`` of what the trend draws of a ``HealthGrid.trend_columns`` (None when nothing is finite): the
    page's script takes the same values for its range."""
    return finite_extent(columns["min"], columns["max"], columns["mean"])


def _default_statistic(statistics, wanted):
    return wanted if wanted in statistics else DEFAULT_STATISTIC if DEFAULT_STATISTIC in statistics \
        else statistics[0]


class _HealthDocument(LiveDocument):
    """A ``LiveDocument`` whose static copy is the panel's own (the heatmap's colour mapping, the selector and the
    colour bar have no static rendering): ``static`` (held weakly) returns that layout."""

    def __init__(self, root, static, **kwargs):
        self._static = weakref.WeakMethod(static)
        super().__init__(root, **kwargs)

    def static_html(self):
        static = self._static()
        layout = static() if static is not None else None
        if layout is None:
            return super().static_html()
        from ..plots.static import to_html
        try:
            return to_html(layout)
        except Exception as e:          # a fallback must never break the live widget
            return f"<pre>{html.escape(self._name)} (no static rendering: {html.escape(str(e))})</pre>"


class HealthPanel(LiveView):
    """Live per-layer health of a training network: pass it to ``flow.watch_health(panel)`` (with
    ``writer=SummaryWriter(...)`` to log the same reports for the dashboard) and ``display(panel)``.

    The first report fixes the layers and statistics; a report of other layers (another job) is an error. The
    heatmap keeps the whole run in at most ``max_steps`` columns of consecutive steps. ``statistic`` is the one shown
    first (default ``grad_norm``); the page's selector switches it and a click on a heatmap row shows that layer's
    trend. ``refresh()`` pushes what is pending now; ``close()`` does so and stops the refresh thread. Outside
    Jupyter (or with ``mode="terminal"``) it prints alert lines and a per-layer line instead.
    """

    delivered_inline = True     # see the module docstring

    def __init__(self, refresh_hz=DEFAULT_HZ, max_steps=400, mode=None, file=None, statistic=None):
        self.mode = resolve_mode(mode, "HealthPanel")
        self.refresh_hz = check_hz(refresh_hz, "HealthPanel")
        if not isinstance(max_steps, int) or isinstance(max_steps, bool) or max_steps < 2:
            raise ValueError(f"HealthPanel: max_steps must be an int of at least 2, got {max_steps!r}")
        if statistic is not None and statistic not in STATISTICS:
            raise ValueError(f"HealthPanel: unknown statistic {statistic!r}; known: {', '.join(STATISTICS)}")
        self.max_steps, self._wanted_statistic, self._file = max_steps, statistic, file
        self._grid = None                      # HealthGrid, made by the first report (read it as ``grid``)
        self._pending = []                     # (step, table) of reports not yet folded into the grid
        self._attention = None                 # HealthGrid of attention entropy (``attention_grid``), transformers
        self._attention_pending = []           # (step, [one entropy a row]) not yet folded
        self.attention_map = None              # its HealthHeatmap, once built
        self.statistic = None                  # the statistic shown first (and in the static copy)
        self._alerts = deque(maxlen=ALERTS_KEPT)    # the newest HealthAlerts, oldest first (``alerts``)
        self._alert_groups = AlertGroups()     # every alert so far, one row a kind on a layer: the page's list
        self._sources = []                     # weak references to watch_health's flushes (``health_source``)
        self._step = None                      # the latest report's step (``step``)
        self._latest = None                    # the latest report's table (terminal lines)
        self._new_alerts = []                  # alerts of a (kind, layer) not seen before, not yet printed (terminal)
        self._alerts_changed = False
        self._data_lock = threading.Lock()    # the grid, pending tables and alerts; held briefly
        self._ui_lock = threading.RLock()     # Bokeh models and the live document
        self._key = uuid.uuid4().hex           # the page keeps the statistic and layer chosen under it
        self._cells = None                     # the page's data, once the layout is built
        self._printed_at = self._printed_step = None     # the last per-layer line (terminal)
        period = 1.0 / self.refresh_hz if self.mode == "notebook" else max(1.0, 1.0 / self.refresh_hz)
        self._refresher = Refresher(self.refresh, period, "flowlab-health-panel")
        if self.mode == "notebook":
            self._root = column(heading(WAITING), sizing_mode="stretch_width")
            self.widget = _HealthDocument(self._root, self._static_layout, before_settle=self._before_settle,
                                          name="HealthPanel")

    # ---------------------------------------------------------------------------------------------- reports

    def __call__(self, report):
        """The ``watch_health`` handler: keep ``report``'s table for the next fold and its alerts (cheap: the job's
        thread waits on it)."""
        if not isinstance(report, HealthReport):
            raise TypeError(f"HealthPanel: expected a flowlab.HealthReport (pass the panel to flow.watch_health), "
                            f"got {type(report).__name__}: {report!r:.80}")
        with self._data_lock:
            self._check_layers(tuple(report.table), lambda: health_log.columns(report.table))
            if report.attention:
                self._keep_attention([report.step], {block: [heads] for block, heads in report.attention.items()})
            self._pending.append((report.step, report.table))
            if len(self._pending) >= FOLD_EVERY:
                self._fold()
            self._step, self._latest = report.step, report.table
            self._keep_alerts(report.alerts)
        self._refresher.poke()

    def health_block(self, block):
        """The ``watch_health`` handler's bulk form: keep a ``flowlab.health.HealthBlock`` (many calls' tables,
        folded into the grid at once, and their alerts)."""
        with self._data_lock:
            self._check_layers(block.layers, lambda: block.statistics)
            if block.attention:
                self._keep_attention(block.steps.tolist(), block.attention)
            self._fold()                      # reports taken one at a time before, in step order
            stats = self._grid.statistics
            values = block.values
            if stats != block.statistics:     # the same names in another order (or fewer): by name
                where = {s: j for j, s in enumerate(block.statistics)}
                values = np.stack([values[:, :, where[s]] if s in where else np.full(values.shape[:2], np.nan)
                                   for s in stats], axis=2)
            self._grid.extend(block.steps, values)
            self._step = int(block.steps[-1])
            # the terminal's per-layer line reads the latest table: made from the block only there
            self._latest = block.report(-1).table if self.mode == "terminal" else None
            self._keep_alerts(block.alerts)
        self._refresher.poke()

    def health_source(self, flush: Callable[[], None]):
        """``watch_health``'s block path hands the panel its ``flush``: called (on the caller's thread) before each
        refresh and each read of the panel, so that what it shows and says holds every call recorded so far.
        Returns what the job calls after each call it records: the refresh thread's poke."""
        with self._data_lock:
            self._sources.append(weakref.WeakMethod(flush) if hasattr(flush, "__self__") else lambda: flush)
        return self._refresher.poke

    def _pull(self):
        """Every call recorded so far into the panel (``health_source``); not under the data lock."""
        with self._data_lock:
            sources = list(self._sources)
        for source in sources:
            flush = source()
            if flush is None:                 # its job is gone
                with self._data_lock:
                    if source in self._sources:
                        self._sources.remove(source)
            else:
                flush()

    def _check_layers(self, layers, statistics):
        """The first report fixes the layers (and the grid's statistics, ``statistics()``); another job's is an
        error (under the data lock)."""
        if self._grid is None:
            self._grid = HealthGrid(layers, statistics(), self.max_steps)
            self.statistic = _default_statistic(self._grid.statistics, self._wanted_statistic)
        elif layers != self._grid.layers:
            raise ValueError(f"HealthPanel: this panel shows the layers {list(self._grid.layers)}; a report of "
                             f"layers {list(layers)} came (another job?): use one panel per job")

    def _keep_alerts(self, alerts):
        if alerts:
            self._alerts.extend(alerts)
            self._new_alerts += self._alert_groups.add(alerts)
            self._alerts_changed = True

    def _keep_attention(self, steps, attention):
        """Keep the attention entropies of ``steps`` (``{block: [one row of heads a step]}``) as one row a head, or
        a block's lowest (``ATTENTION_ROWS``)."""
        blocks = {block: np.asarray(heads, np.float64).reshape(len(steps), -1) for block, heads in attention.items()}
        if sum(heads.shape[1] for heads in blocks.values()) <= ATTENTION_ROWS:
            names = [f"{block}/head_{h}" for block, heads in blocks.items() for h in range(heads.shape[1])]
            rows = np.concatenate(list(blocks.values()), axis=1)
        else:
            names = [f"{block} (lowest head)" for block in blocks]
            rows = np.stack([heads.min(axis=1) for heads in blocks.values()], axis=1)
        if self._attention is None:
            self._attention = HealthGrid(tuple(names), (ATTENTION_STATISTIC,), self.max_steps)
        elif tuple(names) != self._attention.layers:
            raise ValueError(f"HealthPanel: this panel shows the attention blocks of {list(self._attention.layers)}; "
                             f"a report of {names} came (another job?): use one panel per job")
        self._attention_pending.extend(zip(steps, rows.tolist()))

    def _fold(self):
        """Fold the pending tables into the grid at once (under the data lock)."""
        if self._attention_pending:
            pending, self._attention_pending = self._attention_pending, []
            last = self._attention.last_step if self._attention.last_step is not None else -1
            kept = []
            for step, values in pending:        # in step order, as the main grid's fold
                if step > last:
                    kept.append((step, values))
                    last = step
            if kept:
                self._attention.extend([step for step, _ in kept],
                                       np.array([row for _, row in kept], np.float64)[:, :, None])
        pending, self._pending = self._pending, []
        last = self._grid.last_step if self._grid.last_step is not None else -1
        steps, tables = [], []
        for step, table in pending:
            if step > last:                 # in step order: a re-run's earlier steps are left out, as the grid does
                steps.append(step)
                tables.append(table)
                last = step
        if steps:
            stats = self._grid.statistics
            self._grid.extend(steps, np.array([[[row.get(s, np.nan) for s in stats] for row in table.values()]
                                                for table in tables], np.float64))

    # ------------------------------------------------------------------------------------------------ reading

    @property
    def grid(self):
        """The run's ``HealthGrid`` (None before the first report), every report so far folded in."""
        self._pull()
        with self._data_lock:
            if self._pending:
                self._fold()
            return self._grid

    @property
    def attention_grid(self):
        """The attention entropies' ``HealthGrid`` (rows as the module docstring says, statistic
        ``attention_entropy``), every report so far folded in; None for a network without attention."""
        self._pull()
        with self._data_lock:
            if self._attention_pending:
                self._fold()
            return self._attention

    def default_layer(self, statistic=None):
        """The layer whose trend shows before a click: the first layer (in forward order) with an alert, else the
        first layer; None before the first report. With ``statistic``, among the layers that have it (a batch
        norm's moving statistics: only the batch norms), when any has."""
        self._pull()
        with self._data_lock:
            return None if self._grid is None else self._default_layer(statistic)

    def _default_layer(self, statistic=None):
        layers = self._grid.layers
        if statistic is not None and statistic in self._grid.statistics:
            means = self._grid.cells(statistic)["mean"]
            having = [layer for layer, row in zip(layers, means) if np.isfinite(row).any()]
            layers = having or layers
        alerted = self._alert_groups.layers()
        return next((layer for layer in layers if layer in alerted), layers[0])

    def cells_columns(self, start=0):
        """The ``cells`` source's rows of buckets ``start…`` (a row per bucket and layer, bucket by bucket): ``row``
        (the layer's index), ``first``, ``last``, ``end`` (one past ``last``: the trend's) and ``right`` (where the
        next bucket starts: the heatmap cell's edge, as ``HealthHeatmap`` draws it) steps, ``nonfinite`` and, for
        every statistic ``s``, ``lo|s``, ``mean|s``, ``hi|s``: what ``HealthGrid.cells`` gives, for the page to
        switch between."""
        grid = self._grid
        n_layers = len(grid.layers)
        c = grid.cells_from(start)           # every statistic of the buckets from ``start``, at once
        buckets = len(c["first"])
        out = {"row": np.tile(np.arange(n_layers, dtype=np.float64), buckets),
               "first": np.repeat(c["first"], n_layers).astype(np.float64),
               "last": np.repeat(c["last"], n_layers).astype(np.float64)}
        out["end"] = out["last"] + 1.0
        last = grid.buckets.last[grid.buckets.count - 1] if grid.buckets.count else None
        right = np.append(c["first"][1:], [last + 1] if buckets else [])
        out["right"] = np.repeat(right, n_layers).astype(np.float64)
        out["nonfinite"] = c["nonfinite"].reshape(-1)
        for j, s in enumerate(grid.statistics):
            for part in ("lo", "mean", "hi"):
                out[f"{part}|{s}"] = c[part][:, :, j].reshape(-1)
        return out

    # ------------------------------------------------------------------------------------------------ display

    def refresh(self):
        """Push every pending update now (the refresh thread calls this too)."""
        self._pull()
        with self._ui_lock:
            with self._data_lock:      # a consistent snapshot of what changed, then let reports go on
                if self._grid is None:
                    return
                self._fold()
                at = self._grid.buckets.take()
                # from the bucket before the first changed one: its right edge is where the next one starts
                start = None if at is None else max(at - 1, 0)
                cells = None if at is None or self.mode == "terminal" else self.cells_columns(start)
                attention = None if cells is None or self._attention is None else HealthHeatmap._columns(
                    self._attention.layers, self._attention.cells(ATTENTION_STATISTIC), True, 0)
                alerts_changed, self._alerts_changed = self._alerts_changed, False
                alerts = self._alert_groups.columns() if alerts_changed else None
                counts = self._alert_groups.kind_counts()
                new_alerts, self._new_alerts = self._new_alerts, []
                step, latest = self._step, self._latest
            if at is None and not alerts_changed:
                return
            if self.mode == "terminal":
                self._print(new_alerts, step, latest, counts)
            else:
                self._show(start, cells, alerts, counts, step, attention)

    def _show(self, start, cells, alerts, counts, step, attention=None):
        live, built = self.widget, self._cells is None
        if built:
            self._build()
        if cells is not None:
            live.splice(self._cells, start * len(self._grid.layers), cells)
        if attention is not None and self.attention_map is not None:    # a few rows a head: sent whole
            live.splice(self.attention_map.source, 0, attention)
        default = self._grid.layers.index(self.default_layer())
        live.splice(self._meta, 0, {"step": [step], "default_layer": [default]})
        if alerts is not None:
            live.set(self._alerts_div, text=self._alerts_html(alerts, counts))
        if built:                      # the page gets the whole document
            self._fill_models()
            live.publish()
        else:
            live.push()

    def _build(self):
        """The layout, once the first report fixed the layers (``_show`` fills it through the live document)."""
        grid = self._grid                # its layers and statistics: fixed
        names = list(grid.layers)
        columns = ["row", "first", "last", "end", "right", "nonfinite"] + \
            [f"{part}|{s}" for s in grid.statistics for part in ("lo", "mean", "hi")]
        # names: what tests and page scripts find the models by
        self._cells = ColumnDataSource({c: [] for c in columns}, name="health-cells")
        self._meta = ColumnDataSource({"step": [], "default_layer": []}, name="health-meta")
        self.heatmap = HealthHeatmap(names)
        fig = self.heatmap.figure
        fig.name, self.heatmap.source.name = "health-heatmap", "health-heat"
        self._trend_source = trend_source()
        self._trend_source.name = "health-trend"
        # the page fills it, and sets its value range with the data (_PAGE_JS); its step range is the heatmap's
        self.trend = trend_figure(self._trend_source, y_label=self.statistic)
        self.trend.name = "health-trend-figure"
        self.trend.title.text_font_size = "9pt"
        self.select = Select(value=self.statistic, options=list(grid.statistics), width=190, name="health-statistic",
                             stylesheets=[":host { margin-top: 4px; }"])
        # below the trend, as wide as the panel and as high as its text: every kind shows, each message in full
        self._alerts_div = Div(text="", name="health-alerts", sizing_mode="stretch_width",
                               styles={"font-size": "9pt"}, disable_math=True)
        args = dict(key=self._key, cells=self._cells, meta=self._meta, heat=self.heatmap.source,
                    alarms=self.heatmap.alarms,
                    glyph=self.heatmap.glyph, log_bar=self.heatmap.bars[False], linear_bar=self.heatmap.bars[True],
                    linear_mapper=self.heatmap.linear, log_mapper=self.heatmap.log,
                    heat_figure=fig, trend=self._trend_source, trend_figure=self.trend,
                    trend_axis=self.trend.yaxis[0], select=self.select, names=names,
                    meanings={s: STATISTICS.get(s, "") for s in grid.statistics},
                    linear_statistics=sorted(LINEAR))
        script = lambda event: CustomJS(args=dict(args, event=event), code=_PAGE_JS)     # noqa: E731
        self.select.js_on_change("value", script("select"))
        self.heatmap.source.selected.js_on_change("indices", script("tap"))
        self._cells.js_on_change("data", script("data"))
        self._meta.js_on_change("data", script("data"))
        self.widget._document.js_on_event("document_ready", script("ready"))
        title = f'<b>HealthPanel</b> &nbsp;<span style="color:#777">{len(names)} layers · statistic</span>'
        attention = self._build_attention()
        # the heatmap's steps and the trend's line up pixel for pixel (and the attention map's, above the trend)
        share_steps(fig, self.trend, *attention)
        self._root.children = [
            row(Div(text=title, width=200, disable_math=True, stylesheets=[":host { margin-top: 10px; }"]),
                self.select), fig] + attention + [
            self.trend, self._alerts_div]

    def _build_attention(self):
        """The attention heatmap's figure (a list of none for a network without attention): a linear 0…1 scale,
        fixed, so that a head's colour means the same at every step."""
        if self._attention is None:
            return []
        self.attention_map = HealthHeatmap(self._attention.layers)
        self.attention_map.figure.name, self.attention_map.source.name = "health-attention", "health-attention-heat"
        with self._data_lock:
            self.attention_map.update(self._attention, ATTENTION_STATISTIC, linear=True,
                                      title=f"{ATTENTION_STATISTIC}: {TRANSFORMER_STATISTICS[ATTENTION_STATISTIC]}")
        self.attention_map.linear.update(low=0.0, high=1.0)
        return [self.attention_map.figure]

    def _fill_models(self):
        """Write the panel's own choice (``statistic``, the default layer) into the heatmap and trend models, which
        only the page's script changes otherwise: the snapshot then draws before the script runs."""
        stat = self.statistic
        with self._data_lock:
            layer, step = self._default_layer(stat), self._step
            self.heatmap.update(self._grid, stat)
            self._trend_source.data = trend = self._grid.trend_columns(layer, stat)
        fit_range(None, self.trend.y_range, _trend_extent(trend))
        self.heatmap.figure.title.text = f"{stat}: {STATISTICS.get(stat, '')}  (to step {step})"
        self.trend.title.text = f"layer {layer}: {stat}"

    def _before_settle(self):
        """The end of a cell: flush, then refresh the models the snapshot carries."""
        self.refresh()
        with self._ui_lock:
            if self._cells is not None:
                self._fill_models()

    @staticmethod
    def _alerts_html(groups, counts, shown=ALERT_LAYERS_SHOWN):
        """The alert list: the count per kind, then every kind (the one seen last first), each with its count, its
        layers and steps, and one row for each of its first ``shown`` layers (``AlertGroups.columns()``: one group a
        kind on a layer, the latest first): the steps it fired, how often and its latest message in full, wrapping.
        A kind's further layers are named in one line (a broken ResNet has dozens; their messages differ only in
        the layer). Everything escaped."""
        if not counts:
            return '<div style="color:#2a7d2a"><b>No alerts</b> so far.</div>'
        total = sum(counts.values())
        summary = " · ".join(f"{html.escape(kind)} <b>{n:,}</b>" for kind, n in sorted(counts.items()))
        by_kind, firsts = {}, {}         # kind -> its groups' rows, in the order of columns(): the latest first
        for first, *row_ in zip(groups["first"], groups["step"], groups["steps"], groups["count"], groups["kind"],
                                groups["layer"], groups["message"]):
            by_kind.setdefault(row_[3], []).append(row_)
            firsts.setdefault(row_[3], []).append(first)
        rows = []
        for kind, members in by_kind.items():
            first, last = min(firsts[kind]), max(step for step, *_ in members)
            span = f"step {first:,}" if first == last else f"steps {first:,} … {last:,}"
            layers = [layer for *_, layer, _ in members if layer]
            where = f"{len(layers)} layer{'s' if len(layers) != 1 else ''}" if layers else "the network"
            n = counts.get(kind, sum(count for _, _, count, *_ in members))
            rows.append(f'<tr class="flowlab-alert-kind" data-kind="{html.escape(kind)}">'
                        f'<td colspan="4" style="padding:5px 0 2px 0;border-top:1px solid #ddd;text-align:left">'
                        f'<b style="color:{ALARM}">{html.escape(kind)}</b> <span style="color:#777">· {n:,} '
                        f'alert{"s" if n != 1 else ""} on {where} · {span}</span></td></tr>')
            for _, steps, count, _, layer, message in members[:shown]:
                rows.append(f'<tr class="flowlab-alert" style="vertical-align:top">'
                            f'<td style="color:#777;white-space:nowrap;{PAD}">{steps}</td>'
                            f'<td style="color:#777;text-align:right;{PAD}">{count:,}</td>'
                            f'<td style="white-space:nowrap;{PAD}">{html.escape(layer) or "—"}</td>'
                            # the whole message, wrapping; a long layer name in it (ResNet's
                            # res3_1_branch2c_bn_add_relu) may break anywhere rather than widen the table (and
                            # left-aligned: a saved notebook's stylesheet aligns table cells right)
                            f'<td class="flowlab-alert-message" style="padding-bottom:3px;text-align:left;'
                            f'white-space:normal;overflow-wrap:anywhere">{html.escape(message)}</td></tr>')
            rest = members[shown:]
            if rest:
                names = ", ".join(f"{html.escape(layer) or '—'} ({count:,})" for _, _, count, _, layer, _ in rest)
                rows.append(f'<tr class="flowlab-alert-more"><td colspan="4" style="color:#777;text-align:left;'
                            f'white-space:normal;overflow-wrap:anywhere;{PAD}">… and {len(rest)} more layer'
                            f'{"s" if len(rest) != 1 else ""} (times): {names}</td></tr>')
        return (f'<div><b>{total:,} alert{"s" if total != 1 else ""}</b> of {len(by_kind)} '
                f'kind{"s" if len(by_kind) != 1 else ""}: {summary}</div>'
                '<table style="border-collapse:collapse;font-size:8.5pt;width:100%">'
                f'<tr style="color:#777;text-align:left"><th style="{PAD}">steps</th><th style="{PAD}">times</th>'
                f'<th style="{PAD}">layer</th><th style="text-align:left">message (the latest)</th></tr>'
                + "".join(rows) + "</table>")

    def _static_layout(self):
        """What a saved notebook shows: the heatmap as SVG, the default layer's trend and the alert list."""
        with self._ui_lock:
            if self._cells is None:
                return None
            with self._data_lock:
                layer = self._default_layer(self.statistic)
                svg = heatmap_svg(self._grid, self.statistic)
                source = ColumnDataSource(self._grid.trend_columns(layer, self.statistic))
                alerts = self._alerts_html(self._alert_groups.columns(), self._alert_groups.kind_counts())
            trend = trend_figure(source, y_label=self.statistic)
            fit_trend(None, trend, source.data)
            trend.title.text = f"layer {layer}: {self.statistic}"
            trend.title.text_font_size = "9pt"
            attention = [] if self._attention is None else [Div(text=heatmap_svg(
                self._attention, ATTENTION_STATISTIC), sizing_mode="stretch_width")]
            heading_html = (f"<b>HealthPanel</b> &nbsp;<span style=\"color:#777\">{len(self._grid.layers)} layers · "
                            f"statistic {html.escape(self.statistic)}</span>")
            return column(heading(heading_html), Div(text=svg, sizing_mode="stretch_width"), *attention, trend,
                          Div(text=alerts, sizing_mode="stretch_width", styles={"font-size": "9pt"}),
                          sizing_mode="stretch_width")

    # ------------------------------------------------------------------------------------------------ terminal

    def _print(self, new_alerts, step, latest, counts):
        out = self._file or sys.stdout
        for a in new_alerts:
            print(f"[step {a.step}] {a.kind} {a.layer or '(network)'}: {a.message}", file=out)
        now = time.monotonic()
        if latest is not None and step != self._printed_step and \
                (self._printed_at is None or now - self._printed_at >= TERMINAL_TABLE_PERIOD):
            print(self._table_line(step, latest, counts), file=out)
            self._printed_at, self._printed_step = now, step
        out.flush()

    def _table_line(self, step, table, counts):
        stat = self.statistic
        parts = [f"{layer} {row[stat]:.3g}" if stat in row else f"{layer} —" for layer, row in table.items()]
        alerts = ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items())) or "none"
        return f"[step {step}] {stat}: " + "  ".join(parts) + f" | alerts so far: {alerts}"

    def close(self):
        """Push what is pending and stop refreshing; in a terminal, print the final per-layer line."""
        super().close()
        if self.mode == "terminal":
            with self._data_lock:
                step, latest, counts = self._step, self._latest, self._alert_groups.kind_counts()
            if latest is not None and step != self._printed_step:
                print(self._table_line(step, latest, counts), file=self._file or sys.stdout, flush=True)
                self._printed_step = step

    @property
    def counts(self):
        """Alerts per kind over the whole run, as a ``Counter`` (from ``alert_groups``)."""
        self._pull()
        with self._data_lock:
            return Counter(self._alert_groups.kind_counts())

    @property
    def alerts(self):
        """The newest ``ALERTS_KEPT`` ``HealthAlert``s, oldest first (a deque)."""
        self._pull()
        return self._alerts

    @property
    def alert_groups(self):
        """Every alert so far, one row a kind on a layer (``plots.health.AlertGroups``): the page's list."""
        self._pull()
        return self._alert_groups

    @property
    def step(self):
        """The latest report's step (None before the first)."""
        self._pull()
        return self._step

    def __repr__(self):
        self._pull()
        with self._data_lock:
            if self._grid is None:
                return "HealthPanel(waiting for the first report)"
            return (f"HealthPanel({self.mode}, step={self._step}, layers={list(self._grid.layers)}, "
                    f"alerts={self._alert_groups.kind_counts()})")
