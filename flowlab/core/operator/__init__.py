"""Compatibility: OneFlow 0.x's ``oneflow.core.operator`` protobuf modules (``op_conf_pb2``)."""
