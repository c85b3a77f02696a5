"""flow.train.CheckPoint: init, atomic save, checked load, optimizer state round trip."""
import contextlib
import json
import os

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.errors import CheckpointError, ShapeError
from flowlab.runtime import session


def define_jobs(width=16):
    """A train job and a predict job sharing the MLP's variables by name."""
    def mlp(x):
        h = flow.layers.dense(x, width, activation=flow.nn.relu, name="h")
        return flow.layers.dense(h, 3, name="out")

    @flow.global_function(type="train")
    def train_job(x: tp.Numpy.Placeholder((8, 4)), y: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, mlp(x))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9).minimize(loss)
        return loss

    @flow.global_function()
    def predict_job(x: tp.Numpy.Placeholder((8, 4))) -> tp.Numpy:
        return mlp(x)

    return train_job, predict_job


def batch(i):
    rng = np.random.default_rng(i)
    return rng.standard_normal((8, 4)).astype(np.float32), rng.integers(0, 3, 8).astype(np.int32)


def host_values():
    return {name: v.numpy() for name, v in session.default().variables.items()}


def assert_values_equal(a, b):
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_save_load_round_trip_restores_variables_and_predictions(tmp_path):
    train_job, predict_job = define_jobs()
    for i in range(3):
        train_job(*batch(i))
    x = batch(99)[0]
    saved, saved_pred = host_values(), predict_job(x)
    assert any(name.endswith("-momentum") for name in saved)

    ckpt = tmp_path / "ckpt"
    flow.train.CheckPoint().save(ckpt)                      # os.PathLike accepted
    assert {"meta.json", "snapshot_done"} <= set(os.listdir(ckpt))
    meta = json.loads((ckpt / "meta.json").read_text())
    assert {v["name"] for v in meta["variables"]} == set(saved)

    for i in range(3, 6):                                   # move away from the saved state
        train_job(*batch(i))
    assert not np.array_equal(predict_job(x), saved_pred)

    arrays_before = {name: v.value for name, v in session.default().variables.items()}
    flow.train.CheckPoint().load(str(ckpt))
    assert_values_equal(host_values(), saved)
    np.testing.assert_array_equal(predict_job(x), saved_pred)
    for name, v in session.default().variables.items():    # loaded in place into the existing arrays
        assert v.value is arrays_before[name]


def test_save_into_non_empty_directory_fails_and_writes_nothing(tmp_path):
    train_job, _ = define_jobs()
    train_job(*batch(0))
    target = tmp_path / "ckpt"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match=r"not empty.*notes\.txt") as info:
        flow.train.CheckPoint().save(target)
    assert str(target) in str(info.value)
    assert os.listdir(target) == ["notes.txt"]
    assert os.listdir(tmp_path) == ["ckpt"]                 # no temporary directory left behind

    empty = tmp_path / "empty"                              # an existing empty directory is fine
    empty.mkdir()
    flow.train.CheckPoint().save(empty)
    assert (empty / "snapshot_done").exists()


def test_load_with_other_shapes_names_the_variable_and_changes_nothing(tmp_path):
    train_job, _ = define_jobs(width=16)
    train_job(*batch(0))
    flow.train.CheckPoint().save(tmp_path / "ckpt")

    flow.clear_default_session()
    train_job, _ = define_jobs(width=32)                    # same layer names, another width
    flow.train.CheckPoint().init()
    before = host_values()
    with pytest.raises(CheckpointError) as info:
        flow.train.CheckPoint().load(tmp_path / "ckpt")
    message = str(info.value)
    assert "'h-weight'" in message and "(32, 4)" in message and "(16, 4)" in message
    assert message.index("(32, 4)") < message.index("(16, 4)")   # expected (session) first, then got
    assert "'out-bias'" not in message                      # shapes that fit are not reported
    assert_values_equal(host_values(), before)              # not even the fitting variables were loaded


