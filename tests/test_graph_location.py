"""``BlobDef.location``: where a job's tensor was made, as the user's stack (OneFlow's BlobDesc.location_), down to
the line of the op's call; a gradient's location is that of its forward op."""
import numpy as np

import flowlab as flow
import flowlab.typing as tp


def _hidden(x):
    return flow.layers.dense(x, 4, activation=flow.math.relu, name="hidden")     # the line a location names


def test_location_is_the_users_stack_down_to_the_ops_line():
    seen = {}

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        h = _hidden(x)
        loss = flow.math.reduce_mean(h * h)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        seen["hidden"], seen["loss"] = h, loss
        return loss

    train(np.ones((2, 3), np.float32))          # (gradients are made once the job function has returned)
    forward = seen["hidden"].op_name
    grad = next(t for t in seen["hidden"].graph.tensors if t.op_name.startswith(f"System-AutoGrad-{forward}"))
    location = seen["hidden"].location
    lines = location.splitlines()
    assert lines[-2].startswith('  File "') and lines[-2].endswith("line 10, in _hidden")
    assert lines[-1].strip().startswith("return flow.layers.dense(x, 4")                 # the code line itself
    assert ", in train" in location and "flowlab" + "/" not in location.replace("tests/", "")
    assert seen["loss"].location.splitlines()[-1].strip() == "loss = flow.math.reduce_mean(h * h)"
    assert grad.location == location              # a gradient op points at its forward op's call


def test_watch_scope_blob_defs_carry_the_location():
    values = {}

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        with flow.watch_scope(values):
            y = flow.math.relu(x)        # the line watch_scope's blob_def names
        return y

    job(np.ones((2, 3), np.float32))
    flow.sync_default_session()
    (entry,) = [v for name, v in values.items() if name.startswith("Relu")]
    assert entry["blob_def"].location.splitlines()[-1].strip() == "y = flow.math.relu(x)        # the line " \
        "watch_scope's blob_def names"
