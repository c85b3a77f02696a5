"""A BERT encoder with its pretraining heads as a OneFlow 0.x user writes it, a train job, and learnable data.

The model has OneFlow-Benchmark's ``LanguageModeling/BERT`` layout and variable names (so checkpoints line up):
``bert-embeddings-word_embeddings`` (looked up with ``flow.gather``, and tied to the masked-LM output layer),
``-token_type_embeddings``, ``-position_embeddings`` (``(1, max_positions, hidden)``, sliced to the sequence),
``-LayerNorm``; then per layer ``bert-encoder-layer_<i>-attention-self-{query,key,value}``, ``-attention-output-dense``
and ``-LayerNorm``, ``-intermediate-dense`` (GELU) and ``-output-dense`` / ``-LayerNorm`` (post-norm residual blocks);
dense weights are ``(in, units)`` used as ``matmul(x, w)``. The masked-LM head (``cls-predictions``) gathers the
masked positions (``gather(..., axis=2, batch_dims=2)``, OneFlow's batch gather), transforms them (dense, GELU, layer
norm) and scores them against the word embeddings; the next-sentence head (``cls-seq_relationship``) classifies the
pooled first token (``bert-pooler-dense``, tanh). The losses: the weighted mean masked-LM cross-entropy per sequence
and the next-sentence cross-entropy, each averaged over the batch, and their sum.

Each attention block names its ops so that watches and health find them: ``<layer>-attention-self-attention_scores``
(scaled ``q kᵀ`` plus the padding mask) and ``-attention_probs`` (their softmax over the keys, ``(batch, heads,
query, key)``), and the residual sums ``<layer>-attention-output-residual`` and ``<layer>-output-residual``. ``scale_attention=False`` leaves out the ``1 / sqrt(head size)`` factor (a deliberately broken model).

``pretraining_examples`` makes data the model can learn: each segment repeats every token id twice, so a masked token
is a copy of its neighbour, and the next-sentence label is 0 ("is next", BERT's convention) when both segments draw
their ids from the same half of the vocabulary, 1 when not. ``write_pretraining_ofrecords`` writes them as OFRecord
files in BERT's keys for OneFlow-Benchmark's ``run_pretraining.py``.
"""
# No ``from __future__ import annotations``: the train job's placeholder annotations are read at trace time and
# name locals of ``pretrain_job``.
import math

import numpy as np

import flowlab as flow
import flowlab.typing as tp

PAD, CLS, SEP, MASK = 0, 1, 2, 3          # special token ids; ordinary tokens are 4 .. vocab_size - 1
FIRST_TOKEN = 4
KEYS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids", "masked_lm_weights",
        "next_sentence_labels")


