"""Embeddings and anomaly samples for TensorBoard's projector, in its on-disk layout, and read back.

Every ``(kind, tag, step)`` gets its own directory under the run directory ``logdir``, so later steps never
overwrite earlier ones (OneFlow's projector rewrote one file on every call)::

    logdir/projector_config.pbtxt            every embedding written so far (rewritten atomically each time)
    logdir/<tag>_<step:05d>/                 kind "embedding" (the tag %-quoted); exception/<tag>_<step:05d>/ for
                                             kind "exception"
        tensors.tsv      one row per sample (the value flattened to [n, d])
        metadata.tsv     labels: one column without a header, several columns with a header row
        sprite.png       the samples ``x`` as a square grid of images, when ``x`` holds one image per point
        samples.npy      ``x`` as it is, when it holds no images or not one per point
        labels.npy       (``Projector``) the labels as given, when there is not one per point
        info.json        flowlab's own description: kind, tag, step, shape, sample name/type, NaN/Inf counts
        tensor.npy       (exception kind) the exact values, NaN and Inf included

NaN and Inf would poison the projector's PCA and t-SNE, so ``tensors.tsv`` holds 0 in their place (``info.json``
counts them). For the exception kind, whose point is those values, the metadata also marks each row (``status``
finite/nan/inf/nan+inf and the counts) and ``tensor.npy`` keeps the values exactly. ``read_projector(logdir)``
gives everything back.

``Projector`` is OneFlow's ``flow.summary.Projector``; ``write_embedding`` serves ``SummaryWriter.add_embedding``.
OneFlow stored a projector's ``label`` and ``x`` as given, whatever their sample count (its own summary test passes
10 of each for 100 points), so ``Projector`` does too: counts that differ from the points' go to ``labels.npy`` /
``samples.npy`` instead of the metadata / sprite, which TensorBoard pairs with the points one to one
(``unmatched_note`` says what was left unpaired).
"""
from __future__ import annotations

import io
import json
import math
import os
import tempfile
import threading
import urllib.parse
from typing import NamedTuple

import numpy as np
from google.protobuf import text_format

from . import proto
from .encode import as_array, image_array
from .logdir_files import LocalDirectory, UnsafePath

CONFIG_FILE = "projector_config.pbtxt"
# Caps on what reading a run's projector files may cost (the paths come from a config anyone could have written):
MAX_CONFIG_BYTES = 16 << 20
MAX_TENSOR_BYTES = 256 << 20        # tensors.tsv / tensor.npy: about 20M values written as text
MAX_METADATA_BYTES = 64 << 20
MAX_INFO_BYTES = 1 << 20
MAX_SPRITE_BYTES = 64 << 20
MAX_SPRITE_PIXELS = 8192 * 8192     # TensorBoard's own limit on a sprite's size
KINDS = ("embedding", "exception")
_lock = threading.Lock()            # one config update at a time in this process


class Embedding(NamedTuple):
    tag: str
    step: int
    tensor: np.ndarray              # [n, d]; the exact values (NaN/Inf included) for kind "exception"
    metadata: list                  # rows of str, one per sample ([] without metadata)
    metadata_header: list | None    # column names when the metadata has several columns
    sprite: str | None              # sprite.png: its path (or object key, remotely), for ``read_located``
    kind: str                       # "embedding" or "exception"
    info: dict                      # info.json: sample_name, sample_type, nan_count, inf_count, ...
    labels: np.ndarray | None = None    # labels.npy: labels as given, when not one per point (else in metadata)


# ------------------------------------------------------------------------------------------------------ checks

def _host(array, name):
    array = as_array(array, name)           # NumPy, CuPy (copied to the host), Blobs, torch tensors
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{name} must hold real numbers, got an array of dtype {array.dtype}")
    return array


def _matrix(value, name):
    """``value`` as ``[n, d]``: samples along the first axis, each flattened."""
    array = _host(value, name)
    if array.ndim == 0 or array.shape[0] == 0:
        raise ValueError(f"{name} must have at least one sample along its first axis, got shape {array.shape}")
    return array.reshape(len(array), -1)


