"""Placement on the consistent view: ``flow.distribute.split(axis)`` / ``broadcast()`` / ``auto()``,
``flow.parallel_cast`` and ``get_variable(distribute=)``; the compatibility modules ``flowlab.python.framework.
distribute`` and ``flowlab.core.operator.op_conf_pb2``; and training annotated this way on n logical devices
(``gpu_device_num(n)``) equals training on one, to float tolerance."""
import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.runtime import session

# n logical devices are NumPy threads here (on CuPy they would be n GPUs)
pytestmark = pytest.mark.numpy_backend


def test_compatibility_modules_alias_flowlabs_own():
    import flowlab.core.operator.op_conf_pb2 as op_conf_util
    import flowlab.python.framework.distribute as distribute_util
    assert distribute_util.split is flow.distribute.split and distribute_util.broadcast is flow.distribute.broadcast
    assert distribute_util.auto is flow.distribute.auto
    assert (op_conf_util.kNone, op_conf_util.kTanH, op_conf_util.kSigmoid, op_conf_util.kRelu) == (0, 1, 2, 3)
    assert op_conf_util.ACTIVATIONS[op_conf_util.kNone] is None
    assert op_conf_util.ACTIVATIONS[op_conf_util.kRelu] is flow.nn.relu


def test_distribute_values():
    assert flow.distribute.split(1) == flow.distribute.split(1) != flow.distribute.split(0)
    assert flow.distribute.broadcast() == flow.distribute.broadcast() != flow.distribute.auto()
    assert [d.sbp for d in (flow.distribute.split(2), flow.distribute.broadcast(), flow.distribute.auto())] == \
        ["S(2)", "B", "A"]
    assert repr(flow.distribute.split(0)) == "flow.distribute.split(0)"
    flow.distribute.assert_is_valid_distribute(flow.distribute.broadcast())
    with pytest.raises(TypeError, match="expected flow.distribute.split"):
        flow.distribute.assert_is_valid_distribute("S(0)")
    for bad in (-1, 1.0, True, "0"):
        with pytest.raises(ValueError, match="flow.distribute.split: axis must be an int >= 0"):
            flow.distribute.split(bad)


def test_parallel_cast_is_the_same_tensor_with_its_placement_in_the_graph():
    flow.clear_default_session()

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(3, 2), initializer=flow.ones_initializer(),
                              distribute=flow.distribute.split(1))
        x = flow.parallel_cast(x, distribute=flow.distribute.broadcast(), name="cast_in")
        y = flow.parallel_cast(flow.matmul(x, w), distribute=flow.distribute.split(0),
                               gradient_distribute=flow.distribute.broadcast(), name="cast_out")
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(y)
        return y

    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(job(x), x @ np.ones((3, 2), np.float32))
    nodes = {n.name: n for n in job.graph().nodes}
    assert nodes["cast_in"].attrs == {"distribute": "B", "gradient_distribute": None}
    assert nodes["cast_out"].attrs == {"distribute": "S(0)", "gradient_distribute": "B"}
    assert "cast_out" in str(job.graph())
    # its gradient passes through: the variable trained as without the casts (d sum(x w) / dw = column sums of x)
    expected = 1 - 0.1 * np.repeat(x.sum(axis=0)[:, None], 2, axis=1) / 8
    np.testing.assert_allclose(session.default().variables["w"].numpy(), expected, rtol=1e-6)


