"""Wire decoding: an event file's records as items (``Datum``), the bulk of them straight from their bytes.

Plain scalar records (``Event{wall_time, step, summary{value{tag, simple_value or one-float tensor}}}``, the bulk of
most logs, as tensorboardX, torch, TensorFlow and flowlab write them) are decoded column-wise with NumPy straight from
the wire bytes (``plain_scalars``); every other record is parsed with upb into an ``Event``. Legacy values
(``simple_value``, ``histo``, ``image``, ``audio``) and tensor values are read alike (``decode_value``); a tensor's
meaning comes from its tag's plugin (``value_kind``; which plugin a tag has is the tailer's to say, see
``plugin_inference``). A tensor's declared shape must agree with the data the record carries
(``check_tensor_shape``): TensorBoard fills a shape from one value, so a record of under 100 bytes of shape
[8192, 8192] cost 512 MiB and one of 2^40 elements raised ``MemoryError``. Decoding a record thus costs memory
proportional to its size.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from . import proto
from .framing import at_offsets

GRAPH_TAG = "__run_graph__"       # TensorBoard's tag for a run's graph
KINDS = frozenset({"scalar", "histogram", "image", "audio", "text", "tensor", "hparams", "health", "graph",
                   "meta_graph", "run_metadata", "session_log", "log_message"})


class Datum(NamedTuple):
    """One decoded item of a run.

    ``kind`` and ``value``:
      scalar       float
      histogram    float64 array [k, 3] of (left, right, count) rows (legacy buckets converted as TensorBoard does)
      image        :class:`Image`
      audio        list of encoded clips (bytes)
      text         str for a rank-0 tensor, else a NumPy object array of str
      tensor       NumPy array (any other plugin, or none: see ``plugin``)
      health       float64 array [layers, statistics] of a ``flow.watch_health`` report (``health_log.decode`` with
                   ``plugin_content`` names them)
      hparams      dict of the ``HParamsPluginData`` (proto3 JSON field names; fields at defaults are absent)
      graph        serialized GraphDef bytes (tag ``GRAPH_TAG``); meta_graph: MetaGraphDef bytes (tag None)
      run_metadata serialized RunMetadata bytes
      session_log  dict(status=, msg=, checkpoint_path=), tag None; log_message: the message str, tag None
      purge        the consumer drops data of ``run`` with step >= ``step``: of the tags in ``value`` (a tuple), or of
                   every tag when ``value`` is None
      reread       a file of ``run`` is read again from its start (truncated, rewritten or replaced); ``value`` is
                   dict(path=, reason=, spans={tag: (first, last)}): the consumer drops the data of each tag with
                   first <= step <= last (what the file had given) before the items that follow. tag/step None
    With ``poll(columnar=True)``, scalars decoded column-wise (plain scalar records) come several to a Datum whose
    ``step``, ``wall_time`` and ``value`` are equal-length NumPy arrays (int64, float64, float64); other scalars still
    come one to a Datum, so consumers test ``isinstance(d.step, np.ndarray)``.
    """
    run: str
    tag: str | None
    kind: str
    step: Any
    wall_time: Any
    value: Any
    plugin: str = ""
    plugin_content: bytes = b""


class Image(NamedTuple):
    width: int
    height: int
    encoded: list       # encoded images (PNG bytes), one per sample



# After a plain record's tag: a legacy simple_value (0x15, float), or a rank-0 DT_FLOAT tensor {dtype, [tensor_shape
# {}], float_val} as flowlab's and TensorFlow's writers encode scalars. The float is always the record's last 4 bytes.
_FLOAT_TENSORS = (b"\x42\x08\x08\x01\x2a\x04", b"\x42\x0a\x08\x01\x12\x00\x2a\x04")


def plain_scalars(b, start, length):
    """Decode, column-wise, records that are exactly ``Event{wall_time=1, step=2 (absent when 0),
    summary=5{value=1{tag=1, simple_value=2 | tensor=8}}}`` with one float, in the field order writers use.

    Returns (plain mask, tensor mask, step int64, wall_time float64, value float64, tag id, tag names); entries where
    the plain mask is False are meaningless and those records are left to the protobuf parser. A plain *tensor* is a
    scalar only if its tag's plugin is "scalars", which the caller checks.
    """
    n = len(start)
    if not n:
        return (np.zeros(0, bool), np.zeros(0, bool),
                *(np.zeros(0, d) for d in (np.int64, np.float64, np.float64, np.int64)), [])

    def byte(at):
        return at_offsets(b, np.uint8, at).astype(np.int64)

    def bytes_are(at, pattern):                 # compares up to 8 bytes as one little-endian integer
        mask = (1 << 8 * len(pattern)) - 1
        return (at_offsets(b, "<u8", at) & np.uint64(mask)) == np.uint64(int.from_bytes(pattern, "little"))

    plain = byte(start) == 0x09
    wall = at_offsets(b, "<f8", start + 1)
    # step: absent (0) or a varint of up to 10 bytes at start + 10
    has_step = byte(start + 9) == 0x10
    step, vlen, more = np.zeros(n, np.uint64), np.zeros(n, np.int64), has_step.copy()
    for k in range(10):
        low = at_offsets(b, np.uint8, start + 10 + k).astype(np.uint64)
        step |= np.where(more, (low & 0x7F) << np.uint64(7 * k), 0).astype(np.uint64)
        vlen += more
        more &= low >= 0x80
        if not more.any():
            break
    plain &= ~more
    step = step.view(np.int64)
    p = start + 9 + has_step + vlen
    summary_len, value_len, tag_len = byte(p + 1), byte(p + 3), byte(p + 5)
    after_tag = p + 6 + tag_len
    simple = (byte(after_tag) == 0x15) & (value_len == tag_len + 7)
    tensor = np.zeros(n, bool)
    for pattern in _FLOAT_TENSORS:
        tensor |= bytes_are(after_tag, pattern) & (value_len == tag_len + 2 + len(pattern) + 4)
    plain &= ((byte(p) == 0x2A) & (summary_len < 0x80) & (p + 2 + summary_len == start + length)
              & (byte(p + 2) == 0x0A) & (value_len == summary_len - 2) & (byte(p + 4) == 0x0A) & (simple | tensor))
    value = at_offsets(b, "<f4", start + length - 4).astype(np.float64)
    # Tags: rows of (length, bytes...) padded with zeros, made unique by NumPy.
    tag_id = np.zeros(n, np.int64)
    tags = []
    if plain.any():
        width = int(tag_len[plain].max()) + 1
        cols = np.arange(width)
        rows = np.where(cols < tag_len[plain, None] + 1, byte(p[plain, None] + 5 + cols), 0).astype(np.uint8)
        distinct, inverse = np.unique(rows.view(f"V{width}").ravel(), return_inverse=True)
        tag_id[plain] = inverse.ravel()
        for k, raw in enumerate(map(bytes, distinct)):
            try:
                tags.append(raw[1:1 + raw[0]].decode("utf-8"))
            except UnicodeDecodeError:          # not a valid proto3 string: the parser will reject the record
                tags.append("")
                plain[plain & (tag_id == k)] = False
    return plain, tensor & plain, step, wall, value, tag_id, tags


# -- value decoding --------------------------------------------------------------------------------------------------
Event = proto.Event
_HParams = proto.HParamsPluginData
START = proto.enum_value("tensorboard.SessionLog.SessionStatus", "START")
_SESSION_STATUS = {v.number: v.name for v in proto.descriptor("tensorboard.SessionLog").enum_types_by_name[
    "SessionStatus"].values}

DTYPES = {  # DataType number -> (NumPy dtype, TensorProto field holding values when tensor_content is empty)
    1: (np.float32, "float_val"), 2: (np.float64, "double_val"), 3: (np.int32, "int_val"),
    4: (np.uint8, "int_val"), 5: (np.int16, "int_val"), 6: (np.int8, "int_val"), 7: (object, "string_val"),
    8: (np.complex64, "scomplex_val"), 9: (np.int64, "int64_val"), 10: (np.bool_, "bool_val"),
    17: (np.uint16, "int_val"), 18: (np.complex128, "dcomplex_val"), 19: (np.float16, "half_val"),
    22: (np.uint32, "uint32_val"), 23: (np.uint64, "uint64_val"),
}


class ShapeMismatch(ValueError):
    """A TensorProto whose declared shape disagrees with the values it carries."""


def check_tensor_shape(t) -> None:
    """Raise :class:`ShapeMismatch` unless ``t``'s declared shape agrees with the data present.

    TensorBoard's ``make_ndarray`` fills a shape from a single value (or from none: zeros), so a 50-byte record of
    shape [8192, 8192] costs 512 MiB, and one declaring 2^40 elements raises ``MemoryError``. Here every dimension
    must be >= 0 and the record must carry exactly one value per element (``tensor_content`` of exactly that many
    bytes, or that many typed values; complex numbers two each); the only fill kept is TensorFlow's empty rank-0
    tensor, read as one zero. So decoding a value never allocates more than a small multiple of its record's size.
    Tensors of unsupported dtypes are left to :func:`tensor_to_array`, which refuses them."""
    if t.dtype not in DTYPES:
        return
    dims = [d.size for d in t.tensor_shape.dim]
    if any(d < 0 for d in dims):
        raise ShapeMismatch(f"tensor shape {dims}: expected dimensions >= 0")
    size = math.prod(dims)
    dtype, field = DTYPES[t.dtype]
    if t.tensor_content and dtype is not object:
        present, unit = len(t.tensor_content), np.dtype(dtype).itemsize
        what = "bytes of tensor_content"
    else:
        present, unit = len(getattr(t, field)), 2 if dtype in (np.complex64, np.complex128) else 1
        what = f"values in {field}"
    if present != size * unit and not (present == 0 and size == 1 and not dims):
        raise ShapeMismatch(f"tensor shape {dims} declares {size:,} elements, expected {size * unit:,} {what}, "
                            f"but the record has {present:,}")


def tensor_to_array(t) -> np.ndarray:
    """A TensorProto as a NumPy array (strings as an object array of bytes): raw ``tensor_content`` if present,
    else the typed values. Raises :class:`ShapeMismatch` (a ``ValueError``) when the declared shape disagrees with
    the data (see :func:`check_tensor_shape`), ``ValueError`` for unsupported dtypes."""
    if t.dtype not in DTYPES:
        raise ValueError(f"unsupported tensor dtype {t.dtype}")
    check_tensor_shape(t)
    dtype, field = DTYPES[t.dtype]
    shape = [d.size for d in t.tensor_shape.dim]
    size = math.prod(shape)
    if t.tensor_content and dtype is not object:
        return np.frombuffer(t.tensor_content, dtype).reshape(shape).copy()
    values = getattr(t, field)
    if dtype is object:
        flat = np.empty(len(values), object)
        flat[:] = list(values)
    elif field == "half_val":
        flat = np.array(values, np.uint16).view(np.float16)
    elif dtype in (np.complex64, np.complex128):
        flat = np.array(values, np.float64).view(np.complex128).astype(dtype)
    else:
        flat = np.array(values, dtype)
    if not len(flat):                           # an empty rank-0 tensor (the one fill check_tensor_shape allows)
        flat = np.zeros(size, dtype)
    return flat.reshape(shape)


def shapes_agree(summary) -> bool:
    """Whether every tensor value of ``summary`` carries the data its shape declares (``check_tensor_shape``)."""
    for v in summary.value:
        if v.WhichOneof("value") == "tensor":
            try:
                check_tensor_shape(v.tensor)
            except ShapeMismatch:
                return False
    return True


def _legacy_histogram(h) -> np.ndarray:
    """HistogramProto -> [k, 3] (left, right, count), as TensorBoard's data_compat: empty buckets at both ends are
    dropped and the outer edges become min and max (kept in float64 here; TensorBoard rounds to float32)."""
    counts = np.array(h.bucket, np.float64)
    limits = np.array(h.bucket_limit, np.float64)
    nonzero = np.flatnonzero(counts > 0)
    if not len(nonzero):
        return np.zeros((0, 3))
    first, last = nonzero[0], nonzero[-1]
    inner = limits[first:last]
    return np.stack([np.concatenate([[h.min], inner]), np.concatenate([inner, [h.max]]), counts[first:last + 1]], 1)


def _hparams(content: bytes) -> dict:
    """HParamsPluginData as a dict (proto3 JSON names, defaults absent), google.protobuf.Values as Python values.
    Values are converted here rather than by json_format, which refuses infinities (an hparam may well be inf)."""
    data = _HParams.FromString(content)
    which = data.WhichOneof("data")
    if which == "session_start_info":
        values = {k: _python(v) for k, v in data.session_start_info.hparams.items()}
        data.session_start_info.ClearField("hparams")
    elif which == "experiment":
        domains = {i: [_python(x) for x in h.domain_discrete.values]
                   for i, h in enumerate(data.experiment.hparam_infos) if h.HasField("domain_discrete")}
        for i in domains:
            data.experiment.hparam_infos[i].ClearField("domain_discrete")
    out = json_format.MessageToDict(data, preserving_proto_field_name=True)
    if which == "session_start_info":
        out.setdefault(which, {})["hparams"] = values
    elif which == "experiment":
        for i, domain in domains.items():
            out[which]["hparam_infos"][i]["domain_discrete"] = domain
    return out


def _python(v):
    """A google.protobuf.Value as None, float, str, bool, list or dict."""
    kind = v.WhichOneof("kind")
    if kind == "list_value":
        return [_python(x) for x in v.list_value.values]
    if kind == "struct_value":
        return {k: _python(x) for k, x in v.struct_value.fields.items()}
    return None if kind in (None, "null_value") else getattr(v, kind)


def _strings(a: np.ndarray):
    """Text values: a str, or an object array of str. Not a fixed-width ``str`` array: that pads every element to
    the longest, so one 1 MB string among 1,000 short ones would cost 4 GB."""
    decoded = [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in a.ravel()]
    if a.ndim == 0:
        return decoded[0]
    out = np.empty(len(decoded), object)
    out[:] = decoded
    return out.reshape(a.shape)


def _image_tensor(a: np.ndarray) -> Image:
    flat = list(a.ravel())
    return Image(int(flat[0]), int(flat[1]), flat[2:])


def _scalar_tensor(t) -> float:
    """A one-element TensorProto's value; the common one-float case without going through NumPy."""
    dtype, field = DTYPES.get(t.dtype, (None, ""))
    if not t.tensor_content and field in ("float_val", "double_val", "int_val", "int64_val"):
        values = getattr(t, field)
        if len(values) == 1 and all(d.size == 1 for d in t.tensor_shape.dim):
            return float(values[0])
    return float(tensor_to_array(t).item())


