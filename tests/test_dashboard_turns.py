"""Issue 29: "no request may hold the event loop for more than ~100 ms at any logdir size". A served session over
10,000 runs of 100 scalar points (issue 28's "Scale" logdir, held in memory), run turn by turn as the server runs
it (``test_dashboard_paging.served_turns``): the run list in a turn of its own, the Scalars tab, then its card of
10,000 lines read ``RUN_SLICE`` runs a turn, drawn, filled and joined to the page, each in its own turn; and what a
page then asks of the card (a new smoothing, another x axis, new points). Before, one turn read, drew and filled the
whole card (~300 ms of CPU on the shared 2-core machine), another listed the runs and opened the tab (~100 ms), and
each request was one turn of 160-540 ms. What the card holds is what the same card built at once, outside a server,
holds."""
import gc
import time

import numpy as np
import pytest
from bokeh.document import Document
from bokeh.events import ButtonClick

from flowlab.dashboard import app, runs as run_list
from flowlab.dashboard.store import Store
from flowlab.dashboard.views import scalars
from flowlab.dashboard.views.base import View
from flowlab.summary.decode import Datum
from test_dashboard_paging import _run_turns, browser_sets, served, served_turns, sending

RUNS, STEPS = 10_000, 100
# CPU seconds one turn may take (time.thread_time: the turn's own thread, not threads earlier tests left running):
# the issue's ~100 ms. On the shared 2-core machine at load 5-8 the longest turn of the build takes 45-57 ms (the
# tab's first turn), of a request 47-67 ms (a new x axis: the figure and the fill shown); before, 250-390 ms (the
# card's build), ~100 ms (run list and tab), 160-540 ms (requests).
TURN_BOUND_S = 0.1


class InMemory:
    """The logdir reader a ``Store`` polls (``LogdirProvider``'s interface), handing it ``items`` (decoded ``Datum``s,
    scalars as columns, as the tailer gives them) at its first poll: ten thousand runs without writing and reading
    ten thousand event files (~10 s)."""
    logdir = "memory://runs"
    more = False

    def __init__(self, items):
        self.items = items

    def poll(self, kinds=None, max_bytes=None):
        items, self.items = self.items, []
        return items

    def stats(self):
        return {"runs": RUNS, "files": RUNS, "records_read": RUNS * STEPS, "records_skipped": 0, "errors": {}}

    def exists(self):
        return True

    def projector_signatures(self):
        return {}

    def structure_signatures(self):
        return {}


def memory_items(runs=RUNS):
    """``runs`` runs of ``STEPS`` points of tag ``loss`` (``run00000``...), run 7 with a NaN and a +Inf, run 8 with a
    -Inf, run 9 constant, run 10 a single point: the ``Datum`` of each."""
    rng = np.random.default_rng(0)
    steps = np.arange(STEPS, dtype=np.int64)
    items = []
    for r in range(runs):
        values = np.exp(-steps / 30.0) + 0.05 * rng.random(STEPS) + r / runs
        values[[20, 40]] = [np.nan, np.inf] if r == 7 else values[[20, 40]]
        values[60] = -np.inf if r == 8 else values[60]
        values = np.full(STEPS, 2.5) if r == 9 else values
        n = 1 if r == 10 else STEPS
        items.append(Datum(f"run{r:05d}", "loss", "scalar", steps[:n], 1.7e9 + steps[:n] * 10.0, values[:n]))
    return items


def memory_store(tmp_path, runs=RUNS, items=None):
    """A store holding ``items`` (default: ``memory_items(runs)``)."""
    store = Store(tmp_path)
    store._provider = InMemory(memory_items(runs) if items is None else items)
    store.poll()
    assert len(store.runs()) == runs and len(store.series("scalar")) == runs
    return store


def card_data(card):
    """What the page gets of a card: its rows, flat points and NaN/Inf ticks."""
    return ({k: list(v) for k, v in card.rows.data.items()}, {k: np.asarray(v) for k, v in card.flat.data.items()},
            dict(card.marks.data))