@pytest.mark.parametrize("build, error, match", [
    (lambda x: flow.parallel_cast(x, distribute=flow.distribute.split(2)), ValueError,
     r"parallel_cast: distribute flow.distribute.split\(2\) splits axis 2, but the tensor has shape \(4, 3\)"),
    (lambda x: flow.parallel_cast(x, gradient_distribute=flow.distribute.auto()), ValueError,
     r"gradient_distribute must be split\(axis\) or broadcast\(\), got auto\(\)"),
    (lambda x: flow.parallel_cast(x, distribute="S(0)"), TypeError,
     r"distribute must be flow.distribute.split\(axis\), broadcast\(\) or auto\(\), got 'S\(0\)'"),
    (lambda x: flow.get_variable("v", shape=(5,), distribute=flow.distribute.split(1)), ValueError,
     r"get_variable\('v'\): distribute flow.distribute.split\(1\) splits axis 1, but the tensor has shape \(5,\)"),
    (lambda x: flow.layers.dense(x, 2, model_distribute=flow.distribute.split(2)), ValueError,
     r"layers.dense: model_distribute .* shape \(2, 3\)"),
])
def test_bad_placements_are_named(build, error, match):
    flow.clear_default_session()

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        return build(x)

    with pytest.raises(error, match=match):
        job(np.ones((4, 3), np.float32))


# ------------------------------------------------------------------------------------ n devices equal one device

FEATURES, WIDE = 6, 10


def annotated_model(x, ids):
    """A small wide-and-deep shaped net with Wide & Deep's annotations: a split wide table read through a one-hot
    product, a model-split dense layer, casts to broadcast and back to split with a broadcast gradient."""
    ids = flow.parallel_cast(ids, distribute=flow.distribute.broadcast())
    table = flow.get_variable("wide", shape=(WIDE, 1), initializer=flow.random_uniform_initializer(-0.05, 0.05),
                              distribute=flow.distribute.split(0))
    wide = flow.matmul(flow.one_hot(ids, depth=WIDE, dtype=flow.float32), table)
    wide = flow.parallel_cast(wide, distribute=flow.distribute.split(0),
                              gradient_distribute=flow.distribute.broadcast())
    hidden = flow.layers.dense(x, 8, activation=flow.nn.relu, kernel_initializer=flow.truncated_normal(0.3),
                               model_distribute=flow.distribute.split(0), name="fc1")
    deep = flow.layers.dense(hidden, 1, kernel_initializer=flow.truncated_normal(0.3), name="fc2")
    return wide + deep


def train_annotated(devices, optimizer, steps=4, batch=8):
    flow.clear_default_session()
    flow.config.gpu_device_num(devices)
    config = flow.FunctionConfig()
    config.default_logical_view(flow.scope.consistent_view())
    flow.config.seed(0)

    @flow.global_function(type="train", function_config=config)
    def job(x: tp.Numpy.Placeholder((batch, FEATURES)), ids: tp.Numpy.Placeholder((batch,), dtype=flow.int32),
            y: tp.Numpy.Placeholder((batch, 1), dtype=flow.int32)) -> tp.Numpy:
        loss = flow.nn.sigmoid_cross_entropy_with_logits(y, annotated_model(x, ids))
        optimizer().minimize(loss)
        return loss

    rng = np.random.default_rng(1)
    losses = []
    for _ in range(steps):
        x = rng.standard_normal((batch, FEATURES)).astype(np.float32)
        ids = rng.integers(0, WIDE, batch).astype(np.int32)
        y = (x[:, :1] > 0).astype(np.int32)
        losses.append(job(x, ids, y))
    variables = {name: v.numpy().copy() for name, v in session.default().variables.items()}
    flow.clear_default_session()
    return losses, variables


@pytest.mark.parametrize("optimizer", [
    lambda: flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [0.05])),
    lambda: flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5]), momentum=0.9),
], ids=["adam", "sgd_momentum"])
@pytest.mark.parametrize("devices", [2, 4])
def test_n_logical_devices_train_as_one_with_placement_annotations(devices, optimizer):
    one_losses, one = train_annotated(1, optimizer)
    n_losses, n = train_annotated(devices, optimizer)
    np.testing.assert_allclose(np.concatenate(n_losses), np.concatenate(one_losses), rtol=1e-5, atol=1e-6)
    assert sorted(n) == sorted(one)
    for name in one:
        np.testing.assert_allclose(n[name], one[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert not np.allclose(one["wide"], train_annotated(1, optimizer, steps=1)[1]["wide"])    # it trained
