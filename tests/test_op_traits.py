"""Adding an op touches its own module only: the compiler, the devices and health learn what they need from the
traits an op class declares (``flowlab.ops.Op``), never from its name. These tests declare new ops here, outside
flowlab, and check that each part of flowlab treats them by their traits."""
import ast
import pathlib
import re

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.errors import ShapeError
from flowlab.health import find_layers
from flowlab.ops import Op, apply, spec, ufunc_op
from flowlab.ops.math import _FloatUnary, _Unary, multiply
from flowlab.runtime.devices import join_kinds

ROOT = pathlib.Path(flow.__file__).parent


def _export_lines(source):
    """The line numbers of a module's ``__all__`` list, whose strings name what it exports, not ops it dispatches on."""
    lines = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            lines.update(range(node.lineno, node.end_lineno + 1))
    return lines


def test_no_part_of_flowlab_dispatches_on_an_op_class_name():
    pattern = re.compile(r"op\.__name__\s*(==|!=|in\b)|__name__\s+in\s+\w*OPS|\"(Input|Constant|SGDUpdate|Relu)\"\s*[:,)]")
    offenders = []
    for path in ROOT.rglob("*.py"):
        if "dashboard" in path.parts:
            continue
        source = path.read_text()
        exports = _export_lines(source)
        offenders += [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
                      for n, line in enumerate(source.splitlines(), 1) if n not in exports and pattern.search(line)]
    assert offenders == []


class Softplus(Op):
    """log(1 + exp(x)): positive, and no op flowlab knows by name."""
    prefix, api = "Softplus_", "test.softplus"
    nonnegative = True

    @staticmethod
    def infer(x):
        return spec(x.shape, x.dtype)

    @staticmethod
    def forward(xp, x):
        return xp.logaddexp(0, x)

    @staticmethod
    def vjp(node, dy):
        return (multiply(dy, flow.math.sigmoid(node.inputs[0])),)


def softplus(x, name=None):
    return apply(Softplus, (x,), name)


def test_health_reads_a_new_activation_as_nonnegative_by_its_trait():
    flow.clear_default_session()

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((8, 4))) -> tp.Numpy:
        hidden = flow.layers.dense(x, 6, activation=softplus, name="hidden")
        out = flow.layers.dense(hidden, 3, activation=flow.math.tanh, name="out")
        loss = flow.math.reduce_mean(flow.math.square(out))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss

    job(np.ones((8, 4), np.float32))
    layers = {layer.name: layer.nonnegative for layer in find_layers(job.graph())}
    assert layers == {"hidden": True, "out": False}


class Ramp(Op):
    """A data source of this test: row i of the batch is filled with i + step; its output is a whole batch."""
    prefix, api = "Ramp_", "test.ramp"
    batch_source = True

    @staticmethod
    def infer(batch, width):
        return spec((batch, width), np.float32)

    @staticmethod
    def forward(xp, batch, width):
        return xp.repeat(xp.arange(batch, dtype=np.float32)[:, None], width, axis=1)


def test_devices_split_a_new_batch_source_like_an_argument():
    """Without the trait its output (no inputs) would count as the same on every device and one device's rows
    would come back; with it, the devices' pieces are concatenated like a split argument's. (How a data op makes
    each device its share of the logical batch is the op's own business.)"""
    flow.clear_default_session()
    flow.config.cpu_device_num(2)
    try:
        @flow.global_function()
        def job() -> tp.Numpy:
            rows = apply(Ramp, (), batch=8, width=3)
            return flow.math.reduce_sum(rows, axis=1)

        assert list(job()) == [3.0 * i for i in range(8)] * 2     # both devices' pieces
        kinds = join_kinds(job.graph())
        source = next(n for n in job.graph().nodes if n.op is Ramp)
        assert kinds[source.output.id] == "split"
    finally:
        flow.clear_default_session()


def test_a_new_reduction_joins_over_devices_by_its_reduction_trait():
    class ReduceMin(Op):
        prefix, api, reduction = "ReduceMin_", "test.reduce_min", "min"

        @staticmethod
        def infer(x, axes):
            return spec([d for i, d in enumerate(x.shape) if i not in axes], x.dtype)

        @staticmethod
        def forward(xp, x, axes):
            return xp.min(x, axis=axes)

        split_join = staticmethod(lambda node, kinds: "min" if 0 in node.attrs["axes"] else "split")

    flow.clear_default_session()
    flow.config.cpu_device_num(2)
    try:
        @flow.global_function()
        def job(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
            return apply(ReduceMin, (x,), axes=(0,))

        x = np.arange(12, dtype=np.float32).reshape(4, 3)[::-1].copy()
        assert np.array_equal(job(x), x.min(axis=0))     # each device's minimum, joined by their minimum
    finally:
        flow.clear_default_session()


Cube = ufunc_op(_FloatUnary, "Cube", "test.cube", "power", "({0} * {0} * {0})")


def test_ufunc_op_declares_a_complete_elementwise_op_in_one_statement():
    Reciprocal = ufunc_op(_FloatUnary, "Reciprocal", "test.reciprocal", "reciprocal", "((T)1 / {0})",
                          vjp=lambda node, dy: (flow.math.negative(multiply(dy, multiply(node.output, node.output))),))
    assert Reciprocal.__module__ == __name__ and Reciprocal.prefix == "Reciprocal_"
    assert Reciprocal.supports_out and Reciprocal.inplace and Reciprocal.c_expr == "((T)1 / {0})"
    flow.clear_default_session()

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((5,), dtype=flow.float64)) -> tp.Numpy:
        w = flow.get_variable("w", shape=(5,), dtype=flow.float64, initializer=flow.constant_initializer(2.0))
        y = apply(Reciprocal, (x * w,))
        flow.watch_diff(w, lambda g: grads.append(g))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0]), momentum=0).minimize(y)
        return y

    grads = []
    x = np.array([1.0, 2.0, -4.0, 0.5, 3.0])
    assert np.allclose(job(x), 1 / (2 * x))
    flow.sync_default_session()
    assert np.allclose(grads[0], -1 / (x * 4))      # d(1/(xw))/dw = -1/(x w^2), as watch_diff sees it (unscaled)
    with pytest.raises(ShapeError, match="test.reciprocal: expects a floating-point tensor"):
        @flow.global_function()
        def integer_job(x: tp.Numpy.Placeholder((5,), dtype=flow.int32)) -> tp.Numpy:
            return apply(Reciprocal, (x,))
        integer_job(np.ones(5, np.int32))


