"""Transformer health (``flow.watch_health`` on ``flowlab.examples.bert``): every attention block, layer norm and
feed-forward layer is listed; attention entropy per head and the residual stream's growth are measured, and their
alerts fire on deliberately broken nets (unscaled scores at a large initialisation, heads that cannot learn, branches
that drown the stream) and stay quiet on a healthy one."""
import math

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.examples import bert
from flowlab.health import HealthReport, find_attention, find_residuals, health_alerts
from flowlab.ops.stats import attention_vector

BATCH, SEQ, PREDICTIONS, VOCAB = 8, 16, 3, 24


def watched_bert(steps, lr=1e-3, window=3, before_health=None, writer=None, **builder_options):
    """Reports of ``steps`` train steps of a 2-layer, 2-head BERT built with ``builder_options`` (and the job);
    ``before_health()`` runs in the job before ``watch_health``; ``writer`` also takes the reports."""
    builder = bert.BertBuilder(VOCAB, hidden=16, layers=2, heads=2, max_positions=SEQ, dropout=0.0,
                               attention_dropout=0.0, **builder_options)
    ids = tp.Numpy.Placeholder((BATCH, SEQ), dtype=flow.int32)
    picks = tp.Numpy.Placeholder((BATCH, PREDICTIONS), dtype=flow.int32)
    weights = tp.Numpy.Placeholder((BATCH, PREDICTIONS), dtype=flow.float32)
    labels = tp.Numpy.Placeholder((BATCH, 1), dtype=flow.int32)
    reports = []

    @flow.global_function(type="train")
    def train(input_ids: ids, input_mask: ids, segment_ids: ids, positions: picks, label_ids: picks,
              label_weights: weights, nsp: labels) -> tp.Numpy:
        total, _, _ = builder.pretraining_losses(input_ids, input_mask, segment_ids, positions, label_ids,
                                                 label_weights, nsp)
        flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [lr]), do_bias_correction=True
                            ).minimize(total)
        if before_health is not None:
            before_health()
        flow.watch_health(reports.append, window=window, writer=writer)
        return total

    examples = bert.pretraining_examples(BATCH * steps, seq_length=SEQ, vocab_size=VOCAB,
                                         max_predictions=PREDICTIONS, seed=5)
    for batch in bert.batches(examples, BATCH):
        train(*batch)
    flow.sync_default_session()       # the handler runs on the watch dispatcher's thread
    return reports, train


def kinds(report):
    return {a.kind for a in report.alerts}


TRANSFORMER_ALERTS = {"attention_collapsed", "attention_uniform", "residual_growth"}


def test_reports_list_every_block_and_a_healthy_net_raises_no_transformer_alert():
    reports, _ = watched_bert(3)
    report = reports[-1]
    for i in range(2):
        layer = f"bert-encoder-layer_{i}"
        for name in ("attention-self-query", "attention-self-key", "attention-self-value", "attention-output-dense",
                     "attention-output-LayerNorm", "intermediate-dense", "output-dense", "output-LayerNorm"):
            assert f"{layer}-{name}" in report.table
        assert len(report.attention[f"{layer}-attention-self"]) == 2                      # one entropy per head
        assert {f"{layer}-attention-output-residual", f"{layer}-output-residual"} <= set(report.residual)
    assert list(report.attention) == [f"bert-encoder-layer_{i}-attention-self" for i in range(2)]
    assert len(report.residual) == 4
    # a small initialisation: every head near uniform, every branch small beside its stream
    for heads in report.attention.values():
        assert all(0.99 < e <= 1.0 for e in heads)
    for row in report.residual.values():
        assert row["growth"] == pytest.approx(1.0, abs=0.05) and row["branch_ratio"] < 0.2
        assert row["stream_norm"] == pytest.approx(math.sqrt(BATCH * SEQ * 16), rel=0.05)   # a layer norm's output
    assert not any(kinds(r) & TRANSFORMER_ALERTS for r in reports)      # uniform, but not yet for a whole window


def test_watch_health_lists_the_whole_encoder_in_forward_order():
    """Every layer of the encoder, each with its statistics: the embeddings (a layer of tables, where they are first
    read), every layer norm and feed-forward layer with activation statistics (the layer norm's output: its beta
    add), every attention block with a row per head, then the heads of the two losses."""
    reports, _ = watched_bert(1)
    report = reports[0]
    per_layer = ["attention-self-query", "attention-self-key", "attention-self-value", "attention-output-dense",
                 "attention-output-LayerNorm", "intermediate-dense", "output-dense", "output-LayerNorm"]
    assert list(report.table) == ["bert-embeddings", "bert-embeddings-LayerNorm"] + [
        f"bert-encoder-layer_{i}-{name}" for i in range(2) for name in per_layer] + [
        "cls-predictions-transform-dense", "cls-predictions-transform-LayerNorm", "cls-predictions",
        "bert-pooler-dense", "cls-seq_relationship"]
    for layer, row in report.table.items():
        assert row["grad_norm"] > 0 and row["weight_norm"] > 0 or layer == "cls-predictions", layer
        if "LayerNorm" in layer or "dense" in layer:
            assert row["act_std"] > 0, layer
    # a layer norm's output is normalized: per row mean 0, variance 1 (gamma 1, beta 0 at the first step)
    for i in range(2):
        row = report.table[f"bert-encoder-layer_{i}-output-LayerNorm"]
        assert row["act_std"] == pytest.approx(1.0, abs=0.01)
    assert "act_std" not in report.table["bert-embeddings"]          # tables only: read by ops of other names
    assert list(report.attention) == [f"bert-encoder-layer_{i}-attention-self" for i in range(2)]
    assert all(len(heads) == 2 for heads in report.attention.values())


