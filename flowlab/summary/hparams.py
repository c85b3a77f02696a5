"""OneFlow's hparams helpers: ``HParam(name, domain)``, the domains ``RealRange``, ``IntegerRange``, ``ValueSet``,
``Metric(name, dtype)``, and ``hparams(dict)`` -> a ``Summary`` for TensorBoard's hparams dashboard.

``hparams({HParam("lr", RealRange(1e-2, 1e-1)): 0.02, Metric("loss", float): 0.02, "dropout": 0.6})`` gives one
``Summary`` holding, in TensorBoard's encoding (``encode.hparams_*``):

* ``_hparams_/experiment``: every hparam's name, type and domain (an interval, or the discrete values of a
  ``ValueSet``) and the metric tags; a plain ``str`` key is an hparam without a domain,
* ``_hparams_/session_start_info``: the values,
* one scalar per ``Metric``, tagged with its name (TensorBoard's hparams table shows a metric's latest scalar).

Values are checked against their keys: a wrong type, or a value outside a ``ValueSet``, raises. A value outside a
range is accepted with a warning (once per hparam and value): OneFlow accepted it, its own example passes one, and
a search beyond the planned range is still a trial worth recording.
"""
from __future__ import annotations

import numbers
import warnings

import numpy as np

from . import encode, proto

_warned = set()


