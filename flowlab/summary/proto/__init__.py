"""TensorBoard's event-file messages, built from the ``.proto`` files beside this module.

``regenerate.sh`` compiles them with protoc into ``descriptors.pb``; here they are loaded into a *private* descriptor
pool. The package and field names are TensorBoard's (``tensorboard.Event`` …), which is what makes the files
readable by TensorBoard; a private pool lets flowlab run in one process with TensorBoard or TensorFlow, whose own
modules register the same names in protobuf's default pool.
"""
from importlib import resources

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_pool = descriptor_pool.DescriptorPool()
for _file in descriptor_pb2.FileDescriptorSet.FromString(
        resources.files(__name__).joinpath("descriptors.pb").read_bytes()).file:
    _pool.Add(_file)


def _message(full_name):
    return message_factory.GetMessageClass(_pool.FindMessageTypeByName(full_name))


Event = _message("tensorboard.Event")
SessionLog = _message("tensorboard.SessionLog")
Summary = _message("tensorboard.Summary")
SummaryMetadata = _message("tensorboard.SummaryMetadata")
HistogramProto = _message("tensorboard.HistogramProto")
TensorProto = _message("tensorboard.TensorProto")
TensorShapeProto = _message("tensorboard.TensorShapeProto")
GraphDef = _message("tensorboard.GraphDef")
NodeDef = _message("tensorboard.NodeDef")
AttrValue = _message("tensorboard.AttrValue")
ProjectorConfig = _message("tensorboard.ProjectorConfig")
HParamsPluginData = _message("tensorboard.hparams.HParamsPluginData")
Experiment = _message("tensorboard.hparams.Experiment")
HParamInfo = _message("tensorboard.hparams.HParamInfo")
MetricInfo = _message("tensorboard.hparams.MetricInfo")
SessionStartInfo = _message("tensorboard.hparams.SessionStartInfo")
SessionEndInfo = _message("tensorboard.hparams.SessionEndInfo")
ListValue = _message("google.protobuf.ListValue")
Value = _message("google.protobuf.Value")


def enum_value(enum_full_name, name):
    """The number of ``name`` in an enum of these files, e.g. ``("tensorboard.DataType", "DT_FLOAT") -> 1``."""
    return _pool.FindEnumTypeByName(enum_full_name).values_by_name[name].number


def descriptor(full_name):
    return _pool.FindMessageTypeByName(full_name)