def _check_tag_step(tag, step):
    if not isinstance(tag, str) or not tag:
        raise TypeError(f"tag must be a non-empty str, got {tag!r}")
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)):
        raise TypeError(f"step must be an int, got {type(step).__name__} {step!r}")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return tag, int(step)


def _cell(value):
    # A tab or newline inside a label would shift TensorBoard's columns or rows.
    return str(value).replace("\t", " ").replace("\r", " ").replace("\n", " ")


def _metadata_rows(metadata, n, header):
    """(rows of str, header or None) from a list of labels or a list of rows."""
    rows = list(metadata.tolist() if isinstance(metadata, np.ndarray) else metadata)
    if len(rows) != n:
        raise ValueError(f"metadata has {len(rows)} rows but there are {n} samples")
    several = any(isinstance(r, (list, tuple, np.ndarray)) for r in rows)
    rows = [[_cell(c) for c in r] if several else [_cell(r)] for r in rows]
    width = {len(r) for r in rows}
    if len(width) != 1:
        raise ValueError(f"metadata rows must all have the same number of columns, got {sorted(width)}")
    width = width.pop()
    if header is not None and len(header) != width:
        raise ValueError(f"metadata_header has {len(header)} names but the metadata has {width} columns")
    if width == 1:                      # TensorBoard reads a one-column file as labels only, never a header
        return rows, None
    return rows, [_cell(h) for h in header] if header is not None else [f"column_{i}" for i in range(width)]


def _images(array):
    """``array`` as uint8 ``[n, h, w, c]`` (c 1/3/4) when it holds images, else ``None``."""
    if array.dtype != np.uint8 or array.ndim not in (3, 4) or (array.ndim == 4 and array.shape[3] not in (1, 3, 4)):
        return None
    return array[..., None] if array.ndim == 3 else array


_MARK_COLUMNS = ["status", "nan_count", "inf_count"]


def _anomaly_marks(matrix):
    """Per row: status (finite / nan / inf / nan+inf), NaN count, Inf count."""
    if matrix.dtype.kind != "f":
        return [["finite", "0", "0"] for _ in range(len(matrix))]
    marks = []
    for nan, inf in zip(np.isnan(matrix).sum(1).tolist(), np.isinf(matrix).sum(1).tolist()):
        status = "nan+inf" if nan and inf else "nan" if nan else "inf" if inf else "finite"
        marks.append([status, str(nan), str(inf)])
    return marks


def sprite(images: np.ndarray) -> np.ndarray:
    """``[n, h, w, c]`` uint8 images tiled row-major into a square grid (TensorBoard's sprite layout)."""
    n, h, w, c = images.shape
    side = math.ceil(math.sqrt(n))
    grid = np.zeros((side * side, h, w, c), np.uint8)
    grid[:n] = images
    return grid.reshape(side, side, h, w, c).transpose(0, 2, 1, 3, 4).reshape(side * h, side * w, c)


# ------------------------------------------------------------------------------------------------------ writing

def write_atomic(path, data: bytes):
    """Write via a temporary file and a rename, so a reader sees the old file or the new one, never half of one."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-" + os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)                # mkstemp makes it private; the config is as readable as the rest
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _directory(kind, tag, step) -> str:
    """The entry's directory relative to logdir; embedding names always end in digits, so none is "exception"."""
    name = f"{urllib.parse.quote(tag, safe='')}_{step:05d}"   # a tag with "/" stays one directory, and distinct
    return name if kind == "embedding" else f"{kind}/{name}"


def _read_config(directory):
    """The ProjectorConfig of ``directory`` (a ``logdir_files`` directory), empty when it has none."""
    config = proto.ProjectorConfig()
    if directory.lexists(CONFIG_FILE):
        text = directory.read(CONFIG_FILE, "the config", MAX_CONFIG_BYTES).decode("utf-8")
        try:
            text_format.Parse(text, config)
        except text_format.ParseError as e:         # a ValueError, as the view expects of a bad file
            raise ValueError(f"{CONFIG_FILE} in {directory.name!r} is no ProjectorConfig text: {e}") from None
    return config


