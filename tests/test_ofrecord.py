"""OFRecord files: the writer's bytes against the format (framing by hand, protobuf wire bytes), round trips, atomic
writes, and the reader's errors on damaged files."""
import io
import os
import stat
import struct

import numpy as np
import pytest
from PIL import Image

from flowlab.data import ofrecord
from flowlab.data.ofrecord import (OFRecordError, OFRecordWriter, encode_jpeg, feature_value, make_record,
                                   read_records, write_dataset)
from flowlab.data.proto import OFRecord


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _ld(field, payload):
    """A length-delimited protobuf field, written by hand."""
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def test_record_proto_field_numbers_are_oneflows():
    d = OFRecord.DESCRIPTOR
    assert d.full_name == "oneflow.OFRecord" and d.fields_by_name["feature"].number == 1
    kinds = {f.name: f.number for f in d.fields_by_name["feature"].message_type.fields_by_name["value"]
             .message_type.fields}
    assert kinds == {"bytes_list": 1, "float_list": 2, "double_list": 3, "int32_list": 4, "int64_list": 5}


def test_writer_bytes_match_the_format_written_by_hand(tmp_path):
    path = tmp_path / "part-0"
    with OFRecordWriter(path) as w:
        w.write({"k": np.array([1, 2], np.int32)})
        w.write({"b": b"xyz"})
    data = path.read_bytes()
    # record 1: map entry {key "k", value Feature{int32_list{value [1, 2] packed}}}
    feature = _ld(4, _ld(1, bytes([1, 2])))
    entry = _ld(1, b"k") + _ld(2, feature)
    rec1 = _ld(1, entry)
    feature = _ld(1, _ld(1, b"xyz"))
    rec2 = _ld(1, _ld(1, b"b") + _ld(2, feature))
    assert data == struct.pack("<q", len(rec1)) + rec1 + struct.pack("<q", len(rec2)) + rec2
    # and the framing read back by hand: <int64 LE size><record>, no header, no checksum
    size = struct.unpack_from("<q", data)[0]
    parsed = OFRecord.FromString(data[8:8 + size])
    assert list(parsed.feature["k"].int32_list.value) == [1, 2]


def test_feature_kinds_from_python_values():
    img = Image.new("RGB", (6, 4), (200, 10, 30))
    r = make_record({"f": 1.5, "i": 7, "a32": np.arange(6, dtype=np.int32).reshape(2, 3),
                     "a64": np.array([2 ** 40], np.int64), "d": np.array([0.1], np.float64),
                     "fl": [0.5, 1.5], "u8": np.array([255], np.uint8), "s": "héllo", "bs": [b"a", b"bc"],
                     "img": img, "flag": True})
    kinds = {k: f.WhichOneof("kind") for k, f in r.feature.items()}
    assert kinds == {"f": "float_list", "i": "int64_list", "a32": "int32_list", "a64": "int64_list",
                     "d": "double_list", "fl": "float_list", "u8": "int32_list", "s": "bytes_list",
                     "bs": "bytes_list", "img": "bytes_list", "flag": "int32_list"}
    assert list(r.feature["a32"].int32_list.value) == [0, 1, 2, 3, 4, 5]
    assert r.feature["s"].bytes_list.value[0] == "héllo".encode()
    decoded = np.asarray(Image.open(io.BytesIO(r.feature["img"].bytes_list.value[0])))
    assert decoded.shape == (4, 6, 3) and abs(int(decoded[..., 0].mean()) - 200) <= 3
    with pytest.raises(TypeError, match="feature 'x'"):
        make_record({"x": object()})
    with pytest.raises(TypeError, match="mixes bytes"):
        make_record({"x": [b"a", 1]})


def test_write_dataset_round_trip_and_part_names(tmp_path):
    records = [{"class/label": np.int32(i), "v": np.full(3, i, np.float32)} for i in range(7)]
    paths = write_dataset(tmp_path / "ds", records, part_num=3, part_name_suffix_length=5)
    assert [os.path.basename(p) for p in paths] == ["part-00000", "part-00001", "part-00002"]
    back = list(read_records(tmp_path / "ds"))
    labels = [int(feature_value(r, "class/label")[0]) for r in back]
    assert labels == [0, 3, 6, 1, 4, 2, 5]          # round-robin over the parts, parts in order
    assert np.array_equal(feature_value(back[1], "v"), np.full(3, 3, np.float32))
    assert back[1].path.endswith("part-00000") and back[1].offset > 0
    assert ofrecord.part_name(12, "part-", 5) == "part-00012" and ofrecord.part_name(12) == "part-12"
    with pytest.raises(FileExistsError, match="part-00000"):
        write_dataset(tmp_path / "ds", records, part_num=3, part_name_suffix_length=5)


