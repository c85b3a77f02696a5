"""``flowlab.core.common.data_type_pb2``: OneFlow's DataType numbers, names, and their use as a ``dtype``."""
import numpy as np
import pytest

import flowlab as flow
import flowlab.core.common.data_type_pb2 as data_type_util
import flowlab.typing as tp


def test_numbers_and_names_are_oneflows():
    # oneflow/core/common/data_type.proto (v0.3.4)
    expected = {"kInvalidDataType": 0, "kChar": 1, "kFloat": 2, "kDouble": 3, "kInt8": 4, "kInt32": 5, "kInt64": 6,
                "kUInt8": 7, "kOFRecord": 8, "kFloat16": 9, "kTensorBuffer": 10}
    assert {name: getattr(data_type_util, name) for name in expected} == expected
    assert dict(data_type_util.DataType.items()) == expected
    assert data_type_util.DataType.Name(2) == "kFloat"
    assert data_type_util.DataType.Value("kInt32") == 5
    with pytest.raises(ValueError, match="no member of number 42"):
        data_type_util.DataType.Name(42)


def test_members_convert_to_and_from_flowlab_dtypes():
    D = data_type_util.DataType
    assert flow.dtypes.as_dtype(data_type_util.kFloat) == flow.float32
    assert flow.dtypes.as_dtype(data_type_util.kFloat16) == flow.float16
    assert flow.dtypes.as_dtype(data_type_util.kInt64) == flow.int64
    assert D.of(flow.float32) is D.kFloat and D.of(flow.int8) is D.kInt8 and D.of(np.uint8) is D.kUInt8
    with pytest.raises(TypeError, match="dtype: DataType.kOFRecord is not a numeric dtype"):
        flow.dtypes.as_dtype(data_type_util.kOFRecord)


def test_a_member_works_as_a_job_dtype():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        w = flow.get_variable("dt_w", shape=(3,), dtype=data_type_util.kFloat, initializer=flow.ones_initializer())
        return flow.cast(x + w, dtype=data_type_util.kInt32)
    out = job(np.array([0.5, 1.5, 2.5], np.float32))
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, [1, 2, 3])
