"""Build ``Summary.Value``s in the encodings TensorBoard's plugins read today (DESIGN.md §6).

Every kind is a ``TensorProto`` tagged with a plugin in its ``SummaryMetadata``:

=========  ==============================================================  ===========  ===============
kind       tensor                                                          plugin       data class
=========  ==============================================================  ===========  ===============
scalar     rank-0 ``DT_FLOAT``                                             scalars      SCALAR
histogram  ``DT_DOUBLE`` ``[k, 3]`` rows of (left edge, right edge, count)  histograms   TENSOR
image      ``DT_STRING`` ``[2 + n]``: width, height, then n PNGs           images       BLOB_SEQUENCE
text       ``DT_STRING`` of any shape (rank 0 for one string)               text         TENSOR
hparams    empty ``DT_FLOAT`` ``[0]``; the data is the plugin content       hparams      TENSOR
tensor     any dtype and shape (numbers as raw little-endian bytes)        chosen       TENSOR
=========  ==============================================================  ===========  ===============

The functions are pure: they validate their input (``TypeError``/``ValueError`` naming what was expected and what
came) and return a new value carrying its metadata. TensorBoard keeps only the first metadata of a tag and ignores
repeats; ``EventFileWriter`` keeps it on every value but thins it out for scalars (see ``writer``);
``metadata=False`` leaves it out here.

Histograms follow TensorBoard's default bucketing: 30 equal-width buckets over the finite min..max, every bucket at
the one value when all values are equal; values up to ±1.8e308 work (the range is computed on halved values when
``max - min`` overflows), and at most ``MAX_BUCKETS`` buckets are written. NaN and ±Inf cannot sit in a bucket and TensorBoard's proto has no field
for them, so they are left out; ``nonfinite_counts`` counts them, and ``SummaryWriter.add_histogram`` records the
counts as the scalars ``<tag>/nan_count`` and ``<tag>/inf_count`` once a tag has met one.
"""
from __future__ import annotations

import io
import math
import numbers
import time

import numpy as np

from ..ops.stats import stats_vector
from . import proto

DT = {name: proto.enum_value("tensorboard.DataType", name) for name in (
    "DT_FLOAT", "DT_DOUBLE", "DT_INT32", "DT_UINT8", "DT_INT16", "DT_INT8", "DT_STRING", "DT_COMPLEX64",
    "DT_INT64", "DT_BOOL", "DT_UINT16", "DT_COMPLEX128", "DT_HALF", "DT_UINT32", "DT_UINT64")}
_NUMPY_DT = {np.dtype(k): DT[v] for k, v in {
    "float32": "DT_FLOAT", "float64": "DT_DOUBLE", "int32": "DT_INT32", "uint8": "DT_UINT8", "int16": "DT_INT16",
    "int8": "DT_INT8", "complex64": "DT_COMPLEX64", "int64": "DT_INT64", "bool": "DT_BOOL", "uint16": "DT_UINT16",
    "complex128": "DT_COMPLEX128", "float16": "DT_HALF", "uint32": "DT_UINT32", "uint64": "DT_UINT64"}.items()}

DATA_CLASS = {name: proto.enum_value("tensorboard.DataClass", "DATA_CLASS_" + name)
              for name in ("SCALAR", "TENSOR", "BLOB_SEQUENCE")}
DEFAULT_BUCKETS = 30
MAX_BUCKETS = 1 << 16           # 24 bytes each per record; far more than any chart can show
HPARAMS_TAGS = {"experiment": "_hparams_/experiment", "session_start_info": "_hparams_/session_start_info",
                "session_end_info": "_hparams_/session_end_info"}
_STATUS = {name: proto.enum_value("tensorboard.hparams.Status", "STATUS_" + name)
           for name in ("SUCCESS", "FAILURE", "RUNNING", "UNKNOWN")}
_HPARAM_TYPE = {bool: "DATA_TYPE_BOOL", float: "DATA_TYPE_FLOAT64", str: "DATA_TYPE_STRING"}


def _metadata(plugin_name, data_class, content=b""):
    return proto.SummaryMetadata(plugin_data=proto.SummaryMetadata.PluginData(plugin_name=plugin_name,
                                                                              content=content),
                                 data_class=DATA_CLASS[data_class])


# Plugin contents are the plugins' ``*PluginData{version: 0}``, which serialise to no bytes at all.
_SCALAR_METADATA = _metadata("scalars", "SCALAR")
_HISTOGRAM_METADATA = _metadata("histograms", "TENSOR")
_IMAGE_METADATA = _metadata("images", "BLOB_SEQUENCE")
_TEXT_METADATA = _metadata("text", "TENSOR")


