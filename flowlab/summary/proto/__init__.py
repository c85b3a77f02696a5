"""TensorBoard's event-file messages, built from the ``.proto`` files beside this module (``regenerate.sh``,
``flowlab.proto_pool``). The package and field names are TensorBoard's (``tensorboard.Event`` …), which is what
makes the files readable by TensorBoard."""
from ...proto_pool import ProtoPool

_files = ProtoPool(__name__)
_message = _files.message

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
    return _files.enum_value(enum_full_name, name)


def descriptor(full_name):
    return _files.descriptor(full_name)