def ensure_config(logdir):
    """Create ``logdir`` and its (possibly empty) ``projector_config.pbtxt``; existing entries are kept."""
    os.makedirs(logdir, exist_ok=True)
    with _lock:
        path = os.path.join(logdir, CONFIG_FILE)
        if not os.path.exists(path):
            write_atomic(path, b"")


def write(logdir, kind, tag, step, value, metadata=None, metadata_header=None, images=None, samples=None,
          extra_info=None, labels=None) -> str:
    """Write one embedding of ``kind`` and list it in the config; returns its directory.

    ``value`` [n, ...] is flattened to [n, d]; ``images`` (uint8 [n, h, w, c]) become the sprite; ``samples`` (any
    array, any number of samples) are kept as ``samples.npy`` and ``labels`` (any array) as ``labels.npy``.
    Writing the same (kind, tag, step) again replaces that one entry.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    tag, step = _check_tag_step(tag, step)
    logdir = os.fspath(logdir)
    value = _host(value, "value")
    shape, matrix = value.shape, _matrix(value, "value")
    n = len(matrix)
    rows, header = _metadata_rows(metadata, n, metadata_header) if metadata is not None else ([], None)
    if images is not None and len(images) != n:       # the sprite's grid is laid out for one image per point
        raise ValueError(f"x has {len(images)} images but value has {n} samples")

    info = {"kind": kind, "tag": tag, "step": step, "shape": list(shape), **(extra_info or {})}
    finite = matrix
    if matrix.dtype.kind == "f":
        bad_nan, bad_inf = np.isnan(matrix), np.isinf(matrix)
        info.update(nan_count=int(bad_nan.sum()), inf_count=int(bad_inf.sum()))
        finite = np.where(bad_nan | bad_inf, 0, matrix)
    if kind == "exception":
        # Anomaly views want to see which samples went bad: every row is marked, beside any labels given.
        marks = _anomaly_marks(matrix)
        header = (header or ["label"]) + _MARK_COLUMNS if rows else _MARK_COLUMNS
        rows = [r + m for r, m in zip(rows, marks)] if rows else marks

    rel = _directory(kind, tag, step)
    directory = os.path.join(logdir, *rel.split("/"))
    os.makedirs(directory, exist_ok=True)
    lines = ["\t".join(f"{v:.9g}" for v in row) for row in finite.astype(np.float64).tolist()]
    with open(os.path.join(directory, "tensors.tsv"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    if kind == "exception":
        np.save(os.path.join(directory, "tensor.npy"), matrix)
    embedding = proto.ProjectorConfig().embeddings.add()
    embedding.tensor_name = f"{tag}:{step:05d}" if kind == "embedding" else f"{kind}/{tag}:{step:05d}"
    embedding.tensor_path = f"{rel}/tensors.tsv"
    embedding.tensor_shape.extend(matrix.shape)
    if rows:
        table = ([header] if header else []) + rows
        with open(os.path.join(directory, "metadata.tsv"), "w", encoding="utf-8") as f:
            f.write("".join("\t".join(r) + "\n" for r in table))
        embedding.metadata_path = f"{rel}/metadata.tsv"
    if images is not None:
        from PIL import Image                           # Pillow only when there are images
        grid = sprite(images)
        Image.fromarray(grid[..., 0] if grid.shape[2] == 1 else grid).save(os.path.join(directory, "sprite.png"))
        embedding.sprite.image_path = f"{rel}/sprite.png"
        embedding.sprite.single_image_dim.extend([images.shape[2], images.shape[1]])     # width, height
    if samples is not None:
        np.save(os.path.join(directory, "samples.npy"), samples)
    labels_path = os.path.join(directory, "labels.npy")
    if labels is not None:
        np.save(labels_path, labels)
    elif os.path.exists(labels_path):       # from an earlier write of this step: the reader would take it as ours
        os.remove(labels_path)
    with open(os.path.join(directory, "info.json"), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=1)

    with _lock:         # the config last: TensorBoard only learns of an embedding once its files are complete
        config = _read_config(LocalDirectory(logdir))
        kept = [e for e in config.embeddings if e.tensor_name != embedding.tensor_name]
        del config.embeddings[:]
        config.embeddings.extend(kept + [embedding])
        write_atomic(os.path.join(logdir, CONFIG_FILE), text_format.MessageToString(config).encode("utf-8"))
    return directory


def write_embedding(logdir, mat, metadata=None, label_img=None, step=0, tag="default", metadata_header=None):
    """``SummaryWriter.add_embedding``: ``mat`` [n, d]; ``metadata`` n labels or n rows (with ``metadata_header``);
    ``label_img`` [n, c, h, w] images (uint8, or floats in [0, 1]) for the sprite."""
    matrix = _host(mat, "mat")
    if matrix.ndim != 2:
        raise ValueError(f"mat must be a matrix [n, d], got shape {matrix.shape}")
    images = None
    if label_img is not None:
        nchw = _host(label_img, "label_img")
        if nchw.ndim != 4:
            raise ValueError(f"label_img must be [n, c, h, w], got shape {nchw.shape}")
        images = image_array(nchw.transpose(0, 2, 3, 1), "label_img")
    return write(logdir, "embedding", tag, 0 if step is None else step, matrix, metadata, metadata_header, images)


# ------------------------------------------------------------------------------------------------------ OneFlow API

def _count(array):
    """The number of samples along ``array``'s first axis (a 0-d array is one sample)."""
    return len(array) if array.ndim else 1


