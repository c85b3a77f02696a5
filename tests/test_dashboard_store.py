"""The dashboard store: one tail of the logdir, append-only series, deltas per session, purges and thinning."""
import numpy as np
import pytest

from flowlab.dashboard.store import Store
from flowlab.dashboard.views.base import View
from flowlab.summary import SummaryWriter, proto
from flowlab.summary.record import frame


class Probe(View):
    def layout(self):
        return None

    def update(self):
        return [self.delta(s) for s in self.store.series("scalar")]


def test_sessions_get_only_what_they_have_not_seen(tmp_path):
    with SummaryWriter(tmp_path / "a") as w:
        for i in range(10):
            w.add_scalar("loss", float(i), i)
    store = Store(tmp_path)
    store.poll()
    probe = Probe(store)
    first = probe.update()
    assert len(first) == 1 and first[0].reset and first[0].steps.tolist() == list(range(10))
    assert len(probe.update()[0].steps) == 0                      # nothing new
    with SummaryWriter(tmp_path / "a") as w:                  # a second file in the same run
        w.add_scalar("loss", 10.0, 10)
    store.poll()
    later = probe.update()[0]
    assert not later.reset and later.steps.tolist() == [10] and later.values.tolist() == [10.0]
    assert store.runs() == ["a"]


def test_restart_purge_bumps_the_epoch_and_sessions_reset(tmp_path):
    run = tmp_path / "r"
    run.mkdir()

    def event(**kw):
        return frame(proto.Event(**kw).SerializeToString())

    def scalar(step, value):
        e = proto.Event(wall_time=1.0, step=step)
        e.summary.value.add(tag="x", simple_value=value)
        return frame(e.SerializeToString())

    start = proto.SessionLog.Value("START") if hasattr(proto.SessionLog, "Value") else 1
    records = [event(wall_time=0.0, file_version="brain.Event:2"),
               frame(proto.Event(wall_time=0.5, step=0, session_log=proto.SessionLog(status=start))
                     .SerializeToString())]
    records += [scalar(s, float(s)) for s in range(5)]
    path = run / "events.out.tfevents.1.host.1.0"
    path.write_bytes(b"".join(records))
    store = Store(tmp_path)
    store.poll()
    probe = Probe(store)
    probe.update()
    with open(path, "ab") as f:                               # the run restarts from step 3
        f.write(frame(proto.Event(wall_time=2.0, step=3, session_log=proto.SessionLog(status=start))
                      .SerializeToString()))
        f.write(scalar(3, 30.0))
    store.poll()
    d = probe.update()[0]
    assert d.reset and d.steps.tolist() == [0, 1, 2, 3] and d.values[-1] == 30.0