def _real(value):
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _integer(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


class RealRange:
    """The interval ``[min_value, max_value]`` of real numbers."""
    type_name = "float"

    def __init__(self, min_value, max_value):
        if not (_real(min_value) and _real(max_value)) or not min_value <= max_value:
            raise ValueError(f"{type(self).__name__}: expected two numbers min_value <= max_value, "
                             f"got {min_value!r}, {max_value!r}")
        self.min_value, self.max_value = min_value, max_value

    def check(self, name, value):
        if not _real(value):
            raise TypeError(f"hparam {name!r} has domain {self!r}: its value must be a number, "
                            f"got {type(value).__name__} {value!r}")
        return float(value)

    def contains(self, value):
        return self.min_value <= value <= self.max_value

    def fill(self, info):
        info.domain_interval.min_value = float(self.min_value)
        info.domain_interval.max_value = float(self.max_value)

    def __repr__(self):
        return f"{type(self).__name__}({self.min_value!r}, {self.max_value!r})"


class IntegerRange(RealRange):
    """The integers from ``min_value`` to ``max_value`` (both included)."""
    type_name = "int"

    def __init__(self, min_value, max_value):
        if not (_integer(min_value) and _integer(max_value)):
            raise ValueError(f"IntegerRange: expected two ints, got {min_value!r}, {max_value!r}")
        super().__init__(int(min_value), int(max_value))

    def check(self, name, value):
        if not (_integer(value) or (_real(value) and float(value).is_integer())):
            raise TypeError(f"hparam {name!r} has domain {self!r}: its value must be an int, "
                            f"got {type(value).__name__} {value!r}")
        return int(value)


class ValueSet:
    """A list of allowed values, all of one type: str, bool or numbers."""

    def __init__(self, values):
        values = list(values) if isinstance(values, (list, tuple, set, frozenset)) else None
        if not values:
            raise ValueError("ValueSet: expected a non-empty list of values")
        kinds = {self._kind(v) for v in values}
        if None in kinds or len(kinds) != 1:
            raise TypeError(f"ValueSet: values must be all str, all bool or all numbers, got {values!r}")
        self.values, self.type_name = values, kinds.pop()

    @staticmethod
    def _kind(value):
        if isinstance(value, (bool, np.bool_)):
            return "bool"
        if _real(value):
            return "float"
        return "str" if isinstance(value, str) else None

    def check(self, name, value):
        if self._kind(value) != self.type_name:
            raise TypeError(f"hparam {name!r} has domain {self!r}: its value must be a {self.type_name}, "
                            f"got {type(value).__name__} {value!r}")
        if value not in self.values:
            raise ValueError(f"hparam {name!r}: {value!r} is not one of {self.values!r}")
        return bool(value) if self.type_name == "bool" else float(value) if self.type_name == "float" else value

    def contains(self, value):
        return value in self.values

    def fill(self, info):
        for value in self.values:
            info.domain_discrete.values.add().CopyFrom(encode.hparam_value(info.name, value)[0])

    def __repr__(self):
        return f"ValueSet({self.values!r})"


def _label(text, name):
    """An optional display name or description: None or text protobuf can hold (checked here, not when written)."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str or None, got {type(text).__name__} {text!r}")
    return encode.check_text(text, name)


class HParam:
    """A named hyperparameter with an optional domain (``RealRange``, ``IntegerRange`` or ``ValueSet``)."""

    def __init__(self, name, domain=None, display_name=None, description=None):
        encode.check_tag(name, "HParam name")
        if domain is not None and not isinstance(domain, (RealRange, ValueSet)):
            raise TypeError(f"HParam {name!r}: domain must be RealRange, IntegerRange or ValueSet, got {domain!r}")
        self.name, self.domain = name, domain
        self.display_name, self.description = _label(display_name, "display_name"), _label(description, "description")

    def __repr__(self):
        return f"HParam({self.name!r}, {self.domain!r})"


class Metric:
    """A metric shown beside the hparams: its value is written as a scalar tagged ``name``."""

    def __init__(self, name, dtype=float, display_name=None, description=None):
        encode.check_tag(name, "Metric name")
        if dtype not in (float, int):
            raise TypeError(f"Metric {name!r}: dtype must be float or int, got {dtype!r}")
        self.name, self.dtype = name, dtype
        self.display_name, self.description = _label(display_name, "display_name"), _label(description, "description")

    def __repr__(self):
        return f"Metric({self.name!r}, {self.dtype.__name__})"


def _check_value(hparam, value):
    """``value`` checked against the hparam's domain and made a plain bool, float or str."""
    if hparam.domain is None:
        _, kind = encode.hparam_value(hparam.name, value)      # raises unless bool, number or str
        return kind(value)
    value = hparam.domain.check(hparam.name, value)
    if not hparam.domain.contains(value) and (hparam.name, value) not in _warned:
        _warned.add((hparam.name, value))
        warnings.warn(f"hparam {hparam.name!r} = {value!r} lies outside its domain {hparam.domain!r}; it is "
                      f"recorded as it is (TensorBoard's default filter may hide this trial)", stacklevel=3)
    return value


def hparams(hparams_dict) -> proto.Summary:
    """A ``Summary`` of hparams and metric values (see the module docstring); ``str()`` of it is text format."""
    if not isinstance(hparams_dict, dict) or not hparams_dict:
        raise TypeError(f"hparams: expected a non-empty dict of HParam/Metric/str keys to values, "
                        f"got {hparams_dict!r}")
    values, metrics, infos = {}, {}, {}
    for key, value in hparams_dict.items():
        if isinstance(key, Metric):
            if not _real(value) or (key.dtype is int and not float(value).is_integer()):
                raise TypeError(f"metric {key.name!r} must have {'an int' if key.dtype is int else 'a number'} as "
                                f"its value, got {type(value).__name__} {value!r}")
            metrics[key.name] = (key, float(value))
            continue
        hparam = HParam(key) if isinstance(key, str) else key
        if not isinstance(hparam, HParam):
            raise TypeError(f"hparams: keys must be flow.summary.HParam, flow.summary.Metric or str, got {key!r}")
        if hparam.name in values:
            raise ValueError(f"hparams: hparam {hparam.name!r} appears twice")
        values[hparam.name] = _check_value(hparam, value)
        infos[hparam.name] = hparam
    if set(values) & set(metrics):
        raise ValueError(f"hparams: {sorted(set(values) & set(metrics))} are both hparams and metrics")

    # No creation time (0 is not serialised): it shows nowhere, and its 8 bytes cost up to 36 characters of text
    # format, where OneFlow's example feeds the whole Summary through a 1500-byte placeholder.
    experiment = encode.hparams_experiment(values, list(metrics), time_created_secs=0)
    content = proto.HParamsPluginData.FromString(experiment.metadata.plugin_data.content)
    for info in content.experiment.hparam_infos:         # add what encode's torch-style dict cannot say
        hparam = infos[info.name]
        if hparam.domain is not None:
            hparam.domain.fill(info)
        if hparam.display_name:
            info.display_name = hparam.display_name
        if hparam.description:
            info.description = hparam.description
    for info in content.experiment.metric_infos:
        metric = metrics[info.name.tag][0]
        info.display_name = metric.display_name or ""
        info.description = metric.description or ""
    experiment.metadata.plugin_data.content = content.SerializeToString()

    summary = proto.Summary()
    summary.value.extend([experiment, encode.hparams_session_start(values)])
    summary.value.extend(encode.scalar(name, value) for name, (_, value) in metrics.items())
    return summary
