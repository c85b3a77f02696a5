"""``flowlab.examples.bert``: the encoder's losses equal a PyTorch transcription with the same weights, its variables
carry OneFlow-Benchmark's names, it trains (the losses fall on the learnable data), and the data and OFRecord
writer follow BERT's keys and rules."""
import math

import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.data.ofrecord import read_records
from flowlab.examples import bert

SMALL = dict(seq_length=16, vocab_size=24, max_predictions=3)


def predict_losses(builder, batch):
    """The builder's three losses on ``batch`` (``KEYS`` order) in a predict job (no dropout)."""
    shapes = [a.shape for a in batch]

    @flow.global_function()
    def bert_losses(input_ids: tp.Numpy.Placeholder(shapes[0], dtype=flow.int32),
                    input_mask: tp.Numpy.Placeholder(shapes[1], dtype=flow.int32),
                    segment_ids: tp.Numpy.Placeholder(shapes[2], dtype=flow.int32),
                    positions: tp.Numpy.Placeholder(shapes[3], dtype=flow.int32),
                    label_ids: tp.Numpy.Placeholder(shapes[4], dtype=flow.int32),
                    weights: tp.Numpy.Placeholder(shapes[5], dtype=flow.float32),
                    nsp_labels: tp.Numpy.Placeholder(shapes[6], dtype=flow.int32)) -> tp.Bundle[tp.Numpy]:
        return list(builder.pretraining_losses(input_ids, input_mask, segment_ids, positions, label_ids, weights,
                                               nsp_labels))
    return [float(v) for v in bert_losses(*batch)]


def torch_bert_losses(torch, t, batch, layers, heads, hidden):
    """BERT's pretraining losses ``(total, masked LM, next sentence)`` as PyTorch tensors, written directly in PyTorch
    from the tensors ``t`` (flowlab's variable names; their dtype is the computation's) and ``batch`` (NumPy, ``KEYS``
    order). The test's reference in float64, and ``benchmarks/bert.py``'s PyTorch side (float32, trained)."""
    F = torch.nn.functional
    dtype = t["bert-embeddings-word_embeddings"].dtype
    ids, mask, segments, positions, label_ids, weights, nsp = (torch.from_numpy(np.asarray(a)).long() if i != 5 else
                                                               torch.from_numpy(np.asarray(a)).to(dtype)
                                                               for i, a in enumerate(batch))
    b, s = ids.shape
    size = hidden // heads

    def dense(x, name):
        return torch.addmm(t[f"{name}-bias"], x, t[f"{name}-weight"])

    def norm(x, name):
        return F.layer_norm(x, (hidden,), t[f"{name}-LayerNorm-gamma"], t[f"{name}-LayerNorm-beta"], eps=1e-5)

    e = "bert-embeddings"
    x = t[f"{e}-word_embeddings"][ids] + t[f"{e}-token_type_embeddings"][segments] + \
        t[f"{e}-position_embeddings"][:, :s]
    x = norm(x, e).reshape(b * s, hidden)
    add_mask = (mask.to(dtype).reshape(b, 1, 1, s) - 1) * 10000
    for i in range(layers):
        p = f"bert-encoder-layer_{i}"
        q, k, v = (dense(x, f"{p}-attention-self-{n}").reshape(b, s, heads, size).transpose(1, 2)
                   for n in ("query", "key", "value"))
        probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(size) + add_mask, dim=-1)
        context = (probs @ v).transpose(1, 2).reshape(b * s, hidden)
        attended = norm(dense(context, f"{p}-attention-output-dense") + x, f"{p}-attention-output")
        inner = F.gelu(dense(attended, f"{p}-intermediate-dense"))
        x = norm(dense(inner, f"{p}-output-dense") + attended, f"{p}-output")
    sequence = x.reshape(b, s, hidden)
    picked = torch.gather(sequence, 1, positions[:, :, None].expand(-1, -1, hidden)).reshape(-1, hidden)
    picked = norm(F.gelu(dense(picked, "cls-predictions-transform-dense")), "cls-predictions-transform")
    logits = picked @ t[f"{e}-word_embeddings"].T + t["cls-predictions-output_bias"]
    per_token = F.cross_entropy(logits, label_ids.reshape(-1), reduction="none").reshape(b, -1) * weights
    mlm = (per_token.sum(-1) / (weights.sum(-1) + 1e-5)).mean()
    pooled = torch.tanh(dense(sequence[:, 0], "bert-pooler-dense"))
    nsp_logits = pooled @ t["cls-seq_relationship-output_weights"].T + t["cls-seq_relationship-output_bias"]
    nsp_loss = F.cross_entropy(nsp_logits, nsp.reshape(-1))
    return mlm + nsp_loss, mlm, nsp_loss


def torch_losses(torch, w, batch, layers, heads, hidden):
    """``torch_bert_losses`` in float64 from the variables ``w`` (name -> array), as floats."""
    t = {k: torch.from_numpy(np.asarray(v, np.float64)) for k, v in w.items()}
    return [float(v) for v in torch_bert_losses(torch, t, batch, layers, heads, hidden)]


def test_losses_equal_a_pytorch_transcription_with_the_same_weights():
    torch = pytest.importorskip("torch")
    examples = bert.pretraining_examples(8, **SMALL, seed=3)
    batch = bert.batches(examples, 8)[0]
    builder = bert.BertBuilder(SMALL["vocab_size"], hidden=16, layers=2, heads=2, max_positions=20, dropout=0.1,
                               attention_dropout=0.1, init_range=0.5)     # large weights: differences would show
    got = predict_losses(builder, batch)
    weights = {name: value.numpy() for name, value in flow.get_all_variables().items()}
    want = torch_losses(torch, weights, batch, layers=2, heads=2, hidden=16)
    np.testing.assert_allclose(got, want, rtol=2e-5)


