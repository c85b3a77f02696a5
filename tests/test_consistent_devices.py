"""OneFlow 0.x models on n logical devices under the consistent view train as on one device, to float tolerance:
a BERT-style encoder with OneFlow-Benchmark's masked-LM normalisation (a sum over the whole batch, which each device
holds only a part of until flowlab all-reduces it) and a Wide & Deep net with sparse tables, both reading their
OFRecords inside the job; the all-reduce's gradients against finite differences; the data ops' rows on each device;
placements flowlab cannot honour named in their errors."""
import numpy as np
import pytest

import flowlab as flow
import flowlab.typing as tp
from flowlab.data.ofrecord import write_dataset
from flowlab.errors import FeedError, TraceError
from flowlab.examples import bert, wide_deep
from flowlab.ops.placement import AllReduce
from flowlab.runtime import session

# n logical devices are NumPy threads here (on CuPy they would be n GPUs)
pytestmark = pytest.mark.numpy_backend

SEQ, VOCAB, PREDICTIONS, HIDDEN = 16, 24, 3, 16


def variables():
    return {name: v.numpy().copy() for name, v in session.default().variables.items()}


def assert_same_training(one, many, rtol=1e-5, atol=1e-6):
    (one_losses, one_vars), (many_losses, many_vars) = one, many
    np.testing.assert_allclose(np.asarray(many_losses), np.asarray(one_losses), rtol=rtol, atol=atol)
    assert sorted(many_vars) == sorted(one_vars)
    for name in one_vars:
        np.testing.assert_allclose(many_vars[name], one_vars[name], rtol=rtol, atol=atol, err_msg=name)


# --------------------------------------------------------------------------------- a BERT-style encoder, OFB's loss

def ofb_masked_lm_loss(builder, sequence, table, positions, label_ids, weights):
    """OneFlow-Benchmark's ``_AddMaskedLanguageModelLoss``: each sequence's weighted token losses over the mean
    weight of a sequence *in the whole batch* (``reduce_sum`` over the batch, divided by the batch size)."""
    with flow.scope.namespace("other"):
        per_sequence = flow.math.reduce_sum(weights, axis=[-1])
        ones = per_sequence * 0.0 + 1.0
        mean_weight = flow.math.reduce_sum(per_sequence) / flow.math.reduce_sum(ones)
    with flow.scope.namespace("cls-predictions"):
        picked = flow.reshape(flow.gather(sequence, positions, axis=2, batch_dims=2), [-1, HIDDEN])
        picked = builder.layer_norm(builder.dense(picked, HIDDEN, "transform-dense", activation=flow.math.gelu))
        logits = flow.matmul(picked, table, transpose_b=True)
        losses = flow.nn.sparse_softmax_cross_entropy_with_logits(labels=flow.reshape(label_ids, [-1]),
                                                                  logits=logits)
        numerator = flow.math.reduce_sum(flow.reshape(losses, [-1, PREDICTIONS]) * weights, axis=[-1])
        return flow.math.reduce_mean(numerator / (mean_weight + 1e-5))


def train_bert(devices, directory, steps=3, batch=8):
    flow.clear_default_session()
    flow.config.gpu_device_num(devices)
    flow.config.seed(0)
    builder = bert.BertBuilder(VOCAB, hidden=HIDDEN, layers=1, heads=2, max_positions=SEQ, dropout=0,
                               attention_dropout=0)

    @flow.global_function(type="train")
    def pretrain() -> tp.Numpy:
        with flow.scope.placement("cpu", "0:0"):        # as run_pretraining.py reads one part file
            records = flow.data.ofrecord_reader(directory, batch_size=batch, random_shuffle=True)
            blob = {key: flow.data.OFRecordRawDecoder(records, key, shape=[n], dtype=dtype) for key, n, dtype in
                    [("input_ids", SEQ, flow.int32), ("input_mask", SEQ, flow.int32), ("segment_ids", SEQ, flow.int32),
                     ("masked_lm_positions", PREDICTIONS, flow.int32), ("masked_lm_ids", PREDICTIONS, flow.int32),
                     ("masked_lm_weights", PREDICTIONS, flow.float), ("next_sentence_labels", 1, flow.int32)]}
        sequence, table = builder.encoder(blob["input_ids"], blob["input_mask"], blob["segment_ids"])
        mlm = ofb_masked_lm_loss(builder, sequence, table, blob["masked_lm_positions"], blob["masked_lm_ids"],
                                 blob["masked_lm_weights"])
        nsp = flow.math.reduce_mean(builder.next_sentence_loss(sequence, blob["next_sentence_labels"]))
        total = mlm + nsp
        flow.optimizer.AdamW(flow.optimizer.PiecewiseConstantScheduler([], [3e-3]), weight_decay=0.01).minimize(total)
        return total

    flow.train.CheckPoint().init()          # traces the job for the session's devices first, as OFB's Snapshot does
    initial = variables()
    losses = [float(pretrain()) for _ in range(steps)]
    boxes = [n for n in pretrain.graph().nodes if n.op is AllReduce]
    return (losses, variables()), boxes, initial


