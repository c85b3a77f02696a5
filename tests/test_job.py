"""Job functions: placeholders, return annotations, names, shared variables, training semantics, bad input."""
import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.errors import FeedError, ShapeError, TraceError


def test_numpy_placeholder_and_return():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        return flow.math.exp(x) * 2.0 + 1.0

    x = np.arange(6, dtype=np.float32).reshape(2, 3) / 10
    np.testing.assert_allclose(job(x), np.exp(x) * 2 + 1, rtol=1e-6)


def test_returned_array_is_not_overwritten_by_the_next_call():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        return flow.nn.relu(x) + 1.0

    first = job(np.full(4, 1, np.float32))
    job(np.full(4, 5, np.float32))
    np.testing.assert_array_equal(first, np.full(4, 2, np.float32))


def test_old_style_fixed_tensor_def_and_unannotated_handle():
    @flow.global_function()
    def job(x=flow.FixedTensorDef((3,))):
        return flow.math.square(x)

    blob = job(np.array([1, -2, 3], np.float32)).get()
    np.testing.assert_array_equal(blob.numpy(), [1, 4, 9])
    np.testing.assert_array_equal(blob.ndarray(), [1, 4, 9])
    assert blob.mean() == pytest.approx(14 / 3)
    assert blob.shape == (3,)
    # the array's operators too, as OneFlow's LocalBlob (DCGAN indexes the images it gets back)
    assert blob[1] == 4 and len(blob) == 3 and list(blob) == [1, 4, 9]
    np.testing.assert_array_equal(blob * 2 + blob, [3, 12, 27])
    np.testing.assert_array_equal(np.sqrt(blob), [1, 2, 3])
    assert float(blob[2]) == 9.0 and hash(blob) == hash(blob)      # a Blob stays hashable, as OneFlow's


def test_list_numpy_accepts_smaller_shapes_and_retraces_with_the_same_names():
    @flow.global_function()
    def job(x: tp.ListNumpy.Placeholder((10,), dtype=flow.int8)) -> tp.ListNumpy:
        return flow.cast(x, flow.int32) + flow.constant(1, dtype=flow.int32)

    out = job([np.frombuffer(b"abc", dtype=np.int8)])
    assert isinstance(out, list) and out[0].tolist() == [98, 99, 100]
    names_first = [n.name for n in job.graph().nodes]
    out = job([np.frombuffer(b"hello", dtype=np.int8)])
    assert out[0].shape == (5,)
    assert [n.name for n in job.graph().nodes] == names_first
    with pytest.raises(FeedError, match="at most shape"):
        job([np.zeros(11, np.int8)])


def test_callback_and_tuple_and_dict_returns():
    from typing import Dict, Tuple

    @flow.global_function()
    def cb_job(x: tp.Numpy.Placeholder((2,))) -> tp.Callback[tp.Numpy]:
        return x + 1.0

    got = []
    cb_job(np.zeros(2, np.float32))(got.append)     # runs on the dispatcher thread
    flow.sync_default_session()
    np.testing.assert_array_equal(got[0], [1, 1])

    @flow.global_function()
    def tuple_job(x: tp.Numpy.Placeholder((2,))) -> Tuple[tp.Numpy, tp.ListNumpy]:
        return x, x * 2.0

    a, b = tuple_job(np.ones(2, np.float32))
    np.testing.assert_array_equal(a, [1, 1])
    np.testing.assert_array_equal(b[0], [2, 2])

    @flow.global_function()
    def dict_job(x: tp.Numpy.Placeholder((2,))) -> Dict[str, tp.Numpy]:
        return {"double": x * 2.0, "neg": -x}

    out = dict_job(np.ones(2, np.float32))
    np.testing.assert_array_equal(out["neg"], [-1, -1])


def test_none_return_runs_the_job():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2,))) -> None:
        flow.nn.relu(x)

    assert job(np.ones(2, np.float32)) is None


