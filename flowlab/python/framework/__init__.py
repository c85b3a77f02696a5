"""Compatibility: modules of OneFlow 0.x's ``oneflow.python.framework`` that programs import by path."""