@pytest.fixture(scope="module")
def bert_records(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bert")
    bert.write_pretraining_ofrecords(directory, 40, seq_length=SEQ, vocab_size=VOCAB, max_predictions=PREDICTIONS)
    return str(directory)


@pytest.mark.parametrize("devices", [2, 4])
def test_a_bert_encoder_with_oneflow_benchmarks_loss_trains_on_n_devices_as_on_one(bert_records, devices):
    one, no_boxes, initial = train_bert(1, bert_records)
    many, boxes, _ = train_bert(devices, bert_records)
    # Adam divides by the root of a gradient's square: where a gradient is ~0 (biases that softmax cancels),
    # rounding differences of the devices' sums move a weight by up to ~1e-3 of a step (the rate is 3e-3)
    assert_same_training(one, many, atol=1e-5)
    assert not no_boxes
    # the batch's weight sum and its size are all-reduced (once each), before their quotient
    assert [(n.attrs["how"], n.inputs[0].node.op.__name__) for n in boxes] == [("sum", "ReduceSum")] * 2
    assert not np.allclose(one[1]["bert-pooler-dense-weight"], initial["bert-pooler-dense-weight"])   # it trained


def test_without_the_all_reduce_the_loss_would_differ(bert_records):
    """The data make the per-device weight sums differ from the batch's: the test above can fail."""
    examples = bert.pretraining_examples(40, SEQ, VOCAB, PREDICTIONS)
    sums = examples["masked_lm_weights"][:8].sum(axis=1)
    assert len({float(sums[:4].mean()), float(sums[4:].mean()), float(sums.mean())}) == 3


# ------------------------------------------------------------------------------------- Wide & Deep, sparse tables

WIDE_FIELDS, DEEP_FIELDS, DENSE_FIELDS, VOCAB_ROWS = 2, 4, 3, 200


@pytest.fixture(scope="module")
def click_records(tmp_path_factory):
    directory = tmp_path_factory.mktemp("wdl")
    labels, dense, wide, deep = wide_deep.synthetic_clicks(96, DENSE_FIELDS, WIDE_FIELDS, DEEP_FIELDS, VOCAB_ROWS,
                                                           VOCAB_ROWS, seed=3, ids_per_field=20)
    write_dataset(directory, ({"labels": labels[i], "dense_fields": dense[i], "wide_sparse_fields": wide[i],
                               "deep_sparse_fields": deep[i]} for i in range(96)), part_num=4,
                  part_name_suffix_length=5)
    return str(directory)


def train_wide_deep(devices, directory, steps=4, batch=16):
    """``wdl_train_eval.py``'s train job (reader with 4 part files, shuffled; LazyAdam on both tables, updated
    sparsely) at a small size, without dropout."""
    flow.clear_default_session()
    flow.config.gpu_device_num(devices)
    flow.config.seed(0)
    config = flow.FunctionConfig()
    config.default_data_type(flow.float)
    config.indexed_slices_optimizer_conf(dict(include_op_names=dict(op_name=list(wide_deep.TABLES))))

    @flow.global_function("train", config)
    def train_job():
        records = flow.data.ofrecord_reader(directory, batch_size=batch, data_part_num=4, part_name_suffix_length=5,
                                            random_shuffle=True, shuffle_after_epoch=True)
        labels, dense, wide, deep = flow.identity_n([
            flow.data.OFRecordRawDecoder(records, key, shape=(n,), dtype=dtype) for key, n, dtype in
            [("labels", 1, flow.int32), ("dense_fields", DENSE_FIELDS, flow.float),
             ("wide_sparse_fields", WIDE_FIELDS, flow.int32), ("deep_sparse_fields", DEEP_FIELDS, flow.int32)]])
        logits = wide_deep.model(dense, wide, deep, VOCAB_ROWS, VOCAB_ROWS, dim=4, hidden=(8,), dropout=0.0)
        loss = flow.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
        flow.optimizer.LazyAdam(flow.optimizer.PiecewiseConstantScheduler([], [0.05])).minimize(loss)
        return flow.math.reduce_mean(loss), labels

    losses, labels = [], []
    for _ in range(steps):
        loss, label = train_job().get()
        losses.append(float(loss.numpy()))
        labels.append(label.numpy())
    return (losses, variables()), np.concatenate(labels)


@pytest.mark.parametrize("devices", [2, 4])
def test_wide_and_deep_reading_its_records_trains_on_n_devices_as_on_one(click_records, devices):
    one, one_labels = train_wide_deep(1, click_records)
    many, many_labels = train_wide_deep(devices, click_records)
    np.testing.assert_array_equal(many_labels, one_labels)     # the very records, in the same (shuffled) order
    assert_same_training(one, many)
    assert not np.allclose(one[1]["fc1-weight"], train_wide_deep(1, click_records, steps=1)[0][1]["fc1-weight"])


# --------------------------------------------------------------------------------- the all-reduce and its gradient

def boxed_loss_numpy(x, w1, w2, reduce="mean"):
    h = np.tanh(x @ w1) @ w2
    centered = h - h.mean(axis=0)
    per_example = centered ** 2 / ((h * h).sum(axis=0) + 1.0) + h / (h.max(axis=0) + 10.0) + \
        h / (h.min(axis=0) - 10.0)
    return per_example.mean() if reduce == "mean" else per_example.sum()


def boxed_loss(x, w1, w2, reduce):
    """Per-device reductions over the batch (sum, mean, max, min) used where only their logical value serves,
    behind two layers: the all-reduces' gradients lie between the two variables' updates."""
    h = flow.matmul(flow.math.tanh(flow.matmul(x, w1)), w2)
    centered = h - flow.math.reduce_mean(h, axis=[0])
    peak = flow.math.reduce_max(h, axis=[0])
    low = -flow.math.reduce_max(-h, axis=[0])
    per_example = centered * centered / (flow.math.reduce_sum(h * h, axis=[0]) + 1.0) + h / (peak + 10.0) + \
        h / (low - 10.0)
    return flow.math.reduce_mean(per_example) if reduce == "mean" else flow.math.reduce_sum(per_example)


def gradients_on(devices, x, w0, reduce):
    """The loss and the gradients of ``w1``, ``w2`` (starting at ``w0``) of one SGD step at rate 1."""
    flow.clear_default_session()
    flow.config.gpu_device_num(devices)
    config = flow.FunctionConfig()
    config.default_data_type(flow.double)

    @flow.global_function(type="train", function_config=config)
    def job(x_: tp.Numpy.Placeholder(x.shape, dtype=flow.double)) -> tp.Numpy:
        w1, w2 = (flow.get_variable(name, shape=w0[name].shape, dtype=flow.double,
                                    initializer=flow.zeros_initializer()) for name in ("w1", "w2"))
        loss = boxed_loss(x_, w1, w2, reduce)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1.0]), momentum=0).minimize(loss)
        return loss

    flow.load_variables(w0)
    loss = float(job(x))
    return loss, {name: w0[name] - session.default().variables[name].numpy() for name in w0}, job


