"""OneFlow 0.x's in-job summary API: ops that write TensorBoard event files while a job runs.

Inside ``@flow.global_function`` jobs (OneFlow's docs, seed 004)::

    flow.summary.create_summary_writer(logdir)      # a job of its own; run it once before the others
    flow.summary.scalar(value, step, tag)           # value: one number
    flow.summary.histogram(value, step, tag)        # value: any real array
    flow.summary.image(value, step, tag)            # value: uint8 NHWC, C in 1, 3, 4 (written as PNGs)
    flow.summary.pb(value, step=step)               # value: int8 bytes of a text-format Summary
    flow.summary.flush_summary_writer()

``tag`` is an int8 tensor of the tag's UTF-8 bytes (``np.fromstring("loss", dtype=np.int8)``) and ``step`` an int64
tensor with one element; a plain ``str`` tag or ``int`` step also works and becomes a constant of the job.
Each call adds a side-effect op (no outputs; the compiler keeps it) whose kernel runs on the host, when the job
runs, and hands the data to the process's one summary writer: an ``EventFileWriter`` writing
``events.out.tfevents.*`` under ``logdir``, the names TensorBoard looks for (OneFlow's ``event.*.log`` files were
never found by it). Inputs are checked while the job is traced; a summary op run before ``create_summary_writer``
raises ``NoSummaryWriterError``.

Helpers outside jobs: ``text(list_of_str)`` -> a ``Summary`` whose ``str()`` is what ``pb`` takes, and
``Graph(logdir).write_structure_graph()`` (see ``Graph``). ``hparams`` and ``Projector`` live in their own modules.
"""
from __future__ import annotations

import json
import os
import threading

import numpy as np
from google.protobuf import text_format

from ..errors import FlowlabError, ShapeError
from ..ops import Op, apply, as_tensor
from . import encode, graph_export, proto
from .projector import write_atomic
from .writer import EventFileWriter, check_step

STRUCTURE_GRAPH_FILE = "structure_graph.json"


class NoSummaryWriterError(FlowlabError, RuntimeError):
    """A summary op ran before any ``flow.summary.create_summary_writer`` job."""


# ------------------------------------------------------------------------------------------------------ the writer

_writer: EventFileWriter | None = None
_writer_lock = threading.Lock()


def _open_writer(logdir):
    """Make the writer for ``logdir`` the current one; the same logdir keeps its open writer (and file)."""
    global _writer
    with _writer_lock:
        if _writer is not None and os.path.abspath(_writer.logdir) == os.path.abspath(logdir):
            return _writer
        if _writer is not None:
            _writer.close()
        _writer = EventFileWriter(logdir)
        return _writer


def current_writer() -> EventFileWriter:
    """The writer the summary ops write to."""
    writer = _writer
    if writer is None:
        raise NoSummaryWriterError(
            "no summary writer: run a job that calls flow.summary.create_summary_writer(logdir) before jobs that "
            "write summaries")
    return writer


def close_summary_writer():
    """Flush and close the current writer (the next summary op needs a new ``create_summary_writer`` job)."""
    global _writer
    with _writer_lock:
        if _writer is not None:
            _writer.close()
            _writer = None


# ------------------------------------------------------------------------------------------------------ host values

def _host(array) -> np.ndarray:
    return encode.as_array(array)           # NumPy as it is; CuPy copied to the host


def _tag(array) -> str:
    data = _host(array).tobytes().rstrip(b"\0")     # trailing NULs: a tag padded to a fixed length
    try:
        return encode.check_tag(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"tag bytes {data[:40]!r} are not UTF-8 text") from None


def _step(array) -> int:
    return check_step(int(_host(array).reshape(-1)[0]), "step")     # a uint64 step may not fit Event.step


# ------------------------------------------------------------------------------------------------------ ops

class _SummaryOp(Op):
    outputs = ()
    side_effect = True


def _check(t, name, kinds, what, size=None):
    """Trace-time check of one input tensor: dtype kind in ``kinds``; exactly ``size`` elements when given."""
    if t.dtype.kind not in kinds:
        raise ShapeError(f"{name} must be {what}, got {t.dtype} tensor {t.logical_blob_name}")
    if size is not None and t.size != size:
        raise ShapeError(f"{name} must have exactly {size} element, got shape {t.shape} ({t.logical_blob_name})")


