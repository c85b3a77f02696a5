"""Compatibility: OneFlow 0.x's ``oneflow.python`` package, for programs that import its modules by path (see
``flowlab.python.framework``)."""
