"""Wide & Deep click prediction as a OneFlow 0.x user writes it (OneFlow-Benchmark's
``ClickThroughRate/WideDeepLearning``), with sparse embedding updates, plus its train and predict jobs.

The wide part is a ``(wide_vocab, 1)`` table: each of the ``wide`` ids of an example reads one weight, and their
sum is the wide score. The deep part is a ``(deep_vocab, dim)`` table: the ``deep`` ids' rows, concatenated with the
dense features, feed ReLU layers (``hidden``, with dropout) and a last dense layer to the deep score. The logit is
their sum; the loss ``flow.nn.sigmoid_cross_entropy_with_logits`` against 0/1 click labels. Both tables carry
Wide & Deep's placement annotations (``distribute.split``, ``parallel_cast``), which change nothing in what is
computed, and the train job names them in ``indexed_slices_optimizer_conf``: each step updates only the rows its
ids gathered (LazyAdam by default), so a step costs O(batch) whatever the tables' sizes.
"""
# No ``from __future__ import annotations``: the jobs' placeholder annotations are read at trace time.
import flowlab as flow
import flowlab.typing as tp

TABLES = ("wide_embedding", "deep_embedding")


def model(dense, wide_ids, deep_ids, wide_vocab, deep_vocab, dim=16, hidden=(64, 64), dropout=0.5):
    """The logits ``(N, 1)`` of Wide & Deep over ``dense`` ``(N, d)`` float features and int ``wide_ids``
    ``(N, w)`` / ``deep_ids`` ``(N, k)``."""
    init = flow.random_uniform_initializer(minval=-0.05, maxval=0.05)
    wide_ids = flow.parallel_cast(wide_ids, distribute=flow.distribute.broadcast())
    wide_table = flow.get_variable("wide_embedding", shape=(wide_vocab, 1), initializer=init,
                                   distribute=flow.distribute.split(0))
    wide = flow.gather(params=wide_table, indices=wide_ids)                        # (N, w, 1)
    wide = flow.math.reduce_sum(flow.reshape(wide, (-1, wide.shape[1])), axis=[1], keepdims=True)
    wide = flow.parallel_cast(wide, distribute=flow.distribute.split(0),
                              gradient_distribute=flow.distribute.broadcast())

    deep_ids = flow.parallel_cast(deep_ids, distribute=flow.distribute.broadcast())
    deep_table = flow.get_variable("deep_embedding", shape=(deep_vocab, dim), initializer=init,
                                   distribute=flow.distribute.split(1))
    deep = flow.gather(params=deep_table, indices=deep_ids)                        # (N, k, dim)
    deep = flow.parallel_cast(deep, distribute=flow.distribute.split(0),
                              gradient_distribute=flow.distribute.split(2))
    deep = flow.concat([flow.reshape(deep, (-1, deep.shape[1] * deep.shape[2])), dense], axis=1)
    for i, units in enumerate(hidden, 1):
        deep = flow.layers.dense(deep, units, activation=flow.math.relu, name=f"fc{i}",
                                 kernel_initializer=flow.glorot_uniform_initializer(),
                                 bias_initializer=flow.constant_initializer(0.0))
        deep = flow.nn.dropout(deep, rate=dropout)
    deep = flow.layers.dense(deep, 1, name=f"fc{len(hidden) + 1}", kernel_initializer=flow.glorot_uniform_initializer(),
                             bias_initializer=flow.constant_initializer(0.0))
    return wide + deep


