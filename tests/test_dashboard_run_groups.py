"""Run groups chosen beside the run list (``dashboard.run_groups``): by a name pattern through RE2 or by an hparam's
value, flowlab's own hparams and tensorboardX's child-run ones, with a bad pattern keeping the last good grouping."""
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
    with np.errstate(invalid="ignore"):
        run_means = np.nanmean(spans, axis=2)               # (NumPy warns about the all-NaN spans: they are NaN)
    np.testing.assert_allclose(mean, np.nanmean(run_means, axis=0), equal_nan=True)
    np.testing.assert_allclose(std, np.nanstd(run_means, axis=0), equal_nan=True)
    np.testing.assert_allclose(low, np.nanmin(spans, axis=(0, 2)), equal_nan=True)
    assert high[51] == 50.0 and count[30] == 2 and count[90] == 0 and np.isnan(mean[90])
    # under the budget it is step by step, exactly as without one
    exact = group_band(members)
    for a, b in zip(exact, group_band(members, budget=1000)):
        np.testing.assert_array_equal(a, b)
    # runs on different steps, one logging a step twice (its last value counts)
    s, m, *_ = group_band([(np.array([0, 2, 2, 4]), np.array([1.0, 5.0, 3.0, 1.0])), (np.array([1, 2]), np.ones(2))])
    assert s.tolist() == [0, 1, 2, 4] and m.tolist() == [1.0, 1.0, 2.0, 1.0]
