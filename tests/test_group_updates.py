"""The compiler's ``group_small_updates`` pass (``compiler.group_updates``): the Adam updates of small variables run as
one ``AdamGroupUpdate`` over their arrays laid end to end, and train to the bit as their own updates do: Adam with
bias correction and clipping, AdamW whose decay skips the biases (two groups), a dynamic loss scale that skips a
step with Inf gradients; and variables read between the first and the last of a set keep their own updates."""
import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.compiler import passes
from flowlab.optim.optimizers import AdamGroupUpdate, AdamUpdate

pytestmark = pytest.mark.numpy_backend        # a NumPy pass

BATCH, FEATURES, HIDDEN = 16, 12, 20


def job_with_small_variables(optimizer):
    """Dense layers, a layer norm and a bias of their own: nine variables, all under BLAS_PASS_FROM elements."""
    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((BATCH, FEATURES)), y: tp.Numpy.Placeholder((BATCH, FEATURES))) -> tp.Numpy:
        h = flow.layers.dense(x, HIDDEN, activation=flow.math.gelu, name="d0")
        h = flow.layers.layer_norm(h, name="ln")
        h = flow.layers.dense(h, HIDDEN, activation=flow.math.tanh, name="d1")
        out = flow.layers.dense(h, FEATURES, name="d2")
        shift = flow.get_variable("shift", shape=(FEATURES,), initializer=flow.constant_initializer(0.1))
        loss = flow.math.reduce_mean(flow.math.square(out + shift - y), axis=1)
        optimizer().minimize(loss)
        return loss
    return job


def train(grouped, optimizer, monkeypatch, steps=5, feeds=None):
    """``(losses, {variable: value} incl. moments, the job's plan)`` after ``steps`` calls, with the pass or
    without it."""
    monkeypatch.setattr(passes, "PASSES", tuple(p for p in passes.PASSES
                                                if grouped or p is not passes.group_small_updates))
    flow.clear_default_session()
    job = job_with_small_variables(optimizer)
    batch = np.random.default_rng(3).standard_normal((BATCH, FEATURES)).astype(np.float32)
    losses = []
    for step in range(steps):
        x = batch.copy()                                # one batch: the loss falls
        if feeds is not None:
            x = feeds(step, x)
        losses.append(job(x, np.sin(batch)).copy())
    weights = {name: v.numpy().copy() for name, v in flow.get_all_variables().items()}
    monkeypatch.undo()
    return losses, weights, job.plan()


def schedule():
    return flow.optimizer.PiecewiseConstantScheduler([2], [0.05, 0.02])


OPTIMIZERS = {
    "adam": (lambda: flow.optimizer.Adam(schedule()), 1),
    "adam-bias-correction-clipped": (lambda: flow.optimizer.Adam(
        schedule(), beta1=0.8, beta2=0.95, epsilon=1e-3, do_bias_correction=True,
        grad_clipping=flow.optimizer.grad_clipping.by_global_norm(0.3)), 1),
    "adamw-decay-but-biases": (lambda: flow.optimizer.AdamW(schedule(), weight_decay=0.3,
                                                            weight_decay_excludes="bias"), 2),
}


@pytest.mark.parametrize("case", OPTIMIZERS)
def test_grouped_updates_train_to_the_bit_as_one_update_each(case, monkeypatch):
    optimizer, groups = OPTIMIZERS[case]
    alone, alone_weights, alone_plan = train(False, optimizer, monkeypatch)
    together, together_weights, plan = train(True, optimizer, monkeypatch)
    grouped = [n for n in plan.nodes if n.op is AdamGroupUpdate]
    assert len(grouped) == groups
    assert sum(n.attrs["count"] for n in grouped) == 9 and not any(n.op is AdamUpdate for n in plan.nodes)
    assert f"group_small_updates: 9 updates in {groups} groups" in plan.describe_passes()
    assert not any(n.op is AdamGroupUpdate for n in alone_plan.nodes)
    for a, b in zip(alone, together):
        np.testing.assert_array_equal(a, b)
    assert alone_weights.keys() == together_weights.keys() and any(k.endswith("-m") for k in alone_weights)
    for name, value in alone_weights.items():
        np.testing.assert_array_equal(together_weights[name], value, err_msg=name)
    assert np.mean(alone[-1]) < np.mean(alone[0])          # it trains


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")     # the Inf fed on purpose
def test_a_step_a_dynamic_loss_scale_skips_changes_no_grouped_variable(monkeypatch):
    """Step 2 feeds an Inf: the scale's NaN/Inf count makes the grouped update return before it writes anything,
    as each update alone does."""
    def optimizer():
        return flow.optimizer.Adam(schedule(), do_bias_correction=True,
                                   loss_scale_policy=flow.optimizer.loss_scale.dynamic_loss_scale(2 ** 10))

    def feeds(step, x):
        if step == 2:
            x[0, 0] = np.inf
        return x
    _, before, _ = train(True, optimizer, monkeypatch, steps=2)
    _, skipped, plan = train(True, optimizer, monkeypatch, steps=3, feeds=feeds)
    assert any(n.op is AdamGroupUpdate for n in plan.nodes)
    for name, value in before.items():
        if "LossScale" not in name:
            np.testing.assert_array_equal(skipped[name], value, err_msg=name)
    _, alone, _ = train(False, optimizer, monkeypatch, steps=5, feeds=feeds)
    _, together, _ = train(True, optimizer, monkeypatch, steps=5, feeds=feeds)
    for name, value in alone.items():
        np.testing.assert_array_equal(together[name], value, err_msg=name)


def test_updates_stay_apart_when_a_node_between_them_reads_their_variables():
    """A set whose first and last update have a reader of a member's variable between them is not grouped (the
    grouped update sits where the last was: the reader would see the variable before its update instead of after)."""
    from flowlab.compiler.group_updates import group_small_updates
    from flowlab.graph import Node
    flow.clear_default_session()
    job = job_with_small_variables(lambda: flow.optimizer.Adam(schedule()))
    graph = job.compiled().plan.graph
    nodes = list(graph.nodes)
    updates = [n for n in nodes if n.op is AdamUpdate]
    assert len(group_small_updates(nodes)[1]) == 1
    first = nodes.index(updates[0])
    reader = Node(flow.ops.math.Square, "reads-a-member", (updates[-1].inputs[0],), {}, "test", None)
    kept, sizes = group_small_updates(nodes[:first + 1] + [reader] + nodes[first + 1:])
    assert sizes == [] and sum(n.op is AdamUpdate for n in kept) == len(updates)
