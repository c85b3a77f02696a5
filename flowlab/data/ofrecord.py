"""OFRecord files, OneFlow's dataset format: write them from Python values, read them back.

A file is a sequence of records, each ``<int64 little-endian byte size><serialized OFRecord>``, with no header and
no checksum. ``OFRecord{map<string, Feature> feature}``; a Feature holds one of ``bytes_list``, ``float_list``,
``double_list``, ``int32_list``, ``int64_list``. A dataset is a directory of part files ``part-<i>``, ``i``
zero-padded to ``part_name_suffix_length`` digits (-1: not padded), as OneFlow's readers look for them.

Writing::

    with OFRecordWriter("data/part-0") as w:
        w.write({"encoded": jpeg_bytes, "class/label": np.int32(3)})
    write_dataset("data", records, part_num=4)      # part-0 … part-3, records dealt round-robin

Both write into a temporary file and rename it into place when everything was written, so a dataset is never
half-written silently: an error (or an interrupted program) leaves no part file behind. Reading::

    for record in read_records("data"):            # a file, or every part file of a directory
        label = feature_value(record, "class/label")

A damaged file raises ``OFRecordError`` naming the file, the record's byte offset and what is wrong.
"""
from __future__ import annotations

import io
import os
import re
import struct
import secrets
from typing import Iterable, Iterator, NamedTuple

import numpy as np
from google.protobuf.message import DecodeError

from .proto import OFRecord

_SIZE = struct.Struct("<q")
KINDS = ("bytes_list", "float_list", "double_list", "int32_list", "int64_list")
_KIND_DTYPES = {"float_list": np.float32, "double_list": np.float64, "int32_list": np.int32,
                "int64_list": np.int64}
_DTYPE_KINDS = {np.dtype(np.float32): "float_list", np.dtype(np.float64): "double_list",
                np.dtype(np.int32): "int32_list", np.dtype(np.int64): "int64_list"}
# Integer NumPy dtypes without a list of their own go to the smallest list that holds every value of the dtype.
_WIDEN = {"b": "int32_list", "i": "int64_list", "u": "int64_list"}


class OFRecordError(ValueError):
    """An OFRecord file or record is damaged or does not hold what was asked for. The message names the file, the
    record's byte offset and, for a feature, the key and the keys the record has."""


class Record(NamedTuple):
    """One record as read from a file: the parsed message, and where it came from (for messages)."""
    record: object          # an OFRecord message
    path: str
    offset: int             # byte offset of the record's size field in ``path``

    def where(self) -> str:
        return f"record at byte offset {self.offset} of {self.path}"


# --------------------------------------------------------------------------------------------- building records