class Projector:
    """OneFlow's ``flow.summary.Projector(logdir)``: embeddings and exception (anomaly) samples per step."""

    def __init__(self, logdir):
        self.logdir = os.fspath(logdir)

    def create_embedding_projector(self):
        """Prepare ``logdir`` for embeddings (``embedding_projector`` does this too when needed)."""
        ensure_config(self.logdir)
        return self

    def create_exception_projector(self):
        """Prepare ``logdir`` for exception samples (``exception_projector`` does this too when needed)."""
        ensure_config(self.logdir)
        return self

    def embedding_projector(self, value=None, label=None, tag="embedding", step=0, sample_name=None,
                            sample_type=None, x=None):
        """``value`` [n, ...] points (flattened per sample), ``label`` n labels, ``x`` the n samples they stand
        for (images make the sprite). ``label`` and ``x`` of another count are stored as given (``labels.npy``,
        ``samples.npy``), as OneFlow stored them, but not paired with the points."""
        return self._write("embedding", value, label, tag, step, sample_name, sample_type, x)

    def exception_projector(self, value=None, tag="exception", step=0, sample_name=None, sample_type=None, x=None):
        """Like ``embedding_projector``, for samples whose values may hold NaN/Inf: kept exactly in
        ``tensor.npy`` and counted per row in the metadata."""
        return self._write("exception", value, None, tag, step, sample_name, sample_type, x)

    def _write(self, kind, value, label, tag, step, sample_name, sample_type, x):
        if value is None:
            raise TypeError(f"{kind}_projector: value is required (an array of samples along its first axis)")
        value = _host(value, "value")
        n = len(value) if value.ndim else 0             # 0: write() says a value needs a first axis
        info = {"sample_name": sample_name, "sample_type": sample_type}
        images = samples = labels = None
        if x is not None:
            x = as_array(x, "x")
            info["x_count"] = _count(x)
            images = _images(x) if info["x_count"] == n else None     # a sprite needs one image per point
            samples = None if images is not None else x
        if label is not None:
            label = as_array(label, "label")        # numbers or strings
            if label.dtype == object:               # np.save would need pickle, which the reader refuses
                label = label.astype(str)
            info["label_count"] = _count(label)
            if info["label_count"] == n:
                label = label.reshape(n, -1) if label.ndim > 1 else label.reshape(n)
            else:                                   # metadata needs a row per point: kept as given instead
                label, labels = None, label
        return write(self.logdir, kind, tag, step, value, label, None, images, samples, info, labels)

    def __repr__(self):
        return f"Projector({self.logdir!r})"


