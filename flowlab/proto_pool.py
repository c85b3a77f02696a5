"""Protobuf messages from ``.proto`` files the project wrote itself, compiled with protoc into a ``descriptors.pb``
beside them (each folder's ``regenerate.sh``) and loaded into a *private* descriptor pool: the packages and names are
the formats' own (``tensorboard.Event``, ``oneflow.OFRecord``), and a private pool lets flowlab run in one process
with TensorBoard, TensorFlow or OneFlow, whose modules register the same names in protobuf's default pool."""
from importlib import resources

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory


class ProtoPool:
    """The messages of the ``descriptors.pb`` in package ``package``'s folder."""

    def __init__(self, package):
        self.pool = descriptor_pool.DescriptorPool()
        data = resources.files(package).joinpath("descriptors.pb").read_bytes()
        for file in descriptor_pb2.FileDescriptorSet.FromString(data).file:
            self.pool.Add(file)

    def message(self, full_name):
        return message_factory.GetMessageClass(self.pool.FindMessageTypeByName(full_name))

    def descriptor(self, full_name):
        return self.pool.FindMessageTypeByName(full_name)

    def enum_value(self, enum_full_name, name):
        return self.pool.FindEnumTypeByName(enum_full_name).values_by_name[name].number