def test_a_long_series_is_downsampled_evenly_keeping_spikes_and_nans(tmp_path):
    values = np.sin(np.arange(1000) / 50.0)
    values[137], values[811] = 1000.0, np.nan             # a spike early, a NaN late
    with SummaryWriter(tmp_path) as w:
        for i, v in enumerate(values):
            w.add_scalar("x", float(v), i)
    store = Store(tmp_path, max_points=300)
    store.poll()
    (series,) = store.series("scalar")
    steps, kept = series.steps, series.values
    assert len(series) <= 300
    assert steps[0] == 0 and steps[-1] == 999             # the whole range stays covered...
    assert np.diff(steps).max() <= 1000 / (150 // 4) + 1  # ...evenly: no stretch collapses to a point
    assert 137 in steps and kept[steps.tolist().index(137)] == 1000.0
    assert 811 in steps and np.isnan(kept[steps.tolist().index(811)])
    assert np.nanmin(kept) == values[np.isfinite(values)].astype(np.float32).min()   # logged as float32


def test_other_kinds_keep_a_bounded_even_sample_with_the_newest(tmp_path):
    store = Store(tmp_path, samples={"histogram": 8})
    probe_epochs = set()
    for poll in range(50):                                # 50 polls of 7 histograms each
        with SummaryWriter(tmp_path) as w:
            for i in range(7):
                step = poll * 7 + i
                w.add_histogram("h", np.full(3, float(step)), step)
        store.poll()
        (series,) = store.series("histogram")
        probe_epochs.add(series.epoch)
        assert len(series) <= 16 and series.steps[-1] == step     # bounded (8 + 8 polls' newest), the newest there
    steps = series.steps
    assert steps[0] == 0 and np.diff(steps).max() <= 2 * 350 / 8 + 7   # spread over the whole run
    assert len(probe_epochs) <= 12                       # thinning (a reset for sessions) is occasional


def test_the_newest_item_kept_after_a_poll_moves_the_version(tmp_path, monkeypatch):
    """The newest item of a poll that fell between strides is kept after the poll's items are stored: the version
    moves again then, or a view that read in between would never show a finished run's last item."""
    store = Store(tmp_path, samples={"histogram": 2})
    after_storing = []
    store_items = store._store

    def storing(*args):
        stored = store_items(*args)
        after_storing.append(store.version)
        return stored
    monkeypatch.setattr(store, "_store", storing)
    late = 0
    for poll in range(6):
        with SummaryWriter(tmp_path) as w:
            for i in range(3):
                w.add_histogram("h", np.zeros(3), poll * 3 + i)
        extras = store.series("histogram")[0]._sample._extras if poll else 0
        store.poll()
        (series,) = store.series("histogram")
        assert series.steps[-1] == poll * 3 + 2
        if series._sample._extras > extras:                     # this poll's newest was kept late, by end_poll
            late += 1
            assert store.version > after_storing[-1]
    assert late, "no poll kept its newest item late: the case is not tested"


def test_samples_per_plugin_parsing():
    from flowlab.dashboard.store import parse_samples
    assert parse_samples("images=3, histograms=20,distributions=30") == {"image": 3, "histogram": 30}
    with pytest.raises(ValueError, match="images needs a whole number of at least 1, got '0'"):
        parse_samples("images=0")
    with pytest.raises(ValueError, match="expected KIND=N"):
        parse_samples("movies=3")
    with pytest.raises(ValueError, match="samples"):
        Store("x", samples={"image": 0})


def test_status_reports_missing_logdir_and_corrupt_records(tmp_path):
    missing = Store(tmp_path / "nothing-here")
    missing.poll()
    assert missing.status()["exists"] is False and missing.status()["runs"] == 0
    with SummaryWriter(tmp_path / "run") as w:
        for i in range(3):
            w.add_scalar("x", float(i), i)
    path = next((tmp_path / "run").glob("*tfevents*"))
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF                                          # damage the last record
    path.write_bytes(bytes(data))
    store = Store(tmp_path)
    store.poll()
    status = store.status()
    assert status["exists"] and status["runs"] == 1 and status["records_skipped"] == 1
    assert store.series("scalar")[0].steps.tolist() == [0, 1]


def test_histograms_images_text_are_kept(tmp_path):
    with SummaryWriter(tmp_path) as w:
        w.add_histogram("h", np.arange(100.0), 0)
        w.add_image("img", np.zeros((3, 4, 5), np.uint8), 0)
        w.add_text("notes", "<b>hi</b>", 0)
    store = Store(tmp_path)
    store.poll()
    kinds = {s.kind: s for s in store.series()}
    assert {"histogram", "image", "text"} <= set(kinds)
    assert kinds["histogram"].values[0][:, 2].sum() == 100
    assert list(np.atleast_1d(kinds["text"].values[0])) == ["<b>hi</b>"]


def test_a_big_logdir_is_read_and_sampled_a_batch_at_a_time(tmp_path, monkeypatch):
    from flowlab.dashboard import store as store_module
    from flowlab.summary.tailer import LogdirTailer
    rng = np.random.default_rng(0)
    for run in ("a", "b"):
        with SummaryWriter(tmp_path / run) as w:
            for step in range(300):
                w.add_histogram("h", rng.normal(size=200), step)
                w.add_image("img", rng.integers(0, 255, (3, 32, 32), dtype=np.uint8), step)
                w.add_scalar("loss", 1.0 / (step + 1), step)
    whole = LogdirTailer(tmp_path).poll(kinds=("scalar", "histogram", "image"))
    tailer, pieces, polls = LogdirTailer(tmp_path), [], 0
    while True:                                               # 64 KiB a poll: the same items, in order
        pieces += tailer.poll(kinds=("scalar", "histogram", "image"), max_bytes=1 << 16)
        polls += 1
        if not tailer.more:
            break
    assert polls > 5 and [(d.run, d.tag, d.step) for d in pieces] == [(d.run, d.tag, d.step) for d in whole]

    batches = []
    original = store_module.Store._store
    monkeypatch.setattr(store_module, "POLL_BYTES", 1 << 16)
    monkeypatch.setattr(store_module.Store, "_store", lambda self, items, touched: batches.append(len(items)) or
                        original(self, items, touched))
    store = Store(tmp_path, samples={"image": 5, "histogram": 20})
    store.poll()                                              # one call reads everything, a batch at a time
    assert len(batches) > 5 and max(batches) < len(whole) / 4
    kept = {(s.run, s.kind): s for s in store.series()}
    assert len(kept["a", "image"]) <= 7 and kept["a", "image"].steps[-1] == 299     # 5, the newest at thinning and now
    assert len(kept["b", "histogram"]) <= 22 and kept["b", "histogram"].steps[-1] == 299
    assert kept["a", "scalar"].steps.tolist() == list(range(300))
