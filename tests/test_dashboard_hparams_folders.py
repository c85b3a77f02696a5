"""tensorboardX's ``add_hparams`` writes each call into a folder ``<run>/<time.time()>`` (or ``<run>/<name>``) of
the run: the experiment, the session's hparams and its metrics as scalars. A user means them as the run's hparams and
final metrics, so the dashboard folds such a folder into its run: no extra run in the list, no colour of its own, one
HParams session named by the run, with its hparams and metrics. Folders that are runs of their own stay runs: a
sub-run of scalars, and TensorFlow's hparams sessions (``<experiment>/<session>``, whose parent holds only the
experiment)."""
import numpy as np
import pytest

from test_dashboard_hparams import view_of as hparams_view_of

tensorboardX = pytest.importorskip("tensorboardX")


def view_of(logdir):
    """The store, run list and HParams view over ``logdir``, as the app wires them (``test_dashboard_hparams``)."""
    view = hparams_view_of(logdir)
    return view.store, view.runs, view


def test_add_hparams_folders_fold_into_their_runs(tmp_path):
    names = sorted(f"lr={lr:g}" for lr in (0.1, 0.01, 0.001))
    for k, run in enumerate(names):
        with tensorboardX.SummaryWriter(str(tmp_path / run)) as w:
            for step in range(10):
                w.add_scalar("train/loss", 1.0 / (1 + step + k), step)
            w.add_hparams({"lr": float(run[3:]), "batch": 32}, {"hparam/accuracy": 0.5 + 0.1 * k})
    folders = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.glob("*/*") if p.is_dir())
    assert len(folders) == 3 and all(f.split("/")[1].replace(".", "").isdigit() for f in folders)   # the layout

    store, runs, view = view_of(tmp_path)
    assert store.runs() == names                                    # no run per folder
    assert list(runs.source.data["run"]) == names and len(set(runs.source.data["colour"])) == 3
    assert sorted(view.sessions) == names
    for k, run in enumerate(names):
        session = view.sessions[run]
        assert session["hparams"] == {"lr": float(run[3:]), "batch": 32.0}
        assert session["metrics"] == {"hparam/accuracy": pytest.approx(0.5 + 0.1 * k)}
    (metric,) = [s for s in store.series("scalar") if s.run == names[0] and s.tag == "hparam/accuracy"]
    assert metric.steps.tolist() == [0]                             # the metric is the run's, at its step
    assert {s.run for s in store.series()} == set(names)            # nothing left under a folder's name


def test_a_metric_the_run_logged_too_stays_in_step_order(tmp_path):
    with tensorboardX.SummaryWriter(str(tmp_path / "run")) as w:
        for step in range(5):
            w.add_scalar("hparam/loss", 1.0 / (1 + step), step + 1)
        w.add_hparams({"lr": 0.1}, {"hparam/loss": 0.25}, global_step=3)
    store, _, view = view_of(tmp_path)
    (series,) = [s for s in store.series("scalar") if s.tag == "hparam/loss"]
    assert series.run == "run" and series.steps.tolist() == [1, 2, 3, 3, 4, 5]
    assert view.sessions["run"]["metrics"] == {"hparam/loss": pytest.approx(0.2)}  # the last value at the last step


def test_runs_of_their_own_stay_runs(tmp_path):
    from tensorboardX.summary import hparams
    with tensorboardX.SummaryWriter(str(tmp_path / "run")) as w:
        w.add_scalar("loss", 1.0, 0)
    with tensorboardX.SummaryWriter(str(tmp_path / "run" / "eval")) as w:      # a sub-run of scalars
        w.add_scalar("loss", 2.0, 0)
    # TensorFlow's layout: the experiment in the parent, each session (hparams first, then metrics) in a sub-run
    experiment, start, end = hparams({"lr": 0.1}, {"accuracy": 0.0})
    with tensorboardX.SummaryWriter(str(tmp_path / "tuning")) as w:
        w.file_writer.add_summary(experiment)
    for k in range(2):
        with tensorboardX.SummaryWriter(str(tmp_path / "tuning" / f"run-{k}")) as w:
            w.file_writer.add_summary(hparams({"lr": 0.1 * (k + 1)}, {"accuracy": 0.0})[1])
            w.add_scalar("accuracy", 0.8 + 0.1 * k, 0)
    store, runs, view = view_of(tmp_path)
    assert store.runs() == ["run", "run/eval", "tuning", "tuning/run-0", "tuning/run-1"]
    assert sorted(view.sessions) == ["tuning", "tuning/run-0", "tuning/run-1"]
    assert view.sessions["tuning/run-1"]["hparams"] == {"lr": pytest.approx(0.2)}
    assert view.sessions["tuning/run-1"]["metrics"] == {"accuracy": pytest.approx(0.9)}
    assert np.isclose(view.sessions["tuning/run-0"]["metrics"]["accuracy"], 0.8)