def assert_same_card(card, reference, smooth_rtol=0.0):
    """The same rows, points and ticks; the smoothed values within ``smooth_rtol`` (an average carried forward as
    points come rounds otherwise than one computed over the whole series: ~1e-12)."""
    (rows, flat, marks), (rows_ref, flat_ref, marks_ref) = card_data(card), card_data(reference)
    assert rows.keys() == rows_ref.keys() and flat.keys() == flat_ref.keys()
    for k in rows:
        np.testing.assert_array_equal(rows[k], rows_ref[k], err_msg=k)
    for k in flat:
        if k == "smooth" and smooth_rtol:
            np.testing.assert_allclose(flat[k], flat_ref[k], rtol=smooth_rtol, err_msg=k)
        else:
            np.testing.assert_array_equal(flat[k], flat_ref[k], err_msg=k)
    assert marks == marks_ref


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return memory_store(tmp_path_factory.mktemp("runs"))


def test_ten_thousand_runs_are_served_in_turns_under_the_loops_budget(store, monkeypatch):
    reads, per_turn = [0], []
    delta = View.delta

    def counted(self, series):
        reads[0] += 1
        return delta(self, series)

    monkeypatch.setattr(View, "delta", counted)

    def after_turn(views):
        per_turn.append(reads[0])
        reads[0] = 0

    turns, views = served_turns(store, after_turn)
    cpu = [round(t * 1000) for t, _, _ in turns]
    print(f"{len(turns)} turns; CPU ms per turn: {cpu}; series read per turn: {per_turn}")
    view = views["scalars"]
    card = view.cards["loss"]
    assert len(card.lines) == RUNS and view.grid.tags == [0, 1]                          # built and in the page
    # machine-independent: no turn reads more than a slice of the runs (before: one turn read all 10,000)
    assert max(per_turn) <= scalars.RUN_SLICE and sum(per_turn) == RUNS, per_turn
    assert sum(1 for n in per_turn if n) >= RUNS // scalars.RUN_SLICE
    assert max(t for t, _, _ in turns) < TURN_BOUND_S, cpu
    assert not view._reading and not view._unplaced

    # the same card as one built at once outside a server: every run's points, smoothing, extents, dots and ticks
    reference = app.build_document(Document(), store)["scalars"].cards["loss"]
    assert_same_card(card, reference)
    assert sorted(card.marks.data["what"]) == ["+Inf", "-Inf", "NaN"]                  # spikes and NaNs still shown
    assert set(card.marks.data["run"]) == {"run00007", "run00008"}
    assert [r for r, x in zip(card.rows.data["run"], card.rows.data["dot_x"]) if np.isfinite(x)] == ["run00010"]


def test_a_card_changed_while_its_runs_are_read_is_read_again(tmp_path):
    """Smoothing and x axis changed while the card's runs are being read (turn by turn): the card comes out as one
    built with the new settings, not with the slices read before the change smoothed or chosen the old way."""
    store = memory_store(tmp_path, runs=3 * scalars.RUN_SLICE + 1)
    changed = []

    def after_turn(views):
        view = views.get("scalars")
        if view is None or not view._reading:
            return
        card, todo = next(iter(view._reading.values()))
        if not changed and todo and len(card.lines) >= scalars.RUN_SLICE:       # a slice read, more to come
            view.smoothing.value = 0.9
            view._resmooth()                 # (what the slider's value_throttled calls)
            changed.append("smoothing")
        elif changed == ["smoothing"] and len(card.lines) and todo:
            view.x_axis.active = 1            # relative time
            changed.append("axis")

    turns, views = served_turns(store, after_turn)
    assert changed == ["smoothing", "axis"]
    view = views["scalars"]
    card = view.cards["loss"]
    assert len(card.lines) == len(store.runs()) and view.grid.tags == [0, 1]
    assert set(card.rows.data["axis"]) == {scalars.X_AXES.index("relative")}
    reference = app.build_document(Document(), store)["scalars"]
    reference.smoothing.value = 0.9
    reference._resmooth()
    reference.x_axis.active = 1
    assert_same_card(card, reference.cards["loss"])
    assert max(t for t, _, _ in turns) < TURN_BOUND_S, [round(t * 1000) for t, _, _ in turns]


