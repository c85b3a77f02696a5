"""Compatibility: OneFlow 0.x's ``oneflow.core`` protobuf modules that programs import by path."""
