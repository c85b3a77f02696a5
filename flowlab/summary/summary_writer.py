"""``SummaryWriter``: PyTorch's summary API (``add_scalar``, ``add_histogram``, ``add_image`` …) over
``EventFileWriter``, writing the encodings of ``encode``.

Arguments are checked on the caller's thread, so a bad tag, value or image raises right where it was passed; only
checked data reaches the writer thread.

Where it differs from ``torch.utils.tensorboard``:

* ``add_hparams`` writes into this writer's own run by default (torch makes a new sub-run per call), so the hparams
  sit beside the training curves. The experiment and session start go out on the first call; later calls (or
  ``add_scalar(metric_tag, ...)``) add metric values, and ``close()`` ends the session with status SUCCESS
  (FAILURE when a ``with`` block exits with an exception). ``run_name`` puts a trial in a sub-run instead.
* ``add_histogram`` writes TensorBoard's ``[k, 3]`` bucket tensor; ``bins="tensorflow"`` means TensorBoard's
  default of 30 equal-width buckets. NaN/±Inf are left out of the buckets and counted in the scalars
  ``<tag>/nan_count`` and ``<tag>/inf_count`` from the first step where a tag has any.
* ``add_images`` stores each image as its own sample rather than tiling them into one grid.
* Names that become directories, ``add_scalars``' ``<main_tag>_<key>`` and ``add_hparams(run_name=...)``, must stay
  inside ``logdir``: ``/`` nests runs as in torch, but absolute paths, empty, ``.`` or ``..`` parts, NUL or other
  control characters, and symbolic links leading out are refused with ``ValueError`` (nothing is written). They
  are refused rather than mapped to a safe name, because the run would then show under a name nobody chose
  (torch writes such runs outside the logdir). Tags never become paths (``add_embedding`` quotes its tag into one
  directory name).

Threads: one writer may be shared by any number of threads. Each sub-run gets exactly one child writer (created
under a lock, so one event file per sub-run however many threads race to its first value). ``flush()`` and
``close()`` cover every child, including one created by a call racing them; once ``close()`` returns, every value
accepted by a call that returned is on disk (it survives SIGKILL). After ``close()`` (or while it runs) every
``add_*`` call raises ``ValueError`` saying the writer is closed, and starts no sub-run; an ``add_scalars`` that races
``close()`` may have written some of its keys before it raises.

Errors: every argument is checked before anything is queued, so a bad call raises at once, naming the argument,
and leaves the writer and what it accepted before untouched. Write errors (a full disk) are ``EventFileWriter``'s
to keep and retry; ``flush()`` and ``close()`` raise them naming the file.
"""
from __future__ import annotations

import datetime
import os
import socket
import threading
import time

from ..runtime import dispatch
from . import encode, health_log
from .writer import EventFileWriter, check_step


def _step(global_step):
    return 0 if global_step is None else check_step(global_step, "global_step")


def _check_relative(name, what):
    """The parts of ``name``, a relative path of plain names (checked on its own, before any prefix is added)."""
    parts = name.replace("\\", "/").split("/")    # both separators, so a name means the same on every OS
    if (os.path.isabs(name) or os.path.splitdrive(name)[0] or any(part in ("", ".", "..") for part in parts)
            or any(ord(c) < 32 or c == "\x7f" for c in name)):
        raise ValueError(f"{what} must name a run directory inside the logdir: relative, '/' only between names, "
                         f"no '.' or '..' parts, no NUL or control characters; got {name!r}")
    return parts


def _subrun_path(logdir, name, what):
    """``logdir/name`` for a sub-run named by the caller, refusing any name that could lead outside ``logdir``."""
    parts = _check_relative(name, what)
    path = os.path.join(logdir, *parts)
    root = os.path.realpath(logdir)
    if os.path.commonpath([root, os.path.realpath(path)]) != root:
        raise ValueError(f"{what} {name!r}: {path!r} leads outside the logdir {logdir!r} through a symbolic link")
    return path


def _walltime(walltime):
    return time.time() if walltime is None else encode.to_wall_time(walltime, "walltime")


