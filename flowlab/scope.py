"""``flow.scope``: placement, name scopes and logical views.

``placement`` records the device tag on the ops created inside it (shown by ``print(job.graph())``) without moving
them: a job runs whole on each of the devices ``flow.config.gpu_device_num(n)`` sets, data-parallel. The logical
view (``consistent_view()``, the default, or ``mirrored_view()``, through ``config.default_logical_view``) says how
arguments and results are split over them and joined (``runtime/devices.py``).
"""
import contextlib
import re

from .graph import device_scope, name_scope
from .runtime import session

_DEVICE_IDS = re.compile(r"(\d+):(\d+)(?:-(\d+))?")


def _devices_named(machine_device_ids):
    """The device indices ``machine_device_ids`` names (OneFlow's ``"machine:device"`` / ``"machine:first-last"``,
    or a list of them), checked against the one machine and the devices ``flow.config`` set."""
    api = "flow.scope.placement"
    entries = [machine_device_ids] if isinstance(machine_device_ids, str) else machine_device_ids
    if not isinstance(entries, (list, tuple)) or not entries or not all(isinstance(e, str) for e in entries):
        raise TypeError(f"{api}: machine_device_ids must be a string like '0:0' or '0:0-3', or a list of them, "
                        f"got {machine_device_ids!r}")
    count, named = session.default().device_num, []
    for entry in entries:
        match = _DEVICE_IDS.fullmatch(entry.strip())
        if match is None:
            raise ValueError(f"{api}: machine_device_ids must be 'machine:device' or 'machine:first-last' "
                             f"(e.g. '0:0-3'), got {entry!r}")
        machine, first = int(match[1]), int(match[2])
        last = first if match[3] is None else int(match[3])
        if machine != 0:
            raise ValueError(f"{api}: machine_device_ids {entry!r} names machine {machine}; flowlab runs on one "
                             "machine, machine 0")
        if last < first:
            raise ValueError(f"{api}: machine_device_ids {entry!r}: the last device ({last}) comes before the first "
                             f"({first})")
        if last >= count:
            raise ValueError(f"{api}: machine_device_ids {entry!r} names device {last}, but flow.config set "
                             f"{count} device(s) (gpu_device_num / cpu_device_num): devices 0 to {count - 1}")
        named.extend(range(first, last + 1))
    return named


@contextlib.contextmanager
def placement(device_tag, machine_device_ids="0:0"):
    """``with flow.scope.placement("gpu", "0:0"):`` tags the ops made inside with a device (``print(job.graph())``
    shows it) without moving them: jobs run whole on each device that ``flow.config.gpu_device_num`` sets, and a
    data op placed on one device (OneFlow-Benchmark's BERT reads on ``"cpu", "0:0"``) still makes the whole batch,
    which the devices share. The devices named must exist on this one machine.
    """
    if device_tag not in ("cpu", "gpu"):
        raise ValueError(f"flow.scope.placement: device_tag must be 'cpu' or 'gpu', got {device_tag!r}")
    _devices_named(machine_device_ids)
    ids = machine_device_ids if isinstance(machine_device_ids, str) else ",".join(machine_device_ids)
    with device_scope(f"{device_tag}:{ids}"):
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
