"""Our .proto files describe TensorBoard's messages exactly, and records are framed as TensorBoard frames them."""
import importlib
import struct

import pytest

from flowlab.summary import proto
from flowlab.summary.record import RecordScanner, frame, masked_crc

# Our message -> TensorBoard's generated module holding the same message.
PEERS = {
    "tensorboard.Event": "tensorboard.compat.proto.event_pb2",
    "tensorboard.SessionLog": "tensorboard.compat.proto.event_pb2",
    "tensorboard.Summary": "tensorboard.compat.proto.summary_pb2",
    "tensorboard.SummaryMetadata": "tensorboard.compat.proto.summary_pb2",
    "tensorboard.HistogramProto": "tensorboard.compat.proto.histogram_pb2",
    "tensorboard.TensorProto": "tensorboard.compat.proto.tensor_pb2",
    "tensorboard.TensorShapeProto": "tensorboard.compat.proto.tensor_shape_pb2",
    "tensorboard.GraphDef": "tensorboard.compat.proto.graph_pb2",
    "tensorboard.NodeDef": "tensorboard.compat.proto.node_def_pb2",
    "tensorboard.AttrValue": "tensorboard.compat.proto.attr_value_pb2",
    "tensorboard.ProjectorConfig": "tensorboard.plugins.projector.projector_config_pb2",
    "tensorboard.hparams.HParamsPluginData": "tensorboard.plugins.hparams.plugin_data_pb2",
    "tensorboard.hparams.SessionStartInfo": "tensorboard.plugins.hparams.plugin_data_pb2",
    "tensorboard.hparams.SessionEndInfo": "tensorboard.plugins.hparams.plugin_data_pb2",
    "tensorboard.hparams.Experiment": "tensorboard.plugins.hparams.api_pb2",
    "tensorboard.hparams.HParamInfo": "tensorboard.plugins.hparams.api_pb2",
    "tensorboard.hparams.MetricInfo": "tensorboard.plugins.hparams.api_pb2",
}


def _fields(descriptor, seen=None):
    """{path: (number, type, label)} for a message and every message nested in it."""
    seen = set() if seen is None else seen
    out = {}
    if descriptor.full_name in seen:
        return out
    seen.add(descriptor.full_name)
    for f in descriptor.fields:
        repeated = f.is_repeated if hasattr(f, "is_repeated") else f.label == f.LABEL_REPEATED
        out[f"{descriptor.name}.{f.name}"] = (f.number, f.type, repeated, f.containing_oneof.name
                                              if f.containing_oneof else None)
        if f.message_type is not None:
            out.update(_fields(f.message_type, seen))
        if f.enum_type is not None:
            out[f"{f.enum_type.name}"] = tuple(sorted((v.name, v.number) for v in f.enum_type.values))
    return out


@pytest.mark.parametrize("name", sorted(PEERS))
def test_messages_match_tensorboards(name):
    ours = _fields(proto.descriptor(name))
    module = importlib.import_module(PEERS[name])
    theirs = _fields(module.DESCRIPTOR.message_types_by_name[name.rsplit(".", 1)[1]])
    for path, spec in ours.items():
        assert path in theirs, f"{path} is not in TensorBoard's {name}"
        if isinstance(spec, tuple) and spec and isinstance(spec[0], tuple):      # an enum: ours may be a subset
            assert set(spec) <= set(theirs[path]), path
        else:
            assert theirs[path] == spec, path


def test_masked_crc_matches_tensorboards():
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
    for data in (b"", b"a", b"hello world", bytes(range(256)) * 3):
        assert masked_crc(data) == masked_crc32c(data)


def test_frame_layout():
    data = b"payload"
    record = frame(data)
    assert struct.unpack("<Q", record[:8])[0] == len(data)
    assert struct.unpack("<I", record[8:12])[0] == masked_crc(record[:8])
    assert record[12:-4] == data and struct.unpack("<I", record[-4:])[0] == masked_crc(data)


def test_scanner_reassembles_records_fed_byte_by_byte():
    payloads = [bytes([i]) * i for i in range(60)]
    stream = b"".join(frame(p) for p in payloads)
    scanner, got = RecordScanner(), []
    for i in range(len(stream)):
        scanner.feed(stream[i:i + 1])
        got += scanner.read()
    assert got == payloads and scanner.corrupt_records == 0 and scanner.pending_bytes() == 0


@pytest.mark.parametrize("flip", [0, 5, 9, 12, 20, 28])
def test_scanner_skips_a_corrupt_record_and_keeps_the_rest(flip):
    payloads = [b"first-record", b"second-record", b"third-record"]
    stream = bytearray(b"".join(frame(p) for p in payloads))
    start = len(frame(payloads[0]))
    stream[start + flip] ^= 0x5A      # corrupt the second record at some offset
    scanner = RecordScanner()
    scanner.feed(bytes(stream))
    assert scanner.read() == [payloads[0], payloads[2]]
    assert scanner.corrupt_records == 1 and scanner.skipped_bytes == len(frame(payloads[1]))


def test_scanner_waits_on_every_truncation():
    payloads = [b"x" * 10, b"y" * 20]
    stream = b"".join(frame(p) for p in payloads)
    first = len(frame(payloads[0]))
    for cut in range(len(stream)):
        scanner = RecordScanner()
        scanner.feed(stream[:cut])
        got = scanner.read()
        assert got == payloads[:1] if cut >= first else got == []
        assert scanner.corrupt_records == 0
        scanner.feed(stream[cut:])
        assert got + scanner.read() == payloads