# ---------------------------------------------------------------------------------------------------------- checks

def _shown(value, limit=60):
    """``repr(value)`` cut to ``limit`` characters, for error messages about arbitrary input."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 20]}...{text[-12:]} ({len(text):,} characters)"


def check_text(text, name):
    """``text`` is a str that can be written as UTF-8 (no lone surrogates, which protobuf refuses)."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"{name} must be text that can be written as UTF-8, got {_shown(text)} with "
                             f"{e.object[e.start:e.end]!r} at index {e.start} ({e.reason})") from None
    return text


def check_tag(tag, name="tag"):
    if not isinstance(tag, str):
        raise TypeError(f"{name} must be a str, got {type(tag).__name__} {_shown(tag)}")
    if not tag:
        raise ValueError(f"{name} must be a non-empty str")
    return check_text(tag, name)


def as_array(values, name="values"):
    """A NumPy array of ``values``: NumPy arrays, sequences, Blobs, CuPy arrays (copied to the host)."""
    if type(values).__module__.startswith("cupy"):
        values = values.get()
    elif hasattr(values, "numpy") and type(values).__module__.startswith("torch"):
        values = values.detach().cpu().numpy()
    try:
        return np.asarray(values)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be array-like, got {type(values).__name__}: {e}") from None


def to_scalar(value, name="value") -> float:
    """``value`` as a float: a real number, or a NumPy/CuPy array (or Blob) holding exactly one real number."""
    if type(value) is float:                        # the hot path: a plain float needs no more checks
        return value
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    if isinstance(value, numbers.Real):
        try:
            return float(value)
        except OverflowError:
            raise ValueError(f"{name} must be a real number within float64's range (|x| < 1.8e308), got "
                             f"{type(value).__name__} {_shown(value)}") from None
    if isinstance(value, (numbers.Complex, np.complexfloating)):
        raise TypeError(f"{name} must be a real number, got complex {value!r}")
    array = as_array(value, name)
    if array.size != 1:
        raise ValueError(f"{name} must be a single number (a 0-d or 1-element array), "
                         f"got an array of shape {array.shape}")
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be a real number, got an array of dtype {array.dtype}")
    return float(array.reshape(()))


# ---------------------------------------------------------------------------------------------------------- tensors

def tensor_proto(array, name="tensor"):
    """A ``TensorProto`` of ``array``: numbers as raw little-endian bytes, strings (str/bytes) as ``string_val``."""
    array = as_array(array, name)
    out = proto.TensorProto()
    out.tensor_shape.dim.extend(proto.TensorShapeProto.Dim(size=n) for n in array.shape)
    if array.dtype.kind in "OUS":
        out.dtype = DT["DT_STRING"]
        out.string_val.extend(_as_bytes(s, name) for s in array.flat)
        return out
    native = array.dtype.newbyteorder("=")
    if native not in _NUMPY_DT:
        raise TypeError(f"tensor dtype {array.dtype} has no TensorBoard DataType; "
                        f"expected one of {sorted(str(d) for d in _NUMPY_DT)}")
    out.dtype = _NUMPY_DT[native]
    out.tensor_content = np.ascontiguousarray(array, dtype=native.newbyteorder("<")).tobytes()
    return out


def to_wall_time(value, name="walltime") -> float:
    """``value`` (seconds since the epoch) as a finite float: a NaN or infinite wall time has no moment, and readers
    (exports as strict JSON, the wall-time axis) could only show it as missing data."""
    seconds = to_scalar(value, name)
    if not math.isfinite(seconds):
        raise ValueError(f"{name} must be a finite number of seconds since the epoch, got {seconds!r}")
    return seconds


def _as_bytes(s, name):
    if isinstance(s, str):
        return check_text(s, f"{name} strings").encode("utf-8")
    if isinstance(s, bytes):
        return s
    raise TypeError(f"{name}: string tensors hold str or bytes, got {type(s).__name__} {_shown(s)}")


def tensor(tag, values, plugin_name="flowlab_tensor", content=b"", *, metadata=True):
    """Any array under a plugin of the caller's choice (TensorBoard shows only the plugins it knows)."""
    out = proto.Summary.Value(tag=check_tag(tag))
    out.tensor.CopyFrom(tensor_proto(values, "values"))
    if metadata:
        out.metadata.CopyFrom(_metadata(check_tag(plugin_name, "plugin_name"), "TENSOR", content))
    return out


