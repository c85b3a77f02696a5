"""The pager every card view shares (dashboard/views/paging.py) and what CardsView builds with it, without a browser:
which keys are on a page, that only a page's cards exist, and that what leaves a page is forgotten; and what one
Scalars card costs a served session's event loop, turn by turn."""
import gc
import time

import numpy as np
import pytest
from bokeh.document import Document

from flowlab.dashboard.store import Store
from flowlab.dashboard.views.histograms import HistogramsView
from flowlab.dashboard.views.images import ImagesView
from flowlab.dashboard.views.paging import PAGE_SIZE, Pager
from flowlab.dashboard.views.text import TextView
from flowlab.summary import SummaryWriter, encode


def test_pages_split_the_keys_in_order():
    calls = []
    pager = Pager("t", page_size=4, on_change=lambda: calls.append(pager.visible))
    keys = [f"k{i:02}" for i in range(10)]
    assert pager.set_keys(keys) is True and pager.visible == keys[:4]
    assert pager.set_keys(list(keys)) is False                           # the same keys: nothing to do
    assert pager.layout.name == "pager:t" and pager.layout.tags == [4, 0, 3]
    assert pager.layout.visible and pager.previous.disabled and not pager.next.disabled
    assert pager.label.text == "1–4 of 10"
    pager.go(2)
    assert calls == [keys[8:]] and pager.layout.tags == [2, 2, 3] and pager.next.disabled
    pager.go(7)                                                          # clamped: already there, no call
    assert pager.page == 2 and len(calls) == 1
    pager.set_keys(keys[:6])                                             # keys went away: back to the last page
    assert pager.page == 1 and pager.visible == keys[4:6]
    pager.size.value = "8"                                               # the first card on show stays in view
    assert pager.page_size == 8 and pager.page == 0 and pager.visible == keys[:6] and pager.next.disabled


def test_a_few_keys_need_no_controls():
    pager = Pager("t")
    pager.set_keys(range(3))
    assert not pager.layout.visible and pager.visible == [0, 1, 2] and pager.label.text == "1–3 of 3"
    pager.set_keys([])
    assert pager.visible == [] and pager.layout.tags == [0, 0, 1]
    with pytest.raises(ValueError, match="page_size"):
        Pager("t", page_size=0)


def test_the_buttons_move_between_pages():
    from bokeh.events import ButtonClick
    pager = Pager("t", page_size=2)
    pager.set_keys("abcde")
    pager.next._trigger_event(ButtonClick(pager.next))
    assert pager.visible == ["c", "d"]
    pager.previous._trigger_event(ButtonClick(pager.previous))
    assert pager.visible == ["a", "b"]


@pytest.fixture
def many(tmp_path):
    """30 histogram series, 10 image series and 10 text series."""
    rng = np.random.default_rng(0)
    with SummaryWriter(tmp_path / "run") as w:
        for tag in range(30):
            for step in range(3):
                w.add_histogram(f"h{tag:02}", rng.normal(tag, 1, 200), step)
        for tag in range(10):
            w.add_image(f"i{tag:02}", rng.integers(0, 256, (4, 4, 3), dtype=np.uint8), 0, dataformats="HWC")
            w.add_text(f"t{tag:02}", f"text {tag}", 0)
    return tmp_path