def test_variables_carry_oneflow_benchmark_names():
    examples = bert.pretraining_examples(4, **SMALL)
    predict_losses(bert.BertBuilder(SMALL["vocab_size"], hidden=8, layers=1, heads=2, max_positions=20),
                   bert.batches(examples, 4)[0])
    names = set(flow.get_all_variables())
    expected = {"bert-embeddings-word_embeddings", "bert-embeddings-token_type_embeddings",
                "bert-embeddings-position_embeddings", "bert-embeddings-LayerNorm-gamma",
                "bert-encoder-layer_0-attention-self-query-weight", "bert-encoder-layer_0-attention-self-key-bias",
                "bert-encoder-layer_0-attention-output-dense-weight",
                "bert-encoder-layer_0-attention-output-LayerNorm-beta",
                "bert-encoder-layer_0-intermediate-dense-weight", "bert-encoder-layer_0-output-LayerNorm-gamma",
                "cls-predictions-transform-dense-weight", "cls-predictions-transform-LayerNorm-gamma",
                "cls-predictions-output_bias", "bert-pooler-dense-weight", "cls-seq_relationship-output_weights",
                "cls-seq_relationship-output_bias"}
    assert expected <= names
    assert len(names) == 5 + 16 + 9    # embeddings, one layer, the heads
    assert flow.get_all_variables()["bert-encoder-layer_0-intermediate-dense-weight"].numpy().shape == (8, 32)


def test_training_lowers_both_losses():
    flow.config.seed(0)
    examples = bert.pretraining_examples(256, **SMALL, seed=1)
    job = bert.pretrain_job(batch_size=32, hidden=32, layers=2, heads=2, lr=3e-3, warmup_steps=5, dropout=0.0,
                            attention_dropout=0.0, **SMALL)
    batches = bert.batches(examples, 32)
    losses = np.array([[float(v) for v in job(*batches[step % len(batches)])] for step in range(80)])
    assert np.all(np.isfinite(losses))
    np.testing.assert_allclose(losses[:, 0], losses[:, 1] + losses[:, 2], rtol=1e-5)
    first, last = losses[:5].mean(axis=0), losses[-10:].mean(axis=0)
    assert first[1] == pytest.approx(math.log(SMALL["vocab_size"]), abs=0.3)     # chance at the start
    assert last[0] < first[0] - 0.3 and last[1] < first[1] - 0.3


def test_examples_follow_the_rules():
    ex = bert.pretraining_examples(64, seq_length=32, vocab_size=100, max_predictions=5, seed=2)
    assert {k: v.shape for k, v in ex.items()} == {
        "input_ids": (64, 32), "input_mask": (64, 32), "segment_ids": (64, 32), "masked_lm_positions": (64, 5),
        "masked_lm_ids": (64, 5), "masked_lm_weights": (64, 5), "next_sentence_labels": (64, 1)}
    middle = bert.FIRST_TOKEN + (100 - bert.FIRST_TOKEN) // 2
    for n in range(64):
        ids = ex["input_ids"][n].copy()
        used = int(ex["input_mask"][n].sum())
        assert ids[0] == bert.CLS and ids[used - 1] == bert.SEP and not ids[used:].any()
        picked = ex["masked_lm_weights"][n] > 0
        assert 2 <= picked.sum() <= 5 and not picked[picked.sum():].any()
        positions = ex["masked_lm_positions"][n][picked]
        assert np.all(ids[positions] == bert.MASK)
        ids[positions] = ex["masked_lm_ids"][n][picked]          # unmask
        seps = np.flatnonzero(ids == bert.SEP)
        a, b = ids[1:seps[0]], ids[seps[0] + 1:seps[1]]
        for segment, start in ((a, 1), (b, seps[0] + 1)):
            assert segment.size % 2 == 0 and np.all(segment[0::2] == segment[1::2])     # pairs: x x y y ...
            masked_pairs = (positions[(positions >= start) & (positions < start + segment.size)] - start) // 2
            assert len(set(masked_pairs)) == masked_pairs.size                           # never both of a pair
        same_half = (a[0] >= middle) == (b[0] >= middle)
        assert np.all((a >= middle) == (a[0] >= middle)) and np.all((b >= middle) == (b[0] >= middle))
        assert ex["next_sentence_labels"][n, 0] == (0 if same_half else 1)
        assert np.all(ex["segment_ids"][n][seps[0] + 1:used] == 1) and not ex["segment_ids"][n][:seps[0] + 1].any()
    assert 0.25 < ex["next_sentence_labels"].mean() < 0.75


def test_ofrecords_hold_bert_keys(tmp_path):
    paths = bert.write_pretraining_ofrecords(tmp_path / "data", 6, part_num=2, seed=4)
    assert [p.rsplit("/", 1)[-1] for p in paths] == ["part-0", "part-1"]
    records = list(read_records(str(tmp_path / "data"), part_num=2))
    assert len(records) == 6
    ex = bert.pretraining_examples(6, seed=4)
    first = records[0].record.feature
    assert set(first) == set(bert.KEYS)
    np.testing.assert_array_equal(first["input_ids"].int32_list.value, ex["input_ids"][0])
    np.testing.assert_array_equal(first["masked_lm_weights"].float_list.value, ex["masked_lm_weights"][0])


def test_bad_configurations_are_named():
    with pytest.raises(ValueError, match="hidden .* must be a multiple of heads"):
        bert.BertBuilder(50, hidden=30, heads=4)
    with pytest.raises(ValueError, match="seq_length must be an int >= 12"):
        bert.pretraining_examples(2, seq_length=8)