def jobs(batch_size, dense_fields, wide_fields, deep_fields, wide_vocab, deep_vocab, dim=16, hidden=(64, 64),
         dropout=0.5, lr=1e-3, optimizer="lazy_adam", sparse=True):
    """``(train_job, predict_job)``: ``train_job(labels (N, 1) int32, dense (N, d), wide_ids (N, w) int32, deep_ids
    (N, k) int32) -> mean loss`` and ``predict_job(dense, wide_ids, deep_ids) -> click probabilities (N, 1)``.
    ``optimizer`` is ``"lazy_adam"`` or ``"sgd"``; ``sparse=False`` trains the tables densely (for comparison)."""
    if optimizer not in ("lazy_adam", "sgd"):
        raise ValueError(f"wide_deep.jobs: optimizer must be 'lazy_adam' or 'sgd', got {optimizer!r}")
    config = flow.FunctionConfig()
    config.default_data_type(flow.float)
    if sparse:
        config.indexed_slices_optimizer_conf(dict(include_op_names=dict(op_name=list(TABLES))))

    def logits(dense, wide_ids, deep_ids):
        return model(dense, wide_ids, deep_ids, wide_vocab, deep_vocab, dim, hidden, dropout)

    @flow.global_function(type="train", function_config=config)
    def train_job(labels: tp.Numpy.Placeholder((batch_size, 1), dtype=flow.int32),
                  dense: tp.Numpy.Placeholder((batch_size, dense_fields)),
                  wide_ids: tp.Numpy.Placeholder((batch_size, wide_fields), dtype=flow.int32),
                  deep_ids: tp.Numpy.Placeholder((batch_size, deep_fields), dtype=flow.int32)) -> tp.Numpy:
        loss = flow.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits(dense, wide_ids, deep_ids))
        schedule = flow.optimizer.PiecewiseConstantScheduler([], [lr])
        opt = flow.optimizer.LazyAdam(schedule) if optimizer == "lazy_adam" else \
            flow.optimizer.SGD(schedule, momentum=0)
        opt.minimize(loss)
        return flow.math.reduce_mean(loss)

    @flow.global_function()
    def predict_job(dense: tp.Numpy.Placeholder((batch_size, dense_fields)),
                    wide_ids: tp.Numpy.Placeholder((batch_size, wide_fields), dtype=flow.int32),
                    deep_ids: tp.Numpy.Placeholder((batch_size, deep_fields), dtype=flow.int32)) -> tp.Numpy:
        return flow.math.sigmoid(logits(dense, wide_ids, deep_ids))

    return train_job, predict_job


def auc(labels, scores):
    """The area under the ROC curve: the chance that a random positive scores above a random negative (ties
    count half), from ranks."""
    import numpy as np
    labels = np.asarray(labels).reshape(-1).astype(bool)
    scores = np.asarray(scores, np.float64).reshape(-1)
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if positives == 0 or negatives == 0:
        raise ValueError("auc: needs both positive and negative labels")
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(scores.size)
    sorted_scores = scores[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_scores)) + 1]
    ends = np.r_[starts[1:], scores.size]
    for s, e in zip(starts, ends):                  # tied scores share their mean rank
        ranks[order[s:e]] = (s + e + 1) / 2
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def synthetic_clicks(n, dense_fields, wide_fields, deep_fields, wide_vocab, deep_vocab, seed=0, ids_per_field=50):
    """``(labels, dense, wide_ids, deep_ids)`` of ``n`` learnable examples: every id has a hidden effect, each field
    draws from its own ``ids_per_field`` ids of the table (Zipf-like: a few ids are frequent), and a click is drawn
    with probability ``sigmoid(dense . w + sum of the ids' effects)``. Rows no field can draw stay untouched."""
    import numpy as np
    world = np.random.default_rng(12345)              # the same hidden effects for every seed
    dense_w = world.normal(0, 1.0, dense_fields)
    wide_pool = world.choice(wide_vocab, (wide_fields, ids_per_field), replace=wide_vocab < wide_fields * ids_per_field)
    deep_pool = world.choice(deep_vocab, (deep_fields, ids_per_field), replace=deep_vocab < deep_fields * ids_per_field)
    wide_effect, deep_effect = world.normal(0, 1.0, wide_vocab), world.normal(0, 0.5, deep_vocab)
    popularity = 1 / np.arange(1, ids_per_field + 1)
    popularity /= popularity.sum()
    rng = np.random.default_rng(seed)
    dense = rng.uniform(0, 1, (n, dense_fields)).astype(np.float32)
    wide = wide_pool[np.arange(wide_fields), rng.choice(ids_per_field, (n, wide_fields), p=popularity)]
    deep = deep_pool[np.arange(deep_fields), rng.choice(ids_per_field, (n, deep_fields), p=popularity)]
    logit = (dense - 0.5) @ dense_w + wide_effect[wide].sum(1) + deep_effect[deep].sum(1)
    labels = (rng.uniform(size=n) < 1 / (1 + np.exp(-logit))).astype(np.int32)[:, None]
    return labels, dense, wide.astype(np.int32), deep.astype(np.int32)