def test_only_the_page_is_built_and_what_leaves_it_is_forgotten(many):
    store = Store(many)
    store.poll()
    view = HistogramsView(store)
    doc = Document()
    doc.add_root(view.layout())
    view.update()
    keys = [s.key for s in store.series("histogram")]
    assert len(keys) == 30 and view.pager.visible == keys[:PAGE_SIZE]
    assert list(view._cards) == keys[:PAGE_SIZE] and set(view._seen) == set(keys[:PAGE_SIZE])
    assert [c for c in view.grid.children] == [view._cards[k].layout for k in keys[:PAGE_SIZE]]
    sources = [m for m in doc.models if getattr(m, "name", None) == "cards-source:histograms"]
    assert len(sources) == PAGE_SIZE                                     # nothing of the other pages in the document
    first = view._cards[keys[0]]

    last = view.pager.pages - 1
    view.pager.go(last)                                                  # as a click does: rebuilt at once
    shown = keys[last * PAGE_SIZE:]
    assert 0 < len(shown) <= PAGE_SIZE and list(view._cards) == shown and set(view._seen) == set(shown)
    c = view._cards[keys[-1]]
    np.testing.assert_array_equal(np.unique(c.source.data["step"]), [0, 1, 2])
    buckets = store.series("histogram")[-1].slice()[2][1]
    rows = np.asarray(c.source.data["step"]) == 1
    np.testing.assert_array_equal(np.asarray(c.source.data["count"])[rows], buckets[buckets[:, 2] > 0, 2])
    assert len([m for m in doc.models if getattr(m, "name", None) == "cards-source:histograms"]) == len(shown)

    view.pager.go(0)                                                     # back: built afresh from the store
    again = view._cards[keys[0]]
    assert again is not first
    np.testing.assert_array_equal(again.source.data["count"], first.source.data["count"])


def test_new_series_take_their_place_in_the_order(many):
    store = Store(many)
    store.poll()
    view = HistogramsView(store)
    Document().add_root(view.layout())
    view.update()
    with SummaryWriter(many / "a-new-run") as w:                         # sorts before "run": first on page 0
        w.add_histogram("h", np.arange(10.0), 0)
    store.poll()
    view.update()
    assert view.pager.visible[0] == ("a-new-run", "h", "histogram") and len(view._cards) == PAGE_SIZE
    assert view._cards[("a-new-run", "h", "histogram")].source.data["count"].sum() == 10
    assert view.pager.label.text == f"1–{PAGE_SIZE} of 31"


@pytest.mark.parametrize("view_class, kind", [(ImagesView, "image"), (TextView, "text")])
def test_images_and_text_are_paged_too(many, view_class, kind):
    store = Store(many)
    store.poll()
    view = view_class(store)
    view.pager.size.value = "4"
    Document().add_root(view.layout())
    view.update()
    keys = [s.key for s in store.series(kind)]
    assert list(view._cards) == keys[:4]
    view.pager.go(2)
    assert list(view._cards) == keys[8:] and view.pager.layout.tags == [2, 2, 3]


@pytest.fixture
def tagged(tmp_path):
    """Two runs with 30 scalar tags in three groups (``g0/t00`` ... ``g2/t29``), two steps each."""
    for run in ("a", "b"):
        with SummaryWriter(tmp_path / run) as w:
            for step in range(2):
                for i in range(30):
                    w.add_scalar(f"g{i // 10}/t{i:02}", i + step, step)
    return tmp_path