class BertBuilder:
    """The layers of a BERT encoder. ``dropout`` applies to the embeddings and the residual branches,
    ``attention_dropout`` to the attention probabilities (both only in train jobs); weights start as
    ``truncated_normal(init_range)``, biases at zero."""

    def __init__(self, vocab_size, hidden=128, layers=2, heads=2, intermediate=None, max_positions=512, type_vocab=2,
                 dropout=0.1, attention_dropout=0.1, init_range=0.02, scale_attention=True):
        if not (isinstance(hidden, int) and isinstance(heads, int) and heads > 0 and hidden % heads == 0):
            raise ValueError(f"BertBuilder: hidden ({hidden!r}) must be a multiple of heads ({heads!r})")
        for argument, value in (("vocab_size", vocab_size), ("layers", layers), ("max_positions", max_positions),
                                ("type_vocab", type_vocab)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"BertBuilder: {argument} must be a positive int, got {value!r}")
        self.vocab_size, self.hidden, self.layers, self.heads = vocab_size, hidden, layers, heads
        self.head_size = hidden // heads
        self.intermediate = 4 * hidden if intermediate is None else intermediate
        self.max_positions, self.type_vocab = max_positions, type_vocab
        self.dropout, self.attention_dropout = dropout, attention_dropout
        self.init_range, self.scale_attention = init_range, scale_attention

    def _init(self):
        return flow.truncated_normal(self.init_range)

    def dense(self, x, units, name, activation=None):
        """``activation(x @ <name>-weight + <name>-bias)`` over 2-D ``x`` (OneFlow-Benchmark's ``(in, units)``
        weight layout)."""
        weight = flow.get_variable(f"{name}-weight", shape=(x.shape[-1], units), dtype=x.dtype,
                                   initializer=self._init())
        bias = flow.get_variable(f"{name}-bias", shape=(units,), dtype=x.dtype,
                                 initializer=flow.constant_initializer(0.0))
        out = flow.nn.bias_add(flow.matmul(x, weight, name=f"{name}_matmul"), bias, name=f"{name}_bias_add")
        return out if activation is None else activation(out, name=f"{name}_activation")

    def layer_norm(self, x):
        return flow.layers.layer_norm(x, name="LayerNorm", begin_norm_axis=-1, begin_params_axis=-1)

    def drop(self, x, rate):
        return x if rate == 0 else flow.nn.dropout(x, rate=rate)

    def embeddings(self, input_ids, segment_ids):
        """``(batch, seq, hidden)`` embeddings and the word embedding table."""
        seq = input_ids.shape[1]
        if seq > self.max_positions:
            raise ValueError(f"BertBuilder: sequences of {seq} tokens exceed max_positions ({self.max_positions})")
        with flow.scope.namespace("embeddings"):
            table = flow.get_variable("word_embeddings", shape=(self.vocab_size, self.hidden), dtype=flow.float32,
                                      initializer=self._init())
            x = flow.gather(table, input_ids, axis=0, name="word_lookup")
            types = flow.get_variable("token_type_embeddings", shape=(self.type_vocab, self.hidden),
                                      dtype=flow.float32, initializer=self._init())
            x = x + flow.gather(types, segment_ids, axis=0, name="token_type_lookup")
            positions = flow.get_variable("position_embeddings", shape=(1, self.max_positions, self.hidden),
                                          dtype=flow.float32, initializer=self._init())
            if seq != self.max_positions:
                positions = flow.slice(positions, begin=[None, 0, 0], size=[None, seq, -1])
            x = self.drop(self.layer_norm(x + positions), self.dropout)
        return x, table

    def attention(self, x2d, mask_add, seq):
        """Multi-head self-attention over ``(batch * seq, hidden)`` rows: the context ``(batch * seq, hidden)``."""
        def heads(t):       # (batch * seq, hidden) -> (batch, heads, seq, head_size)
            return flow.transpose(flow.reshape(t, (-1, seq, self.heads, self.head_size)), perm=[0, 2, 1, 3])

        q = heads(self.dense(x2d, self.hidden, "query"))
        k = heads(self.dense(x2d, self.hidden, "key"))
        v = heads(self.dense(x2d, self.hidden, "value"))
        scale = 1.0 / math.sqrt(self.head_size) if self.scale_attention else 1.0
        scores = flow.math.add(flow.matmul(q, k, transpose_b=True, alpha=scale), mask_add, name="attention_scores")
        probs = flow.nn.softmax(scores, name="attention_probs")
        context = flow.matmul(self.drop(probs, self.attention_dropout), v)
        return flow.reshape(flow.transpose(context, perm=[0, 2, 1, 3]), (-1, self.hidden))

    def layer(self, x2d, mask_add, seq, index):
        """One post-norm transformer layer over ``(batch * seq, hidden)`` rows."""
        with flow.scope.namespace(f"layer_{index}"):
            with flow.scope.namespace("attention"):
                with flow.scope.namespace("self"):
                    context = self.attention(x2d, mask_add, seq)
                with flow.scope.namespace("output"):
                    attended = self.drop(self.dense(context, self.hidden, "dense"), self.dropout)
                    attended = self.layer_norm(flow.math.add(attended, x2d, name="residual"))
            with flow.scope.namespace("intermediate"):
                inner = self.dense(attended, self.intermediate, "dense", activation=flow.math.gelu)
            with flow.scope.namespace("output"):
                out = self.drop(self.dense(inner, self.hidden, "dense"), self.dropout)
                return self.layer_norm(flow.math.add(out, attended, name="residual"))

    def encoder(self, input_ids, input_mask, segment_ids):
        """``(sequence output (batch, seq, hidden), word embedding table)``."""
        batch_seq = input_ids.shape
        with flow.scope.namespace("bert"):
            x, table = self.embeddings(input_ids, segment_ids)
            with flow.scope.namespace("encoder"):
                # 0 where a key is a real token, -10000 at padding: added to every query's scores
                mask = flow.reshape(flow.cast(input_mask, flow.float32), (-1, 1, 1, batch_seq[1]))
                mask_add = flow.math.multiply(mask - 1.0, 10000.0, name="attention_mask")
                x2d = flow.reshape(x, (-1, self.hidden))
                for i in range(self.layers):
                    x2d = self.layer(x2d, mask_add, batch_seq[1], i)
            return flow.reshape(x2d, (-1, batch_seq[1], self.hidden)), table

    def masked_lm_loss(self, sequence, table, positions, label_ids, label_weights):
        """Per-sequence weighted mean cross-entropy of the masked tokens, ``(batch,)``."""
        predictions = positions.shape[1]
        with flow.scope.namespace("cls-predictions"):
            picked = flow.gather(sequence, positions, axis=2, batch_dims=2, name="gather_masked")
            picked = flow.reshape(picked, (-1, self.hidden))
            with flow.scope.namespace("transform"):
                picked = self.layer_norm(self.dense(picked, self.hidden, "dense", activation=flow.math.gelu))
            bias = flow.get_variable("output_bias", shape=(self.vocab_size,), dtype=picked.dtype,
                                     initializer=flow.constant_initializer(0.0))
            logits = flow.nn.bias_add(flow.matmul(picked, table, transpose_b=True), bias, name="mlm_logits")
            loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels=flow.reshape(label_ids, (-1,)),
                                                                    logits=logits)
            loss = flow.reshape(loss, (-1, predictions)) * label_weights
            return flow.math.reduce_sum(loss, axis=[-1]) / (flow.math.reduce_sum(label_weights, axis=[-1]) + 1e-5)

    def next_sentence_loss(self, sequence, labels):
        """Cross-entropy of the pooled first token's is-next prediction, ``(batch,)``."""
        with flow.scope.namespace("bert-pooler"):
            first = flow.reshape(flow.slice(sequence, [None, 0, 0], [None, 1, -1]), (-1, self.hidden))
            pooled = self.dense(first, self.hidden, "dense", activation=flow.math.tanh)
        with flow.scope.namespace("cls-seq_relationship"):
            weight = flow.get_variable("output_weights", shape=(2, self.hidden), dtype=pooled.dtype,
                                       initializer=self._init())
            bias = flow.get_variable("output_bias", shape=(2,), dtype=pooled.dtype,
                                     initializer=flow.constant_initializer(0.0))
            logits = flow.nn.bias_add(flow.matmul(pooled, weight, transpose_b=True), bias, name="nsp_logits")
            return flow.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)

    def pretraining_losses(self, input_ids, input_mask, segment_ids, positions, label_ids, label_weights,
                           next_sentence_labels):
        """``(total, masked-LM, next-sentence)`` losses, each a scalar mean over the batch."""
        sequence, table = self.encoder(input_ids, input_mask, segment_ids)
        mlm = flow.math.reduce_mean(self.masked_lm_loss(sequence, table, positions, label_ids, label_weights),
                                    name="mlm_loss")
        nsp = flow.math.reduce_mean(self.next_sentence_loss(sequence, next_sentence_labels), name="nsp_loss")
        return flow.math.add(mlm, nsp, name="total_loss"), mlm, nsp


