"""Run groups chosen beside the run list (``dashboard.run_groups``): by a name pattern through RE2 or by an hparam's
value, flowlab's own hparams and tensorboardX's child-run ones, with a bad pattern keeping the last good grouping."""
import warnings

import pytest

from flowlab.dashboard.run_groups import RunGroups
from flowlab.dashboard.runs import RunSelection
from flowlab.dashboard.store import Store
from flowlab.summary import SummaryWriter

RUNS = {"lr=0.1,seed=0": 0.1, "lr=0.1,seed=1": 0.1, "lr=0.01,seed=0": 0.01, "baseline": None}


@pytest.fixture
def store(tmp_path):
    for run, lr in RUNS.items():
        with SummaryWriter(str(tmp_path / run)) as w:
            w.add_scalar("loss", 1.0, 0)
            if lr is not None:
                w.add_hparams({"lr": lr, "seed": int(run[-1])}, {"loss": 1.0})
    tensorboardx = pytest.importorskip("tensorboardX")
    with tensorboardx.SummaryWriter(str(tmp_path / "tbx")) as w:         # hparams in a child run <run>/<time>
        w.add_scalar("loss", 1.0, 0)
        w.add_hparams({"lr": 0.01, "seed": 7}, {"hparam/loss": 1.0})
    store = Store(str(tmp_path))
    store.poll()
    return store


def test_groups_by_name_pattern_by_first_capture_or_whole_match(store):
    grouping = RunGroups(store)
    changes = []
    grouping.on_change(lambda: changes.append(1))
    assert grouping.groups(sorted(RUNS)) == {} and not grouping.active
    grouping.by.value = "name"
    grouping.pattern.value = r"lr=([^,]+)"
    assert grouping.groups(sorted(RUNS)) == {"0.01": ["lr=0.01,seed=0"], "0.1": ["lr=0.1,seed=0", "lr=0.1,seed=1"]}
    assert changes and grouping.band == "std"
    grouping.pattern.value = r"seed=\d"                                 # no capture: the whole match
    assert grouping.groups(sorted(RUNS)) == {"seed=0": ["lr=0.01,seed=0", "lr=0.1,seed=0"], "seed=1": ["lr=0.1,seed=1"]}
    grouping.pattern.value = r"lr=("                                     # bad: said, and the last good one holds
    assert "Invalid group regex" in grouping.message.text and grouping.message.visible
    assert set(grouping.groups(sorted(RUNS))) == {"seed=0", "seed=1"}
    grouping.pattern.value = r"(a+)+$<script>"                           # RE2: no backtracking, markup escaped
    assert "<script>" not in grouping.message.text
    grouping.band_choice.active = 1
    assert grouping.band == "range"


def test_groups_by_hparam_including_tensorboardx_child_runs(store):
    grouping = RunGroups(store)
    assert [value for value, _ in grouping.by.options] == ["", "name"]    # no hparams read yet
    grouping.update()
    assert [value for value, _ in grouping.by.options] == ["", "name", "hparam:lr", "hparam:seed"]
    grouping.by.value = "hparam:lr"
    runs = sorted(store.runs())
    groups = grouping.groups(runs)
    assert groups["lr=0.1"] == ["lr=0.1,seed=0", "lr=0.1,seed=1"]
    # the tensorboardX run takes its child session's hparams (and the child run itself has them too)
    assert "tbx" in groups["lr=0.01"] and "lr=0.01,seed=0" in groups["lr=0.01"]
    assert grouping.group_of("baseline") is None                           # no hparams: on its own
    assert not grouping.pattern.visible and grouping.band_choice.visible


def test_run_list_tells_views_when_the_grouping_changes(store):
    runs = RunSelection(store)
    runs.update()
    calls = []
    runs.on_change(lambda: calls.append(runs.grouping.groups(sorted(runs.store.runs()))))
    runs.grouping.by.value = "hparam:seed"
    assert calls and calls[-1]["seed=0"] == ["lr=0.01,seed=0", "lr=0.1,seed=0"]
    keys = [key for key, _, _ in runs.url_state()]
    assert keys == ["runs", "groupby", "group", "band"]


def test_group_band_over_a_budget_takes_equal_spans_and_keeps_every_extreme():
    import numpy as np
    from flowlab.plots.data import group_band
    rng = np.random.default_rng(1)
    values = rng.normal(size=(3, 1000))
    values[1, 517] = 50.0                                   # a spike in one run
    values[2, 300:310] = np.nan                             # a whole span of one run is NaN
    values[:, 900:910] = np.nan                             # a span where no run has a finite value
    members = [(np.arange(1000), v) for v in values]
    steps, mean, std, low, high, count = group_band(members, budget=100)
    assert steps.tolist() == list(range(0, 1000, 10))
    spans = values.reshape(3, 100, 10)
    with warnings.catch_warnings():                         # (NumPy warns about the all-NaN spans: they are NaN)
        warnings.simplefilter("ignore", RuntimeWarning)
        run_means = np.nanmean(spans, axis=2)
        reference_mean, reference_std = np.nanmean(run_means, axis=0), np.nanstd(run_means, axis=0)
        reference_low = np.nanmin(spans, axis=(0, 2))
    np.testing.assert_allclose(mean, reference_mean, equal_nan=True)
    np.testing.assert_allclose(std, reference_std, equal_nan=True)
    np.testing.assert_allclose(low, reference_low, equal_nan=True)
    assert high[51] == 50.0 and count[30] == 2 and count[90] == 0 and np.isnan(mean[90])
    # under the budget it is step by step, exactly as without one
    exact = group_band(members)
    for a, b in zip(exact, group_band(members, budget=1000)):
        np.testing.assert_array_equal(a, b)
    # runs on different steps, one logging a step twice (its last value counts)
    s, m, *_ = group_band([(np.array([0, 2, 2, 4]), np.array([1.0, 5.0, 3.0, 1.0])), (np.array([1, 2]), np.ones(2))])
    assert s.tolist() == [0, 1, 2, 4] and m.tolist() == [1.0, 1.0, 2.0, 1.0]