def test_unary_and_binary_ufunc_ops_keep_their_kernels_and_names():
    from flowlab.ops import math as m
    x = np.array([-2.0, 0.5, 3.0], np.float32)
    y = np.array([1.0, -1.0, 2.0], np.float32)
    for op, expected in [(m.Add, x + y), (m.Subtract, x - y), (m.Multiply, x * y), (m.Divide, x / y),
                         (m.Maximum, np.maximum(x, y)), (m.Minimum, np.minimum(x, y))]:
        assert np.array_equal(op.forward(np, x, y), expected), op.__name__
        out = np.empty_like(x)
        assert op.forward(np, x, y, out=out) is out and np.array_equal(out, expected)
    for op, expected in [(m.Negative, -x), (m.Exp, np.exp(x)), (m.Square, x * x), (m.Abs, np.abs(x)),
                         (m.Sign, np.sign(x)), (m.Tanh, np.tanh(x))]:
        assert np.array_equal(op.forward(np, x), expected), op.__name__
    assert [op.prefix for op in (m.Subtract, m.Multiply, m.Divide, m.Negative)] == \
        ["Sub_", "Mul_", "Div_", "Negative_"]      # OneFlow's names of unnamed nodes
    assert m.Exp.nonnegative and m.Abs.nonnegative and not m.Tanh.nonnegative and not _Unary.nonnegative


def test_ops_whose_sign_depends_on_their_arguments_say_so_per_node():
    """``clip_by_value(x, 0, 6)`` (MobileNet's relu6) and the fused BN-ReLU are non-negative; ``clip_by_value(x,
    -1, 1)`` and a plain batch norm are not: health tells dead units by it."""
    flow.clear_default_session()

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((4, 3, 5, 5))) -> tp.Numpy:
        h = flow.layers.conv2d(x, 4, 3, padding="SAME", name="conv")
        relu6 = flow.clip_by_value(flow.layers.batch_normalization(h, axis=1, name="plain_bn"), 0, 6, name="relu6")
        fused = flow.layers.batch_normalization_relu(relu6, axis=1, name="fused_bn")
        clipped = flow.layers.batch_normalization(fused, axis=1, name="clipped_bn")
        out = flow.clip_by_value(clipped, -1, 1, name="clipped_bn_clip")
        loss = flow.math.reduce_mean(flow.math.square(out))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        return loss

    job(np.random.default_rng(0).normal(size=(4, 3, 5, 5)).astype(np.float32))
    nodes = {n.name: n for n in job.graph().nodes}
    assert nodes["relu6"].op.is_nonnegative(nodes["relu6"]) and nodes["fused_bn"].op.is_nonnegative(nodes["fused_bn"])
    assert not nodes["clipped_bn_clip"].op.is_nonnegative(nodes["clipped_bn_clip"])
    assert not nodes["plain_bn"].op.is_nonnegative(nodes["plain_bn"])
    layers = {layer.name: layer.nonnegative for layer in find_layers(job.graph())}
    assert layers == {"conv": False, "plain_bn": False, "fused_bn": True, "clipped_bn": False}


class Gram(Op):
    """``x xᵀ``: a product flowlab does not know, declared to compute in float16 under auto mixed precision."""
    prefix, api = "Gram_", "test.gram"
    amp = "float16"

    @staticmethod
    def infer(x):
        return spec((x.shape[0], x.shape[0]), x.dtype)

    @staticmethod
    def forward(xp, x):
        return x @ x.T


def test_auto_mixed_precision_casts_around_a_new_op_by_its_trait(monkeypatch):
    from flowlab.compiler import amp
    monkeypatch.setattr(amp, "ON_NUMPY", True)
    config = flow.FunctionConfig()
    config.enable_auto_mixed_precision(True)

    @flow.global_function(function_config=config)
    def job(x: tp.Numpy.Placeholder((3, 4))) -> tp.Numpy:
        return flow.math.exp(apply(Gram, (x,)))

    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    got = job(x)
    gram = next(n for n in job.plan().nodes if n.op is Gram)
    assert [t.dtype for t in (*gram.inputs, *gram.outputs)] == [np.float16, np.float16]
    assert got.dtype == np.float32
    x16 = x.astype(np.float16)
    np.testing.assert_allclose(got, np.exp((x16 @ x16.T).astype(np.float32)), rtol=1e-6)
