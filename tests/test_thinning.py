"""The one downsampler (flowlab/summary/thinning.py): ``downsample_many`` is ``downsample`` of many series at once,
and at the small budgets a card of many runs gives each line (scalars.LINE_FLOOR points) every bucket still keeps
its first and last point, its extremes (the spikes) and a point of each kind of non-finite value it holds."""
import numpy as np
import pytest

from flowlab.dashboard.views import scalars
from flowlab.summary.thinning import downsample, downsample_many


def reference_downsample(x, values, budget):
    """The rule written out one bucket at a time (``budget // 4`` equal-width x buckets; each keeps its first and
    last point, its smallest and largest finite value and its first NaN, +Inf and -Inf, the earliest on ties)."""
    v = np.asarray(values, np.float64)
    if len(v) <= budget:
        return np.arange(len(v))
    order = np.argsort(np.asarray(x, np.float64), kind="stable")
    xs = np.asarray(x, np.float64)[order]
    buckets = budget // 4
    span = xs[-1] - xs[0]
    column = np.zeros(len(v), np.int64) if span == 0 else \
        np.minimum(((xs - xs[0]) * (buckets / span)).astype(np.int64), buckets - 1)
    kept = set()
    for b in np.unique(column):
        members = order[column == b]              # original indices, in x order
        vals = v[members]
        kept.update((members[0], members[-1]))
        finite = np.isfinite(vals)
        if finite.any():
            kept.add(members[np.flatnonzero(finite & (vals == vals[finite].min()))[0]])
            kept.add(members[np.flatnonzero(finite & (vals == vals[finite].max()))[0]])
        for special in (np.isnan(vals), vals == np.inf, vals == -np.inf):
            if special.any():
                kept.add(members[np.flatnonzero(special)[0]])
    return np.array(sorted(kept), np.int64)


def random_series(rng, n, sorted_x=True):
    x = np.sort(rng.integers(0, 3 * n + 1, n)) if sorted_x else rng.integers(0, 3 * n + 1, n)
    v = rng.normal(size=n)
    for value, share in ((np.nan, 0.05), (np.inf, 0.02), (-np.inf, 0.02)):
        v[rng.random(n) < share] = value
    return x.astype(np.float64), v


def test_many_series_at_once_are_each_downsampled_as_alone():
    rng = np.random.default_rng(0)
    for _ in range(200):
        k = int(rng.integers(1, 8))
        series = [random_series(rng, int(rng.integers(0, 80)), sorted_x=rng.random() < 0.7) for _ in range(k)]
        series.append((np.full(30, 5.0), rng.normal(size=30)))            # every point at one x
        budgets = rng.integers(4, 40, len(series))
        got = downsample_many([x for x, _ in series], [v for _, v in series], budgets)
        for (x, v), budget, idx in zip(series, budgets, got):
            expected = reference_downsample(x, v, int(budget))
            np.testing.assert_array_equal(idx, expected)
            np.testing.assert_array_equal(downsample(x, v, int(budget)), expected)
    # one budget for all; no series at all
    xs, vs = zip(*[random_series(rng, 50) for _ in range(3)])
    assert [list(i) for i in downsample_many(xs, vs, 12)] == [list(downsample(x, v, 12)) for x, v in zip(xs, vs)]
    assert downsample_many([], [], 8) == []


@pytest.mark.parametrize("budget", [4, 8, scalars.LINE_FLOOR, 40])
@pytest.mark.parametrize("n", [100, 10_000])
def test_small_budgets_keep_every_spike_nan_and_inf_visible(budget, n):
    """A line of a card of many runs gets ``LINE_FLOOR`` points: one spike up, one down, one NaN, one +Inf and one
    -Inf per bucket, planted at random places in noise, are all kept, and every bucket keeps its first, last, lowest
    and highest points and a NaN, +Inf and -Inf wherever it holds one."""
    rng = np.random.default_rng(n + budget)
    x = np.arange(n, dtype=np.float64) * 3.0
    v = np.sin(np.arange(n) / (n / 6)) + 0.1 * rng.random(n)
    buckets = budget // 4
    column = np.minimum((x * (buckets / x[-1])).astype(np.int64), buckets - 1)
    planted = {"up": [], "down": [], "nan": [], "+inf": [], "-inf": []}
    for b in range(buckets):
        at = rng.choice(np.flatnonzero(column == b)[1:-1], 5, replace=False)     # not a bucket's first or last
        for (kind, value), i in zip((("up", 50.0 + b), ("down", -50.0 - b), ("nan", np.nan), ("+inf", np.inf),
                                     ("-inf", -np.inf)), at):
            v[i] = value
            planted[kind].append(int(i))
    kept = downsample(x, v, budget)
    assert len(kept) <= 7 * buckets
    for kind, where in planted.items():
        assert set(where) <= set(kept.tolist()), kind
    for b in range(buckets):
        members = np.flatnonzero(column == b)
        mine = kept[column[kept] == b]
        vals, shown = v[members], v[mine]
        assert mine[0] == members[0] and mine[-1] == members[-1]
        finite = np.isfinite(vals)
        assert np.nanmax(shown[np.isfinite(shown)]) == vals[finite].max()
        assert np.nanmin(shown[np.isfinite(shown)]) == vals[finite].min()
        for special in (np.isnan, np.isposinf, np.isneginf):
            assert special(vals).any() == special(shown).any()


def test_a_line_of_the_floor_still_shows_each_kind_of_value_as_the_card_sends_it(tmp_path):
    """Scalars cards: the floor's share keeps a card's NaN/±Inf ticks (the marks) and the points of a line's spike."""
    from bokeh.document import Document
    from flowlab.dashboard import app
    from flowlab.dashboard.store import Store
    from flowlab.summary.decode import Datum
    from test_dashboard_turns import InMemory
    runs, steps = scalars.CARD_POINTS // scalars.LINE_FLOOR + 1, np.arange(100, dtype=np.int64)     # (the floor)
    rng = np.random.default_rng(3)
    items = []
    for r in range(runs):
        values = np.cos(steps / 15.0) + 0.01 * rng.random(len(steps))
        if r == 3:
            values[[17, 50, 86]] = [np.nan, np.inf, -np.inf]
        if r == 4:
            values[63] = 1e6                        # a spike
        items.append(Datum(f"run{r:05d}", "loss", "scalar", steps, 1.7e9 + steps, values))
    store = Store(tmp_path)
    store._provider = InMemory(items)
    store.poll()
    card = app.build_document(Document(), store)["scalars"].cards["loss"]
    assert card.share == scalars.LINE_FLOOR
    assert {line.limit for line in card.lines.values()} == {scalars.LINE_FLOOR}
    assert max(len(line.shown) for line in card.lines.values()) <= 7 * (scalars.LINE_FLOOR // 4)
    assert sorted(zip(card.marks.data["steps"], card.marks.data["what"])) == [(17, "NaN"), (50, "+Inf"),
                                                                             (86, "-Inf")]
    spiky = card.lines["run00004"]
    assert 63 in spiky.shown.tolist() and spiky.values[63] == 1e6
    assert max(len(line.shown) for line in card.lines.values()) < len(steps)          # (downsampled, all of them)