def _identity(x):
    return x


def file_version(text) -> float | None:
    try:
        return float(text.split(":")[-1])
    except ValueError:
        return None


def _audio_tensor(a: np.ndarray) -> list:
    return list(a.reshape(len(a), -1)[:, 0]) if a.ndim else [a.item()]     # rows of (clip, label)


# Legacy value field -> (kind, the plugin TensorBoard's data_compat assigns it), and its decoder.
LEGACY = {"simple_value": ("scalar", "scalars"), "histo": ("histogram", "histograms"),
           "image": ("image", "images"), "audio": ("audio", "audio")}
LEGACY_DECODE = {"simple_value": float, "histo": _legacy_histogram,
                  "image": lambda im: Image(im.width, im.height, [im.encoded_image_string]),
                  "audio": lambda au: [au.encoded_audio_string]}
# Tensor values: plugin -> kind (anything else is kind "tensor", the array itself), and kind -> decoder.
TENSOR_KINDS = {"scalars": "scalar", "histograms": "histogram", "images": "image", "audio": "audio",
                 "text": "text", "hparams": "hparams", "flowlab_health": "health"}
_TENSOR_DECODE = {"histogram": lambda a: a.astype(np.float64).reshape(-1, 3), "health": lambda a: a.astype(np.float64),
                  "image": _image_tensor, "audio": _audio_tensor, "text": _strings}