def test_entropy_and_residual_numbers_are_those_of_the_tensors():
    """The report's numbers recomputed from the same call's attention probabilities and residual tensors, watched."""
    from flowlab import graph as g
    seen = {}

    def watch_parts():
        graph = g.current_graph("test")
        for block, probs in find_attention(graph):
            flow.watch(probs, lambda v, block=block: seen.__setitem__(block, v))
        for r in find_residuals(graph):
            for part in ("out", "stream", "branch"):
                flow.watch(getattr(r, part), lambda v, key=(r.name, part): seen.__setitem__(key, v))

    reports, _ = watched_bert(1, init_range=0.5, before_health=watch_parts)
    report = reports[-1]
    for block, heads in report.attention.items():
        np.testing.assert_allclose(heads, attention_vector(np, seen[block]), rtol=1e-6)
        assert 0.05 < min(heads) < 0.99           # neither collapsed nor uniform at this initialisation
    for name, row in report.residual.items():
        norm = {part: np.linalg.norm(seen[(name, part)].astype(np.float64)) for part in ("out", "stream", "branch")}
        assert row["stream_norm"] == pytest.approx(norm["stream"], rel=1e-5)
        assert row["growth"] == pytest.approx(norm["out"] / norm["stream"], rel=1e-5)
        assert row["branch_ratio"] == pytest.approx(norm["branch"] / norm["stream"], rel=1e-5)


def test_attention_vector_against_a_direct_computation():
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((3, 2, 5, 6)) * 3
    scores[..., 4:] = -10000.0                       # two padded keys: the entropy is over the other four
    scores[1, 0, :, :4] = 0.0                        # one uniform head of one example
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    want = np.zeros(2)
    for h in range(2):
        rows = [-(p[:4] * np.log(p[:4])).sum() / np.log(4) for b in range(3) for p in probs[b, h]]
        want[h] = np.mean(rows)
    np.testing.assert_allclose(attention_vector(np, probs.astype(np.float32)), want, rtol=1e-5)
    one_hot = np.zeros((1, 1, 2, 3))
    one_hot[..., 1] = 1.0
    assert attention_vector(np, one_hot).tolist() == [0.0]


def test_unscaled_scores_at_a_large_initialisation_collapse_the_heads():
    reports, _ = watched_bert(1, init_range=1.0, scale_attention=False)
    report = reports[0]
    assert "attention_collapsed" in kinds(report)
    alert = next(a for a in report.alerts if a.kind == "attention_collapsed")
    assert alert.layer in report.attention and "1/sqrt(head size)" in alert.message
    assert min(min(heads) for heads in report.attention.values()) < 0.05


def test_heads_that_cannot_learn_stay_uniform_and_are_reported_after_a_window():
    reports, _ = watched_bert(5, lr=0.0, window=3)
    assert not any("attention_uniform" in kinds(r) for r in reports[:3])     # not before a whole window
    assert all("attention_uniform" in kinds(r) for r in reports[3:])
    alert = next(a for a in reports[-1].alerts if a.kind == "attention_uniform")
    assert "learn nothing" in alert.message and alert.layer.endswith("attention-self")


def test_branches_that_drown_the_stream_are_reported():
    reports, _ = watched_bert(1, init_range=3.0)
    report = reports[0]
    grown = [a.layer for a in report.alerts if a.kind == "residual_growth"]
    assert grown and all(report.residual[name]["growth"] > 10 for name in grown)
    assert all(name.endswith("-residual") for name in grown)


def test_rules_are_pure_functions_of_the_numbers():
    def report(step, heads, growth):
        return HealthReport(step, {}, attention={"blk": heads},
                            residual={"sum": {"stream_norm": 1.0, "growth": growth, "branch_ratio": growth - 1}})
    history = [report(s, [0.99, 0.5], 1.1) for s in range(2)]
    now = report(2, [0.995, 0.01], 50.0)
    got = [(a.kind, a.layer) for a in health_alerts(history, now, {"window": 2})]
    assert got == [("attention_collapsed", "blk"), ("attention_uniform", "blk"), ("residual_growth", "sum")]
    assert "head 0 of attention block blk still attends" in health_alerts(history, now, {"window": 2})[1].message
    assert health_alerts(history, now, {"window": 3, "attention_collapsed": 0.001, "residual_growth": 100}) == []


