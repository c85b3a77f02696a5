"""``flow.scope``: placement, name scopes and logical views.

``placement`` records the device tag on the ops created inside it (shown by ``print(job.graph())``) without moving
them: a job runs whole on each of the devices ``flow.config.gpu_device_num(n)`` sets, data-parallel. The logical
view (``consistent_view()``, the default, or ``mirrored_view()``, through ``config.default_logical_view``) says how
arguments and results are split over them and joined (``runtime/devices.py``).
"""
import contextlib

from .graph import device_scope, name_scope


@contextlib.contextmanager
def placement(device_tag, machine_device_ids="0:0"):
    """``with flow.scope.placement("gpu", "0:0"):`` tags the ops made inside with a device (``print(job.graph())``
    shows it) without moving them: jobs run whole on each device that ``flow.config.gpu_device_num`` sets.
    """
    if device_tag not in ("cpu", "gpu"):
        raise ValueError(f"flow.scope.placement: device_tag must be 'cpu' or 'gpu', got {device_tag!r}")
    with device_scope(f"{device_tag}:{machine_device_ids}"):
        yield


def namespace(name):
    """Prefix the names of ops and variables created inside with ``name-``."""
    return name_scope(name)


def consistent_view():
    """The consistent logical view (the default): a job's arguments and results are whole batches, split over the
    devices and joined back.
    """
    return "consistent"


def mirrored_view():
    """The mirrored logical view: ``tp.ListNumpy`` arguments and results hold one array a device."""
    return "mirrored"


__all__ = ["placement", "namespace", "consistent_view", "mirrored_view"]
