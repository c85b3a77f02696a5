"""``oneflow.core.common.data_type_pb2``: OneFlow's ``DataType`` enum, for programs that import it
(``import oneflow.core.common.data_type_pb2 as data_type_util``, e.g. OneFlow-Benchmark's BERT).

The members are ``flowlab.dtypes.DataType``'s: ints with OneFlow's numbers (``kFloat == 2``), as a protobuf enum's
values are, which every flowlab ``dtype=`` argument also accepts (``flow.get_variable(...,
dtype=data_type_util.kFloat)`` is ``dtype=flow.float32``); ``DataType.Name(2)`` / ``DataType.Value("kFloat")`` work
as on the generated module.
"""
from ...dtypes import DataType

kInvalidDataType = DataType.kInvalidDataType
kChar = DataType.kChar
kFloat = DataType.kFloat
kDouble = DataType.kDouble
kInt8 = DataType.kInt8
kInt32 = DataType.kInt32
kInt64 = DataType.kInt64
kUInt8 = DataType.kUInt8
kOFRecord = DataType.kOFRecord
kFloat16 = DataType.kFloat16
kTensorBuffer = DataType.kTensorBuffer

__all__ = ["DataType", "kInvalidDataType", "kChar", "kFloat", "kDouble", "kInt8", "kInt32", "kInt64", "kUInt8",
           "kOFRecord", "kFloat16", "kTensorBuffer"]