def test_networks_without_attention_get_no_transformer_rows():
    @flow.global_function(type="train")
    def residual_mlp(x: tp.Numpy.Placeholder((4, 8))) -> tp.Numpy:
        h = flow.layers.dense(x, 8, activation=flow.nn.relu, name="hidden")
        y = flow.layers.dense(x + h, 1, name="out")
        loss = flow.math.reduce_mean(y * y)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
        flow.watch_health(reports.append)
        return loss
    reports = []
    residual_mlp(np.ones((4, 8), np.float32))
    flow.sync_default_session()
    assert reports[0].attention == {} and reports[0].residual == {}
    graph = residual_mlp.compiled(((4, 8),)).graph
    residuals = find_residuals(graph)
    assert find_attention(graph) == [] and len(residuals) == 1     # a residual sum, but no attention: not watched
    assert residuals[0].stream.node.op.is_placeholder and residuals[0].branch.node.name.startswith("hidden")


# ------------------------------------------------------------------------------------------------ transformer-aware

def test_query_and_key_projections_are_read_as_making_their_blocks_scores():
    """Roles from the graph: the layers a block's softmax reaches through no other layer (query, key), not the value
    projection; a layer of vectors only (the masked-LM output bias) is one."""
    from flowlab.health import find_layers, roles_of
    _, job = watched_bert(1)
    roles = roles_of(find_layers(job.graph()))
    for i in range(2):
        block = f"bert-encoder-layer_{i}-attention-self"
        assert roles[f"{block}-query"].attention == block and roles[f"{block}-key"].attention == block
        assert roles[f"{block}-value"].attention is None
        assert roles[f"bert-encoder-layer_{i}-intermediate-dense"].attention is None
    assert [name for name, role in roles.items() if role.attention] == [
        f"bert-encoder-layer_{i}-attention-self-{p}" for i in range(2) for p in ("query", "key")]
    assert roles["cls-predictions"].vectors_only and not roles["cls-predictions-transform-dense"].vectors_only


def test_a_healthy_bert_raises_no_alert_in_its_first_steps_and_a_broken_one_still_vanishes():
    """At initialisation the query and key gradients are ~1e-4 of the output layer's (uniform attention, small
    weights): by design, no vanishing_gradient while the heads are uniform. Nor an update_ratio on the zero-initialised
    output bias. No warm-up at a learning rate of 1 saturates the heads: the query/key gradients then do vanish,
    and the alert says so."""
    healthy, _ = watched_bert(10, window=20)
    q = healthy[0].table["bert-encoder-layer_0-attention-self-query"]["grad_norm"]
    assert q < 1e-3 * healthy[0].table["cls-seq_relationship"]["grad_norm"]      # what used to raise the alert
    assert [(r.step, a.kind, a.layer) for r in healthy for a in r.alerts] == []
    broken, _ = watched_bert(10, window=20, lr=1.0)
    vanished = {a.layer for r in broken for a in r.alerts if a.kind == "vanishing_gradient"}
    assert vanished & {f"bert-encoder-layer_{i}-attention-self-{p}" for i in range(2) for p in ("query", "key")}
    assert any(a.kind == "attention_collapsed" for r in broken for a in r.alerts)


def test_the_score_layers_relief_holds_only_while_their_heads_are_uniform():
    from flowlab.health import LayerRole
    roles = {"q": LayerRole(relu=False, attention="block", size=10), "v": LayerRole(relu=False, size=10),
             "out": LayerRole(relu=False, size=10)}

    def alerts(q_grad, heads):
        table = {"q": {"grad_norm": q_grad}, "v": {"grad_norm": 0.5}, "out": {"grad_norm": 1.0}}
        return [(a.kind, a.layer) for a in health_alerts([], HealthReport(0, table, attention={"block": heads}),
                                                         roles=roles)]
    assert alerts(1e-5, [0.999, 0.995]) == []                               # uniform heads: tiny by design
    assert alerts(1e-5, [0.999, 0.6]) == [("vanishing_gradient", "q")]       # a head attends: it must learn
    assert alerts(0.0, [0.999, 0.995]) == [("vanishing_gradient", "q")]      # no gradient at all: always
    plain = {**roles, "q": LayerRole(relu=False, size=10)}
    table = {"q": {"grad_norm": 1e-5}, "v": {"grad_norm": 0.5}, "out": {"grad_norm": 1.0}}
    assert [a.layer for a in health_alerts([], HealthReport(0, table, attention={"block": [1.0]}), roles=plain)] \
        == ["q"]                                                             # a layer not making scores: as before