@pytest.mark.parametrize("reduce", ["mean", "sum"])      # a summed loss sums the devices' gradients
@pytest.mark.parametrize("devices", [1, 2, 4])
def test_all_reduce_gradients_match_finite_differences(devices, reduce):
    rng = np.random.default_rng(4)
    x, w0 = rng.normal(size=(8, 3)), {"w1": rng.normal(size=(3, 4)), "w2": rng.normal(size=(4, 2))}
    loss, grads, job = gradients_on(devices, x, w0, reduce)
    assert loss == pytest.approx(boxed_loss_numpy(x, w0["w1"], w0["w2"], reduce), rel=1e-12)
    for name in w0:
        numeric = np.zeros_like(w0[name])
        for index in np.ndindex(*numeric.shape):
            moved = [{**w0, name: w0[name].copy()} for _ in range(2)]
            moved[0][name][index] += 1e-6
            moved[1][name][index] -= 1e-6
            numeric[index] = (boxed_loss_numpy(x, moved[0]["w1"], moved[0]["w2"], reduce) -
                              boxed_loss_numpy(x, moved[1]["w1"], moved[1]["w2"], reduce)) / 2e-6
        np.testing.assert_allclose(grads[name], numeric, rtol=1e-6, atol=1e-9, err_msg=name)
    hows = sorted(n.attrs["how"] for n in job.graph().nodes if n.op is AllReduce)
    assert hows == ([] if devices == 1 else ["max", "max", "mean", "sum"])