# ---------------------------------------------------------------------------------------------------------- scalars

def fill_scalar(out, tag, value: float, metadata=True):
    """Write a checked scalar into the ``Summary.Value`` ``out`` in place (building in place avoids the copy that
    upb makes when one message is assigned into another; this is the writer's hot path)."""
    out.tag = tag
    out.tensor.dtype = 1                            # DT_FLOAT; a rank-0 tensor has no dims
    out.tensor.float_val.append(value)
    if metadata:
        out.metadata.CopyFrom(_SCALAR_METADATA)
    return out


def scalar(tag, value, *, metadata=True):
    """A scalar. NaN and ±Inf are written as they are (they are what anomaly views look for)."""
    return fill_scalar(proto.Summary.Value(), check_tag(tag), to_scalar(value), metadata)


# ---------------------------------------------------------------------------------------------------------- histograms

def nonfinite_counts(values) -> tuple[int, int]:
    """(number of NaNs, number of ±Infs) in ``values``."""
    array = _numeric(as_array(values), "values")
    if array.dtype.kind != "f":
        return 0, 0
    nan, inf = stats_vector(np, array)[4:]
    return int(nan), int(inf)


def _numeric(array, name):
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{name} must hold real numbers, got an array of dtype {array.dtype}")
    return array


def _bin_rule_width(rule, data, low, high):
    """The bucket width NumPy's bin rule ``rule`` picks, found without building the edges (a rule like "fd" on
    data with one far outlier asks for billions of buckets). NumPy keeps its rules in a private table; where it
    has moved, None (the edges are then built and counted after)."""
    for module in ("numpy.lib._histograms_impl", "numpy.lib.histograms"):
        try:
            selectors = __import__(module, fromlist=["_hist_bin_selectors"])._hist_bin_selectors
        except (ImportError, AttributeError):
            continue
        if rule not in selectors:
            return None
        return float(selectors[rule](data, (low, high)))
    return None


def _scale_for(low, high):
    """A power of two bringing ``[low, high]`` into [-1, 1] when ``high - low`` (or a square, for the bin rules)
    would overflow float64, else 1.0. Scaling by a power of two is exact, so counts do not change."""
    big = max(abs(low), abs(high))
    return 2.0 ** -math.frexp(big)[1] if big > 2.0 ** 500 else 1.0


def _check_bucket_count(k, bins):
    if k > MAX_BUCKETS:
        count = f"{k:,}" if k < 10 ** 15 else f"about {float(k):.1e}"
        raise ValueError(f"bins={_shown(bins)} asks for {count} buckets; at most {MAX_BUCKETS:,} are written (each "
                         f"is a row of the event record, and no chart shows more)")


def check_bins(bins):
    """``bins`` as a bucket count (1..``MAX_BUCKETS``), or the name of a NumPy bin rule (a str)."""
    if isinstance(bins, str):
        return DEFAULT_BUCKETS if bins == "tensorflow" else bins
    if isinstance(bins, (bool, np.bool_)) or not isinstance(bins, numbers.Integral) or bins < 1:
        raise ValueError(f"bins must be a positive int, 'tensorflow' or a NumPy bin rule; got {_shown(bins)}")
    _check_bucket_count(int(bins), bins)        # before the data is touched: a huge count fails at once
    return int(bins)


