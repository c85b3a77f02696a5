"""OneFlow's OFRecord messages (``oneflow.OFRecord`` …), built from ``record.proto`` beside this module
(``regenerate.sh``, ``flowlab.proto_pool``)."""
from ...proto_pool import ProtoPool

_message = ProtoPool(__name__).message

OFRecord = _message("oneflow.OFRecord")
Feature = _message("oneflow.Feature")
BytesList = _message("oneflow.BytesList")
FloatList = _message("oneflow.FloatList")
DoubleList = _message("oneflow.DoubleList")
Int32List = _message("oneflow.Int32List")
Int64List = _message("oneflow.Int64List")
