"""flow.unittest: a test file written as OneFlow's own op tests are runs under pytest (and unittest) unchanged;
tests for more nodes or devices than flowlab runs on are skipped with the reason."""
import os
import re
import subprocess
import sys
import textwrap
import unittest

import pytest

import flowlab as flow

ONEFLOW_STYLE_TESTS = textwrap.dedent('''
    import unittest

    import numpy as np
    import flowlab as flow
    import flowlab.typing as tp


    @flow.unittest.skip_unless_1n1d()
    class TestRelu(flow.unittest.TestCase):
        def test_relu(test_case):
            @flow.global_function(type="predict")
            def relu_job(x: tp.Numpy.Placeholder((5,))) -> tp.Numpy:
                return flow.nn.relu(x)

            x = np.array([-1, 0, 2, -3, 4], np.float32)
            test_case.assertTrue(np.array_equal(relu_job(x), np.maximum(x, 0)))
            test_case.assertEqual(flow.unittest.env.node_size(), 1)
            test_case.assertFalse(flow.unittest.env.eager_execution_enabled())

        # Both declare the variable "v" with other shapes: only a fresh session per test lets both pass.
        def test_variable_3(test_case):
            test_case.assertEqual(_declare_v(3).shape, (3,))

        def test_variable_5(test_case):
            test_case.assertEqual(_declare_v(5).shape, (5,))


    def _declare_v(n):
        @flow.global_function()
        def job() -> tp.Numpy:
            return flow.get_variable("v", shape=(n,), dtype=flow.float, initializer=flow.zeros_initializer())
        return job()


    @flow.unittest.skip_unless_1n2d()
    class TestTwoDevices(flow.unittest.TestCase):
        def test_split(test_case):
            flow.config.gpu_device_num(2)


    class TestMixed(flow.unittest.TestCase):
        @flow.unittest.skip_unless_2n1d()
        def test_two_nodes(test_case):
            raise AssertionError("must not run")

        @flow.unittest.skip_unless_1n4d()
        @unittest.skipIf(flow.unittest.env.eager_execution_enabled(), "lazy only")
        def test_four_devices(test_case):
            raise AssertionError("must not run")


    if __name__ == "__main__":
        unittest.main()
''')


def run_pytest(tmp_path, extra_env=None):
    test_file = tmp_path / "test_oneflow_style.py"
    test_file.write_text(ONEFLOW_STYLE_TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEFLOW_TEST_")}
    env.update(extra_env or {})
    done = subprocess.run([sys.executable, "-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider", str(test_file)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


def outcomes(output):
    return dict(re.findall(r"::(\w+::\w+) (PASSED|SKIPPED|FAILED|ERROR)", output))


def test_oneflow_style_test_file_runs_1n1d_and_skips_multi_device_with_reasons(tmp_path):
    code, output = run_pytest(tmp_path)
    assert code == 0, output
    assert outcomes(output) == {
        "TestRelu::test_relu": "PASSED", "TestRelu::test_variable_3": "PASSED", "TestRelu::test_variable_5": "PASSED",
        "TestTwoDevices::test_split": "SKIPPED", "TestMixed::test_two_nodes": "SKIPPED",
        "TestMixed::test_four_devices": "SKIPPED"}, output
    assert "only runs when node_size is 1 and device_num is 2; this run has node_size 1 and device_num 1" in output
    assert "needs 2 node(s) with 1 device(s) each" in output
    assert "only runs when node_size is 1 and device_num is 4" in output


def test_a_run_configured_for_two_devices_skips_the_1n1d_tests_as_oneflow_did(tmp_path):
    code, output = run_pytest(tmp_path, {"ONEFLOW_TEST_DEVICE_NUM": "2"})
    assert code == 0, output
    assert outcomes(output)["TestRelu::test_relu"] == "SKIPPED"
    assert "only runs when node_size is 1 and device_num is 1; this run has node_size 1 and device_num 2" in output
    assert outcomes(output)["TestTwoDevices::test_split"] == "PASSED"      # flowlab runs two devices


def test_eager_runs_are_skipped_with_the_reason(tmp_path):
    code, output = run_pytest(tmp_path, {"ONEFLOW_TEST_ENABLE_EAGER": "1"})
    assert code == 0, output
    assert outcomes(output)["TestRelu::test_relu"] == "SKIPPED"
    assert "flowlab runs jobs lazily only" in output


def test_the_file_runs_under_plain_unittest_too(tmp_path):
    test_file = tmp_path / "test_oneflow_style.py"
    test_file.write_text(ONEFLOW_STYLE_TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONEFLOW_TEST_")}
    done = subprocess.run([sys.executable, str(test_file)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Ran 6 tests" in done.stderr and "OK (skipped=3)" in done.stderr


def test_env_reads_oneflows_variables(monkeypatch):
    for name in ("ONEFLOW_TEST_NODE_LIST", "ONEFLOW_TEST_DEVICE_NUM", "ONEFLOW_TEST_GPU_DEVICE_NUM"):
        monkeypatch.delenv(name, raising=False)
    env = flow.unittest.env
    assert (env.node_size(), env.device_num(), env.gpu_device_num(), env.has_node_list()) == (1, 1, 1, False)
    with pytest.raises(RuntimeError, match="ONEFLOW_TEST_NODE_LIST is not set"):
        env.node_list()
    monkeypatch.setenv("ONEFLOW_TEST_NODE_LIST", "10.0.0.1,10.0.0.2")
    monkeypatch.setenv("ONEFLOW_TEST_DEVICE_NUM", "4")
    assert (env.node_list(), env.node_size(), env.device_num(), env.gpu_device_num()) == \
        (["10.0.0.1", "10.0.0.2"], 2, 4, 4)
    monkeypatch.setenv("ONEFLOW_TEST_DEVICE_NUM", "four")
    with pytest.raises(ValueError, match="ONEFLOW_TEST_DEVICE_NUM='four' must be a positive int"):
        env.device_num()


def test_the_device_limit_is_one_rule_shared_with_flow_config(monkeypatch):
    monkeypatch.setenv("ONEFLOW_TEST_DEVICE_NUM", "2")
    monkeypatch.delenv("ONEFLOW_TEST_NODE_LIST", raising=False)
    monkeypatch.setattr(flow.config, "MAX_DEVICE_NUM", 1)
    with pytest.raises(ValueError, match=r"gpu_device_num\(2\): flowlab runs on at most 1 device"):
        flow.config.gpu_device_num(2)
    assert "flowlab runs on at most 1" in flow.unittest.skip_reason(1, 2)

    monkeypatch.setattr(flow.config, "MAX_DEVICE_NUM", 2)
    flow.config.gpu_device_num(2)
    flow.config.cpu_device_num(2)
    assert flow.unittest.skip_reason(1, 2) is None
    assert "only runs when node_size is 1 and device_num is 1" in flow.unittest.skip_reason(1, 1)

    def test():
        return "ran"
    assert flow.unittest.skip_unless_1n2d()(test) is test
    skipped = flow.unittest.skip_unless_1n1d()(test)
    with pytest.raises(unittest.SkipTest):
        skipped()