def histogram_buckets(values, bins=DEFAULT_BUCKETS, name="values") -> np.ndarray:
    """``[k, 3]`` float64 rows (left, right, count) over the finite values.

    ``bins``: a bucket count up to ``MAX_BUCKETS`` (TensorBoard's equal-width buckets; ``"tensorflow"`` means the
    default 30), or the name of a NumPy bin rule such as ``"auto"`` or ``"fd"``.
    """
    k = check_bins(bins)
    rule = isinstance(k, str)
    data = _numeric(as_array(values, name), name).astype(np.float64, copy=False).ravel()
    data = data[np.isfinite(data)]
    if data.size == 0:
        return np.zeros((DEFAULT_BUCKETS if rule else k, 3))
    low, high = float(data.min()), float(data.max())
    scale = _scale_for(low, high)
    scaled = data * scale if scale != 1.0 else data
    if rule:
        try:
            width = _bin_rule_width(bins, scaled, low * scale, high * scale)
            if width is not None and width > 0 and low != high:
                _check_bucket_count(math.ceil((high * scale - low * scale) / width), bins)
            edges = np.histogram_bin_edges(scaled, bins=bins)
        except ValueError as e:
            if "buckets; at most" in str(e):
                raise
            raise ValueError(f"bins={bins!r} is not a bin count, 'tensorflow' or a NumPy bin rule: {e}") from None
        _check_bucket_count(len(edges) - 1, bins)
        counts, edges = np.histogram(scaled, bins=edges)
        return np.stack([edges[:-1] / scale, edges[1:] / scale, counts], axis=1).astype(np.float64)
    if low == high:                                 # TensorBoard: every edge at the value, all counts in the last
        out = np.zeros((k, 3))
        out[:, :2] = high
        out[-1, 2] = data.size
        return out
    try:
        counts, edges = np.histogram(scaled, bins=k, range=(low * scale, high * scale))
    except ValueError:
        # NumPy refuses equal-width buckets narrower than the floats can tell apart (a range of a few ulps):
        # the same edges, some of them equal, counted by search instead.
        edges = np.maximum.accumulate(low * scale + (high * scale - low * scale) * np.linspace(0.0, 1.0, k + 1))
        counts, edges = np.histogram(scaled, bins=edges)
    edges = edges / scale
    edges[0], edges[-1] = low, high
    return np.stack([edges[:-1], edges[1:], counts], axis=1).astype(np.float64)


def histogram(tag, values, bins=DEFAULT_BUCKETS, *, metadata=True, name="values"):
    """A histogram of the finite ``values`` (see ``histogram_buckets``)."""
    return histogram_of_buckets(tag, histogram_buckets(values, bins, name), metadata=metadata)


def histogram_of_buckets(tag, buckets, *, metadata=True):
    """A histogram from buckets counted already: ``[k, 3]`` rows of (left edge, right edge, count)."""
    buckets = np.asarray(buckets, np.float64)
    if buckets.ndim != 2 or buckets.shape[1] != 3 or not 1 <= len(buckets) <= MAX_BUCKETS:
        raise ValueError(f"buckets must be [k, 3] rows (left, right, count) with 1 <= k <= {MAX_BUCKETS}, "
                         f"got shape {buckets.shape}")
    out = proto.Summary.Value(tag=check_tag(tag))
    out.tensor.CopyFrom(tensor_proto(buckets))
    if metadata:
        out.metadata.CopyFrom(_HISTOGRAM_METADATA)
    return out


# ---------------------------------------------------------------------------------------------------------- images

def image_array(img, name="img") -> np.ndarray:
    """Check an ``HWC`` or ``NHWC`` image (C in 1, 3, 4; uint8, or floats in [0, 1]) and return it as uint8."""
    array = as_array(img, name)
    if array.ndim not in (3, 4) or array.shape[-1] not in (1, 3, 4) or 0 in array.shape:
        raise ValueError(f"{name} must have shape (H, W, C) or (N, H, W, C) with C in 1, 3 or 4 and no empty "
                         f"axis; got shape {array.shape}")
    if array.dtype == np.uint8:
        return array
    if array.dtype.kind != "f":
        raise TypeError(f"{name} must be uint8 (0..255) or floating point (0..1), got dtype {array.dtype}")
    low, high = float(np.min(array)), float(np.max(array))
    if not (0.0 <= low and high <= 1.0):            # also false for NaN
        raise ValueError(f"{name}: floating-point pixels must lie in [0, 1], got min {low}, max {high}")
    return np.rint(array * 255.0).astype(np.uint8)


def png(hwc: np.ndarray) -> bytes:
    from PIL import Image                           # Pillow only when images are written
    mode = {1: "L", 3: "RGB", 4: "RGBA"}[hwc.shape[-1]]
    buffer = io.BytesIO()
    Image.fromarray(hwc[..., 0] if mode == "L" else hwc, mode).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def image(tag, img, *, metadata=True, name="img"):
    """One ``HWC`` image or a batch ``NHWC`` of them, as PNGs (one sample per image)."""
    pixels = image_array(img, name)
    batch = pixels if pixels.ndim == 4 else pixels[None]
    height, width = batch.shape[1:3]
    out = proto.Summary.Value(tag=check_tag(tag))
    out.tensor.dtype = DT["DT_STRING"]
    out.tensor.tensor_shape.dim.add(size=2 + len(batch))
    out.tensor.string_val.extend([str(width).encode(), str(height).encode()] + [png(one) for one in batch])
    if metadata:
        out.metadata.CopyFrom(_IMAGE_METADATA)
    return out


# ---------------------------------------------------------------------------------------------------------- text