def pretrain_job(batch_size=8, seq_length=32, max_predictions=5, vocab_size=100, hidden=128, layers=2, heads=2,
                 lr=1e-3, warmup_steps=10, dropout=0.1, attention_dropout=0.1, scale_attention=True,
                 health_writer=None, health_every=1, health_thresholds=None):
    """A ``@flow.global_function(type="train")`` job over a batch in BERT's keys (``KEYS``, int32 arrays, the
    weights float32, next-sentence labels ``(batch, 1)``) returning ``[total, mlm, nsp]`` losses, minimized by
    Adam (bias-corrected) at ``lr`` after a linear warm-up of ``warmup_steps`` (0: none). With ``health_writer``
    (a ``SummaryWriter``) it also runs ``flow.watch_health(writer=health_writer, every=health_every,
    **health_thresholds)``."""
    builder = BertBuilder(vocab_size, hidden, layers, heads, max_positions=max(seq_length, 64), dropout=dropout,
                          attention_dropout=attention_dropout, scale_attention=scale_attention)
    ids = tp.Numpy.Placeholder((batch_size, seq_length), dtype=flow.int32)
    picks = tp.Numpy.Placeholder((batch_size, max_predictions), dtype=flow.int32)
    weights = tp.Numpy.Placeholder((batch_size, max_predictions), dtype=flow.float32)
    labels = tp.Numpy.Placeholder((batch_size, 1), dtype=flow.int32)
    warmup = flow.optimizer.warmup.linear(warmup_steps, 0) if warmup_steps else None

    @flow.global_function(type="train")
    def bert_pretrain(input_ids: ids, input_mask: ids, segment_ids: ids, masked_lm_positions: picks,
                      masked_lm_ids: picks, masked_lm_weights: weights,
                      next_sentence_labels: labels) -> tp.Bundle[tp.Numpy]:
        total, mlm, nsp = builder.pretraining_losses(input_ids, input_mask, segment_ids, masked_lm_positions,
                                                     masked_lm_ids, masked_lm_weights, next_sentence_labels)
        scheduler = flow.optimizer.PiecewiseConstantScheduler([], [lr], warmup=warmup)
        flow.optimizer.Adam(scheduler, do_bias_correction=True).minimize(total)
        if health_writer is not None:
            flow.watch_health(writer=health_writer, every=health_every, **(health_thresholds or {}))
        return [total, mlm, nsp]

    return bert_pretrain