def test_a_partial_value_the_devices_can_join_is_not_all_reduced():
    """A mean loss plus a mean loss, times a constant: joined as a mean of the pieces, no exchange needed."""
    flow.config.gpu_device_num(2)

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        return (flow.math.reduce_mean(x) + flow.math.reduce_mean(x * x)) * 0.5

    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    assert float(job(x)) == pytest.approx((x.mean() + (x * x).mean()) / 2, rel=1e-6)
    assert not [n for n in job.graph().nodes if n.op is AllReduce]


# ------------------------------------------------------------------------------------------ reshapes of the batch

def test_reshapes_that_keep_the_batch_in_front_join_and_others_are_named():
    flow.config.gpu_device_num(2)

    @flow.global_function()
    def kept(x: tp.Numpy.Placeholder((4, 3, 2))) -> tp.Bundle[tp.Numpy]:
        # -1 in front, the logical batch size, this device's leading axes merged (its own shape, as the job sees it)
        return [flow.reshape(x, [-1, 2]), flow.reshape(x, [4, 6]), flow.reshape(x, [x.shape[0] * x.shape[1], 2])]

    @flow.global_function()
    def moved(x: tp.Numpy.Placeholder((4, 3, 2))) -> tp.Numpy:
        return flow.reshape(x, [3, -1])             # the batch ends up along axis 1: not the devices' rows

    x = np.arange(24, dtype=np.float32).reshape(4, 3, 2)
    flat, rows, merged = kept(x)
    np.testing.assert_array_equal(flat, x.reshape(-1, 2))
    np.testing.assert_array_equal(rows, x.reshape(4, 6))
    np.testing.assert_array_equal(merged, x.reshape(-1, 2))
    with pytest.raises(TraceError, match=r"values of Reshape_\d+/out_0 .*made at .*test_consistent_devices.py"):
        moved(x)


# ------------------------------------------------------------------------------------------------ the data ops

def label_records(directory, n=32):
    write_dataset(directory, [{"class/label": np.int32(i)} for i in range(n)], part_num=2)
    return str(directory)


def reader_job(directory, batch, view="consistent"):
    config = flow.FunctionConfig()
    config.default_logical_view(flow.scope.mirrored_view() if view == "mirrored" else flow.scope.consistent_view())
    ret = tp.ListNumpy if view == "mirrored" else tp.Numpy

    @flow.global_function(function_config=config)
    def job() -> ret:
        records = flow.data.ofrecord_reader(directory, batch_size=batch, data_part_num=2, random_shuffle=True)
        return flow.data.OFRecordRawDecoder(records, "class/label", shape=(), dtype=flow.int32)
    return job


def test_readers_hand_each_device_its_rows_of_what_one_device_reads(tmp_path):
    directory = label_records(tmp_path)
    job = reader_job(directory, 8)
    one = np.concatenate([job() for _ in range(4)])
    flow.clear_default_session()
    flow.config.gpu_device_num(4)
    job = reader_job(directory, 8)
    np.testing.assert_array_equal(np.concatenate([job() for _ in range(4)]), one)
    assert sorted(one.tolist()) == list(range(32)) and one.tolist() != sorted(one.tolist())
    assert job.graph().nodes[0].outputs[0].shape == (2,)        # inside the job: this device's rows

    flow.clear_default_session()
    flow.config.gpu_device_num(2)
    job = reader_job(directory, 4, "mirrored")
    pieces = [job() for _ in range(4)]          # mirrored: batch_size a device
    assert [[p.shape for p in call] for call in pieces] == [[(4,), (4,)]] * 4
    np.testing.assert_array_equal(np.concatenate([np.concatenate(call) for call in pieces]), one)