def make_feature(value, key="value"):
    """A ``Feature`` from a Python value:

    - ``bytes`` / ``bytearray`` / ``str`` (UTF-8) -> ``bytes_list`` with one value; a list/tuple of them -> one
      value each;
    - a PIL image -> ``bytes_list`` holding it JPEG-encoded (quality 95);
    - a float/int or a NumPy array/list of numbers -> ``float_list`` (float32, Python floats), ``double_list``
      (float64 arrays), ``int32_list`` (int32 arrays) or ``int64_list`` (Python ints, int64 arrays); other integer
      dtypes widen to the list that holds them; bools become int32. Arrays are flattened (C order);
    - an existing ``Feature`` is used as it is.
    """
    from .proto import Feature
    if isinstance(value, Feature):
        return value
    feature = Feature()
    if isinstance(value, (bytes, bytearray, str)) or _is_pil_image(value):
        feature.bytes_list.value.append(_as_bytes(value, key))
        return feature
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(v, (bytes, bytearray, str)) or _is_pil_image(v) for v in value):
        feature.bytes_list.value.extend(_as_bytes(v, key) for v in value)
        return feature
    if isinstance(value, (list, tuple)) and any(isinstance(v, (bytes, bytearray, str)) for v in value):
        raise TypeError(f"feature {key!r}: a list mixes bytes/str with other values: {value!r:.80}")
    if isinstance(value, float):
        kind, array = "float_list", np.asarray([value], np.float32)
    elif isinstance(value, (bool, np.bool_)):
        kind, array = "int32_list", np.asarray([value], np.int32)
    elif isinstance(value, int):
        kind, array = "int64_list", np.asarray([value], np.int64)
    else:
        try:
            array = np.asarray(value)
        except Exception as e:      # ragged lists and the like
            raise TypeError(f"feature {key!r}: cannot make a feature from {type(value).__name__}: {e}") from None
        if array.dtype.kind not in "biuf":
            raise TypeError(f"feature {key!r}: expected bytes, str, a PIL image, a number or an array of numbers, "
                            f"got {type(value).__name__} of dtype {array.dtype}")
        if isinstance(value, (list, tuple)) and array.dtype == np.float64:
            array = array.astype(np.float32)        # a list of Python floats: OneFlow's float_list
        if array.dtype in _DTYPE_KINDS:
            kind = _DTYPE_KINDS[array.dtype]
        elif array.dtype.kind == "f":
            kind, array = "float_list", array.astype(np.float32)     # float16
        else:
            kind = _WIDEN[array.dtype.kind] if array.dtype != np.uint32 else "int64_list"
            if array.dtype.kind == "b" or (array.dtype.itemsize < 4 and kind == "int64_list"):
                kind = "int32_list"                 # bool, int8/16, uint8/16 fit in int32
            array = array.astype(_KIND_DTYPES[kind])
    getattr(feature, kind).value.extend(array.ravel().tolist())
    return feature


def make_record(features: dict):
    """An ``OFRecord`` from ``{key: value}`` (values as ``make_feature`` takes them)."""
    if not isinstance(features, dict):
        raise TypeError(f"a record must be a dict of key -> value, got {type(features).__name__}")
    record = OFRecord()
    for key, value in features.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"record keys must be non-empty strings, got {key!r}")
        record.feature[key].CopyFrom(make_feature(value, key))
    return record


def _is_pil_image(value):
    try:
        from PIL import Image
    except ImportError:         # pragma: no cover - Pillow is a dependency
        return False
    return isinstance(value, Image.Image)


def _as_bytes(value, key):
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    return encode_jpeg(value)


def encode_jpeg(image, quality=95) -> bytes:
    """JPEG bytes of a PIL image or of a uint8 array ``(H, W)``, ``(H, W, 1)`` or ``(H, W, 3)`` (RGB)."""
    from PIL import Image
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] not in (1, 3)):
            raise ValueError(f"encode_jpeg: expected a uint8 array (H, W), (H, W, 1) or (H, W, 3), got "
                             f"{image.dtype} {image.shape}")
        image = Image.fromarray(image[..., 0] if image.ndim == 3 and image.shape[2] == 1 else image)
    if image.mode not in ("RGB", "L"):
        image = image.convert("RGB")
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=quality)
    return out.getvalue()


def frame(record) -> bytes:
    """One record as it lies in a file: its size (int64, little-endian) and its serialized bytes."""
    data = record if isinstance(record, (bytes, bytearray)) else record.SerializeToString()
    return _SIZE.pack(len(data)) + bytes(data)


# --------------------------------------------------------------------------------------------- writing

