"""OneFlow's ``oneflow.core`` protobuf modules that programs import, as thin aliases over flowlab's own names."""