def test_distributions_draw_a_group_as_the_distribution_of_all_its_runs_values(tmp_path):
    import numpy as np
    from bokeh.document import Document
    from flowlab.dashboard import app
    from flowlab.plots.data import NORMAL_HISTOGRAM_BPS, compress_histogram, merge_histograms
    rng = np.random.default_rng(0)
    samples = {}
    for run in ("lr=0.1,seed=0", "lr=0.1,seed=1", "lr=0.1,seed=2", "baseline"):
        with SummaryWriter(str(tmp_path / run)) as w:
            for step in (0, 10, 20):
                samples[run, step] = rng.normal(len(samples) % 3, 1 + step / 10, 3000)
                w.add_histogram("weights", samples[run, step], step)
    store = Store(str(tmp_path))
    store.poll()
    doc = Document()
    views = app.build_document(doc, store)
    tabs = doc.get_model_by_name("tabs")
    tabs.active = [panel.name for panel in tabs.tabs].index("distributions")
    runs = doc.get_model_by_name("runs-summary")        # (the session's run list, found through a view)
    view = views["distributions"]
    grouping = view.runs.grouping
    grouping.by.value, grouping.pattern.value = "name", r"lr=([^,]+)"
    assert view._order == [("0.1", "weights", "group"), ("baseline", "weights", "histogram")]     # groups first
    card = view._cards["0.1", "weights", "group"]
    data = card.source.data
    assert list(data["step"]) == [0, 10, 20]
    members = [f"lr=0.1,seed={k}" for k in range(3)]
    for i, step in enumerate((0, 10, 20)):
        logged = [b for s in store.series("histogram") if s.run in members for st, b in
                  zip(store.read(s).steps, store.read(s).values) if st == step]
        expected = compress_histogram(merge_histograms(logged), NORMAL_HISTOGRAM_BPS)
        np.testing.assert_allclose([data[f"bp{bp}"][i] for bp in NORMAL_HISTOGRAM_BPS], expected)
        pooled = np.concatenate([samples[run, step] for run in members])       # what the values were
        assert abs(data["bp5000"][i] - np.median(pooled)) < 0.15
        assert data["bp0"][i] == pytest.approx(pooled.min(), rel=1e-6)
    assert card.layout.above[0].text == "group 0.1 (3 runs)"
    view.runs.check_only(members[:2] + ["baseline"])                     # a member unchecked: the group is remade
    assert view._cards["0.1", "weights", "group"].layout.above[0].text == "group 0.1 (2 runs)"
    grouping.by.value = ""                                               # no grouping: a card per run again
    assert sorted(view._cards) == sorted((run, "weights", "histogram") for run in members[:2] + ["baseline"])
    assert runs.text.startswith("3 of 4")


def test_merge_histograms_is_the_histogram_of_the_pooled_values():
    import numpy as np
    from flowlab.plots.data import NORMAL_HISTOGRAM_BPS, compress_histogram, merge_histograms
    rng = np.random.default_rng(3)
    samples = [rng.normal(k, 1 + k, 4000) for k in range(3)]
    histograms = []
    for k, x in enumerate(samples):                             # each on its own edges, as writers bin
        counts, edges = np.histogram(x, bins=20 + 9 * k)
        histograms.append(np.column_stack([edges[:-1], edges[1:], counts]))
    merged = merge_histograms(histograms)
    assert merged[:, 2].sum() == 12000 and (merged[1:, 0] == merged[:-1, 1]).all()     # contiguous, nothing lost
    pooled = np.concatenate(samples)
    q = compress_histogram(merged, NORMAL_HISTOGRAM_BPS)
    np.testing.assert_allclose(q, np.percentile(pooled, np.array(NORMAL_HISTOGRAM_BPS) / 100), atol=0.08)
    twice = merge_histograms([histograms[0], histograms[0]])    # same edges: counts add exactly
    kept = histograms[0][histograms[0][:, 2] > 0]
    np.testing.assert_array_equal(twice, np.column_stack([kept[:, :2], 2 * kept[:, 2]]))
    # a constant tensor's zero-width bucket stays a point, between the halves of the bucket it falls in
    np.testing.assert_array_equal(merge_histograms([[[1, 1, 5]], [[0, 2, 4]]]), [[0, 1, 2], [1, 1, 5], [1, 2, 2]])
    assert merge_histograms([[[0, 1, 0]]]).shape == (0, 3)