class OFRecordWriter:
    """Writes records to one OFRecord file. ``write(record)`` takes a dict (see ``make_record``) or an ``OFRecord``.

    The records go to a temporary file beside ``path``; ``close()`` (or leaving the ``with`` block normally)
    renames it to ``path``. Leaving the block through an exception, or ``abort()``, removes it: ``path`` then
    holds what it held before (nothing, usually), never a partial file. ``overwrite=False`` refuses an existing
    ``path``.
    """

    def __init__(self, path, overwrite=True):
        self.path = os.fspath(path)
        if not overwrite and os.path.exists(self.path):
            raise FileExistsError(f"OFRecordWriter: {self.path} exists (pass overwrite=True to replace it)")
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            raise FileNotFoundError(f"OFRecordWriter: directory {directory} does not exist")
        # open()'s exclusive mode, not mkstemp: the file gets the modes the user's umask gives (mkstemp's are 0600)
        self._tmp = os.path.join(directory, f".{os.path.basename(self.path)}.{secrets.token_hex(8)}.tmp")
        self._file = open(self._tmp, "xb")
        self.count = 0

    def write(self, record):
        if self._file is None:
            raise ValueError(f"OFRecordWriter({self.path}): write after close")
        if isinstance(record, dict):
            record = make_record(record)
        elif not isinstance(record, OFRecord):
            raise TypeError(f"OFRecordWriter.write: expected a dict of features or an OFRecord, "
                            f"got {type(record).__name__}")
        self._file.write(frame(record))
        self.count += 1

    def close(self):
        """Finish the file: flush, sync and rename it into place."""
        if self._file is None:
            return
        file, self._file = self._file, None
        try:
            file.flush()
            os.fsync(file.fileno())
        finally:
            file.close()
        os.replace(self._tmp, self.path)

    def abort(self):
        """Drop everything written: the temporary file goes, ``path`` is untouched."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if os.path.exists(self._tmp):
            os.remove(self._tmp)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __del__(self):              # a writer dropped without close() leaves no partial file
        if getattr(self, "_file", None) is not None:
            self.abort()


def part_name(index, prefix="part-", suffix_length=-1) -> str:
    """The name OneFlow's readers look for: ``prefix`` + ``index`` zero-padded to ``suffix_length`` digits."""
    digits = str(index)
    return prefix + "0" * max(suffix_length - len(digits), 0) + digits


def write_dataset(directory, records: Iterable, part_num=1, part_name_prefix="part-", part_name_suffix_length=-1,
                  overwrite=False) -> list[str]:
    """Write ``records`` (dicts or ``OFRecord`` s) into ``part_num`` part files of ``directory`` (created if
    needed), dealing them round-robin. Returns the part files' paths.

    All parts are written to temporary files first and renamed into place only when every record was written, so
    a failure leaves no part file at all. ``overwrite=False`` refuses a directory that already holds any of these
    part files.
    """
    if not isinstance(part_num, int) or part_num < 1:
        raise ValueError(f"write_dataset: part_num must be a positive int, got {part_num!r}")
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    paths = [os.path.join(directory, part_name(i, part_name_prefix, part_name_suffix_length))
             for i in range(part_num)]
    existing = [p for p in paths if os.path.exists(p)]
    if existing and not overwrite:
        raise FileExistsError(f"write_dataset: {directory} already holds {', '.join(map(os.path.basename, existing))}"
                              " (pass overwrite=True to replace them)")
    writers = []
    try:
        writers = [OFRecordWriter(p) for p in paths]
        for i, record in enumerate(records):
            writers[i % part_num].write(record)
    except BaseException:
        for w in writers:
            w.abort()
        raise
    for w in writers:
        w.close()
    return paths


# --------------------------------------------------------------------------------------------- reading

def iter_file(path) -> Iterator[tuple[bytes, int]]:
    """``(serialized record, byte offset)`` of each record of one file, in order; ``OFRecordError`` for a size
    field that is cut off, not positive, or larger than what is left of the file."""
    path = os.fspath(path)
    total = os.path.getsize(path)
    with open(path, "rb") as f:
        offset = 0
        while True:
            head = f.read(8)
            if not head:
                return
            if len(head) < 8:
                raise OFRecordError(f"{path}: truncated file: {len(head)} stray byte(s) at byte offset {offset}, "
                                    "where a record's 8-byte size field should start")
            (size,) = _SIZE.unpack(head)
            left = total - offset - 8
            if size <= 0 or size > left:
                raise OFRecordError(f"{path}: damaged or truncated record at byte offset {offset}: its size field "
                                    f"says {size} bytes, but {left} byte(s) follow in the file")
            data = f.read(size)
            if len(data) != size:       # the file shrank while being read
                raise OFRecordError(f"{path}: truncated record at byte offset {offset}: expected {size} bytes, "
                                    f"read {len(data)}")
            yield data, offset
            offset += 8 + size