def test_oneflow_names_dense_counter_and_lbns():
    seen = {}

    @flow.global_function()
    def job(images=flow.FixedTensorDef((8, 1, 28, 28), dtype=flow.float),
            labels=flow.FixedTensorDef((8,), dtype=flow.int32)):
        reshape = flow.reshape(images, [images.shape[0], -1])
        hidden = flow.layers.dense(reshape, 512, activation=flow.nn.relu)
        logits = flow.layers.dense(hidden, 10)
        seen["logits"] = logits
        seen["hidden"] = hidden
        return logits

    job.compiled()
    # OneFlow's seed program prints exactly these for the second dense layer.
    assert seen["logits"].op_name == "Dense_6_bias_add"
    assert seen["logits"].logical_blob_name == "Dense_6_bias_add/out_0"
    names = {n.name for n in job.graph().nodes}
    assert {"Dense_6-weight", "Dense_6-bias", "Dense_6_matmul", "Dense_5_activation"} <= names
    weight = job.graph().variables["Dense_6-weight"]
    assert weight.logical_blob_name == "Dense_6-weight/out" and weight.shape == (10, 512)


def test_variables_are_shared_by_name_between_train_and_predict_jobs():
    def model(x):
        return flow.layers.dense(x, 1, use_bias=False, kernel_initializer=flow.constant_initializer(0.0), name="lin")

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((4, 2)), y: tp.Numpy.Placeholder((4, 1))) -> tp.Numpy:
        loss = flow.math.square(model(x) - y)
        flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
        return loss

    @flow.global_function()
    def predict(x: tp.Numpy.Placeholder((4, 2))) -> tp.Numpy:
        return model(x)

    x = np.array([[1, 0], [0, 1], [1, 1], [2, 1]], np.float32)
    y = x @ np.array([[2.0], [-1.0]], np.float32)
    for _ in range(300):
        train(x, y)
    np.testing.assert_allclose(predict(x), y, atol=1e-3)


def test_minimize_scales_model_gradients_by_loss_size():
    # loss_i = w * x_i with per-example loss of 4 elements: the gradient of w is sum(x)/4 (a mean), not sum(x).
    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(1,), initializer=flow.constant_initializer(1.0))
        loss = x * w
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1.0]), momentum=0).minimize(loss)
        return loss

    train(np.array([1, 2, 3, 6], np.float32))
    w = flow.runtime.session.default().variables["w"].numpy()
    np.testing.assert_allclose(w, [1.0 - 3.0])


def test_sgd_momentum_default_and_adam_defaults():
    assert flow.optimizer.SGD(0.1).momentum == 0.9
    adam = flow.optimizer.Adam(0.1)
    assert (adam.beta1, adam.beta2, adam.epsilon, adam.do_bias_correction) == (0.9, 0.999, 1e-8, False)


