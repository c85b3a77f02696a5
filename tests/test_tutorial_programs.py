"""Programs a OneFlow 0.x user writes (tests/oneflow_programs.py), run with flowlab imported as flow: a LeNet-style
convnet (conv2d, max_pool2d, dropout, dense) trains and saves with ``flow.train.CheckPoint``, and a second program
loads it into a predict job; an MLP is fine-tuned with a layer its checkpoint lacks; train and predict jobs hand their
results to ``tp.Callback`` functions.

Each program runs as ``__main__`` in a fresh session, as its own process would, in a working directory holding a
small generated ``mnist.npz`` (so ``flow.data.load_mnist`` reads it and downloads nothing); running in this process
lets the tests look at the variables each program leaves."""
import math
import re

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp

from oneflow_programs import (ASYNC_EVAL, ASYNC_TRAIN, BATCH, CONVNET_DIR, CONVNET_EVAL, CONVNET_TRAIN,
                              FINETUNED_DIR, MLP_DIR, MLP_FINETUNE, MLP_PRETRAIN, printed_losses, write_mnist)


def run_program(source, name, capsys):
    """Run ``source`` as ``__main__`` in a fresh session; return (its globals, what it printed)."""
    flow.clear_default_session()
    namespace = {"__name__": "__main__", "__file__": name}
    exec(compile(source, name, "exec"), namespace)
    return namespace, capsys.readouterr().out


def variable_values():
    return {name: np.array(blob.numpy()) for name, blob in flow.get_all_variables().items()}


def saved_values(path):
    return {name: np.array(blob.numpy()) for name, blob in flow.checkpoint.get(path).items()}


def assert_same_values(actual, expected, names):
    for name in names:
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ---------------------------------------------------------------------------------------------------- convnet

def test_convnet_trains_saves_and_a_second_program_loads_it(workdir, capsys):
    write_mnist(workdir, n_train=6 * BATCH, n_test=2 * BATCH)
    _, out = run_program(CONVNET_TRAIN, "convnet_train.py", capsys)
    epoch_losses = [float(v) for v in re.findall(r"^epoch \d mean loss (\S+)$", out, re.M)]
    assert len(epoch_losses) == 2 and all(math.isfinite(v) and v > 0 for v in epoch_losses), out
    assert out.endswith(f"saved to {CONVNET_DIR}\n")
    trained = variable_values()
    shapes = {"stage1-weight": (6, 1, 5, 5), "stage1-bias": (6,), "stage2-weight": (12, 6, 5, 5),
              "stage2-bias": (12,), "features-weight": (64, 12 * 7 * 7), "features-bias": (64,),
              "scores-weight": (10, 64), "scores-bias": (10,)}
    assert {name: trained[name].shape for name in shapes} == shapes
    assert_same_values(saved_values(CONVNET_DIR), trained, shapes)

    _, out = run_program(CONVNET_EVAL, "convnet_eval.py", capsys)
    assert_same_values(variable_values(), trained, shapes)
    right, seen = map(int, re.fullmatch(r"right (\d+) of (\d+)\n", out).groups())
    assert seen == 2 * BATCH
    assert right > 2 * seen // 10, out                          # the restored model beats chance (a tenth) twice over


# ---------------------------------------------------------------------------------------------------- fine-tuning

def test_mlp_fine_tuning_loads_the_pretrained_layers_and_initialises_the_new_one(workdir, capsys, monkeypatch):
    write_mnist(workdir, n_train=21 * BATCH, n_test=BATCH)
    _, out = run_program(MLP_PRETRAIN, "mlp_pretrain.py", capsys)
    losses = printed_losses(out)
    assert sorted(losses) == [0, 10, 20] and losses[20] < losses[0] / 2, out
    pretrained = variable_values()
    assert sorted(pretrained) == ["body-bias", "body-weight", "head-bias", "head-weight"]

    after_load = {}
    load = flow.train.CheckPoint.load

    def load_and_look(self, path):                              # the values the fine-tuning starts from
        load(self, path)
        after_load.update(variable_values())
    monkeypatch.setattr(flow.train.CheckPoint, "load", load_and_look)
    with pytest.warns(UserWarning, match=r"has no values for variables \['refine-weight', 'refine-bias'\]; they keep "
                                         r"their current or initial values"):
        _, out = run_program(MLP_FINETUNE, "mlp_finetune.py", capsys)
    assert_same_values(after_load, pretrained, pretrained)
    assert after_load["refine-weight"].shape == (10, 10) and np.abs(after_load["refine-weight"]).max() > 0
    losses = printed_losses(out)
    assert all(map(math.isfinite, losses.values())) and losses[20] < losses[0], out
    tuned = variable_values()
    assert not np.array_equal(tuned["body-weight"], pretrained["body-weight"])     # the loaded layers train on
    np.testing.assert_array_equal(saved_values(FINETUNED_DIR)["refine-weight"], tuned["refine-weight"])


# ---------------------------------------------------------------------------------------------------- callbacks

def test_callback_programs_hand_every_result_to_their_callbacks(workdir, capsys):
    test_images, test_digits = write_mnist(workdir, n_train=21 * BATCH, n_test=6 * BATCH)
    namespace, out = run_program(ASYNC_TRAIN, "async_train.py", capsys)
    flow.sync_default_session()                                 # callbacks run off the calling thread
    assert namespace["steps_seen"] == 21                        # one call per batch
    losses = printed_losses(out + capsys.readouterr().out)
    assert sorted(losses) == [0, 10, 20] and losses[20] < losses[0], out
    trained = variable_values()

    namespace, _ = run_program(ASYNC_EVAL, "async_eval.py", capsys)
    flow.sync_default_session()
    assert namespace["tally"]["seen"] == 6 * BATCH
    assert_same_values(variable_values(), trained, trained)    # flow.load_variables(flow.checkpoint.get(...))

    # the callbacks counted what a synchronous job computes with the program's model and the loaded variables
    @flow.global_function(type="predict")
    def logits_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28))) -> tp.Numpy:
        return namespace["mlp"](images)

    right = sum(int((logits_job(x).argmax(1) == y).sum())
                for x, y in zip(test_images.reshape(6, BATCH, 1, 28, 28), test_digits.reshape(6, BATCH)))
    assert namespace["tally"]["right"] == right
    assert right > 6 * BATCH // 2                               # well above chance (a tenth)