def parse(data, path, offset) -> Record:
    """The ``Record`` of one serialized record; ``OFRecordError`` if it is no OFRecord."""
    try:
        return Record(OFRecord.FromString(data), path, offset)
    except DecodeError as e:
        raise OFRecordError(f"{path}: record at byte offset {offset} ({len(data)} bytes) is not a valid OFRecord: "
                            f"{e}") from None


def dataset_files(path, part_num=None, part_name_prefix="part-", part_name_suffix_length=-1) -> list[str]:
    """The files of a dataset: ``path`` itself if it is a file; else the part files ``part_num`` names (every
    ``<prefix><digits>`` file of the directory, in numeric order, when ``part_num`` is None)."""
    path = os.fspath(path)
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise FileNotFoundError(f"OFRecord dataset {path!r} does not exist")
    if part_num is not None:
        return part_files(path, part_num, part_name_prefix, part_name_suffix_length, "read_records")
    pattern = re.compile(re.escape(part_name_prefix) + r"(\d+)$")
    found = sorted((int(m.group(1)), name) for name in os.listdir(path) if (m := pattern.match(name)))
    if not found:
        raise FileNotFoundError(f"OFRecord dataset {path!r} holds no part files named {part_name_prefix}<n>")
    return [os.path.join(path, name) for _, name in found]


def part_files(directory, part_num, prefix, suffix_length, api) -> list[str]:
    """The ``part_num`` part files of ``directory`` a reader reads; ``FileNotFoundError`` naming every missing one
    (and what the directory holds) otherwise."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{api}: OFRecord directory {directory!r} does not exist" +
                                (" (it is a file; pass its directory)" if os.path.isfile(directory) else ""))
    paths = [os.path.join(directory, part_name(i, prefix, suffix_length)) for i in range(part_num)]
    missing = [os.path.basename(p) for p in paths if not os.path.isfile(p)]
    if missing:
        present = sorted(os.listdir(directory))
        shown = ", ".join(present[:8]) + (f" … ({len(present)} entries)" if len(present) > 8 else "")
        raise FileNotFoundError(
            f"{api}: {len(missing)} of the {part_num} part file(s) are missing in {directory}: "
            f"{', '.join(missing[:8])}{' …' if len(missing) > 8 else ''} (data_part_num={part_num}, "
            f"part_name_prefix={prefix!r}, part_name_suffix_length={suffix_length}); the directory holds: "
            f"{shown or 'nothing'}")
    return paths


def read_records(path, part_num=None, part_name_prefix="part-", part_name_suffix_length=-1) -> Iterator[Record]:
    """Every record of a file, or of a dataset directory's part files in order (see ``dataset_files``)."""
    for file in dataset_files(path, part_num, part_name_prefix, part_name_suffix_length):
        for data, offset in iter_file(file):
            yield parse(data, file, offset)


# --------------------------------------------------------------------------------------------- reading features

def feature_of(rec: Record, key, api="OFRecord"):
    """The ``Feature`` under ``key``; ``OFRecordError`` naming the keys present if it is missing or empty."""
    features = rec.record.feature
    if key not in features:
        raise OFRecordError(f"{api}: {rec.where()} has no key {key!r}; keys present: {sorted(features)}")
    feature = features[key]
    if feature.WhichOneof("kind") is None:
        raise OFRecordError(f"{api}: {rec.where()}: key {key!r} holds an empty Feature (no list is set); "
                            f"keys present: {sorted(features)}")
    return feature


def feature_kind(rec: Record, key, api="OFRecord"):
    return feature_of(rec, key, api).WhichOneof("kind")


