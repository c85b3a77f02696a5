"""Errors flowlab raises. Each names the argument or tensor, what was expected and what came."""


class FlowlabError(Exception):
    """Base of flowlab's own errors."""


class TraceError(FlowlabError, RuntimeError):
    """An op was used where no job function is being traced, or a job misuses the graph."""


class ShapeError(FlowlabError, ValueError):
    """Shapes or dtypes of an op's inputs do not fit; the message ends with the user's source line."""


class FeedError(FlowlabError, ValueError):
    """A job was called with the wrong number, shape or dtype of arguments."""


class CheckpointError(FlowlabError, ValueError):
    """A checkpoint cannot be saved or loaded as asked."""


class DeviceError(FlowlabError, RuntimeError):
    """A GPU was asked for but none works."""


class WatchCallbackError(FlowlabError, RuntimeError):
    """A watch handler raised; the message names the watched tensor, the handler and the call."""


class AnomalyError(FlowlabError, FloatingPointError):
    """A job with ``config.detect_anomaly(True)`` produced NaN or Inf; the message names the first op that did."""


__all__ = [
    "FlowlabError", "TraceError", "ShapeError", "FeedError", "CheckpointError", "DeviceError", "WatchCallbackError",
    "AnomalyError",
]
