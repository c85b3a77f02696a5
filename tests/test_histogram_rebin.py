"""Histograms with buckets of unequal widths (tensorboardX's and TensorFlow's default exponential ones) are drawn
in equal-width buckets, counts conserved (``plots.data.equal_width_buckets``), on every histogram plot: the
Histograms tab's offset ridges, overlay and runs modes. A normal sample shows no false dip at 0; equal-width
buckets pass through as logged. The Distributions tab's percentiles come from the logged buckets (exact)."""
import numpy as np
import pytest

from flowlab.dashboard.store import Store
from flowlab.dashboard.views.distributions import COLUMNS, DistributionsView
from flowlab.dashboard.views.histograms import HistogramsView
from flowlab.plots.data import EQUAL_BUCKETS, NORMAL_HISTOGRAM_BPS, compress_histogram, equal_width_buckets
from flowlab.summary import SummaryWriter, encode, proto
from flowlab.summary.decode import _legacy_histogram

tensorboardX = pytest.importorskip("tensorboardX")


def tf_default_limits():
    """TensorFlow's default bucket limits (core/lib/histogram/histogram.cc): 1e-12 growing by 10 % up to 1e20,
    mirrored below 0, with DBL_MAX as the last."""
    positive = [1e-12]
    while positive[-1] < 1e20:
        positive.append(positive[-1] * 1.1)
    return [-v for v in reversed(positive)] + [0.0] + positive + [np.finfo(np.float64).max]


def tf_histogram(sample):
    """A HistogramProto as TensorFlow's C++ writer fills it (each value in the first bucket whose limit is above it),
    read back as the dashboard reads it."""
    limits = np.array(tf_default_limits())
    counts = np.bincount(np.searchsorted(limits, sample, side="right"), minlength=len(limits))[:len(limits)]
    h = proto.HistogramProto(min=sample.min(), max=sample.max(), num=len(sample), sum=sample.sum(),
                             sum_squares=float(sample @ sample), bucket_limit=limits.tolist(),
                             bucket=counts.astype(float).tolist())
    return _legacy_histogram(h)


def tbx_histogram(sample):
    """tensorboardX's histogram of ``sample`` with its writer's default (exponential) buckets, read back as the
    dashboard reads it."""
    summary = tensorboardX.summary.histogram("h", sample, default_bins())
    return _legacy_histogram(summary.value[0].histo)


