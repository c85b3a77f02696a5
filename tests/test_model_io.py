"""OneFlow's model I/O v2 (flow.checkpoint.get/save, flow.load_variables, flow.get_all_variables) and
flow.config.enable_legacy_model_io, against real saved directories, across both APIs."""
import os

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.errors import CheckpointError
from flowlab.runtime import session
from test_checkpoint import assert_values_equal, batch, define_jobs, disk_full_at_second_write, host_values


def define_linear():
    """A predict job computing x @ w.T + b from the variables 'lin-weight' (3, 4) and 'lin-bias' (3,)."""
    @flow.global_function()
    def linear(x: tp.Numpy.Placeholder((2, 4))) -> tp.Numpy:
        return flow.layers.dense(x, 3, name="lin")
    return linear


def test_checkpoint_save_loads_through_CheckPoint_and_CheckPoint_save_through_load_variables(tmp_path):
    train_job, predict_job = define_jobs()
    for i in range(3):
        train_job(*batch(i))
    x = batch(99)[0]
    saved, saved_pred = host_values(), predict_job(x)

    v2_dir = tmp_path / "v2"
    flow.checkpoint.save(str(v2_dir))
    assert {"meta.json", "snapshot_done"} <= set(os.listdir(v2_dir))     # CheckPoint's own format
    on_disk = flow.checkpoint.get(v2_dir)
    assert set(on_disk) == set(saved)
    assert_values_equal({name: v.numpy() for name, v in on_disk.items()}, saved)
    assert on_disk["h-weight"].shape == (16, 4) and on_disk["h-weight"].dtype == np.float32

    train_job(*batch(5))                                     # move away from the saved state
    assert not np.array_equal(predict_job(x), saved_pred)
    flow.train.CheckPoint().load(v2_dir)                     # the legacy API reads the v2 save
    assert_values_equal(host_values(), saved)
    np.testing.assert_array_equal(predict_job(x), saved_pred)

    legacy_dir = tmp_path / "legacy"
    flow.train.CheckPoint().save(legacy_dir)
    flow.clear_default_session()                             # a new program: define the jobs, then load
    _, predict_job = define_jobs()
    flow.load_variables(flow.checkpoint.get(legacy_dir))     # the v2 API reads the legacy save
    np.testing.assert_array_equal(predict_job(x), saved_pred)
    assert_values_equal({n: v for n, v in host_values().items() if not n.endswith("-momentum")},
                        {n: v for n, v in saved.items() if not n.endswith("-momentum")})


def test_get_all_variables_are_the_session_variables_and_follow_training():
    train_job, _ = define_jobs()
    before_any_call = flow.get_all_variables()               # jobs defined, none called: declared and initialised
    assert set(before_any_call) == set(session.default().variables) >= {"h-weight", "h-bias", "out-weight"}
    for name, value in before_any_call.items():
        np.testing.assert_array_equal(value.numpy(), session.default().variables[name].numpy(), err_msg=name)
        assert value.shape == session.default().variables[name].shape

    first = before_any_call["out-weight"].numpy()
    train_job(*batch(0))
    after = flow.get_all_variables()["out-weight"].numpy()
    assert not np.array_equal(first, after)                  # numpy() reads the value now, not a stale copy
    np.testing.assert_array_equal(before_any_call["out-weight"].numpy(), after)
    after[...] = 0                                           # a copy: changing it leaves the variable alone
    assert np.any(session.default().variables["out-weight"].numpy() != 0)


def test_load_variables_from_numpy_then_predict_uses_the_loaded_weights():
    linear = define_linear()
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    flow.load_variables({"lin-weight": w, "lin-bias": b})    # before the job's first call, as tutorials do
    x = rng.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(linear(x), x @ w.T + b, rtol=1e-6)

    w2 = w * 2
    flow.load_variables({"lin-weight": w2})                  # a partial dict changes only what it names
    np.testing.assert_allclose(linear(x), x @ w2.T + b, rtol=1e-6)


def test_load_variables_assigns_one_variable_from_another():
    @flow.global_function()
    def add() -> tp.Numpy:
        def var(name, init):
            return flow.get_variable(name, shape=(9, 3), dtype=flow.float32, initializer=init)
        return var("x", flow.random_normal_initializer(mean=10, stddev=1)) + \
            var("y", flow.constant_initializer(5)) + var("z", flow.random_normal_initializer())

    all_vars = flow.get_all_variables()
    flow.load_variables({"x": all_vars["z"]})
    np.testing.assert_allclose(add(), all_vars["z"].numpy() * 2 + all_vars["y"].numpy(), rtol=1e-6)


