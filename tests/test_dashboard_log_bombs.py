"""Memory and time bombs in logs (issue 29): a few bytes of log cost the dashboard a bounded, documented amount.

Images: an image above ``thumbnails.MAX_PIXELS`` is refused with a card saying why while other runs' cards build; an
allowed big one is decoded once per process, to the card's size, whatever the number of sessions. Text: a table of a
million cells renders ``MAX_TABLE_ROWS`` rows at a time, quickly, and says how many are hidden.
"""
import re
import struct
import time
import tracemalloc
import zlib

import numpy as np
import pytest
from bokeh.document import Document

from flowlab.dashboard.store import Store
from flowlab.dashboard.views import text as text_view
from flowlab.dashboard.views.images import SIZE, ImagesView
from flowlab.dashboard.views.text import MAX_TABLE_ROWS, TextView
from flowlab.plots import thumbnails
from flowlab.summary import SummaryWriter, proto


def png_of_zeros(width, height, color_type=0, bit_depth=1):
    """A valid PNG of ``width`` × ``height`` black pixels, compressed to almost nothing (rows of zero bytes, made a
    few at a time so that a bomb costs the test no memory)."""
    channels = {0: 1, 2: 3, 6: 4}[color_type]
    row = b"\0" * (1 + (width * channels * bit_depth + 7) // 8)        # filter byte 0, then the pixels
    z = zlib.compressobj(9)
    rows = row * 256
    idat = b"".join(z.compress(rows) for _ in range(height // 256)) + z.compress(row * (height % 256)) + z.flush()

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def write_png(logdir, run, tag, png, width, height, step=0):
    value = proto.Summary.Value(tag=tag, image=proto.Summary.Image(width=width, height=height, colorspace=1,
                                                                   encoded_image_string=png))
    with SummaryWriter(logdir / run) as w:
        w.file_writer.add_summary([value], step)


def session(view_class, store):
    view = view_class(store)
    Document().add_root(view.layout())
    view.update()
    return view


def small_image(seed=0):
    return np.random.default_rng(seed).integers(0, 256, (5, 7, 3), dtype=np.uint8)


def pixels_of(packed):
    return np.asarray(packed).view(np.uint8).reshape(*np.shape(packed), 4)[::-1]


@pytest.fixture(autouse=True)
def fresh_cache():
    thumbnails.clear_cache()
    yield
    thumbnails.clear_cache()


def test_a_decompression_bomb_gets_a_card_saying_why_and_other_runs_still_build(tmp_path):
    bomb = png_of_zeros(20000, 20000)
    assert len(bomb) < 64_000                   # ~49 KB for 400 million pixels
    write_png(tmp_path, "a_bomb", "pictures", bomb, 20000, 20000)
    with SummaryWriter(tmp_path / "b_fine") as w:
        w.add_image("pictures", small_image(), 0, dataformats="HWC")
    store = Store(tmp_path)
    store.poll()
    view = session(ImagesView, store)           # raised DecompressionBombError: the tab stayed blank
    refused = view._cards[("a_bomb", "pictures", "image")]
    assert "refused" in refused.caption.text and "20,000 × 20,000" in refused.caption.text
    assert f"{thumbnails.MAX_PIXELS:,}" in refused.caption.text        # the cap is stated
    assert len(refused.source.data["image"]) == 1 and refused.source.data["image"][0].size <= 32 * 32
    fine = view._cards[("b_fine", "pictures", "image")]
    assert np.array_equal(pixels_of(fine.source.data["image"][0])[..., :3], small_image())
    assert "refused" not in fine.caption.text


def test_damaged_and_foreign_images_are_refused_not_raised():
    assert isinstance(thumbnails.thumbnail_rgba(b"\x89PNG\r\n\x1a\n" + b"\0" * 40, SIZE), thumbnails.Refused)
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n"     # Pillow would run Ghostscript on this
    assert "format" in thumbnails.thumbnail_rgba(eps, SIZE).reason


def test_a_big_allowed_image_is_decoded_once_at_card_size_for_every_session(tmp_path, monkeypatch):
    """A 4096 × 3072 RGB PNG of 40 KB (12.6 million pixels, under the cap): before, every session decoded it at full
    size and kept (and sent) a 48 MiB array; now one decode, shared, of 320 × 240."""
    width, height = 4096, 3072
    write_png(tmp_path, "run", "big", png_of_zeros(width, height, color_type=2, bit_depth=8), width, height)
    store = Store(tmp_path)
    store.poll()
    decodes = []
    decode = thumbnails.decode_thumbnail
    monkeypatch.setattr(thumbnails, "decode_thumbnail", lambda *a: decodes.append(a[1:]) or decode(*a))
    started = time.perf_counter()
    first = session(ImagesView, store)
    assert time.perf_counter() - started < 3.0              # one full decode of 12.6 Mpx (~0.2 s here)
    tracemalloc.start()
    try:
        started = time.perf_counter()
        views = [session(ImagesView, store) for _ in range(3)]
        elapsed = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert decodes == [(SIZE,)]                             # once, for four sessions
    assert peak < 8 << 20 and elapsed < 1.0                 # was 3 x 48 MiB of arrays and 3 decodes
    for view in [first, *views]:
        picture = view._cards[("run", "big", "image")].source.data["image"][0]
        assert picture.shape == (SIZE * height // width, SIZE)
        assert (pixels_of(picture) == [0, 0, 0, 255]).all()


class _Session:
    """What a Bokeh server gives a session's document, as far as views look: a session context (no request)."""
    request = None


def served_session(view_class, store):
    """``session``, in a document that says it is served: callbacks added with ``add_next_tick_callback`` wait in
    ``doc.session_callbacks`` for the test to run them (the loop's next turn)."""
    import weakref
    view, doc, context = view_class(store), Document(), _Session()
    doc._session_context = weakref.ref(context)
    doc.add_root(view.layout())
    view.update()
    return view, doc, context


def next_turns(doc, timeout=60.0):
    """Wait for callbacks to be added to ``doc`` (from any thread), then run them as the loop would."""
    deadline = time.monotonic() + timeout
    while not doc.session_callbacks and time.monotonic() < deadline:
        time.sleep(0.01)
    for callback in list(doc.session_callbacks):
        doc.remove_next_tick_callback(callback)
        callback.callback()


def test_a_served_session_decodes_a_big_image_off_the_loop_once_for_every_session(tmp_path, monkeypatch):
    """A 4000 × 4000 PNG (under the cap): its first decode took 0.13-0.48 s on the IOLoop, in the request that
    showed the card. In a served document the card says "decoding", the decode runs in the thumbnails' worker thread
    (once, however many sessions wait for it), and the card is drawn on the loop turn after."""
    import threading
    thumbnails.clear_cache()
    width = height = 4000
    write_png(tmp_path, "run", "big", png_of_zeros(width, height, color_type=2, bit_depth=8), width, height)
    store = Store(tmp_path)
    store.poll()
    threads, decode, release = [], thumbnails.decode_thumbnail, threading.Event()

    def recorded(*args):
        threads.append(threading.current_thread())
        release.wait(30)                            # both sessions ask before the decode ends
        return decode(*args)

    monkeypatch.setattr(thumbnails, "decode_thumbnail", recorded)
    sessions = [served_session(ImagesView, store) for _ in range(2)]
    release.set()
    for view, doc, _ in sessions:
        card = view._cards[("run", "big", "image")]
        assert card.source.data["image"] == [] and card.caption.text == "decoding…"     # not drawn yet
    for view, doc, _ in sessions:
        next_turns(doc)
        card = view._cards[("run", "big", "image")]
        (picture,) = card.source.data["image"]
        assert picture.shape == (SIZE, SIZE) and (pixels_of(picture) == [0, 0, 0, 255]).all()
        assert card.caption.text == ""
    assert len(threads) == 1 and threads[0] is not threading.main_thread()       # once, in the worker
    assert threads[0].name.startswith("flowlab-thumbnails")
    view, doc, _ = served_session(ImagesView, store)       # a third session: from the cache, at once
    assert view._cards[("run", "big", "image")].source.data["image"][0] is picture and not doc.session_callbacks
    assert len(threads) == 1


def test_the_loop_is_not_held_while_a_big_image_is_decoded_for_a_session(tmp_path, monkeypatch, chromium):
    """A real server, a page on ``/?tab=images`` in Chromium (a session's cards are built once a page has connected),
    and a run that then logs a 4000 × 4000 PNG: the event loop's longest stall from the image's arrival until its card is drawn (before: the
    whole decode ran on the loop, 0.13-0.48 s here, seconds on a loaded machine). The decode is held 0.5 s before
    it runs, so that it cannot be quick by chance."""
    from loop_probe import LoopProbe
    from flowlab.dashboard.server import ServerThread
    from dashboard_page import open_dashboard
    thumbnails.clear_cache()
    write_png(tmp_path, "run", "big", png_of_zeros(8, 8, color_type=2, bit_depth=8), 8, 8, step=0)
    width = height = 4000
    png = png_of_zeros(width, height, color_type=2, bit_depth=8)
    decode, timings = thumbnails.decode_thumbnail, []

    def slow(encoded, size):
        if encoded != png:                          # (the store's copy: equal, not the same object)
            return decode(encoded, size)
        time.sleep(0.5)
        started = time.perf_counter()
        try:
            return decode(encoded, size)
        finally:
            timings.append(time.perf_counter() - started)

    monkeypatch.setattr(thumbnails, "decode_thumbnail", slow)
    server = ServerThread(tmp_path, reload_interval=0.1)
    try:
        deadline = time.monotonic() + 30
        while not server.server.store.series("image") and time.monotonic() < deadline:
            time.sleep(0.05)
        probe = LoopProbe(server)
        page, errors = open_dashboard(chromium, server.url + "?tab=images")
        time.sleep(0.5)                             # the page's own turns (its document, the tab) are done
        probe.reset()
        write_png(tmp_path, "run", "big", png, width, height, step=1)
        deadline = time.monotonic() + 60
        while not timings and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)                             # the card is drawn on the turn after
        stall = probe.stop()
        assert errors == []
        page.close()
    finally:
        server.stop()
    assert timings, "the big image was never decoded"
    print(f"one decode: {timings[0] * 1000:.0f} ms; longest loop stall from the image's arrival until its card was "
          f"drawn: {stall * 1000:.0f} ms")
    assert thumbnails.cached_thumbnail(png, SIZE) is not None
    assert stall < 0.1, f"the event loop stalled {stall * 1000:.0f} ms (gaps: {probe.gaps})"


def test_the_thumbnail_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(thumbnails, "CACHE_BYTES", 3 * (SIZE * SIZE * 4))
    pngs = [png_of_zeros(SIZE + k, SIZE + k, color_type=2, bit_depth=8) for k in range(6)]
    for png in pngs:
        thumbnails.thumbnail_rgba(png, SIZE)
    assert len(thumbnails._cache) <= 3 and thumbnails._cache_bytes <= thumbnails.CACHE_BYTES
    assert (pngs[-1], SIZE) in thumbnails._cache                # the most recent stays


def test_a_million_cell_text_tensor_renders_a_capped_paged_table_quickly(tmp_path):
    """Before: a million Markdown cells rendered on the IOLoop (47.7 s, 26.7 MB of HTML per session)."""
    n = 1_000_000
    with SummaryWriter(tmp_path / "run") as w:
        w.add_text("table", np.full(n, "*x*"), 0)
    store = Store(tmp_path)
    store.poll()
    started = time.perf_counter()
    view = session(TextView, store)
    elapsed = time.perf_counter() - started
    c = view._cards[("run", "table", "text")]
    (entry,) = c.entries.children
    assert elapsed < 0.5 and len(entry.text) < 10_000
    assert entry.text.count("<tr>") == MAX_TABLE_ROWS and entry.text.count("<em>x</em>") == MAX_TABLE_ROWS
    assert f"Rows 1–25 of 1,000,000 shown (999,975 rows not shown; at most {MAX_TABLE_ROWS} at a time)" in entry.text
    assert c.pager.visible and c.previous.disabled and not c.next.disabled
    started = time.perf_counter()
    c.page_rows(+1)
    assert time.perf_counter() - started < 0.1
    assert "Rows 26–50 of 1,000,000" in entry.text and not c.previous.disabled
    for _ in range(3):
        c.page_rows(-1)
    assert "Rows 1–25" in entry.text and c.previous.disabled


def test_long_documents_wide_tables_and_long_cells_are_cut_and_say_so():
    doc = text_view.render_text("word " * 10_000)
    assert f"{50_000 - text_view.MAX_VALUE_CHARS:,} more characters not shown" in doc
    wide = text_view.render_text(np.full((2, 50), "y" * 2000, dtype=object))
    assert wide.count("<td>") == 2 * text_view.MAX_TABLE_COLUMNS
    assert f"The first {text_view.MAX_TABLE_COLUMNS} of 50 columns shown" in wide
    assert "cells cut" in wide and sum(map(len, re.findall("y{5,}", wide))) == text_view.MAX_VALUE_CHARS
    short = text_view.render_text(np.array(["a", "b"]))
    assert "not shown" not in short and short.count("<tr>") == 2