def test_scalars_build_a_page_of_cards_and_the_tag_search_pages_its_matches(tagged):
    from flowlab.dashboard.views import scalars as scalars_module
    from flowlab.dashboard.views.scalars import ScalarsView
    store = Store(tagged)
    store.poll()
    view = ScalarsView(store)
    doc = Document()
    doc.add_root(view.layout())
    view.update()
    size = scalars_module.PAGE_SIZE
    tags = [f"g{i // 10}/t{i:02}" for i in range(30)]
    assert list(view.cards) == tags[:size] and view.grid.tags == [0, size]
    assert view.pager.layout.tags == [size, 0, -(-30 // size)] and view.pager.label.text == f"1–{size} of 30"
    assert set(view._seen) == {(run, tag, "scalar") for run in "ab" for tag in tags[:size]}   # nothing else read
    cards = [m for m in doc.models if (getattr(m, "name", None) or "").startswith("card:")]
    assert sorted(m.name for m in cards) == [f"card:{t}" for t in tags[:size]]
    assert view.groups["g0"].toggle.label == f"▾ g0  ({size} of 10)"
    np.testing.assert_array_equal(view.cards["g0/t03"].lines["b"].values, [3.0, 4.0])

    view.pager.go(view.pager.pages - 1)                                  # the last page: built, the first dropped
    last = tags[(view.pager.pages - 1) * size:]
    assert list(view.cards) == last and set(view._seen) == {(r, t, "scalar") for r in "ab" for t in last}
    assert [g.name for g in view.groups.values() if g.layout.visible] == ["g2"]

    view.tag_filter.value = "t(05|29)$"                                  # matches on two pages: one page of two
    assert view.pager.page == 0 and view.pager.visible == ["g0/t05", "g2/t29"] == sorted(view.cards)
    assert [g.name for g in view.groups.values() if g.layout.visible] == ["g0", "g2"]
    np.testing.assert_array_equal(view.cards["g2/t29"].lines["a"].values, [29.0, 30.0])
    view.tag_filter.value = "^g1/"
    assert list(view.cards) == tags[10:10 + size] and view.pager.label.text == f"1–{size} of 10"
    view.tag_filter.value = "nothing matches"
    assert view.cards == {} and view.grid.tags == [0, 0]


def test_a_new_tag_goes_last_in_its_group_and_is_built_only_on_its_page(tagged):
    from flowlab.dashboard.views.scalars import PAGE_SIZE, ScalarsView
    store = Store(tagged)
    store.poll()
    view = ScalarsView(store)
    Document().add_root(view.layout())
    view.update()
    first = dict(view.cards)
    with SummaryWriter(tagged / "a") as w:
        w.add_scalar("g0/a-new-one", 1.0, 5)                             # sorts first by name, but came later
    store.poll()
    view.update()
    assert view.cards == first                                           # nothing on screen moved
    assert view.pager._keys.index("g0/a-new-one") == 10 and view.pager.label.text == f"1–{PAGE_SIZE} of 31"


# ------------------------------------------------------------------------------------------- a Scalars card's turn

class _Served:
    """What a Bokeh server gives a session's document, as far as the dashboard looks: a session context."""
    request = None


def served(doc):
    """Make ``doc`` say it is served (a session context, as Bokeh's weak reference to it, but living as long as the
    document)."""
    context = _Served()
    doc._session_context = lambda: context


def sending(doc):
    """Serialise each change of ``doc`` as the server does, into a PATCH-DOC message; returns the list that gets the
    bytes of each message (``_run_turns`` sums them per turn)."""
    from bokeh.protocol import Protocol
    protocol, sent = Protocol(), []

    def patched(event):          # (what ServerSession._document_patched does for each subscribed connection,
        # but the one whose message made the change: ``browser_sets``)
        if hasattr(event, "to_serializable") and event.setter is not BROWSER:
            message = protocol.create("PATCH-DOC", [event])
            sent.append(len(message.content_json) + sum(len(b.data) for b in message.buffers))

    doc.on_change(patched)
    return sent


def served_turns(store, after_turn=None):
    """A whole session document (``app.build_document``) that says it is served, its IOLoop turns run one by one as
    the server runs them: each next-tick callback is a turn, and each change it makes to the document becomes a
    PATCH-DOC message as the server makes it, in the turn (Bokeh serialises there). Returns, per turn, ``(CPU
    seconds, models that joined the document, bytes of the messages)``, and the session's views. ``after_turn(views)``,
    when given, is called after each turn (outside its time): to look at the session, or act on it, between turns."""
    from flowlab.dashboard import app
    doc = Document()
    served(doc)
    views = app.build_document(doc, store)
    sent = sending(doc)
    turns = []
    gc.collect()
    gc.freeze()             # what earlier tests left is not the turns' work (a full collection of it cost 0.2 s)
    try:
        _run_turns(doc, sent, turns, after_turn and (lambda: after_turn(views)))
    finally:
        gc.unfreeze()
    return turns, views


BROWSER = object()           # the setter of a page's changes (``browser_sets``), as the server session is


def browser_sets(model, attr, value):
    """What the server does with a page's PATCH-DOC message setting ``model.attr`` to ``value`` (a list stays a
    JSON list, as the page sends a JavaScript array; a NumPy array is encoded as the page sends a typed array): apply
    it to the document, the session as the setter (it sends the change back to no one)."""
    from bokeh.core.serialization import Serializer
    model.document.apply_json_patch(
        {"events": [{"kind": "ModelChanged", "model": {"id": model.id}, "attr": attr,
                     "new": Serializer(deferred=False).encode(value)}]}, setter=BROWSER)


def _run_turns(doc, sent, turns, after_turn=None):
    for _ in range(200):
        ticks = [cb for cb in doc.session_callbacks if type(cb).__name__ == "NextTickCallback"]
        if not ticks:
            break
        for tick in ticks:
            doc.remove_next_tick_callback(tick)
            sent.clear()
            before = len(doc.models)
            started = time.thread_time()
            tick.callback()
            turns.append((time.thread_time() - started, len(doc.models) - before, sum(sent)))
            if after_turn is not None:
                after_turn()


def test_a_scalars_card_costs_a_server_turn_under_the_loops_budget(tmp_path):
    """16 tags in 3 runs (a NaN and an +Inf among them): the Scalars tab of a served session, built turn by turn as
    the server runs it. Issue 29: no request may hold the event loop for more than ~100 ms; one card's
    turn held it 150-270 ms (~96 Bokeh models a card: building them, Bokeh's walk over every model of the document
    when a card joins it, and serialising ~32 KB). Machine-independent bounds: the models a card adds and the bytes
    a turn sends; and the CPU time of the longest turn (time.thread_time: the turn's own work, on this machine; the
    process's CPU time also counts the threads earlier tests leave running: a full run measured up to 106 ms where
    this test alone measures ~60)."""
    from flowlab.dashboard.views.scalars import PAGE_SIZE
    for r, run in enumerate("abc"):
        with SummaryWriter(tmp_path / run) as w:
            for step in range(50):
                for i in range(16):
                    spike = {(0, 20): float("nan"), (0, 30): float("inf")}.get((i, step)) if run == "a" else None
                    w.add_scalar(f"layer{i // 8}/w{i:02}", spike if spike is not None else i + step * 0.1 + r, step)
    store = Store(tmp_path)
    store.poll()
    turns, views = served_turns(store)
    view = views["scalars"]
    assert len(view.cards) == PAGE_SIZE and view.grid.tags == [0, PAGE_SIZE]        # the page is complete
    assert view.cards["layer0/w00"].marks.data["what"] == ["NaN", "+Inf"]            # the ticks are there
    card_turns = [t for t in turns if t[1] > 0][1:]         # (the first: the session's document, the tab's controls)
    joined = [models for _, models, _ in card_turns]
    print(f"{len(turns)} turns; models joining per card turn: {joined}; bytes per turn: "
          f"{[b for _, _, b in card_turns]}; CPU ms per turn: {[round(t * 1000) for t, _, _ in turns]}")
    sent = [b for _, _, b in card_turns]
    assert len(card_turns) == PAGE_SIZE                     # one turn joins one card (another one built it)
    # was 96 models and ~32,600 bytes a card (98 and ~35,000 for the first: its group's header); the first now
    # brings the parts every card shares (the runs' palette among them, ~2,700 bytes: the rows name colours by it)
    assert max(joined[1:]) <= 45 and joined[0] <= 65, joined
    assert max(sent[1:]) <= 24_000 and sent[0] <= 31_500, sent
    # was 104-206 ms of CPU a card turn on the shared 2-core machine, now 25-70 (the longest: the last card's, when
    # Bokeh's walk covers a whole page)
    assert max(t for t, _, _ in turns) < 0.1, [round(t * 1000) for t, _, _ in turns]
