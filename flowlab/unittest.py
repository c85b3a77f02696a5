"""``flow.unittest``: the harness OneFlow's own op tests are written against, so they run under pytest unchanged.

    @flow.unittest.skip_unless_1n1d()
    class TestRelu(flow.unittest.TestCase):
        def test_relu(test_case): ...

As in OneFlow, the environment says which configuration this test run is: ``ONEFLOW_TEST_NODE_LIST`` (comma
separated hosts; one node when unset) and ``ONEFLOW_TEST_DEVICE_NUM`` (devices per node; 1 when unset). A test
marked ``skip_unless_<n>n<d>d()`` runs only in a run of that configuration, and only if flowlab can run on it
(``flow.config.devices_supported``: one machine, up to ``config.MAX_DEVICE_NUM`` logical devices); otherwise it is
skipped with the reason.
"""
from __future__ import annotations

import os
import types
import unittest

from . import config
from .runtime import session


def eager_execution_enabled():
    """Whether this run asks for eager execution (``ONEFLOW_TEST_ENABLE_EAGER=1``); flowlab's jobs are lazy."""
    return os.getenv("ONEFLOW_TEST_ENABLE_EAGER") == "1"


def typing_check_enabled():
    return os.getenv("ONEFLOW_TEST_ENABLE_TYPING_CHECK") == "1"


def has_node_list():
    return bool(os.getenv("ONEFLOW_TEST_NODE_LIST"))


def node_list():
    """The hosts of this run, from ``ONEFLOW_TEST_NODE_LIST``."""
    nodes = os.getenv("ONEFLOW_TEST_NODE_LIST")
    if not nodes:
        raise RuntimeError("flow.unittest.env.node_list: the environment variable ONEFLOW_TEST_NODE_LIST is not set")
    return nodes.split(",")


def node_size():
    return len(node_list()) if has_node_list() else 1


def _count_from_env(variable):
    text = os.getenv(variable)
    if not text:
        return None
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"flow.unittest.env: the environment variable {variable}={text!r} must be a positive int")
    return count


def device_num():
    """Devices per node in this run, from ``ONEFLOW_TEST_DEVICE_NUM`` (1 when unset)."""
    return _count_from_env("ONEFLOW_TEST_DEVICE_NUM") or 1


def gpu_device_num():
    """OneFlow 0.2's name: ``ONEFLOW_TEST_GPU_DEVICE_NUM``, else ``device_num()``."""
    return _count_from_env("ONEFLOW_TEST_GPU_DEVICE_NUM") or device_num()


env = types.SimpleNamespace(
    eager_execution_enabled=eager_execution_enabled, typing_check_enabled=typing_check_enabled,
    has_node_list=has_node_list, node_list=node_list, node_size=node_size, device_num=device_num,
    gpu_device_num=gpu_device_num)
"""``flow.unittest.env``: OneFlow's test-environment queries (``device_num()``, ``node_size()``, ...)."""


def skip_reason(n, d):
    """Why a test for ``n`` nodes with ``d`` devices each cannot run in this run, or None when it can."""
    if not config.devices_supported(n, d):
        return (f"needs {n} node(s) with {d} device(s) each; flowlab runs on at most {config.MAX_MACHINE_NUM} "
                f"node(s) with {config.MAX_DEVICE_NUM} device(s) each")
    if node_size() != n or device_num() != d:
        return (f"only runs when node_size is {n} and device_num is {d}; this run has node_size {node_size()} "
                f"and device_num {device_num()} (ONEFLOW_TEST_NODE_LIST, ONEFLOW_TEST_DEVICE_NUM)")
    return None


def skip_unless(n, d):
    """A decorator for a test function or class: unchanged when it can run here (``skip_reason``), else skipped."""
    reason = skip_reason(n, d)
    return (lambda test: test) if reason is None else unittest.skip(reason)


def skip_unless_1n1d():
    """``skip_unless(1, 1)``: run the test where 1 machine of 1 device each can run it, else skip it."""
    return skip_unless(1, 1)


def skip_unless_1n2d():
    """``skip_unless(1, 2)``: run the test where 1 machine of 2 devices each can run it, else skip it."""
    return skip_unless(1, 2)


def skip_unless_1n3d():
    """``skip_unless(1, 3)``: run the test where 1 machine of 3 devices each can run it, else skip it."""
    return skip_unless(1, 3)


def skip_unless_1n4d():
    """``skip_unless(1, 4)``: run the test where 1 machine of 4 devices each can run it, else skip it."""
    return skip_unless(1, 4)


def skip_unless_2n1d():
    """``skip_unless(2, 1)``: run the test where 2 machines of 1 device each can run it, else skip it."""
    return skip_unless(2, 1)


def skip_unless_2n2d():
    """``skip_unless(2, 2)``: run the test where 2 machines of 2 devices each can run it, else skip it."""
    return skip_unless(2, 2)


def skip_unless_2n4d():
    """``skip_unless(2, 4)``: run the test where 2 machines of 4 devices each can run it, else skip it."""
    return skip_unless(2, 4)


def num_nodes_required(num_nodes):
    """OneFlow 0.2's marker of how many nodes a test function needs (read by its old test runner)."""
    def mark(test):
        test.__oneflow_test_case_num_nodes_required__ = num_nodes
        return test
    return mark


class TestCase(unittest.TestCase):
    """Each test starts from a fresh default session (``flow.clear_default_session()``), as in OneFlow."""

    def setUp(self):
        if eager_execution_enabled():
            self.skipTest("ONEFLOW_TEST_ENABLE_EAGER=1 asks for eager execution; flowlab runs jobs lazily only")
        session.clear()


class TestCase_1n1d(TestCase):  # noqa: N801 - OneFlow 0.2's name
    """OneFlow 0.2's base class for tests that run only on one node with one device."""

    def setUp(self):
        reason = skip_reason(1, 1)
        if reason is not None:
            self.skipTest(reason)
        super().setUp()


__all__ = ["TestCase", "TestCase_1n1d", "env", "num_nodes_required", "skip_unless", "skip_unless_1n1d",
           "skip_unless_1n2d", "skip_unless_1n3d", "skip_unless_1n4d", "skip_unless_2n1d", "skip_unless_2n2d",
           "skip_unless_2n4d"]