def _to_nhwc(img, dataformats, name, batch):
    """``img`` laid out as ``dataformats`` (letters from N, C, H, W) -> an ``NHWC`` array."""
    array = encode.as_array(img, name)
    shape = array.shape
    allowed = "NCHW" if batch else "CHW"
    fmt = dataformats.upper() if isinstance(dataformats, str) else ""
    if not ("H" in fmt and "W" in fmt and set(fmt) <= set(allowed) and len(set(fmt)) == len(fmt)):
        raise ValueError(f"dataformats must name the axes H and W once each, optionally with "
                         f"{' and '.join(sorted(set(allowed) - set('HW')))}; got {dataformats!r}")
    if array.ndim != len(fmt):
        raise ValueError(f"{name} has shape {array.shape} ({array.ndim} axes), but dataformats={dataformats!r} "
                         f"describes {len(fmt)} axes")
    for axis in "NC":                   # a missing axis becomes a trailing one of size 1
        if axis not in fmt:
            array, fmt = array[..., None], fmt + axis
    nhwc = array.transpose([fmt.index(axis) for axis in "NHWC"])
    empty = [axis for axis, n in zip("NHW", nhwc.shape) if n == 0 and axis in dataformats.upper()]
    if empty:
        raise ValueError(f"{name} has shape {shape} with dataformats={dataformats!r}: {' and '.join(empty)} "
                         f"{'is' if len(empty) == 1 else 'are'} 0; expected at least one image of at least "
                         f"1x1 pixels")
    if nhwc.shape[3] not in (1, 3, 4):
        raise ValueError(f"{name} of shape {shape} with dataformats={dataformats!r} has "
                         f"{nhwc.shape[3]} channels; expected 1, 3 or 4")
    return nhwc


# The scalars add_histogram logs beside a histogram that held NaN/Inf (a histogram has no place for them): NaN, Inf.
COUNT_SUFFIXES = ("/nan_count", "/inf_count")


def counted_histogram(tag):
    """The histogram tag whose NaN or Inf count the scalar ``tag`` may be (``w/nan_count`` -> ``w``), else None."""
    return next((tag[:-len(suffix)] for suffix in COUNT_SUFFIXES if tag.endswith(suffix)), None)