def test_load_variables_rejects_what_does_not_fit_and_changes_nothing():
    linear = define_linear()
    x = np.ones((2, 4), np.float32)
    before_out = linear(x)
    before = host_values()
    good_bias = np.arange(3, dtype=np.float32)

    with pytest.raises(CheckpointError, match=r"'lin-weight'.*shape \(3, 4\).*shape \(4, 3\)") as info:
        flow.load_variables({"lin-bias": good_bias, "lin-weight": np.zeros((4, 3), np.float32)})
    assert "'lin-bias'" not in str(info.value)               # values that fit are not reported ...
    assert_values_equal(host_values(), before)               # ... nor loaded
    with pytest.raises(CheckpointError, match=r"'lin-bias'.*dtype float32.*dtype float64"):
        flow.load_variables({"lin-bias": np.zeros(3)})
    with pytest.raises(CheckpointError, match=r"\['nope'\] are not variable names"):
        flow.load_variables({"lin-bias": good_bias, "nope": good_bias}, ignore_mismatch=False)
    assert_values_equal(host_values(), before)
    np.testing.assert_array_equal(linear(x), before_out)

    with pytest.warns(UserWarning, match="skipped 'nope'"):  # OneFlow's default: unknown names are skipped
        flow.load_variables({"lin-bias": good_bias, "nope": good_bias})
    np.testing.assert_array_equal(session.default().variables["lin-bias"].numpy(), good_bias)

    with pytest.raises(TypeError, match="value_dict must be a dict"):
        flow.load_variables([("lin-bias", good_bias)])
    with pytest.raises(TypeError, match=r"value for 'lin-bias' must be a numpy.ndarray"):
        flow.load_variables({"lin-bias": [0.0, 1.0, 2.0]})
    with pytest.raises(TypeError, match="ignore_mismatch must be True or False"):
        flow.load_variables({}, ignore_mismatch="yes")


def write_oneflow_model(root, variables, with_meta=True):
    """A model directory as OneFlow writes it: <name>/out holds the raw bytes, <name>/meta the text meta info."""
    kinds = {np.dtype(np.float32): "kFloat", np.dtype(np.float64): "kDouble", np.dtype(np.int32): "kInt32"}
    for name, array in variables.items():
        os.makedirs(root / name)
        (root / name / "out").write_bytes(np.ascontiguousarray(array).tobytes())
        if with_meta:
            dims = " ".join(f"dim: {d}" for d in array.shape)
            (root / name / "meta").write_text(f"shape {{\n  {dims}\n}}\ndata_type: {kinds[array.dtype]}\n")
    (root / "snapshot_done").write_bytes(b"")


def test_oneflow_model_directories_load_with_and_without_meta(tmp_path):
    linear = define_linear()
    rng = np.random.default_rng(1)
    w, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    x = rng.standard_normal((2, 4)).astype(np.float32)

    v2 = tmp_path / "oneflow_v2"
    write_oneflow_model(v2, {"lin-weight": w, "lin-bias": b})
    saved = flow.checkpoint.get(v2)
    assert set(saved) == {"lin-weight", "lin-bias"} and saved["lin-weight"].shape == (3, 4)
    np.testing.assert_array_equal(saved["lin-weight"].numpy(), w)
    single = flow.checkpoint.get(v2 / "lin-bias")            # one variable's directory gives that variable
    np.testing.assert_array_equal(single.numpy(), b)
    flow.load_variables(saved)
    np.testing.assert_allclose(linear(x), x @ w.T + b, rtol=1e-6)

    legacy = tmp_path / "oneflow_legacy"                     # OneFlow's legacy saves have no meta files
    write_oneflow_model(legacy, {"lin-weight": w * 3, "lin-bias": b * 3, "ghost": b}, with_meta=False)
    with pytest.raises(CheckpointError, match="without its 'meta' file"):
        flow.checkpoint.get(legacy)["lin-weight"].numpy()
    with pytest.warns(UserWarning, match=r"skipped \['ghost'\].*shapes are unknown"):
        flow.train.CheckPoint().load(legacy)                 # the variables' shapes tell how to read them
    np.testing.assert_allclose(linear(x), x @ (3 * w).T + 3 * b, rtol=1e-5)
    with pytest.warns(UserWarning, match="skipped 'ghost'"):
        flow.load_variables(flow.checkpoint.get(legacy))
    np.testing.assert_allclose(linear(x), x @ (3 * w).T + 3 * b, rtol=1e-5)

    (legacy / "lin-bias" / "out").write_bytes(b"\0" * 8)     # truncated: 2 floats where 3 are needed
    with pytest.raises(CheckpointError, match=r"'lin-bias'.*needs 12 bytes, the file holds 8"):
        flow.load_variables(flow.checkpoint.get(legacy))
    (v2 / "lin-weight" / "out").write_bytes(b"\0" * 4)
    with pytest.raises(CheckpointError, match=r"'lin-weight'.*meta says shape \(3, 4\)"):
        flow.checkpoint.get(v2)