def text(tag, text_string, *, metadata=True):
    """A str (markdown in TensorBoard), or an array/nested list of str (shown as a table)."""
    if not isinstance(text_string, str):
        array = as_array(text_string, "text_string")
        if array.dtype.kind != "U" or array.size == 0:
            raise TypeError(f"text_string must be a str or an array of str, got {type(text_string).__name__}"
                            + (f" of dtype {array.dtype}" if array.dtype.kind != "U" else " with no elements"))
        text_string = array
    out = proto.Summary.Value(tag=check_tag(tag))
    out.tensor.CopyFrom(tensor_proto(np.asarray(text_string, dtype=object), "text_string"))
    if metadata:
        out.metadata.CopyFrom(_TEXT_METADATA)
    return out


# ---------------------------------------------------------------------------------------------------------- hparams

def hparam_value(key, value):
    """``value`` as (``google.protobuf.Value``, Python type) for an hparam; bool, int, float or str only."""
    if isinstance(value, (bool, np.bool_)):
        return proto.Value(bool_value=bool(value)), bool
    if isinstance(value, numbers.Real):
        return proto.Value(number_value=float(value)), float
    if isinstance(value, str):
        return proto.Value(string_value=check_text(value, f"hparam {key!r}")), str
    raise TypeError(f"hparam {key!r} must be a bool, int, float or str, got {type(value).__name__} {_shown(value)}")


def _hparams_value(field, message):
    content = proto.HParamsPluginData(version=0, **{field: message}).SerializeToString()
    out = proto.Summary.Value(tag=HPARAMS_TAGS[field], metadata=_metadata("hparams", "TENSOR", content))
    # TensorBoard's own hparams values carry this empty tensor; it is what readers expect to find.
    out.tensor.dtype = DT["DT_FLOAT"]
    out.tensor.tensor_shape.dim.add(size=0)
    return out


def hparams_experiment(hparam_dict, metric_tags, hparam_domain_discrete=None, time_created_secs=None):
    """The ``_hparams_/experiment`` value: the hparams' names, types and optional discrete domains, and the
    metric tags."""
    domains = dict(hparam_domain_discrete or {})
    unknown = set(domains) - set(hparam_dict)
    if unknown:
        raise ValueError(f"hparam_domain_discrete names hparams not in hparam_dict: {sorted(unknown)}")
    experiment = proto.Experiment(time_created_secs=time.time() if time_created_secs is None
                                  else time_created_secs)
    for key, value in hparam_dict.items():
        check_tag(key, "hparam name")
        _, kind = hparam_value(key, value)
        info = experiment.hparam_infos.add(name=key, type=proto.enum_value("tensorboard.hparams.DataType",
                                                                           _HPARAM_TYPE[kind]))
        if key in domains:
            if isinstance(domains[key], (str, bytes)) or not hasattr(domains[key], "__iter__"):
                raise TypeError(f"hparam_domain_discrete[{key!r}] must be a list of values, "
                                f"got {type(domains[key]).__name__}")
            for choice in domains[key]:
                value_pb, choice_kind = hparam_value(key, choice)
                if choice_kind is not kind:
                    raise TypeError(f"hparam_domain_discrete[{key!r}] holds {type(choice).__name__} {choice!r}, "
                                    f"but hparam {key!r} is {type(value).__name__}")
                info.domain_discrete.values.add().CopyFrom(value_pb)
    for tag in metric_tags:
        experiment.metric_infos.add().name.tag = check_tag(tag, "metric tag")
    return _hparams_value("experiment", experiment)


def hparams_session_start(hparam_dict, start_time_secs=None, group_name=""):
    """The ``_hparams_/session_start_info`` value: this run's hparam values."""
    info = proto.SessionStartInfo(start_time_secs=time.time() if start_time_secs is None else start_time_secs,
                                  group_name=group_name)
    for key, value in hparam_dict.items():
        info.hparams[check_tag(key, "hparam name")].CopyFrom(hparam_value(key, value)[0])
    return _hparams_value("session_start_info", info)


def hparams_session_end(status="SUCCESS", end_time_secs=None):
    """The ``_hparams_/session_end_info`` value; ``status`` is SUCCESS, FAILURE, RUNNING or UNKNOWN."""
    if status not in _STATUS:
        raise ValueError(f"status must be one of {sorted(_STATUS)}, got {status!r}")
    return _hparams_value("session_end_info", proto.SessionEndInfo(
        status=_STATUS[status], end_time_secs=time.time() if end_time_secs is None else end_time_secs))