def _quadratic_job(optimizer_factory, name):
    @flow.global_function(type="train")
    def job(t: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        w = flow.get_variable(name, shape=(3,), initializer=flow.zeros_initializer())
        loss = flow.math.reduce_sum(flow.math.square(w - t))
        optimizer_factory().minimize(loss)
        return loss
    return job


@pytest.mark.parametrize("factory", [
    lambda: flow.optimizer.SGD(0.1),
    lambda: flow.optimizer.SGD(0.1, momentum=0),
    lambda: flow.optimizer.Adam(0.1),
    lambda: flow.optimizer.Adam(0.1, do_bias_correction=True),
    lambda: flow.optimizer.AdamW(0.1, weight_decay=1e-4),
    lambda: flow.optimizer.SGD(flow.optimizer.CosineScheduler(0.2, 400), momentum=0.5,
                               grad_clipping=flow.optimizer.grad_clipping.by_global_norm(1.0)),
])
def test_optimizers_converge(factory):
    job = _quadratic_job(factory, "w")
    target = np.array([1.0, -2.0, 0.5], np.float32)
    for _ in range(400):
        loss = job(target)
    assert float(loss) < 1e-3


def _one_step(optimizer, grad_target):
    """Update of w (start 1.0) by one step on loss = sum(w * g)."""
    flow.clear_default_session()

    @flow.global_function(type="train")
    def job(g: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(2,), initializer=flow.constant_initializer(1.0))
        loss = flow.math.reduce_sum(w * g)
        optimizer.minimize(loss)
        return loss

    job(grad_target)
    job(grad_target)
    return flow.runtime.session.default().variables["w"].numpy()


def test_update_rules_match_numpy_references():
    g = np.array([0.5, -2.0], np.float32)
    # SGD with momentum 0.9, two steps: m1 = -lr g; m2 = 0.9 m1 - lr g.
    lr = 0.1
    m1 = -lr * g
    expected = 1 + m1 + (0.9 * m1 - lr * g)
    np.testing.assert_allclose(_one_step(flow.optimizer.SGD(lr), g), expected, rtol=1e-6)
    # Adam without bias correction, two steps.
    w, m, v = np.ones(2), np.zeros(2), np.zeros(2)
    for _ in range(2):
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        w = w - lr * m / (np.sqrt(v) + 1e-8)
    np.testing.assert_allclose(_one_step(flow.optimizer.Adam(lr), g), w, rtol=1e-5)
    # Adam with bias correction and AdamW decay.
    w, m, v = np.ones(2), np.zeros(2), np.zeros(2)
    for t in (1, 2):
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        lr_t = lr * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
        w = w - lr_t * (m / (np.sqrt(v) + 1e-8) + 0.01 * w)
    np.testing.assert_allclose(_one_step(flow.optimizer.AdamW(lr, do_bias_correction=True, weight_decay=0.01), g),
                               w, rtol=1e-5)


def test_grad_clipping_by_global_norm():
    g = np.array([3.0, 4.0], np.float32)   # norm 5 -> clipped to norm 1
    w = _one_step(flow.optimizer.SGD(1.0, momentum=0, grad_clipping=flow.optimizer.grad_clipping.by_global_norm(1.0)),
                  g)
    np.testing.assert_allclose(w, 1 - 2 * g / 5, rtol=1e-6)


def test_schedulers():
    s = flow.optimizer.PiecewiseConstantScheduler([10, 20], [1.0, 0.5, 0.1])
    assert [s(0), s(10), s(11), s(20), s(21)] == [1.0, 1.0, 0.5, 0.5, 0.1]   # OneFlow: step <= boundary
    c = flow.optimizer.CosineScheduler(1.0, 100, alpha=0.1)
    assert c(0) == pytest.approx(1.0) and c(50) == pytest.approx(0.55) and c(200) == pytest.approx(0.1)
    w = flow.optimizer.PiecewiseConstantScheduler([], [1.0], warmup=flow.optimizer.warmup.linear(10, 0.0))
    assert w(0) == 0.0 and w(5) == pytest.approx(0.5) and w(10) == 1.0
    with pytest.raises(ValueError, match="len\\(values\\) == len\\(boundaries\\) \\+ 1"):
        flow.optimizer.PiecewiseConstantScheduler([1], [0.1])


def test_old_style_config_and_add_loss_trains_with_plain_sgd():
    config = flow.function_config()
    config.default_data_type(flow.float)
    config.train.primary_lr(0.5)
    config.train.model_update_conf({"naive_conf": {}})

    @flow.global_function(config)
    def job(x=flow.FixedTensorDef((2,))):
        w = flow.get_variable("w", shape=(2,), initializer=flow.constant_initializer(1.0))
        loss = w * x
        flow.losses.add_loss(loss)
        return loss

    job(np.array([1.0, 3.0], np.float32)).get()
    # grad of w_i is x_i, scaled by 1/2 (two loss elements); lr 0.5; no momentum.
    np.testing.assert_allclose(flow.runtime.session.default().variables["w"].numpy(), [0.75, 0.25])


# ------------------------------------------------------------------------------------------------------------ errors

def _simple_job():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2, 3)), y: tp.Numpy.Placeholder((3,), dtype=flow.int32)) -> tp.Numpy:
        return x + 1.0
    return job


def test_feed_errors_name_argument_expected_and_got():
    job = _simple_job()
    x, y = np.zeros((2, 3), np.float32), np.zeros(3, np.int32)
    with pytest.raises(FeedError, match=r"takes 2 argument\(s\) \(x, y\), got 3"):
        job(x, y, y)
    with pytest.raises(FeedError, match=r"argument 'x': expected shape \(2, 3\), got \(3, 2\)"):
        job(np.zeros((3, 2), np.float32), y)
    with pytest.raises(FeedError, match=r"argument 'y': expected dtype int32, got int64"):
        job(x, np.zeros(3, np.int64))
    with pytest.raises(FeedError, match=r"argument 'x': expected a numpy.ndarray .* got list"):
        job([[0, 0, 0]], y)
    with pytest.raises(FeedError, match=r"argument 'y' is missing"):
        job(x=x, z=y)


def test_definition_errors():
    with pytest.raises(TypeError, match="argument 'x' needs a placeholder"):
        @flow.global_function()
        def job(x):
            return x
    with pytest.raises(ValueError, match="type must be 'predict' or 'train'"):
        flow.global_function(type="training")
    with pytest.raises(TypeError, match="unsupported return annotation"):
        @flow.global_function()
        def job2(x: tp.Numpy.Placeholder((1,))) -> int:
            return x


