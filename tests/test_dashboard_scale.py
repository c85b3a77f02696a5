"""Issue 28's "Scale": a logdir of thousands of runs. The tailer reads a big logdir's files once per round however
many byte allowances its first read takes; the run list costs the page the same models for 10,000 runs as for ten
and its search finds a run on the last page; a Scalars card of hundreds of runs, built from their points
concatenated, sends what a per-run reference computes (extents, one-point dots, smoothing)."""
import math

import numpy as np
import pytest
from bokeh.document import Document
from bokeh.events import ButtonClick

from flowlab.dashboard import app
from flowlab.dashboard.runs import RunSelection
from flowlab.dashboard.store import Store
from flowlab.dashboard.views.scalars import ema, ema_rows
from flowlab.summary import proto
from flowlab.summary.record import frame
from flowlab.summary.tailer import LogdirTailer


def write_runs(logdir, values_of_run):
    """One event file per run ``run0000``...: tag ``loss``, ``values_of_run[r]`` at steps 0, 1, ..."""
    for r, values in enumerate(values_of_run):
        directory = logdir / f"run{r:04d}"
        directory.mkdir(parents=True)
        with open(directory / "events.out.tfevents.1700000000.test.1.0", "wb") as f:
            f.write(frame(proto.Event(wall_time=1.7e9, file_version="brain.Event:2").SerializeToString()))
            for step, v in enumerate(values):
                summary = proto.Summary(value=[proto.Summary.Value(tag="loss", simple_value=float(v))])
                f.write(frame(proto.Event(wall_time=1.7e9 + step, step=step, summary=summary).SerializeToString()))


def test_a_big_first_read_looks_at_each_file_once_not_once_per_allowance(tmp_path):
    runs = 300
    write_runs(tmp_path, [np.arange(40) + r for r in range(runs)])
    whole = LogdirTailer(tmp_path).poll(kinds=("scalar",), columnar=True)
    tailer = LogdirTailer(tmp_path)
    stats = []
    stat = tailer.files.stat
    tailer.files.stat = lambda f: stats.append(f.name) or stat(f)
    pieces, polls = [], 0
    while True:                          # ~1.5 KB a run, 4 KiB a poll: about a hundred allowances
        pieces += tailer.poll(kinds=("scalar",), columnar=True, max_bytes=4096)
        polls += 1
        if not tailer.more:
            break
    assert polls > 50
    # each file once, plus the file an allowance ran out in (looked at again by the next poll): not runs x polls
    assert len(stats) <= runs + polls
    got = {(d.run, int(s)) for d in pieces for s in np.atleast_1d(d.step)}
    assert got == {(d.run, int(s)) for d in whole for s in np.atleast_1d(d.step)}
    assert len(got) == runs * 40
    tailer.poll(kinds=("scalar",), columnar=True, max_bytes=4096)    # a new round: every file looked at again
    assert len(stats) <= 2 * runs + polls + 1


class RunsOnly:
    """A store that holds runs and nothing else (the run list reads ``runs()``; its grouping, hparams series)."""

    def __init__(self, runs):
        self._runs = runs
        self.version = 0

    def runs(self):
        return self._runs

    def series(self, kind=None):
        return []


def run_list(runs):
    selection = RunSelection(RunsOnly(runs))
    doc = Document()
    doc.add_root(selection.layout())
    selection.update()
    return selection, doc


def search(selection, pattern):
    selection.search.value = pattern


def test_the_run_list_of_ten_thousand_runs_has_the_models_of_ten_and_finds_the_last_run():
    names = [f"run{r:04d}" for r in range(10_000)]
    small, small_doc = run_list(names[:10])
    big, doc = run_list(names)
    assert len(doc.models) == len(small_doc.models)        # no model per run: one table, one source
    assert list(big.source.data["run"]) == names and len(big.source.selected.indices) == 10_000
    assert big.shown() is None and big.summary.text == "10,000 of 10,000 runs shown"

    search(big, "^run9999$")                               # the last run, past any page of the list
    assert list(big.view.filter.indices) == [9999]
    assert big.shown() == {"run9999"} and big.summary.text == "1 of 10,000 runs shown"
    search(big, "run9[89]9[07]")
    assert [names[i] for i in big.view.filter.indices] == ["run9890", "run9897", "run9990", "run9997"]
    big.check_none._trigger_event(ButtonClick(big.check_none))     # "uncheck shown": only those four
    search(big, "")
    assert big.summary.text == "9,996 of 10,000 runs shown"
    assert big.shows("run9996") and not big.shows("run9997") and not big.shows("run9890")
    assert len(doc.models) == len(small_doc.models)

    names.append("run10000")                               # a run that comes later: appended, checked
    big.update()
    assert big.shows("run10000") and big.summary.text == "9,997 of 10,001 runs shown"


def test_ema_rows_is_ema_of_each_series():
    rng = np.random.default_rng(0)
    series = [rng.normal(size=n) for n in (0, 1, 2, 5, 100, 100, 100, 700, 700)]
    series[5][3] = np.nan                      # a NaN, an Inf: smoothed one by one, passed through
    series[7][10] = np.inf
    for weight in (0.0, 0.3, 0.6, 0.95):
        for values, (smoothed, state) in zip(series, ema_rows(series, weight)):
            expected, expected_state = ema(values, weight)
            np.testing.assert_allclose(smoothed, expected, rtol=1e-12, atol=1e-12)
            assert state[1] == expected_state[1] and math.isclose(state[0], expected_state[0], rel_tol=1e-12)
            # ... and going on from that state smooths new points as ema does
            more = rng.normal(size=7)
            np.testing.assert_allclose(ema(more, weight, state)[0], ema(np.r_[values, more], weight)[0][-7:],
                                       rtol=1e-9, atol=1e-12)