def _pairs(rng, tokens, length):
    """``length`` ids in pairs (``x x y y ...``; an odd length ends with a single), each pair's id drawn from
    ``tokens``."""
    return np.repeat(rng.choice(tokens, (length + 1) // 2), 2)[:length]


def pretraining_examples(count, seq_length=32, vocab_size=100, max_predictions=5, seed=0):
    """``count`` learnable pretraining examples as a dict of arrays in BERT's keys (see the module's docstring):
    ``[CLS] A [SEP] B [SEP]`` then padding. Each segment repeats every id twice (``x x y y ...``), so a masked
    token is its unmasked neighbour's copy; ``A`` draws its ids from one half of the ordinary ids and ``B`` from
    the same half (next-sentence label 0, "is next") or from the other (label 1). Between ``max_predictions // 2``
    and ``max_predictions`` tokens, never both of a pair, are replaced by ``[MASK]`` (weight 1; the unused
    prediction slots weigh 0)."""
    if isinstance(seq_length, bool) or not isinstance(seq_length, int) or seq_length < 12:
        raise ValueError(f"pretraining_examples: seq_length must be an int >= 12, got {seq_length!r}")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < FIRST_TOKEN + 8:
        raise ValueError(f"pretraining_examples: vocab_size must be an int >= {FIRST_TOKEN + 8}, got {vocab_size!r}")
    if isinstance(max_predictions, bool) or not isinstance(max_predictions, int) or \
            not 1 <= max_predictions <= seq_length // 4:
        raise ValueError(f"pretraining_examples: max_predictions must be an int in [1, {seq_length // 4}], got "
                         f"{max_predictions!r}")
    rng = np.random.default_rng(seed)
    middle = FIRST_TOKEN + (vocab_size - FIRST_TOKEN) // 2
    halves = (np.arange(FIRST_TOKEN, middle), np.arange(middle, vocab_size))
    out = {"input_ids": np.zeros((count, seq_length), np.int32),
           "input_mask": np.zeros((count, seq_length), np.int32),
           "segment_ids": np.zeros((count, seq_length), np.int32),
           "masked_lm_positions": np.zeros((count, max_predictions), np.int32),
           "masked_lm_ids": np.zeros((count, max_predictions), np.int32),
           "masked_lm_weights": np.zeros((count, max_predictions), np.float32),
           "next_sentence_labels": np.zeros((count, 1), np.int32)}
    first_len = 2 * ((seq_length - 3) // 4)
    for n in range(count):
        half = int(rng.integers(2))
        is_next = bool(rng.integers(2))
        second_len = 2 * int(rng.integers(max(1, first_len // 4), (seq_length - 3 - first_len) // 2 + 1))
        a = _pairs(rng, halves[half], first_len)
        b = _pairs(rng, halves[half if is_next else 1 - half], second_len)
        tokens = np.concatenate([[CLS], a, [SEP], b, [SEP]]).astype(np.int32)
        used = tokens.size
        out["input_ids"][n, :used] = tokens
        out["input_mask"][n, :used] = 1
        out["segment_ids"][n, first_len + 2:used] = 1
        out["next_sentence_labels"][n, 0] = 0 if is_next else 1
        # one token of some pairs: pairs start at 1 (A) and first_len + 2 (B)
        starts = np.concatenate([1 + np.arange(0, first_len, 2), first_len + 2 + np.arange(0, second_len, 2)])
        chosen = rng.choice(starts, int(rng.integers(max(1, max_predictions // 2), max_predictions + 1)),
                            replace=False)
        picked = np.sort(chosen + rng.integers(0, 2, chosen.size))
        out["masked_lm_positions"][n, :picked.size] = picked
        out["masked_lm_ids"][n, :picked.size] = tokens[picked]
        out["masked_lm_weights"][n, :picked.size] = 1.0
        out["input_ids"][n, picked] = MASK
    return out


def write_pretraining_ofrecords(directory, count, part_num=1, seq_length=32, vocab_size=100, max_predictions=5,
                                seed=0, overwrite=False):
    """Write ``pretraining_examples(count, ...)`` as OFRecord part files (``part-0`` ...) in ``directory``, each
    record holding BERT's keys as int32 lists (``masked_lm_weights`` a float list), as OneFlow-Benchmark's
    ``run_pretraining.py`` reads them. Returns the part files' paths."""
    from flowlab.data.ofrecord import write_dataset
    examples = pretraining_examples(count, seq_length, vocab_size, max_predictions, seed)
    records = ({key: examples[key][n] for key in KEYS} for n in range(count))
    return write_dataset(directory, records, part_num=part_num, overwrite=overwrite)


def batches(examples, batch_size):
    """The examples' full batches in order, each a list of arrays in ``KEYS`` order (a train job's arguments)."""
    count = len(examples["input_ids"])
    return [[examples[key][i:i + batch_size] for key in KEYS] for i in range(0, count - batch_size + 1, batch_size)]