def default_bins():
    """tensorboardX's default bins (``SummaryWriter.default_bins``), as a writer makes them."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        w = tensorboardX.SummaryWriter(d)
        bins = w.default_bins
        w.close()
    return bins


def reference(buckets, edges):
    """Each new bucket's count: every old bucket's count times the share of its width the new bucket covers
    (point masses whole in the bucket holding them, the last bucket closed)."""
    out = np.zeros(len(edges) - 1)
    for left, right, count in buckets:
        for i, (a, b) in enumerate(zip(edges[:-1], edges[1:])):
            if right > left:
                out[i] += count * max(0.0, min(right, b) - max(left, a)) / (right - left)
            elif a <= left < b or (i == len(out) - 1 and left == b):
                out[i] += count
    return out


SAMPLE = np.random.default_rng(0).normal(0.0, 1.0, 20_000)


@pytest.mark.parametrize("make", [tbx_histogram, tf_histogram], ids=["tensorboardX", "tensorflow"])
def test_exponential_buckets_become_equal_ones_without_a_dip_at_zero(make):
    raw = make(SAMPLE)
    widths = raw[:, 1] - raw[:, 0]
    assert widths.max() / widths[widths > 0].min() > 1e6                  # exponential: 1e-12 .. a third of 1
    # drawn raw, the buckets around 0 are a deep false dip: the reason for the rebinning
    near_zero = raw[np.abs((raw[:, 0] + raw[:, 1]) / 2) < 0.02, 2]
    assert near_zero.max() < 0.1 * raw[:, 2].max()

    drawn = equal_width_buckets(raw)
    assert len(drawn) == EQUAL_BUCKETS
    np.testing.assert_allclose(np.diff(drawn[:, :2], axis=1), (SAMPLE.max() - SAMPLE.min()) / EQUAL_BUCKETS,
                               rtol=1e-9)
    assert drawn[0, 0] == SAMPLE.min() and drawn[-1, 1] == SAMPLE.max()
    np.testing.assert_allclose(drawn[:, 2].sum(), len(SAMPLE), rtol=1e-12)  # counts conserved
    assert (drawn[:, 2] >= 0).all()
    np.testing.assert_allclose(drawn[:, 2], reference(raw, np.concatenate([drawn[:, 0], drawn[-1:, 1]])),
                               rtol=1e-9, atol=1e-9)
    # the shape is the sample's: what NumPy counts in the same equal buckets, within a few percent of the peak
    truth, _ = np.histogram(SAMPLE, bins=np.concatenate([drawn[:, 0], drawn[-1:, 1]]))
    assert np.abs(drawn[:, 2] - truth).max() < 0.03 * truth.max()
    centre = np.searchsorted(drawn[:, 1], 0.0)                            # the bucket holding 0
    assert drawn[centre, 2] > 0.9 * drawn[:, 2].max()                     # no dip: (near) the peak


def test_equal_width_buckets_pass_through_as_logged():
    logged = encode.histogram_buckets(SAMPLE)                              # flowlab's (TensorBoard's) 30 buckets
    np.testing.assert_array_equal(equal_width_buckets(logged), logged)
    rounded = logged.astype(np.float32).astype(np.float64)               # TensorBoard's tensor form: float32 edges
    np.testing.assert_array_equal(equal_width_buckets(rounded), rounded)
    for name, buckets in [("constant", encode.histogram_buckets(np.full(7, 2.5))),
                          ("one bucket", [[0.0, 1.0, 4.0]]), ("none", np.zeros((0, 3))),
                          ("numpy rule", encode.histogram_buckets(SAMPLE, "fd")),
                          ("a non-finite edge", [[-np.inf, 0.0, 1.0], [0.0, 0.5, 2.0]])]:
        b = np.asarray(buckets, np.float64).reshape(-1, 3)
        np.testing.assert_array_equal(equal_width_buckets(b), b, err_msg=name)


def test_rebinning_spreads_each_bucket_and_keeps_point_masses():
    buckets = np.array([[0.0, 1.0, 3.0], [1.0, 10.0, 9.0], [10.0, 10.0, 5.0], [20.0, 30.0, 2.0]])   # a gap, a point
    drawn = equal_width_buckets(buckets, count=6)
    edges = np.linspace(0.0, 30.0, 7)
    np.testing.assert_allclose(drawn[:, :2], np.column_stack([edges[:-1], edges[1:]]))
    np.testing.assert_allclose(drawn[:, 2], reference(buckets, edges), rtol=1e-12)
    np.testing.assert_allclose(drawn[:, 2], [3 + 4, 5, 5, 0, 1, 1], rtol=1e-12)     # a point on an edge: right of it
    np.testing.assert_allclose(equal_width_buckets(buckets[[3, 1, 0, 2]], count=6), drawn)    # in any order
    # overlapping buckets (a malformed log) are spread the same way, bucket by bucket
    overlapping = np.array([[0.0, 2.0, 4.0], [1.0, 3.0, 2.0], [2.0, 10.0, 8.0]])
    drawn = equal_width_buckets(overlapping, count=5)
    np.testing.assert_allclose(drawn[:, 2], reference(overlapping, np.linspace(0.0, 10.0, 6)), rtol=1e-12)
    assert drawn[:, 2].sum() == pytest.approx(14.0)
    with pytest.raises(ValueError, match="count must be an int >= 1, got 0"):
        equal_width_buckets(buckets, count=0)


@pytest.fixture(scope="module")
def tbx_logdir(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("tbx")
    rng = np.random.default_rng(1)
    samples = {step: rng.normal(step / 10, 1.0, 5000) for step in range(0, 50, 10)}
    with tensorboardX.SummaryWriter(str(logdir / "run")) as w:
        for step, sample in samples.items():
            w.add_histogram("weights", sample, step)                       # the default (exponential) buckets
    with SummaryWriter(logdir / "flowlab") as w:
        for step, sample in samples.items():
            w.add_histogram("weights", sample, step)                       # equal buckets
    return logdir, samples


def build(view_class, logdir):
    from bokeh.document import Document
    store = Store(logdir)
    store.poll()
    view = view_class(store)
    Document().add_root(view.layout())
    view.update()
    return view


def per_step(data):
    steps = np.asarray(data["step"])
    return {int(s): np.column_stack([np.asarray(data[c], float)[steps == s] for c in ("left", "right", "count")])
            for s in np.unique(steps)}


def assert_equal_width_and_conserved(rows, sample, exact=False):
    widths = rows[:, 1] - rows[:, 0]
    np.testing.assert_allclose(widths, (sample.max() - sample.min()) / EQUAL_BUCKETS, rtol=1e-6)
    np.testing.assert_allclose(rows[:, 2].sum(), len(sample), rtol=1e-9)
    truth, _ = np.histogram(sample, bins=np.linspace(sample.min(), sample.max(), EQUAL_BUCKETS + 1))
    drawn = np.zeros(EQUAL_BUCKETS)
    drawn[np.round((rows[:, 0] - sample.min()) / widths.mean()).astype(int)] = rows[:, 2]
    if exact:                                                               # logged equal: drawn as logged
        np.testing.assert_array_equal(drawn, truth)
    else:                       # the logged buckets spread over equal ones, and so the sample's shape: no dip
        edges = np.linspace(sample.min(), sample.max(), EQUAL_BUCKETS + 1)
        np.testing.assert_allclose(drawn, reference(tbx_histogram(sample), edges), rtol=1e-6, atol=1e-6)
        assert np.abs(drawn - truth).max() < 0.1 * truth.max()


def test_histograms_tab_draws_tensorboardx_buckets_in_equal_widths_in_every_mode(tbx_logdir):
    logdir, samples = tbx_logdir
    view = build(HistogramsView, logdir)
    for run in ("run", "flowlab"):
        rows = per_step(view._cards[(run, "weights", "histogram")].source.data)        # offset and overlay
        assert sorted(rows) == sorted(samples)
        for step, sample in samples.items():
            assert_equal_width_and_conserved(rows[step], sample, exact=run == "flowlab")
    view.mode.active = 2                                                    # runs: each run's latest step
    data = view._cards[("", "weights", "runs")].source.data
    for run in ("run", "flowlab"):
        mine = np.array(data["run"]) == run
        rows = np.column_stack([np.asarray(data[c], float)[mine] for c in ("left", "right", "count")])
        assert_equal_width_and_conserved(rows, samples[40], exact=run == "flowlab")


def test_distributions_of_exponential_buckets_are_the_samples_percentiles(tbx_logdir):
    """Percentiles interpolate within the logged buckets, which are finest where most values are: no need (and
    less precision) to rebin them first."""
    logdir, samples = tbx_logdir
    data = build(DistributionsView, logdir)._cards[("run", "weights", "histogram")].source.data
    errors, rebinned_errors = [], []
    for i, step in enumerate(data["step"]):
        sample = samples[int(step)]
        expected = np.percentile(sample, np.array(NORMAL_HISTOGRAM_BPS) / 100)
        drawn = np.array([data[c][i] for c in COLUMNS])
        np.testing.assert_allclose(drawn, expected, atol=0.05)             # (sigma 1; buckets 10 % of the value)
        errors.append(np.abs(drawn - expected).mean())
        rebinned = compress_histogram(equal_width_buckets(tbx_histogram(sample)), NORMAL_HISTOGRAM_BPS)
        rebinned_errors.append(np.abs(rebinned - expected).mean())
    assert np.mean(errors) < np.mean(rebinned_errors)