@pytest.fixture(scope="module")
def many_runs(tmp_path_factory):
    rng = np.random.default_rng(1)
    values = [np.exp(-np.arange(100) / 30) + 0.05 * rng.random(100) + r / 400 for r in range(400)]
    values[7] = values[7][:1]                  # one point: a dot
    values[8] = np.full(50, 2.5)               # constant: not smoothed
    values[9] = values[9].copy()
    values[9][[20, 40]] = [np.nan, np.inf]     # gaps, and ticks
    values[10] = values[10][:30]               # shorter
    logdir = tmp_path_factory.mktemp("many")
    write_runs(logdir, values)
    store = Store(logdir)
    store.poll()
    return store, values


def test_a_card_of_hundreds_of_runs_sends_what_each_run_computes(many_runs):
    store, values = many_runs
    view = app.build_document(Document(), store)["scalars"]
    card = view.cards["loss"]
    rows, flat = card.rows.data, card.flat.data
    assert list(rows["run"]) == [f"run{r:04d}" for r in range(400)]
    weight = view.smoothing.value
    for i, line in enumerate(card.lines.values()):     # each run's points and box as one run alone gives them
        own = line.row_columns()
        a, b = rows["start"][i], rows["stop"][i]
        for column in ("steps", "walls", "ys", "smooth"):
            np.testing.assert_array_equal(flat[column][a:b], own[column])
        stored = line.values                                  # (float32 in the file)
        assert len(stored) == len(values[i])
        expected = stored if len(np.unique(stored)) == 1 else ema(stored, weight)[0]
        np.testing.assert_allclose(np.where(np.isinf(expected), np.nan, expected), flat["smooth"][a:b], rtol=1e-12)
        finite = own["ys"][np.isfinite(own["ys"])]
        assert (rows["x0"][i], rows["x1"][i]) == (own["steps"].min(), own["steps"].max())
        assert (rows["y0"][i], rows["y1"][i]) == (finite.min(), finite.max())
        one = len(values[i]) == 1
        assert np.isnan(rows["dot_x"][i]) != one and (not one or rows["dot_y"][i] == stored[0])
    assert [r for r, x in zip(rows["run"], rows["dot_x"]) if np.isfinite(x)] == ["run0007"]
    assert sorted(card.marks.data["what"]) == ["+Inf", "NaN"] and set(card.marks.data["run"]) == {"run0009"}
    assert isinstance(rows["start"], np.ndarray)             # numbers travel as arrays, not lists of 400


def test_a_card_models_and_y_range_do_not_depend_on_the_run_count(many_runs):
    store, _ = many_runs
    doc = Document()
    view = app.build_document(doc, store)["scalars"]
    card = view.cards["loss"]
    runs = view.runs
    finite = np.concatenate([ln.values[np.isfinite(ln.values)] for ln in card.lines.values()])
    assert card.y_range.default_span == 2.0 and finite.max() > 2.0
    view.outliers.active = True                              # ignore outliers: the shown runs' 5th-95th percentile
    card = view.cards["loss"]
    assert card.y_range.start < np.percentile(finite, 5) < np.percentile(finite, 95) < card.y_range.end
    runs.check_only(["run0000"])
    runs._changed()
    lo, hi = np.percentile(card.lines["run0000"].values, [5, 95])
    pad = (hi - lo) * 0.05
    assert (card.y_range.start, card.y_range.end) == pytest.approx((lo - pad, hi + pad))


def test_a_first_poll_of_many_batches_sorts_the_series_once(tmp_path, monkeypatch):
    from flowlab.dashboard import store as store_module
    write_runs(tmp_path, [np.arange(40) + r for r in range(300)])
    monkeypatch.setattr(store_module, "POLL_BYTES", 4096)           # about a hundred batches
    batches, sorts = [], []
    original_store, original_index = Store._store, Store._index
    monkeypatch.setattr(Store, "_store", lambda self, items, touched: batches.append(1) or
                        original_store(self, items, touched))
    monkeypatch.setattr(Store, "_index", lambda self: sorts.append(1) or original_index(self))
    store = Store(tmp_path)
    version = store.version
    store.poll()
    assert len(batches) > 50 and len(sorts) == 1                      # not once a batch: runs x batches
    assert store.runs() == [f"run{r:04d}" for r in range(300)] and store.version > version
    assert [len(s) for s in store.series("scalar")] == [40] * 300
    store.poll()                                                      # nothing new: nothing sorted again
    assert len(sorts) == 1



def test_a_card_of_many_runs_draws_thin_smoothed_lines_until_few_are_shown(many_runs, monkeypatch):
    from flowlab.dashboard.views import scalars
    store, _ = many_runs
    monkeypatch.setattr(scalars, "DENSE_LINES", 100)
    view = app.build_document(Document(), store)["scalars"]
    smoothed = view.cards["loss"].renderers[1].glyph
    assert smoothed.ys == "smooth" and smoothed.line_width == 1          # 400 runs drawn
    view.runs.check_only([f"run{r:04d}" for r in range(10)])
    view.runs._changed()
    assert smoothed.line_width == 2                                     # 10 drawn
    view.runs.check_only([f"run{r:04d}" for r in range(400)])
    view.runs._changed()
    assert smoothed.line_width == 1