def next_turns(doc):
    """Run ``doc``'s next-tick callbacks as its IOLoop would, each a turn; returns the CPU seconds of each."""
    cpu = []
    for _ in range(200):
        ticks = [cb for cb in doc.session_callbacks if type(cb).__name__ == "NextTickCallback"]
        if not ticks:
            return cpu
        for tick in ticks:
            doc.remove_next_tick_callback(tick)
            started = time.thread_time()
            tick.callback()
            cpu.append(time.thread_time() - started)
    raise AssertionError("the session's turns never ended")


def test_what_a_page_asks_of_a_card_of_ten_thousand_runs_is_spread_over_turns(tmp_path):
    """A new smoothing, another x axis, and a point more in every run (a live logdir): each was one turn of
    150-400 ms on a 10,000-run card (every line smoothed, chosen or grown, then every point packed and sent at
    once). Now the lines are smoothed together, grown ``RUN_SLICE`` runs a turn, and packed ``RUN_SLICE`` a turn
    before the card is filled; the card ends as one built at once with the same settings and data."""
    store = memory_store(tmp_path)
    _, views = served_turns(store)
    view = views["scalars"]
    doc = view.grid.document
    (refresh,) = [cb for cb in doc.session_callbacks if type(cb).__name__ == "PeriodicCallback"]
    cpu = {}

    def request(name, act):
        started = time.thread_time()
        act()
        cpu[name] = [time.thread_time() - started] + next_turns(doc)

    request("smoothing", lambda: (setattr(view.smoothing, "value", 0.9), view._resmooth()))
    request("x axis", lambda: setattr(view.x_axis, "active", 2))       # wall time
    # the same asks of a card built at once, outside a server: its lines grow as the served card's do (a line
    # takes new points as they come, and chooses its points again only past twice its share)
    reference_doc = Document()
    reference = app.build_document(reference_doc, store)["scalars"]
    reference.smoothing.value = 0.9
    reference._resmooth()
    reference.x_axis.active = 2
    store._provider.items = [Datum(f"run{r:05d}", "loss", "scalar", np.array([STEPS]), np.array([1.8e9]),
                                   np.array([r % 7 - 3.0])) for r in range(RUNS)]
    store.poll()
    request("grown", refresh.callback)
    (reference_refresh,) = [cb for cb in reference_doc.session_callbacks
                            if type(cb).__name__ == "PeriodicCallback"]
    reference_refresh.callback()
    print({name: [round(t * 1000) for t in turns] for name, turns in cpu.items()})
    assert all(len(turns) > RUNS // scalars.RUN_SLICE for turns in cpu.values())       # spread, each of them
    assert max(max(turns) for turns in cpu.values()) < TURN_BOUND_S, cpu
    assert not (view._reading or view._growing or view._refilling)

    card = view.cards["loss"]
    assert {len(line.values) for line in card.lines.values()} == {STEPS + 1, 2}         # (run 10 had one point)
    assert_same_card(card, reference.cards["loss"], smooth_rtol=1e-9)
    assert set(card.rows.data["axis"]) == {scalars.X_AXES.index("wall")}


# CPU seconds (median) of the turn of one click on the run list's checkboxes at 10,000 runs: ~43 ms at load 3.8 on the shared
# 2-core machine (the views reading the store for what changed, the card's y range and filter); before, 101-116 ms:
# ~35 ms Bokeh decoding, validating and walking the page's list of 9,999 checked rows, ~30 ms validating and
# encoding each card's filter as a list of 9,999 indices.
CLICK_BOUND_S = 0.075


def test_a_click_on_the_run_list_of_ten_thousand_runs_is_one_short_turn(store):
    """The page sends the rows a click toggled (``RunSelection.toggles``), not the list of every checked row, and a
    card's filter goes to the page as an int32 array (one binary buffer), not as a list of 9,999 indices."""
    turns, views = served_turns(store)
    view = views["scalars"]
    runs, card, doc = view.runs, view.cards["loss"], view.grid.document
    assert runs.source.selected.syncable is False            # the page's whole list never comes back
    names = list(runs.source.data["run"])
    cpu = []
    for seq, (row, checked) in enumerate([(5, 0), (6, 0), (5, 1), (6, 0)], start=1):     # the last: no change
        gc.collect()
        started = time.thread_time()
        browser_sets(runs.toggles, "data", {"row": np.array([row], np.int32), "checked": np.array([checked], np.uint8),
                                            "seq": np.array([float(seq)])})
        cpu.append(time.thread_time() - started)
        cpu += next_turns(doc)
    print("CPU ms per turn of each click:", [round(t * 1000) for t in cpu])
    assert runs.shown() == frozenset(names) - {"run00006"} and runs.summary.text == "9,999 of 10,000 runs shown"
    kept = card.filter.indices
    assert isinstance(kept, np.ndarray) and kept.dtype == np.int32
    np.testing.assert_array_equal(kept, np.delete(np.arange(RUNS), 6))
    assert [card.rows.data["run"][i] for i in kept] == sorted(frozenset(names) - {"run00006"})
    assert card.download.args["shown"].tolist() == [n for n in names if n != "run00006"]
    clicks = sorted(cpu)[-3:]        # (the clicks' own turns; the last click changed nothing)
    assert np.median(clicks) < CLICK_BOUND_S and max(cpu) < TURN_BOUND_S, [round(t * 1000) for t in cpu]

    # the server's own change of the checks reaches the page as the whole list, with new tags every time (the
    # page applies it even when equal to the last one it heard: it may have changed the checks since)
    tags = runs.checks.tags[0]
    runs.check_all._trigger_event(ButtonClick(runs.check_all))
    assert runs.shown() is None and runs.checks.tags[0] == tags + 1 and card.filter.indices is None
    np.testing.assert_array_equal(runs.checks.data["row"], np.arange(RUNS))
    assert runs.checks.data["row"].dtype == np.int32


def test_a_hundred_thousand_runs_are_listed_over_turns_under_the_loops_budget(tmp_path):
    """The run list of a served session lists (and searches) ``LIST_SLICE`` new runs a turn (the app asks again in the next turn,
    ``app.LIST_ALONE``): 100,000 runs in one turn took ~170 ms of CPU, ~380 ms with a search typed (now 30-42 ms
    a turn at load 5 on the shared 2-core machine). Meanwhile only listed runs are shown; the
    search (typed before they came) covers every run."""
    count = 100_000
    one = np.zeros(1, np.int64)
    store = Store(tmp_path)
    store._provider = InMemory([Datum(f"run{r:06d}", "loss", "scalar", one, one + 1.7e9, np.ones(1))
                                for r in range(count)])
    store.poll()
    runs = run_list.RunSelection(store)
    doc = Document()
    doc.add_root(runs.layout())
    served(doc)
    sent = sending(doc)
    runs.search.value = "7$"
    seen = []

    def listing():                  # (what the app's refresh does with the run list)
        if runs.update() >= app.LIST_ALONE:
            doc.add_next_tick_callback(listing)

    doc.add_next_tick_callback(listing)
    turns = []
    _run_turns(doc, sent, turns, lambda: seen.append((len(runs.source.data["run"]), runs.shown(),
                                                      runs.summary.text)))
    cpu = [round(t * 1000) for t, _, _ in turns]
    print(f"CPU ms per turn: {cpu}; bytes per turn: {[b for _, _, b in turns]}")
    assert [n for n, _, _ in seen] == [*range(run_list.LIST_SLICE, count + 1, run_list.LIST_SLICE), count]   # (then none)
    listed, shown, text = seen[0]
    # while listing: only listed runs (ending in 7) are shown
    assert shown == frozenset(f"run{r:06d}" for r in range(7, listed, 10))
    assert text == f"{listed // 10:,} of {listed:,} runs shown; {count - listed:,} more being listed"
    names = [f"run{r:06d}" for r in range(count)]
    assert list(runs.source.data["run"]) == names and runs.checks.data["row"].tolist() == list(range(count))
    assert runs.view.filter.indices.tolist() == list(range(7, count, 10))
    assert runs.shown() == frozenset(names[7::10]) and runs.summary.text == f"10,000 of {count:,} runs shown"
    assert max(t for t, _, _ in turns) < TURN_BOUND_S, cpu

    # another search over the 100,000 runs: ``LIST_SLICE`` runs a turn (one turn of ~200 ms before), the last search
    # in effect until it is done
    runs.search.value = "3$"
    assert runs.shown() == frozenset(names[7::10]) and runs.summary.text.endswith("runs shown; searching…")
    turns = []
    _run_turns(doc, sent, turns)
    cpu = [round(t * 1000) for t, _, _ in turns]
    print(f"search: CPU ms per turn: {cpu}")
    assert len(turns) == count // run_list.LIST_SLICE and max(t for t, _, _ in turns) < TURN_BOUND_S, cpu
    assert runs.shown() == frozenset(names[3::10]) and runs.view.filter.indices.tolist() == list(range(3, count, 10))
    assert runs.summary.text == f"10,000 of {count:,} runs shown"
    runs.search.value = ""
    assert runs.shown() is None and runs.view.filter.indices is None


HUGE = 100_000
# CPU seconds one turn of a 100,000-run card may take: the issue's ~100 ms. The longest turn measured 49-62 ms (a read
# turn, the card joining the page), against 130 ms before; a full garbage collection landing in a turn on a slower CI
# machine must not fail it.
HUGE_TURN_BOUND_S = 0.1


def test_a_card_of_a_hundred_thousand_runs_keeps_its_points_budget_and_every_turn_short(tmp_path):
    """Issue 29 at 100,000 runs of 100 points (10 million points): every line kept all of them, so the card's fill
    and its joining the page were single turns of ~120-140 and ~80 ms of CPU, and the tab's first update (the series
    by tag, each tag checked once a run) ~90 ms. Now the card holds ``CARD_POINTS`` split among its lines, each at
    least ``LINE_FLOOR`` (~1.5 million points here), chosen a slice of runs a turn (``downsample_many``), and still
    shows every run's NaN/±Inf; opening the tab, building the card, a new smoothing, a click on the run list and a
    search are each turns under ``HUGE_TURN_BOUND_S``. (CPU of the longest turn, at load 2-3 on the shared 2-core
    machine: 49-54 ms; 120-140 ms before the budget, then 76-81 ms: a full garbage collection over the card's 100,000
    ``_Line`` objects (30-46 ms) inside a read turn, the card joining the page (~77 ms: 100,000 colour and axis
    strings in its JSON), a click (~57 ms: a set of 100,000 names built and looked up).)"""
    store = memory_store(tmp_path, runs=HUGE)
    turns, views = served_turns(store)
    view = views["scalars"]
    card, doc = view.cards["loss"], view.grid.document
    cpu = {"build": [t for t, _, _ in turns]}
    assert len(card.lines) == HUGE and view.grid.tags == [0, 1]
    # the budget: each line shows its share (the floor, at this many runs), the card a sixth of the points or less
    assert card.share == scalars.line_share(HUGE) == scalars.LINE_FLOOR
    assert {line.limit for line in card.lines.values()} == {scalars.LINE_FLOOR}
    points = len(card.flat.data["steps"])
    assert points <= HUGE * 7 * (scalars.LINE_FLOOR // 4) and points < HUGE * STEPS // 6, points
    assert max(len(line.shown) for line in card.lines.values()) <= 7 * (scalars.LINE_FLOOR // 4)
    # every spike and non-finite value still drawn: the NaN/±Inf ticks and the constant and one-point runs
    assert sorted(zip(card.marks.data["run"], card.marks.data["what"])) == [
        ("run00007", "+Inf"), ("run00007", "NaN"), ("run00008", "-Inf")]
    assert [r for r, x in zip(card.rows.data["run"], card.rows.data["dot_x"]) if np.isfinite(x)] == ["run00010"]

    def request(name, act):
        started = time.thread_time()
        act()
        cpu[name] = [time.thread_time() - started] + next_turns(doc)

    runs = view.runs
    gc.collect()
    gc.freeze()             # (as ``served_turns``: what the store and the card hold is not the requests' work)
    try:
        request("smoothing", lambda: (setattr(view.smoothing, "value", 0.9), view._resmooth()))
        request("click", lambda: browser_sets(runs.toggles, "data", {
            "row": np.array([5], np.int32), "checked": np.array([0], np.uint8), "seq": np.array([1.0])}))
        request("search", lambda: setattr(runs.search, "value", "7$"))
    finally:
        gc.unfreeze()
    print({name: (len(turns), round(max(turns) * 1000)) for name, turns in cpu.items()})
    assert len(cpu["smoothing"]) > HUGE // scalars.RUN_SLICE                # spread
    assert max(max(turns) for turns in cpu.values()) < HUGE_TURN_BOUND_S, \
        {name: [round(t * 1000) for t in turns if t > 0.05] for name, turns in cpu.items()}
    assert not (view._reading or view._growing or view._refilling)
    assert runs.shown() == frozenset(f"run{r:05d}" for r in range(7, HUGE, 10))
    assert card.filter.indices.tolist() == list(range(7, HUGE, 10))
    assert sorted(card.marks.data["what"]) == ["+Inf", "NaN"]                 # run 7's; run 8 is not shown

    # the same card as one built at once with the same settings
    reference = app.build_document(Document(), store)["scalars"]
    reference.smoothing.value = 0.9
    reference._resmooth()
    reference.runs.search.value = "7$"
    assert reference.runs.shown() == runs.shown()
    assert_same_card(card, reference.cards["loss"], smooth_rtol=1e-9)


def test_runs_that_come_split_a_cards_points_again_over_turns(tmp_path):
    """A card's share of points per line is split again when its lines outgrow it by more than a factor of two (not
    at every run that comes): the lines choose their points again a slice a turn, and the card ends as one built at
    once over all the runs."""
    first, later = 3 * scalars.RUN_SLICE, 5 * scalars.RUN_SLICE
    items = memory_items(first + later)
    store = memory_store(tmp_path, runs=first, items=items[:first])
    _, views = served_turns(store)
    view = views["scalars"]
    card, doc = view.cards["loss"], view.grid.document
    assert card.share == scalars.line_share(first) == min(scalars.LIMIT, scalars.CARD_POINTS // first)
    (refresh,) = [cb for cb in doc.session_callbacks if type(cb).__name__ == "PeriodicCallback"]
    store._provider.items = items[first:first + 10]           # a few runs: the share stays
    store.poll()
    refresh.callback()
    next_turns(doc)
    assert card.share == scalars.line_share(first) and len(card.lines) == first + 10
    store._provider.items = items[first + 10:]
    store.poll()
    started = time.thread_time()
    refresh.callback()
    cpu = [time.thread_time() - started] + next_turns(doc)
    share = scalars.line_share(first + later)
    assert share * 2 < scalars.line_share(first)              # (the split this test is about)
    assert card.share == share and {line.limit for line in card.lines.values()} == {share}
    assert len(cpu) > (first + later) // scalars.RUN_SLICE and max(cpu) < TURN_BOUND_S, cpu
    assert len(card.flat.data["steps"]) <= (first + later) * 7 * (share // 4)
    reference = app.build_document(Document(), store)["scalars"].cards["loss"]
    assert reference.share == share
    assert_same_card(card, reference)


def test_a_zoom_on_a_big_card_chooses_its_lines_points_over_turns(tmp_path):
    """A zoom (the page's ``RangesUpdate``) adds each line's exact points of the zoomed range: on a card of more than
    ``RUN_SLICE`` runs, a slice of lines a turn (together: ``choose_lines``), as the same zoom does at once on a card
    built outside a server."""
    from types import SimpleNamespace
    runs = 3 * scalars.RUN_SLICE + 1
    store = memory_store(tmp_path, runs=runs)
    _, views = served_turns(store)
    view = views["scalars"]
    card, doc = view.cards["loss"], view.grid.document
    assert card.share < STEPS                   # (the lines are downsampled: a zoom has points to add)
    zoom = SimpleNamespace(x0=30.0, x1=45.0)
    started = time.thread_time()
    view._zoomed(card, zoom)
    cpu = [time.thread_time() - started] + next_turns(doc)
    assert len(cpu) > runs // scalars.RUN_SLICE and max(cpu) < TURN_BOUND_S, cpu
    reference = app.build_document(Document(), store)["scalars"]
    reference._zoomed(reference.cards["loss"], zoom)
    assert_same_card(card, reference.cards["loss"])
    line = card.lines["run00100"]
    np.testing.assert_array_equal(np.intersect1d(line.shown, np.arange(29, 47)), np.arange(29, 47))   # every one


def test_serve_freezes_what_the_process_holds_once_the_store_is_read():
    """``serve`` calls ``settle_collector`` once its server has started (the store's first poll done): every object
    held then is out of the collector's full collections, which walked the store's series each time."""
    import inspect
    from flowlab.dashboard import server
    held = [[] for _ in range(1000)]                 # (lists: objects the collector tracks)
    frozen = gc.get_freeze_count()
    try:
        server.settle_collector()
        assert gc.get_freeze_count() >= frozen + len(held)
    finally:
        gc.unfreeze()
    assert "settle_collector()" in inspect.getsource(server.serve)


def test_a_cards_lines_are_no_objects_the_collector_walks(tmp_path):
    """Issue 29: a card held one ``_Line`` per run, and at 100,000 runs every full garbage collection walked them all
    (35-70 ms of CPU landing in ~30 ms turns). Its lines are columns now (``_Lines``: arrays), a ``_Line`` a view made
    on access: the objects the collector tracks do not grow with the card's runs."""
    def tracked_after_build(runs):
        store = memory_store(tmp_path / str(runs), runs=runs)
        gc.collect()
        gc.freeze()                 # (the store's series: not the card's)
        try:
            views = app.build_document(Document(), store)
            assert len(views["scalars"].cards["loss"].lines) == runs
            gc.collect()
            return len(gc.get_objects())
        finally:
            gc.unfreeze()

    tracked_after_build(300)        # (what a first build leaves cached)
    few, many = tracked_after_build(300), tracked_after_build(3000)
    assert many - few < 2700 // 10, (few, many)          # (one object per run before: ~2,700 more)


def test_a_cards_lines_read_the_run_lists_choice_by_its_rows(tmp_path):
    """The lines a card draws: the run list's ``ShownRuns`` (a mask over the list's rows) taken by each line's row in
    the list, looked up once (100,000 names looked up in the set at each click were ~20 ms); a run the list has not
    listed yet is not shown; a plain set of runs (no rows) is looked up by name. The same answer either way."""
    store = memory_store(tmp_path, runs=50)
    card = app.build_document(Document(), store)["scalars"].cards["loss"]
    names = list(card.lines)
    order = names[::-1][:40]            # the list's rows in another order than the card's; 10 runs not listed yet
    rows = {run: row for row, run in enumerate(order)}
    picked = {run for run in order if int(run[3:]) % 3}
    mask = np.array([run in picked for run in order])
    shown = run_list.ShownRuns(picked, mask, rows)
    expected = np.array([run in picked for run in names])
    np.testing.assert_array_equal(card.lines.shown_in(shown), expected)
    np.testing.assert_array_equal(card.lines.shown_in(frozenset(picked)), expected)
    assert shown == frozenset(picked) and expected.sum() == len(picked) < 40
    # the other 10 runs listed now, the mask grown with them: their rows looked up (the others' kept)
    rows.update((run, 40 + k) for k, run in enumerate(names[::-1][40:]))
    picked |= set(names[::-1][40:45])
    mask = np.array([run in picked for run in rows])
    expected = np.array([run in picked for run in names])
    np.testing.assert_array_equal(card.lines.shown_in(run_list.ShownRuns(picked, mask, rows)), expected)
    np.testing.assert_array_equal(card.shown_mask(run_list.ShownRuns(picked, mask, rows)), expected)