def single_bytes(rec: Record, key, api="OFRecord") -> bytes:
    """The one bytes value under ``key`` (an encoded image, a string)."""
    feature = feature_of(rec, key, api)
    kind = feature.WhichOneof("kind")
    if kind != "bytes_list":
        raise OFRecordError(f"{api}: {rec.where()}: key {key!r} holds a {kind}, expected a bytes_list with one "
                            f"value; keys present: {_kinds(rec)}")
    values = feature.bytes_list.value
    if len(values) != 1:
        raise OFRecordError(f"{api}: {rec.where()}: key {key!r} holds {len(values)} bytes values, expected exactly "
                            f"one; keys present: {_kinds(rec)}")
    return values[0]


def feature_value(rec: Record, key):
    """The value under ``key`` as Python/NumPy data: a list of bytes for a ``bytes_list``, else a 1-d array of the
    list's dtype."""
    feature = feature_of(rec, key)
    kind = feature.WhichOneof("kind")
    if kind == "bytes_list":
        return list(feature.bytes_list.value)
    return np.asarray(getattr(feature, kind).value, dtype=_KIND_DTYPES[kind])


def raw_values(rec: Record, key, dtype, count, pad=False, api="OFRecordRawDecoder") -> np.ndarray:
    """``count`` values of ``dtype`` under ``key`` (OneFlow's raw decoding), strictly:

    - float dtypes take any numeric list; integer dtypes take ``int32_list`` / ``int64_list`` (values must fit) and
      never a float list (truncating floats to labels would read garbage silently);
    - a ``bytes_list`` (one value) is read as raw bytes, for int8 / uint8 only;
    - the list must hold exactly ``count`` values; with ``pad`` (``auto_zero_padding`` / ``dim1_varying_length``)
      at most ``count``, the rest zero.
    """
    dtype = np.dtype(dtype)
    feature = feature_of(rec, key, api)
    kind = feature.WhichOneof("kind")
    if kind == "bytes_list":
        if dtype not in (np.dtype(np.int8), np.dtype(np.uint8)):
            raise OFRecordError(f"{api}: {rec.where()}: key {key!r} holds a bytes_list, which decodes only to int8 "
                                f"or uint8, but dtype {dtype} was asked for; keys present: {_kinds(rec)}")
        if len(feature.bytes_list.value) != 1:
            raise OFRecordError(f"{api}: {rec.where()}: key {key!r} holds {len(feature.bytes_list.value)} bytes "
                                f"values, expected one; keys present: {_kinds(rec)}")
        values = np.frombuffer(feature.bytes_list.value[0], dtype=dtype)
    else:
        if dtype.kind in "iu" and kind in ("float_list", "double_list"):
            raise OFRecordError(f"{api}: {rec.where()}: key {key!r} holds a {kind}, but dtype {dtype} was asked for "
                                f"(float values are not converted to integers); keys present: {_kinds(rec)}")
        values = np.asarray(getattr(feature, kind).value, dtype=_KIND_DTYPES[kind])
        if dtype.kind in "iu" and values.size and np.dtype(values.dtype).itemsize >= dtype.itemsize:
            info = np.iinfo(dtype)
            if values.min() < info.min or values.max() > info.max:
                raise OFRecordError(f"{api}: {rec.where()}: key {key!r} holds values in [{values.min()}, "
                                    f"{values.max()}], which do not fit dtype {dtype}")
    n = values.size
    if n != count and not (pad and n < count):
        expect = f"at most {count}" if pad else f"{count}"
        raise OFRecordError(f"{api}: {rec.where()}: key {key!r} holds {n} value(s) ({kind}), expected {expect} for "
                            f"the declared shape; keys present: {_kinds(rec)}")
    out = values.astype(dtype, copy=False)
    if n < count:
        out = np.concatenate([out, np.zeros(count - n, dtype)])
    return out


def _kinds(rec: Record):
    """``{key: kind}`` of a record, for messages."""
    return {k: f.WhichOneof("kind") for k, f in sorted(rec.record.feature.items())}


__all__ = ["OFRecordError", "OFRecordWriter", "Record", "dataset_files", "encode_jpeg", "feature_value",
           "frame", "make_feature", "make_record", "part_name", "read_records", "write_dataset"]
