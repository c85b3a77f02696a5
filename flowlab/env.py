"""``flow.env``: OneFlow 0.3.4's environment settings (env_util.py): the machines of a job, their ports, logging.

flowlab runs in one process on one machine, with up to ``config.MAX_DEVICE_NUM`` logical devices
(``flow.config.gpu_device_num(n)``). ``machine`` therefore accepts one machine and refuses more with a message saying
so; the ports only serve OneFlow's links between machines and are checked and kept; ``log_dir`` sends flowlab's log
lines (the ``flowlab`` logger) to a file there as well. Values are settings of the process, as OneFlow's environment
is: ``flow.clear_default_session()`` keeps them. ``settings()`` shows them.
"""
from __future__ import annotations

import logging
import os

from .config import MAX_DEVICE_NUM, MAX_MACHINE_NUM

LOG_FILE = "flowlab.log"

_settings = {"machine": [{"addr": "127.0.0.1"}]}
_log_handler = None


def settings() -> dict:
    """What the setters below were given (``machine``: OneFlow's list of ``{"addr": ...}``, one entry)."""
    return {key: list(value) if isinstance(value, list) else value for key, value in _settings.items()}


def init():
    """OneFlow starts its environment (control plane, machines) here; flowlab has none to start. Returns True as
    OneFlow's first call does."""
    return True


def machine(*val):
    """The machines, each an address string or a dict with ``addr`` (and OneFlow's optional ``ctrl_port_agent``,
    ``data_port_agent``), given as arguments or one list: ``flow.env.machine([{"addr": "192.168.1.1"}])``.
    flowlab runs on one machine: more than one is refused."""
    if len(val) == 1 and isinstance(val[0], (list, tuple)):
        val = val[0]
    machines = [_machine(m) for m in val]
    if not machines:
        raise ValueError("flow.env.machine: expected at least one machine, got none")
    addrs = [m["addr"] for m in machines]
    if len(set(addrs)) != len(addrs):
        raise ValueError(f"flow.env.machine: machine addresses must differ, got {addrs}")
    if len(machines) > MAX_MACHINE_NUM:
        raise ValueError(f"flow.env.machine: got {len(machines)} machines ({', '.join(addrs)}); flowlab runs on "
                         f"{MAX_MACHINE_NUM} machine with up to {MAX_DEVICE_NUM} logical devices. Give one machine "
                         f"(or leave flow.env.machine out) and use flow.config.gpu_device_num(n) for n devices")
    _settings["machine"] = machines


def _machine(m):
    if isinstance(m, str):
        m = {"addr": m}
    if not isinstance(m, dict) or not isinstance(m.get("addr"), str) or not m["addr"]:
        raise TypeError(f"flow.env.machine: each machine must be an address string or a dict with an 'addr' "
                        f"string, got {m!r}")
    unknown = set(m) - {"addr", "ctrl_port_agent", "data_port_agent"}
    if unknown:
        raise ValueError(f"flow.env.machine: unknown machine keys {sorted(unknown)} in {m!r}; expected 'addr', "
                         f"'ctrl_port_agent', 'data_port_agent'")
    for key in ("ctrl_port_agent", "data_port_agent"):
        if key in m:
            _port(f"flow.env.machine: {key}", m[key])
    return dict(m)


def _port(api, val):
    if isinstance(val, bool) or not isinstance(val, int):
        raise TypeError(f"{api}: expected a port number (int), got {val!r}")
    if not 0 < val < 65536:
        raise ValueError(f"{api}: expected a port number in 1..65535, got {val}")
    return val


def ctrl_port(val):
    """The port of OneFlow's control plane between machines. Checked and kept; changes nothing in flowlab, which
    runs on one machine and opens no port for it."""
    _settings["ctrl_port"] = _port("flow.env.ctrl_port", val)


def data_port(val):
    """The port of OneFlow's data transfers between machines. Checked and kept; changes nothing (see
    ``ctrl_port``)."""
    _settings["data_port"] = _port("flow.env.data_port", val)


def log_dir(val):
    """Where OneFlow writes its log files. flowlab creates the directory and adds a handler writing the
    ``flowlab`` logger's lines, INFO and above (the backend notice among them), to ``<val>/flowlab.log`` (replacing
    the file of an earlier ``log_dir``); warnings still reach stderr too."""
    global _log_handler
    if not isinstance(val, str) or not val:
        raise TypeError(f"flow.env.log_dir: expected a directory path (non-empty str), got {val!r}")
    os.makedirs(val, exist_ok=True)
    logger = logging.getLogger("flowlab")
    if _log_handler is not None:
        logger.removeHandler(_log_handler)
        _log_handler.close()
    _log_handler = logging.FileHandler(os.path.join(val, LOG_FILE))
    _log_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    _log_handler.setLevel(logging.INFO)
    logger.addHandler(_log_handler)
    if logger.getEffectiveLevel() > logging.INFO:      # a log file is asked for: it gets the INFO lines
        logger.setLevel(logging.INFO)
    _settings["log_dir"] = val


def logtostderr(val):
    """OneFlow's glog switch (an int). Checked and kept; changes nothing: flowlab's warnings go to stderr and its
    INFO lines only where the application's logging (or ``log_dir``) sends them (``logging.getLogger("flowlab")``)."""
    if isinstance(val, bool) or not isinstance(val, int):
        raise TypeError(f"flow.env.logtostderr: expected an int, got {val!r}")
    _settings["logtostderr"] = val


def logbuflevel(val):
    """OneFlow's glog buffering level (an int). Checked and kept; changes nothing: flowlab's log handlers write
    each line at once."""
    if isinstance(val, bool) or not isinstance(val, int):
        raise TypeError(f"flow.env.logbuflevel: expected an int, got {val!r}")
    _settings["logbuflevel"] = val


def grpc_use_no_signal(val=True):
    """Deprecated in OneFlow 0.3.4 itself, where it does nothing either."""
    return None


__all__ = ["init", "machine", "ctrl_port", "data_port", "log_dir", "logtostderr", "logbuflevel", "grpc_use_no_signal",
           "settings"]