def test_shape_error_at_trace_names_the_users_line():
    @flow.global_function()
    def job(a: tp.Numpy.Placeholder((2, 3)), b: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        return flow.matmul(a, b)

    with pytest.raises(ShapeError, match=r"flow.matmul: inner dimensions differ.*test_job.py:\d+"):
        job(np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32))


def test_op_outside_job_and_minimize_without_variables():
    with pytest.raises(TraceError, match="outside a job function.*global_function"):
        flow.nn.relu(np.zeros(3))

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        loss = flow.math.square(x)
        flow.optimizer.SGD(0.1).minimize(loss)
        return loss

    with pytest.raises(TraceError, match="does not depend on any trainable variable"):
        job(np.zeros(3, np.float32))

    @flow.global_function()
    def predict(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        w = flow.get_variable("w3", shape=(3,))
        flow.optimizer.SGD(0.1).minimize(x * w)
        return x

    with pytest.raises(TraceError, match="predict job"):
        predict(np.zeros(3, np.float32))


def test_variable_redeclared_with_another_shape():
    @flow.global_function()
    def a(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        return flow.layers.dense(x, 4, name="enc")

    @flow.global_function()
    def b(x: tp.Numpy.Placeholder((2, 5))) -> tp.Numpy:
        return flow.layers.dense(x, 4, name="enc")

    a(np.zeros((2, 3), np.float32))
    with pytest.raises(ShapeError, match=r"variable 'enc-weight' was declared with shape \(4, 3\).*\(4, 5\)"):
        b(np.zeros((2, 5), np.float32))


def test_graph_prints_and_plan_reuses_buffers():
    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((16, 8)), y: tp.Numpy.Placeholder((16,), dtype=flow.int32)) -> tp.Numpy:
        h = flow.layers.dense(x, 32, activation=flow.nn.relu, name="h1")
        h = flow.layers.dense(h, 32, activation=flow.nn.relu, name="h2")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, flow.layers.dense(h, 4, name="o"))
        flow.optimizer.SGD(0.1).minimize(loss)
        return loss

    job(np.zeros((16, 8), np.float32), np.zeros(16, np.int32))
    text = str(job.graph())
    assert "h1_matmul" in text and "MatMul" in text and "SGDUpdate" in text
    plan = job.plan()
    produced = [n for n in plan.nodes if n.op.supports_out and n.outputs]
    assert plan.num_buffers < len(produced)         # liveness lets buffers serve several tensors
    assert "h1-weight-SGDUpdate" in plan.source
    # the gradient of the input x is never computed: pruned
    assert not any(n.name.startswith("System-AutoGrad-h1_matmul") and n.outputs[0].shape == (16, 8)
                   for n in plan.nodes)


def test_float64_train_job():
    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((4, 2), dtype=flow.float64)) -> tp.Numpy:
        w = flow.get_variable("w64", shape=(1, 2), dtype=flow.float64, initializer=flow.constant_initializer(1.0))
        loss = flow.math.reduce_sum(flow.matmul(x, w, transpose_b=True), axis=1)
        flow.optimizer.SGD(0.5, momentum=0).minimize(loss)
        return loss

    x = np.arange(8, dtype=np.float64).reshape(4, 2)
    assert job(x).dtype == np.float64
    np.testing.assert_allclose(flow.runtime.session.default().variables["w64"].numpy(),
                               1 - 0.5 * x.mean(0, keepdims=True))


def test_string_annotations_naming_locals_get_a_clear_error():
    code = ("from __future__ import annotations\n"
            "import flowlab as flow\nimport flowlab.typing as tp\n"
            "def build(n):\n"
            "    @flow.global_function()\n"
            "    def job(x: tp.Numpy.Placeholder((n,))) -> tp.Numpy:\n"
            "        return x\n"
            "    return job\n"
            "WIDTH = 3\n"
            "@flow.global_function()\n"
            "def ok(x: tp.Numpy.Placeholder((WIDTH,))) -> tp.Numpy:\n"
            "    return x * 2.0\n")
    namespace = {}
    exec(compile(code, "<future_annotations>", "exec"), namespace)
    np.testing.assert_array_equal(namespace["ok"](np.ones(3, np.float32)), [2, 2, 2])
    with pytest.raises(TypeError, match=r"job function build.<locals>.job: .*cannot be evaluated: name 'n' is not "
                                        r"defined.*enclosing function's local variables"):
        namespace["build"](4)
