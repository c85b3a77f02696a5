"""``oneflow.core.common``: ``data_type_pb2``."""