def _check_step_tag(step, tag):
    _check(step, "step", "iu", "an integer (int64) tensor", size=1)
    if tag.dtype != np.int8:
        raise ShapeError(f"tag must be an int8 tensor of the tag's bytes (np.frombuffer(b'name', dtype=np.int8)), "
                         f"got {tag.dtype} tensor {tag.logical_blob_name}")


class CreateSummaryWriter(_SummaryOp):
    prefix, api = "CreateSummaryWriter_", "flow.summary.create_summary_writer"

    @staticmethod
    def infer(logdir):
        return []

    @staticmethod
    def forward(xp, logdir):
        _open_writer(logdir)


class FlushSummaryWriter(_SummaryOp):
    prefix, api = "FlushSummaryWriter_", "flow.summary.flush_summary_writer"

    @staticmethod
    def infer():
        return []

    @staticmethod
    def forward(xp):
        current_writer().flush()


class WriteScalar(_SummaryOp):
    prefix, api = "WriteScalar_", "flow.summary.scalar"

    @staticmethod
    def infer(value, step, tag):
        _check(value, "value", "biuf", "a real number", size=1)
        _check_step_tag(step, tag)
        return []

    @staticmethod
    def forward(xp, value, step, tag):
        current_writer().add_scalar(_tag(tag), float(_host(value).reshape(())), _step(step))


class WriteHistogram(_SummaryOp):
    prefix, api = "WriteHistogram_", "flow.summary.histogram"

    @staticmethod
    def infer(value, step, tag):
        _check(value, "value", "biuf", "a tensor of real numbers")
        _check_step_tag(step, tag)
        return []

    @staticmethod
    def forward(xp, value, step, tag):
        current_writer().add_summary([encode.histogram(_tag(tag), _host(value), name="value")], _step(step))


class WriteImage(_SummaryOp):
    prefix, api = "WriteImage_", "flow.summary.image"

    @staticmethod
    def infer(value, step, tag):
        if value.dtype != np.uint8 or value.ndim != 4 or value.shape[3] not in (1, 3, 4):
            raise ShapeError(f"value must be uint8 images (N, H, W, C) with C = 1, 3 or 4, got {value.dtype} "
                             f"tensor {value.logical_blob_name} of shape {value.shape}")
        _check_step_tag(step, tag)
        return []

    @staticmethod
    def forward(xp, value, step, tag):
        current_writer().add_summary([encode.image(_tag(tag), _host(value), name="value")], _step(step))


class WritePb(_SummaryOp):
    prefix, api = "WritePb_", "flow.summary.pb"

    @staticmethod
    def infer(value, step):
        if value.dtype != np.int8:
            raise ShapeError(f"value must be an int8 tensor of a text-format Summary's bytes "
                             f"(np.frombuffer(str(summary).encode(), dtype=np.int8)), got {value.dtype} tensor "
                             f"{value.logical_blob_name}")
        _check(step, "step", "iu", "an integer (int64) tensor", size=1)
        return []

    @staticmethod
    def forward(xp, value, step):
        text = _host(value).tobytes().rstrip(b"\0").decode("utf-8", errors="replace")
        summary = proto.Summary()
        try:
            text_format.Parse(text, summary)
        except text_format.ParseError as e:
            raise ValueError(f"flow.summary.pb: value is not a text-format Summary ({e}); build it with "
                             f"str(flow.summary.text(...)) or str(flow.summary.hparams(...))") from None
        for v in summary.value:
            encode.check_tag(v.tag, "a Summary value's tag")
        current_writer().add_summary(summary, _step(step))


def _tag_tensor(tag):
    if isinstance(tag, str):            # a constant of the job: no placeholder needed for a fixed tag
        tag = np.frombuffer(encode.check_tag(tag).encode("utf-8"), dtype=np.int8)
    return as_tensor(tag, argument="tag")


def _step_tensor(step):
    if isinstance(step, (int, np.integer)) and not isinstance(step, bool):
        step = np.array([step], dtype=np.int64)
    return as_tensor(step, argument="step")