# ------------------------------------------------------------------------------------------------------ reading

def read_projector(logdir, directory=None) -> list[Embedding]:
    """Every embedding listed in ``logdir``'s config, in the order written.

    Paths in the config are confined to ``logdir`` (relative, no ``..``, no symbolic link out), must name regular
    files and are size-capped (the ``MAX_*`` constants); a config breaking that raises :class:`UnsafePath`.
    ``directory``: how to read it (a ``logdir_files`` directory: ``LocalFiles.directory`` or, for an fsspec URL,
    ``RemoteFiles.directory``); by default ``logdir`` is a local path. ``Embedding.sprite`` is then what that
    directory's ``read_located`` reads."""
    files = directory if directory is not None else LocalDirectory(os.fspath(logdir))
    out = []
    for entry in _read_config(files).embeddings:
        name, _, step = entry.tensor_name.rpartition(":")
        what = f"embedding {entry.tensor_name!r}:"
        files.locate(entry.tensor_path, f"{what} tensor_path")       # its folder holds the files below
        directory = os.path.dirname(entry.tensor_path.replace("\\", "/"))
        info = {}
        info_rel = f"{directory}/info.json" if directory else "info.json"
        if files.lexists(info_rel):
            info = json.loads(files.read(info_rel, f"{what} info.json", MAX_INFO_BYTES))
            if not isinstance(info, dict):
                raise UnsafePath(f"{what} info.json holds {type(info).__name__}; expected an object")
        exact_rel = f"{directory}/tensor.npy" if directory else "tensor.npy"
        if files.lexists(exact_rel):
            data = files.read(exact_rel, f"{what} tensor.npy", MAX_TENSOR_BYTES)
            tensor = np.load(io.BytesIO(data), allow_pickle=False)
        else:
            data = files.read(entry.tensor_path, f"{what} tensor_path", MAX_TENSOR_BYTES)
            tensor = np.loadtxt(io.StringIO(data.decode("utf-8")), dtype=np.float32, delimiter="\t", ndmin=2)
        rows, header = [], None
        if entry.metadata_path:
            text = files.read(entry.metadata_path, f"{what} metadata_path", MAX_METADATA_BYTES)
            lines = text.decode("utf-8").split("\n")
            rows = [line.split("\t") for line in (lines[:-1] if lines[-1] == "" else lines)]
            if len(rows) == len(tensor) + 1:    # TensorBoard's rule: a header exactly when there are several columns
                header, rows = rows[0], rows[1:]
        sprite = None
        if entry.sprite.image_path:             # checked here; the view reads it with read_located
            sprite = files.locate(entry.sprite.image_path, f"{what} sprite image_path")
        labels = None
        labels_rel = f"{directory}/labels.npy" if directory else "labels.npy"
        if files.lexists(labels_rel):
            data = files.read(labels_rel, f"{what} labels.npy", MAX_METADATA_BYTES)
            labels = np.load(io.BytesIO(data), allow_pickle=False)
        out.append(Embedding(tag=info.get("tag", name), step=int(info.get("step", step or 0)), tensor=tensor,
                             metadata=rows, metadata_header=header, sprite=sprite,
                             kind=info.get("kind", "embedding"), info=info, labels=labels))
    return out


def unmatched_note(embedding: Embedding) -> str:
    """An empty string when the embedding's labels and samples ``x`` (if any) come one per point; else a sentence
    saying which did not and that they are not paired with the points (they are kept in ``labels.npy`` /
    ``samples.npy``)."""
    points = len(embedding.tensor)
    unmatched = []
    for key, what in (("label_count", "labels"), ("x_count", "samples x")):
        count = embedding.info.get(key)
        if isinstance(count, int) and not isinstance(count, bool) and count != points:
            unmatched.append(f"{count} {what}")
    if not unmatched:
        return ""
    return (f"{' and '.join(unmatched)} for {points} points: only one per point can be paired, so the points are "
            f"shown without them")