def test_a_failed_write_leaves_no_part_file(tmp_path):
    def records():
        yield {"a": 1}
        yield {"a": 2}
        raise RuntimeError("source broke")
    with pytest.raises(RuntimeError, match="source broke"):
        write_dataset(tmp_path / "ds", records(), part_num=2)
    assert os.listdir(tmp_path / "ds") == []
    with pytest.raises(TypeError):
        with OFRecordWriter(tmp_path / "single") as w:
            w.write({"a": 1})
            w.write(42)
    assert not (tmp_path / "single").exists() and os.listdir(tmp_path) == ["ds"]


def _two_records(tmp_path):
    path = tmp_path / "part-0"
    with OFRecordWriter(path) as w:
        w.write({"a": 1})
        w.write({"b": b"0123456789"})
    return path


def test_truncated_file_names_file_and_offset(tmp_path):
    path = _two_records(tmp_path)
    data = path.read_bytes()
    first = 8 + struct.unpack_from("<q", data)[0]
    path.write_bytes(data[:-3])
    with pytest.raises(OFRecordError, match=rf"{path}: damaged or truncated record at byte offset {first}"):
        list(read_records(path))
    path.write_bytes(data[:first + 5])
    with pytest.raises(OFRecordError, match=rf"5 stray byte\(s\) at byte offset {first}"):
        list(read_records(path))


def test_damaged_size_and_payload(tmp_path):
    path = _two_records(tmp_path)
    data = bytearray(path.read_bytes())
    first = 8 + struct.unpack_from("<q", data)[0]
    bad = bytearray(data)
    struct.pack_into("<q", bad, first, -4)
    path.write_bytes(bytes(bad))
    with pytest.raises(OFRecordError, match=f"byte offset {first}: its size field says -4"):
        list(read_records(path))
    bad = bytearray(data)
    bad[8:first] = b"\xff" * (first - 8)            # record 0's bytes are no protobuf
    path.write_bytes(bytes(bad))
    with pytest.raises(OFRecordError, match="record at byte offset 0 .* is not a valid OFRecord"):
        list(read_records(path))


def test_feature_errors_name_key_and_keys_present(tmp_path):
    path = tmp_path / "part-0"
    with OFRecordWriter(path) as w:
        w.write({"x": [0.5, 1.5], "n": np.array([1, 2, 3], np.int64), "big": np.array([2 ** 40], np.int64)})
    rec = next(read_records(path))
    with pytest.raises(OFRecordError, match=r"has no key 'y'; keys present: \['big', 'n', 'x'\]"):
        ofrecord.raw_values(rec, "y", np.float32, 2)
    with pytest.raises(OFRecordError, match="key 'x' holds a float_list, but dtype int32 was asked for"):
        ofrecord.raw_values(rec, "x", np.int32, 2)
    with pytest.raises(OFRecordError, match=r"key 'n' holds 3 value\(s\) \(int64_list\), expected 2"):
        ofrecord.raw_values(rec, "n", np.int64, 2)
    with pytest.raises(OFRecordError, match="do not fit dtype int32"):
        ofrecord.raw_values(rec, "big", np.int32, 1)
    assert ofrecord.raw_values(rec, "n", np.float32, 5, pad=True).tolist() == [1, 2, 3, 0, 0]
    assert ofrecord.raw_values(rec, "n", np.int32, 3).dtype == np.int32
    with pytest.raises(OFRecordError, match="holds a float_list, expected a bytes_list"):
        ofrecord.single_bytes(rec, "x")


def test_encode_jpeg_arrays():
    gray = np.tile(np.arange(16, dtype=np.uint8) * 16, (8, 1))
    back = np.asarray(Image.open(io.BytesIO(encode_jpeg(gray))))
    assert back.shape == (8, 16) and np.abs(back.astype(int) - gray).max() <= 8
    with pytest.raises(ValueError, match="uint8 array"):
        encode_jpeg(np.zeros((4, 4, 2), np.uint8))


def test_written_files_get_the_modes_of_the_users_umask(tmp_path):
    """Part files are readable as any file the user writes (a temporary file's private 0600 would lock others out
    of a shared dataset)."""
    mask = os.umask(0o022)
    try:
        paths = write_dataset(tmp_path / "d", [{"x": np.int32(1)}], part_num=2)
    finally:
        os.umask(mask)
    assert [stat.S_IMODE(os.stat(p).st_mode) for p in paths] == [0o644, 0o644]
    assert sorted(os.listdir(tmp_path / "d")) == ["part-0", "part-1"]      # no temporary file left