@contextlib.contextmanager
def disk_full_at_second_write(monkeypatch):
    """``np.save`` fails as a full disk does on its second call inside the block (a save dies part-way)."""
    real_save, calls = np.save, []

    def failing_save(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full (simulated)")
        return real_save(*args, **kwargs)

    monkeypatch.setattr(np, "save", failing_save)
    try:
        yield
    finally:
        monkeypatch.setattr(np, "save", real_save)


def test_crash_mid_save_leaves_nothing_and_partial_checkpoint_is_rejected(tmp_path, monkeypatch):
    train_job, _ = define_jobs()
    train_job(*batch(0))
    with pytest.raises(OSError, match="simulated"), disk_full_at_second_write(monkeypatch):
        flow.train.CheckPoint().save(tmp_path / "ckpt")
    assert os.listdir(tmp_path) == []                       # neither the target nor temporary garbage

    partial = tmp_path / "partial"
    flow.train.CheckPoint().save(partial)
    (partial / "snapshot_done").unlink()                    # what a non-atomic writer would leave after a crash
    with pytest.raises(CheckpointError, match="incomplete or corrupt checkpoint") as info:
        flow.train.CheckPoint().load(partial)
    assert str(partial) in str(info.value)


def test_load_rejects_missing_and_corrupt_checkpoints(tmp_path):
    define_jobs()
    with pytest.raises(CheckpointError, match="does not exist"):
        flow.train.CheckPoint().load(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="incomplete or corrupt"):
        flow.train.CheckPoint().load(tmp_path)              # a directory, but no checkpoint
    flow.train.CheckPoint().init()
    ckpt = tmp_path / "ckpt"
    flow.train.CheckPoint().save(ckpt)
    (ckpt / "meta.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="incomplete or corrupt checkpoint.*meta.json"):
        flow.train.CheckPoint().load(ckpt)


def test_momentum_round_trip_continues_training_identically(tmp_path):
    train_job, _ = define_jobs()
    uninterrupted = [train_job(*batch(i)) for i in range(6)]

    flow.clear_default_session()
    train_job, _ = define_jobs()
    for i in range(3):
        train_job(*batch(i))
    flow.train.CheckPoint().save(tmp_path / "ckpt")
    momentum = session.default().variables["h-weight-momentum"]
    assert np.abs(momentum.numpy()).max() > 0               # the state that must survive is really there
    detour = [train_job(*batch(100 + i)) for i in range(2)]
    assert not np.array_equal(detour[0], uninterrupted[3])

    flow.train.CheckPoint().load(tmp_path / "ckpt")
    resumed = [train_job(*batch(i)) for i in range(3, 6)]
    for got, want in zip(resumed, uninterrupted[3:]):
        np.testing.assert_array_equal(got, want)


def test_init_declares_and_initialises_variables_of_jobs_not_yet_called():
    train_job, predict_job = define_jobs()
    flow.train.CheckPoint().init()
    variables = session.default().variables
    assert {"h-weight", "h-bias", "out-weight", "out-bias", "h-weight-momentum"} <= set(variables)
    assert all(v.value is not None for v in variables.values())
    initial = host_values()
    assert np.abs(initial["h-weight"]).max() > 0

    train_job(*batch(0))
    flow.train.CheckPoint().init()                          # init resets values to their initializers
    assert_values_equal(host_values(), initial)


def test_load_before_jobs_exist_keeps_values_for_jobs_defined_later(tmp_path):
    train_job, predict_job = define_jobs()
    train_job(*batch(0))
    x = batch(7)[0]
    want = predict_job(x)
    flow.train.CheckPoint().save(tmp_path / "ckpt")

    flow.clear_default_session()
    flow.train.CheckPoint().load(tmp_path / "ckpt")         # no job knows these names yet
    assert session.default().variables["h-weight"].value is not None
    _, predict_job = define_jobs()
    np.testing.assert_array_equal(predict_job(x), want)

    @flow.global_function()
    def other_width(x: tp.Numpy.Placeholder((8, 4))) -> tp.Numpy:
        return flow.layers.dense(x, 5, name="h")

    with pytest.raises(ShapeError, match="h-weight"):
        other_width(x)


def test_load_warns_about_variables_the_checkpoint_lacks(tmp_path):
    @flow.global_function()
    def small(x: tp.Numpy.Placeholder((8, 4))) -> tp.Numpy:
        return flow.layers.dense(x, 3, name="a")

    small(batch(0)[0])
    flow.train.CheckPoint().save(tmp_path / "ckpt")
    _, predict_job = define_jobs()
    with pytest.warns(UserWarning, match="h-weight"):
        flow.train.CheckPoint().load(tmp_path / "ckpt")
    assert all(v.value is not None for v in session.default().variables.values())
    predict_job(batch(0)[0])


def test_variables_loaded_before_their_job_is_defined_still_train(tmp_path):
    train_job, _ = define_jobs()
    train_job(*batch(0))
    flow.train.CheckPoint().save(tmp_path / "ckpt")
    flow.clear_default_session()

    flow.train.CheckPoint().load(tmp_path / "ckpt")        # no job defined yet: variables are provisional
    loaded = host_values()
    train_job, _ = define_jobs()
    train_job(*batch(1))
    variables = session.default().variables
    assert variables["h-weight"].trainable and not variables["h-weight"].provisional
    assert not np.array_equal(variables["h-weight"].numpy(), loaded["h-weight"])   # it trained from loaded values


def _npy_header(shape, dtype="<f4"):
    """A .npy 1.0 header declaring ``shape`` (and no data after it)."""
    header = repr({"descr": dtype, "fortran_order": False, "shape": shape}).encode("latin1")
    header += b" " * ((-(len(header) + 11)) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header


def test_load_checks_npy_headers_against_the_file_before_allocating(tmp_path):
    """A header declaring 2^40 elements used to reach np.load, whose allocation raised a bare MemoryError."""
    define_jobs()
    flow.train.CheckPoint().init()
    before = host_values()
    ckpt = tmp_path / "ckpt"
    flow.train.CheckPoint().save(ckpt)
    meta = json.loads((ckpt / "meta.json").read_text())
    entry = dict(meta["variables"][0])
    file = ckpt / entry["file"]
    original = file.read_bytes()

    # meta.json and the header agree on 2^40 elements, the file holds none of them
    meta["variables"][0]["shape"] = [2 ** 40]
    (ckpt / "meta.json").write_text(json.dumps(meta))
    file.write_bytes(_npy_header((2 ** 40,), np.dtype(entry["dtype"]).str))
    with pytest.raises(CheckpointError, match=rf"variable '{entry['name']}' \(.*{entry['file']}\): its header "
                                              rf"declares shape \(1099511627776,\) dtype float32 "
                                              rf"\(4,398,046,511,104 bytes of data\), but the file holds 0 bytes"):
        flow.train.CheckPoint().load(ckpt)

    # a header that disagrees with meta.json, and a truncated file
    meta["variables"][0]["shape"] = entry["shape"]
    (ckpt / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"its header declares shape \(1099511627776,\) dtype float32, "
                                              r"meta.json says shape"):
        flow.train.CheckPoint().load(ckpt)
    file.write_bytes(original[:-4])
    with pytest.raises(CheckpointError, match=r"but the file holds .* bytes"):
        flow.train.CheckPoint().load(ckpt)
    file.write_bytes(b"not a npy file")
    with pytest.raises(CheckpointError, match=rf"{entry['file']}\): ValueError"):
        flow.train.CheckPoint().load(ckpt)
    assert_values_equal(host_values(), before)          # nothing was half-loaded

    file.write_bytes(original)                          # intact again: loads
    flow.train.CheckPoint().load(ckpt)
    assert_values_equal(host_values(), before)