SUMMARY_LIKE = frozenset({"summary", "graph_def", "tagged_run_metadata"})
EVENT_KINDS = {"graph_def": "graph", "meta_graph_def": "meta_graph", "tagged_run_metadata": "run_metadata",
                "session_log": "session_log", "log_message": "log_message"}


def event_datum(run, what, ev) -> Datum:
    step, wall = ev.step, ev.wall_time
    if what == "graph_def":
        return Datum(run, GRAPH_TAG, "graph", step, wall, ev.graph_def, "graphs")
    if what == "meta_graph_def":
        return Datum(run, None, "meta_graph", step, wall, ev.meta_graph_def)
    if what == "tagged_run_metadata":
        trm = ev.tagged_run_metadata
        return Datum(run, trm.tag, "run_metadata", step, wall, trm.run_metadata, "graph_run_metadata")
    if what == "session_log":
        sl = ev.session_log
        return Datum(run, None, "session_log", step, wall, dict(
            status=_SESSION_STATUS.get(sl.status, str(sl.status)), msg=sl.msg, checkpoint_path=sl.checkpoint_path))
    return Datum(run, None, "log_message", step, wall, ev.log_message.message)


def value_kind(field, plugin) -> str:
    """The kind of item a ``Summary.Value`` makes: from its legacy ``field`` (``simple_value``, ``histo``, ...), else
    from its tag's ``plugin`` (``TENSOR_KINDS``; any other plugin, or none, is a plain "tensor")."""
    legacy = LEGACY.get(field)
    return legacy[0] if legacy else TENSOR_KINDS.get(plugin, "tensor")


def decode_value(v, field, kind, content):
    """The value of ``Summary.Value`` ``v`` as ``Datum.value`` of ``kind`` (``content``: its tag's plugin content,
    which is the value itself for hparams). Raises ``ValueError``, ``TypeError``, ``IndexError``, ``DecodeError`` or
    ``json_format.Error`` (``VALUE_ERRORS``) for a value that does not decode."""
    if field in LEGACY:
        return LEGACY_DECODE[field](getattr(v, field))
    if kind == "hparams":
        return _hparams(content)
    if kind == "scalar":
        return _scalar_tensor(v.tensor)
    return _TENSOR_DECODE.get(kind, _identity)(tensor_to_array(v.tensor))


VALUE_ERRORS = (ValueError, TypeError, IndexError, DecodeError, json_format.Error)