class SummaryWriter:
    """Write TensorBoard event files into ``logdir`` (default ``runs/<date>_<host>``, as torch's)."""

    def __init__(self, logdir=None, flush_secs=1.0, filename_suffix="", max_queue=1024):
        if logdir is None:
            logdir = os.path.join("runs", datetime.datetime.now().strftime("%b%d_%H-%M-%S") + "_"
                                  + socket.gethostname())
        self.logdir = os.fspath(logdir)
        self._options = dict(flush_secs=flush_secs, filename_suffix=filename_suffix, max_queue=max_queue)
        self.file_writer = EventFileWriter(self.logdir, **self._options)
        self._children = {}             # sub-runs: add_scalars keys and add_hparams(run_name=...)
        self._children_lock = threading.Lock()  # creates children and closes the writer: none is made after close
        self._closed = False
        self._nonfinite_tags = set()    # histogram tags that have met NaN/Inf: their counts are written from then on
        self._hparams = None            # (hparam_dict, metric tags) once this run holds an hparams session
        self._session_ended = False
        self._health_layouts = {}       # add_health tag (and its parts) -> (layers, statistics) of its first report

    def get_logdir(self):
        return self.logdir

    # ------------------------------------------------------------------------------------------------ scalars

    def add_scalar(self, tag, scalar_value, global_step=None, walltime=None):
        # The file writer checks the tag the first time it sees it (a known tag needs no check).
        self.file_writer.add_scalar(tag, scalar_value if type(scalar_value) is float
                                    else encode.to_scalar(scalar_value, "scalar_value"),
                                    _step(global_step), _walltime(walltime))

    def add_scalars(self, main_tag, tag_scalar_dict, global_step=None, walltime=None):
        """One value per key, each in its own run ``<logdir>/<main_tag>_<key>`` under the tag ``main_tag``, so
        TensorBoard draws them in one chart."""
        encode.check_tag(main_tag, "main_tag")
        if not isinstance(tag_scalar_dict, dict):
            raise TypeError(f"tag_scalar_dict must be a dict of key -> number, got {type(tag_scalar_dict).__name__}")
        values = {encode.check_tag(key, "tag_scalar_dict key"): encode.to_scalar(value, f"tag_scalar_dict[{key!r}]")
                  for key, value in tag_scalar_dict.items()}
        step, wall = _step(global_step), _walltime(walltime)
        self._check_open("add_scalars")
        names = {key: f"{main_tag.replace('/', '_')}_{key}" for key in values}
        for key, name in names.items():     # every run name checked before any value is written
            if name not in self._children:
                what = f"tag_scalar_dict key {key!r} (run directory {name!r})"
                _check_relative(key, what)
                _subrun_path(self.logdir, name, what)
        for key, value in values.items():
            self._child(names[key], "add_scalars").file_writer.add_scalar(main_tag, value, step, wall)

    # ------------------------------------------------------------------------------------------------ arrays

    def add_histogram(self, tag, values, global_step=None, bins="tensorflow", walltime=None):
        encode.check_tag(tag)
        encode.check_bins(bins)
        array = encode.as_array(values, "values")
        value = encode.histogram(tag, array, bins)
        nan, inf = encode.nonfinite_counts(array)
        step, wall = _step(global_step), _walltime(walltime)
        self.file_writer.add_summary([value], step, wall)
        if nan or inf or tag in self._nonfinite_tags:
            self._nonfinite_tags.add(tag)
            for suffix, count in zip(COUNT_SUFFIXES, (nan, inf)):
                self.file_writer.add_scalar(tag + suffix, float(count), step, wall)

    def add_image(self, tag, img, global_step=None, walltime=None, dataformats="CHW"):
        """One image: uint8 (0..255) or float (0..1), laid out as ``dataformats`` (CHW, HWC, HW …)."""
        encode.check_tag(tag)
        value = encode.image(tag, _to_nhwc(img, dataformats, "img", batch=False)[0])
        self.file_writer.add_summary([value], _step(global_step), _walltime(walltime))

    def add_images(self, tag, imgs, global_step=None, walltime=None, dataformats="NCHW"):
        """A batch of images, one sample each (TensorBoard's image slider walks through them)."""
        encode.check_tag(tag)
        value = encode.image(tag, _to_nhwc(imgs, dataformats, "imgs", batch=True), name="imgs")
        self.file_writer.add_summary([value], _step(global_step), _walltime(walltime))

    def add_text(self, tag, text_string, global_step=None, walltime=None):
        self.file_writer.add_summary([encode.text(tag, text_string)], _step(global_step), _walltime(walltime))

    def add_health(self, report, global_step=None, walltime=None, tag="health"):
        """A ``flowlab.HealthReport`` (from ``flow.watch_health``) as one event: its table, loss, alerts and any
        histograms, at ``global_step`` (default the report's step). See ``health_log`` for the layout."""
        if not hasattr(report, "table") or not hasattr(report, "alerts"):
            raise TypeError(f"add_health: report must be a flowlab.HealthReport (what flow.watch_health delivers), "
                            f"got {type(report).__name__}")
        encode.check_tag(tag)
        step = _step(report.step if global_step is None else global_step)
        summary, layouts = health_log.values(report, tag, self._health_layouts)
        self.file_writer.add_summary(summary, step, _walltime(walltime))
        self._health_layouts = layouts

    # ------------------------------------------------------------------------------------------------ hparams

    def add_hparams(self, hparam_dict, metric_dict, hparam_domain_discrete=None, run_name=None,
                    global_step=None):
        """Record a trial's hparams and metric values; returns the writer of the trial's run, whose
        ``add_scalar(metric_tag, ...)`` (or another ``add_hparams``) updates the metrics later."""
        if not isinstance(hparam_dict, dict) or not isinstance(metric_dict, dict):
            raise TypeError(f"hparam_dict and metric_dict must be dicts, got {type(hparam_dict).__name__} and "
                            f"{type(metric_dict).__name__}")
        if run_name is not None:
            _subrun_path(self.logdir, encode.check_tag(run_name, "run_name"), "run_name")
        writer = self if run_name is None else self._child(run_name, "add_hparams")
        writer._write_hparams(hparam_dict, metric_dict, hparam_domain_discrete, _step(global_step))
        return writer

    def _write_hparams(self, hparam_dict, metric_dict, domains, step):
        metrics = {encode.check_tag(tag, "metric tag"): encode.to_scalar(value, f"metric_dict[{tag!r}]")
                   for tag, value in metric_dict.items()}
        wall = time.time()
        if self._hparams is None:
            # Both built (and so checked) before either is written.
            values = [encode.hparams_experiment(hparam_dict, list(metrics), domains, wall),
                      encode.hparams_session_start(hparam_dict, wall)]
            self.file_writer.add_summary(values, step, wall)
            self._hparams = (dict(hparam_dict), set(metrics))
        else:
            known_hparams, known_metrics = self._hparams
            if hparam_dict != known_hparams:
                raise ValueError(f"run {self.logdir!r} already holds the hparams {known_hparams}; one run is one "
                                 f"trial: pass run_name=... to record another")
            if not set(metrics) <= known_metrics:
                raise ValueError(f"metrics {sorted(set(metrics) - known_metrics)} were not in this run's first "
                                 f"add_hparams call ({sorted(known_metrics)}); TensorBoard would not show them")
        for tag, value in metrics.items():
            self.file_writer.add_scalar(tag, value, step, wall)

    # ------------------------------------------------------------------------------------------------ delegated

    def add_graph(self, job):
        """The job's graph for TensorBoard's graph dashboard (built by ``graph_export``)."""
        from .graph_export import graph_def
        self.file_writer.add_graph_def(graph_def(job))

    def add_embedding(self, mat, metadata=None, label_img=None, global_step=None, tag="default",
                      metadata_header=None):
        """Vectors for TensorBoard's projector, written into this run's directory (by ``projector``)."""
        from .projector import write_embedding
        self._check_open("add_embedding")
        step = None if global_step is None else _step(global_step)
        # Text is checked before the projector writes any file (a lone surrogate failed halfway through them).
        encode.check_tag(tag)
        for name, texts in (("metadata", metadata), ("metadata_header", metadata_header)):
            if isinstance(texts, (list, tuple)):
                for item in texts:
                    for text in item if isinstance(item, (list, tuple)) else (item,):
                        if isinstance(text, str):
                            encode.check_text(text, f"{name} labels")
        write_embedding(self.logdir, mat, metadata, label_img, step, tag, metadata_header)

    # ------------------------------------------------------------------------------------------------ lifetime

    def _check_open(self, method):
        if self._closed:
            raise ValueError(f"{method}: SummaryWriter({self.logdir!r}) is closed; nothing more can be added")

    def _child(self, name, method):
        """The one writer of sub-run ``name``, created on first use. The lock makes racing first calls share one
        writer (each used to make its own file, and all but the last were never closed)."""
        child = self._children.get(name)
        if child is None:
            with self._children_lock:
                child = self._children.get(name)
                if child is None:
                    self._check_open(method)
                    child = SummaryWriter(_subrun_path(self.logdir, name, "run name"), **self._options)
                    self._children[name] = child
        return child

    def flush(self):
        dispatch.default().wait()        # what watches (watch_health) still had on their way to this writer
        self.file_writer.flush()
        with self._children_lock:        # a snapshot: another thread may be adding a child
            children = list(self._children.values())
        for child in children:
            child.flush()

    def close(self):
        self._close("SUCCESS")

    def _close(self, status):
        dispatch.default().wait()
        with self._children_lock:        # from here on no child is created, so this list is all of them
            self._closed = True
            children = list(self._children.values())
            end_session = self._hparams is not None and not self._session_ended
            self._session_ended |= end_session
        if end_session:
            self.file_writer.add_summary([encode.hparams_session_end(status)])
        for child in children:
            child._close(status)
        self.file_writer.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self._close("FAILURE" if exc_type is not None else "SUCCESS")

    def __repr__(self):
        return f"SummaryWriter({self.logdir!r})"
