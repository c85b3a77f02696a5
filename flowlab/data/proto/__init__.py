"""OneFlow's OFRecord messages, built from ``record.proto`` beside this module.

``regenerate.sh`` compiles it with protoc into ``descriptors.pb``, loaded here into a *private* descriptor pool:
the package and names are OneFlow's (``oneflow.OFRecord`` …), and a private pool lets flowlab run in one process
with OneFlow, whose own modules register the same names in protobuf's default pool.
"""
from importlib import resources

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_pool = descriptor_pool.DescriptorPool()
for _file in descriptor_pb2.FileDescriptorSet.FromString(
        resources.files(__name__).joinpath("descriptors.pb").read_bytes()).file:
    _pool.Add(_file)


def _message(full_name):
    return message_factory.GetMessageClass(_pool.FindMessageTypeByName(full_name))


OFRecord = _message("oneflow.OFRecord")
Feature = _message("oneflow.Feature")
BytesList = _message("oneflow.BytesList")
FloatList = _message("oneflow.FloatList")
DoubleList = _message("oneflow.DoubleList")
Int32List = _message("oneflow.Int32List")
Int64List = _message("oneflow.Int64List")