def test_seeded_random_sources_draw_on_n_devices_what_one_device_draws():
    def draws(devices):
        flow.clear_default_session()
        flow.config.gpu_device_num(devices)
        flow.config.seed(7)

        @flow.global_function()
        def job() -> tp.Bundle[tp.Numpy]:
            flags = flow.random.CoinFlip(batch_size=8, seed=5)
            values = flow.data.decode_random((3,), flow.float, batch_size=8)
            return [flags, values]
        return [job() for _ in range(3)]

    one, two = draws(1), draws(2)
    for (flags_1, values_1), (flags_2, values_2) in zip(one, two):
        np.testing.assert_array_equal(flags_2, flags_1)
        np.testing.assert_array_equal(values_2, values_1)
    assert not np.array_equal(one[0][1], one[1][1])


def test_data_op_batches_that_do_not_split_and_mixed_piece_shapes_are_named(tmp_path):
    directory = label_records(tmp_path)
    flow.config.gpu_device_num(4)

    @flow.global_function()
    def flips() -> tp.Numpy:
        return flow.random.CoinFlip(batch_size=6)

    with pytest.raises(ValueError, match=r"flow.random.CoinFlip: batch_size must split evenly over the 4 devices "
                                         r".*got 6"):
        flips()

    flow.clear_default_session()
    flow.config.gpu_device_num(2)
    config = flow.FunctionConfig()
    config.default_logical_view(flow.scope.mirrored_view())

    @flow.global_function(function_config=config)
    def mixed(x: tp.ListNumpy.Placeholder((4,))) -> tp.ListNumpy:
        records = flow.data.ofrecord_reader(directory, batch_size=4, data_part_num=2)
        return flow.data.OFRecordRawDecoder(records, "class/label", shape=(), dtype=flow.int32) + \
            flow.cast(flow.math.reduce_sum(x), flow.int32)

    with pytest.raises(TraceError, match=r"job mixed: its data ops hand each of the 2 devices its rows of one batch "
                                         r".*same shapes; got \[\(4,\)\], \[\(2,\)\]"):
        mixed([np.ones(4, np.float32), np.ones(2, np.float32)])


def test_a_declared_batch_that_does_not_split_is_named_when_the_job_is_traced_first():
    flow.config.gpu_device_num(2)

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((5, 3))) -> tp.Numpy:
        return x + 1

    with pytest.raises(FeedError, match=r"job job argument 'x': the consistent view splits the batch .* over 2 "
                                        r"devices, but its placeholder has shape \(5, 3\)"):
        flow.train.CheckPoint().init()


# ---------------------------------------------------------------------------------------------- bad placements

@pytest.mark.parametrize("ids, error, match", [
    ("0:2", ValueError, r"machine_device_ids '0:2' names device 2, but flow.config set 2 device\(s\) .*0 to 1"),
    ("0:0-3", ValueError, r"'0:0-3' names device 3, but flow.config set 2"),
    (["0:0-1", "1:0-1"], ValueError, r"'1:0-1' names machine 1; flowlab runs on one machine"),
    ("0:1-0", ValueError, r"'0:1-0': the last device \(0\) comes before the first \(1\)"),
    ("gpu0", ValueError, r"must be 'machine:device' or 'machine:first-last' \(e.g. '0:0-3'\), got 'gpu0'"),
    (0, TypeError, r"machine_device_ids must be a string like '0:0' or '0:0-3', or a list of them, got 0"),
])
def test_placements_on_devices_that_do_not_exist_are_named(ids, error, match):
    flow.config.gpu_device_num(2)

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        with flow.scope.placement("gpu", ids):
            return x + 1

    with pytest.raises(error, match=r"flow.scope.placement: .*" + match):
        job(np.ones((4, 3), np.float32))


def test_placements_on_existing_devices_run():
    flow.config.gpu_device_num(2)

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        with flow.scope.placement("cpu", ["0:0-1"]):
            y = x + 1
        with flow.scope.placement("gpu", "0:1"):
            return y * 2

    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(job(x), (x + 1) * 2)
    assert {n.device_tag for n in job.graph().nodes if n.op.__name__ in ("Add", "Multiply")} == \
        {"cpu:0:0-1", "gpu:0:1"}
