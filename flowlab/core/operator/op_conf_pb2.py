"""Compatibility: the names OneFlow-Benchmark's programs read from OneFlow 0.x's ``oneflow.core.operator.op_conf_pb2``
(``import oneflow.core.operator.op_conf_pb2 as op_conf_util``; BERT passes ``op_conf_util.kNone`` as "no
activation"). OneFlow's ``ActivationType`` enum of ``op_conf.proto``, with its numbers, and each value's flowlab
function in ``ACTIVATIONS`` (``None`` for ``kNone``)."""
import enum

from ...ops.math import sigmoid, tanh
from ...ops.nn import relu


class ActivationType(enum.IntEnum):
    kNone = 0
    kTanH = 1
    kSigmoid = 2
    kRelu = 3


kNone, kTanH, kSigmoid, kRelu = ActivationType.kNone, ActivationType.kTanH, ActivationType.kSigmoid, \
    ActivationType.kRelu

ACTIVATIONS = {kNone: None, kTanH: tanh, kSigmoid: sigmoid, kRelu: relu}

__all__ = ["ACTIVATIONS", "ActivationType", "kNone", "kRelu", "kSigmoid", "kTanH"]
