"""``flow.scope``: placement, name scopes and logical views.

flowlab runs a job on one device (CuPy or NumPy), so ``placement`` records the device tag on the ops created inside
it (shown by ``print(job.graph())``) without moving them.
"""
import contextlib

from .graph import device_scope, name_scope


@contextlib.contextmanager
def placement(device_tag, machine_device_ids="0:0"):
    if device_tag not in ("cpu", "gpu"):
        raise ValueError(f"flow.scope.placement: device_tag must be 'cpu' or 'gpu', got {device_tag!r}")
    with device_scope(f"{device_tag}:{machine_device_ids}"):
        yield


def namespace(name):
    """Prefix the names of ops and variables created inside with ``name-``."""
    return name_scope(name)


def consistent_view():
    return "consistent"


def mirrored_view():
    return "mirrored"


__all__ = ["placement", "namespace", "consistent_view", "mirrored_view"]