def test_checkpoint_save_of_a_var_dict_and_its_atomicity(tmp_path, monkeypatch):
    linear = define_linear()
    linear(np.zeros((2, 4), np.float32))
    arrays = {"a/b c": np.arange(6, dtype=np.int32).reshape(2, 3), "f": np.ones(2)}   # any name, any dtype
    flow.checkpoint.save(tmp_path / "dict", arrays)
    got = flow.checkpoint.get(tmp_path / "dict")
    assert set(got) == set(arrays)
    for name in arrays:
        np.testing.assert_array_equal(got[name].numpy(), arrays[name])
        assert got[name].numpy().dtype == arrays[name].dtype
    flow.checkpoint.save(tmp_path / "copy", got)             # values from get() save again
    np.testing.assert_array_equal(flow.checkpoint.get(tmp_path / "copy")["a/b c"].numpy(), arrays["a/b c"])

    real_save, target_seen = np.save, []

    def spying_save(*args, **kwargs):                        # while variables are written, the target is absent
        target_seen.append(os.path.exists(tmp_path / "whole"))
        return real_save(*args, **kwargs)

    monkeypatch.setattr(np, "save", spying_save)
    flow.checkpoint.save(tmp_path / "whole")
    assert target_seen == [False, False] and os.path.isfile(tmp_path / "whole" / "snapshot_done")
    monkeypatch.setattr(np, "save", real_save)

    with pytest.raises(OSError, match="simulated"), disk_full_at_second_write(monkeypatch):
        flow.checkpoint.save(tmp_path / "crashed")
    assert sorted(os.listdir(tmp_path)) == ["copy", "dict", "whole"]  # neither the target nor temporary garbage


def test_bad_paths_and_names_give_errors_naming_the_argument(tmp_path):
    define_linear()
    with pytest.raises(TypeError, match=r"flow.checkpoint.save: path must be a str or os.PathLike, got int"):
        flow.checkpoint.save(3)
    with pytest.raises(CheckpointError, match="flow.checkpoint.save: path is empty"):
        flow.checkpoint.save("")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep")
    with pytest.raises(CheckpointError, match=r"flow.checkpoint.save: cannot save checkpoint to path .*full.*not "
                                              r"empty \(it holds x\)"):
        flow.checkpoint.save(tmp_path / "full")
    assert os.listdir(tmp_path / "full") == ["x"]
    with pytest.raises(CheckpointError, match=r"var_dict has keys that are not variable names .*\[3, ''\]"):
        flow.checkpoint.save(tmp_path / "new", {3: np.zeros(1), "": np.zeros(1)})
    with pytest.raises(CheckpointError, match=r"flow.checkpoint.get: no checkpoint at path .*nowhere.*does not "
                                              r"exist"):
        flow.checkpoint.get(tmp_path / "nowhere")
    with pytest.raises(TypeError, match="flow.checkpoint.get: path must be a str"):
        flow.checkpoint.get(None)
    with pytest.raises(CheckpointError, match="neither 'meta.json'.*nor <variable>/out"):
        flow.checkpoint.get(tmp_path / "full")
    with pytest.raises(TypeError, match=r"flow.train.CheckPoint.load: path must be a str"):
        flow.train.CheckPoint().load(1.5)


def test_enable_legacy_model_io_switches_CheckPoint_to_the_v2_semantics(tmp_path):
    assert flow.config.legacy_model_io_enabled()             # flowlab's default: CheckPoint as in OneFlow 0.2
    flow.config.enable_legacy_model_io()                     # the tutorials' first line keeps it
    linear = define_linear()
    flow.train.CheckPoint().init()
    w = np.full((3, 4), 7, np.float32)
    flow.load_variables({"lin-weight": w})
    flow.train.CheckPoint().init()                           # legacy init re-initialises every variable
    assert not np.array_equal(flow.get_all_variables()["lin-weight"].numpy(), w)

    flow.config.enable_legacy_model_io(False)
    assert not flow.config.legacy_model_io_enabled()
    flow.load_variables({"lin-weight": w})
    with pytest.warns(FutureWarning, match=r"deprecated.*flow.checkpoint.save\(path\).*flow.load_variables"):
        check_point = flow.train.CheckPoint()
    check_point.init()                                       # v2: a no-op, loaded values stay
    np.testing.assert_array_equal(flow.get_all_variables()["lin-weight"].numpy(), w)
    check_point.save(tmp_path / "v2")                        # save/load still work, same files
    np.testing.assert_array_equal(flow.checkpoint.get(tmp_path / "v2")["lin-weight"].numpy(), w)
    linear(np.zeros((2, 4), np.float32))

    flow.config.enable_model_io_v2(True)
    assert flow.config.model_io_v2_enabled()
    flow.clear_default_session()                             # the switches belong to the session, as in OneFlow
    assert flow.config.legacy_model_io_enabled() and not flow.config.model_io_v2_enabled()
    with pytest.raises(TypeError, match="enable_legacy_model_io: val must be True or False, got 0"):
        flow.config.enable_legacy_model_io(0)
    with pytest.raises(TypeError, match="enable_model_io_v2: val must be True or False"):
        flow.config.enable_model_io_v2("yes")