def create_summary_writer(logdir):
    """Make ``logdir``'s event file the current writer when the job runs (in a job of its own).

    Differs from OneFlow: the file is named ``events.out.tfevents.*``, so TensorBoard and flowlab's dashboard find
    it (OneFlow named it ``event.*.log``, which TensorBoard never read).
    """
    if not isinstance(logdir, (str, os.PathLike)):
        raise TypeError(f"create_summary_writer: logdir must be a path, got {type(logdir).__name__} {logdir!r}")
    apply(CreateSummaryWriter, (), logdir=os.fspath(logdir))


def flush_summary_writer():
    """Write everything queued so far to the event file when the job runs."""
    apply(FlushSummaryWriter, ())


def scalar(value, step, tag, name=None):
    """In a job: write ``value`` (one real number) as the scalar ``tag`` at ``step`` to the current writer
    (``create_summary_writer``) each time the job runs. ``tag`` is a str or OneFlow's int8 tensor of its bytes;
    ``step`` an int or an int64 tensor of one element.
    """
    apply(WriteScalar, (as_tensor(value, argument="value"), _step_tensor(step), _tag_tensor(tag)), name)


def histogram(value, step, tag, name=None):
    """In a job: write the histogram of ``value`` (real numbers) as ``tag`` at ``step`` each time the job runs
    (``tag`` and ``step`` as in ``scalar``).
    """
    apply(WriteHistogram, (as_tensor(value, argument="value"), _step_tensor(step), _tag_tensor(tag)), name)


def image(value, step, tag, name=None):
    """In a job: write ``value``, uint8 images ``(N, H, W, C)`` with C = 1, 3 or 4, as ``tag`` at ``step`` each time
    the job runs (``tag`` and ``step`` as in ``scalar``).
    """
    apply(WriteImage, (as_tensor(value, argument="value"), _step_tensor(step), _tag_tensor(tag)), name)


def pb(value, step=None, name=None):
    """In a job: write ``value``, an int8 tensor of a text-format ``Summary``'s bytes (``str(flow.summary.text(...))``
    or ``str(flow.summary.hparams(...))``), at ``step`` (0 when None) each time the job runs.
    """
    apply(WritePb, (as_tensor(value, argument="value"), _step_tensor(0 if step is None else step)), name)


# ------------------------------------------------------------------------------------------------------ helpers

def text(text_list, tag="text") -> proto.Summary:
    """A ``Summary`` with one text value (a table row per string); ``str()`` of it goes into ``pb``."""
    if isinstance(text_list, str):
        text_list = [text_list]
    if not isinstance(text_list, (list, tuple)) or not text_list or \
            not all(isinstance(s, str) for s in text_list):
        raise TypeError(f"text: expected a non-empty list of str, got {text_list!r}")
    summary = proto.Summary()
    summary.value.append(encode.text(tag, list(text_list)))
    return summary


class Graph:
    """``flow.summary.Graph(logdir).write_structure_graph()``: every job function defined so far, as OneFlow's
    structure JSON (``<logdir>/structure_graph.json``) and as one ``GraphDef`` for TensorBoard's graph dashboard."""

    def __init__(self, logdir):
        self.logdir = os.fspath(logdir)

    def write_structure_graph(self):
        from ..runtime import session
        jobs = list(session.default().jobs)
        os.makedirs(self.logdir, exist_ok=True)
        document = {"format": "flowlab.structure_graph", "version": 1,
                    "jobs": [graph_export.structure_json(job) for job in jobs]}
        write_atomic(os.path.join(self.logdir, STRUCTURE_GRAPH_FILE),
                      json.dumps(document, indent=1).encode("utf-8"))
        data = graph_export.jobs_graph_def(jobs)
        writer = _writer
        # The open writer of this logdir, when there is one: a second event file in a run makes TensorBoard's
        # reader stop following the first.
        if writer is not None and os.path.abspath(writer.logdir) == os.path.abspath(self.logdir):
            writer.add_graph_def(data)
            writer.flush()
        else:
            writer = EventFileWriter(self.logdir)
            writer.add_graph_def(data)
            writer.close()
        return os.path.join(self.logdir, STRUCTURE_GRAPH_FILE)

    def __repr__(self):
        return f"Graph({self.logdir!r})"
