"""The configuration surface OneFlow-Benchmark's CNN programs use (job_function_util.py, of_cnn_train_val.py,
util.py): FunctionConfig's OneFlow 0.3.4 settings, flow.config's session settings, flow.env, jobs that return a dict
of blobs to ``async_get`` callbacks, and snapshots saved into directories the program made.
"""
import logging
import os

import numpy as np
import pytest

import flowlab as flow
from flowlab import config as config_module
from flowlab import env as env_module
from flowlab.errors import CheckpointError
from flowlab.runtime import session

BATCH, FEATURES, CLASSES = 6, 5, 4


@pytest.fixture(autouse=True)
def fresh_env():
    """flow.env settings belong to the process: each test starts and ends with the default ones."""
    saved = dict(env_module._settings)
    yield
    env_module._settings.clear()
    env_module._settings.update(saved)
    if env_module._log_handler is not None:
        logging.getLogger("flowlab").removeHandler(env_module._log_handler)
        env_module._log_handler.close()
        env_module._log_handler = None


class Args:
    """The arguments job_function_util.py reads."""
    use_fp16 = True
    use_xla = True
    num_nodes = 1


def benchmark_train_config(args):
    """job_function_util.get_train_config, call for call."""
    config = flow.function_config()
    config.default_logical_view(flow.scope.consistent_view())
    config.default_data_type(flow.float)
    if args.use_fp16:
        config.enable_auto_mixed_precision(True)
    if args.use_xla:
        config.use_xla_jit(True)
    config.enable_fuse_add_to_output(True)
    config.cudnn_conv_heuristic_search_algo(False)
    config.prune_parallel_cast_ops(True)
    config.enable_inplace(True)
    if args.num_nodes > 1:
        config.cudnn_conv_heuristic_search_algo(True)
    else:
        config.cudnn_conv_heuristic_search_algo(False)
    config.enable_fuse_model_update_ops(True)
    return config


def data():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((BATCH, FEATURES)).astype(np.float32)
    labels = (np.arange(BATCH) % CLASSES).astype(np.int32)
    return x, labels


def make_train_net(config, optimizer):
    """A TrainNet in the shape of of_cnn_train_val.py's: no arguments (its data come from inside the job), a dict
    of unannotated tensors returned, an optimizer set up as optimizer_util.py does."""
    x, labels = data()

    @flow.global_function("train", config)
    def TrainNet():  # noqa: N802 - the benchmark's name
        images = flow.constant(x)
        label_blob = flow.constant(labels, dtype=flow.int32)
        logits = flow.layers.dense(images, CLASSES, kernel_initializer=flow.random_normal_initializer(stddev=0.3),
                                   kernel_regularizer=flow.regularizers.l2(1.0 / 32768), name="fc")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(label_blob, logits, name="softmax_loss")
        loss = flow.math.reduce_mean(loss)
        predictions = flow.nn.softmax(logits)
        optimizer().minimize(loss)
        return {"loss": loss, "predictions": predictions, "labels": label_blob}

    return TrainNet


def benchmark_sgd(policy=None):
    warmup = flow.optimizer.warmup.linear(2, 0)
    schedule = flow.optimizer.CosineScheduler(base_lr=0.5, steps=8, warmup=warmup)
    return flow.optimizer.SGD(schedule, momentum=None, grad_clipping=None, loss_scale_policy=policy)


@pytest.mark.numpy_backend      # on CuPy enable_auto_mixed_precision computes in float16 (tests/test_amp.py)
def test_a_benchmark_train_config_trains_exactly_as_the_default_one():
    """Every setting job_function_util.py makes (AMP and XLA included) is accepted and kept, and the job trains
    to the very same values as with a default config: on NumPy, where the AMP rewrite is off unless asked for
    (tests/test_amp.py), none of them changes flowlab's arithmetic."""
    config = benchmark_train_config(Args())
    assert config.settings == {"enable_auto_mixed_precision": True, "use_xla_jit": True,
                               "enable_fuse_add_to_output": True, "cudnn_conv_heuristic_search_algo": False,
                               "prune_parallel_cast_ops": True, "enable_inplace": True,
                               "enable_fuse_model_update_ops": True}
    results = []
    for cfg in (config, flow.function_config()):
        flow.clear_default_session()
        net = make_train_net(cfg, lambda: benchmark_sgd(flow.optimizer.loss_scale.dynamic_loss_scale(
            increment_period=2000)))
        losses = [float(net().get()["loss"].numpy()) for _ in range(6)]
        results.append((losses, session.default().variables["fc-weight"].numpy()))
    (amp_losses, amp_weight), (plain_losses, plain_weight) = results
    assert amp_losses == plain_losses and amp_losses[-1] < amp_losses[0]
    np.testing.assert_array_equal(amp_weight, plain_weight)
    assert amp_weight.dtype == np.float32          # AMP keeps float32 master weights (documented)


def top_k_matches(predictions, labels, k):
    """util.match_top_k's arithmetic, on a blob's ``.numpy()`` and a blob used as an array (``labels.reshape``)."""
    best = np.argpartition(predictions.numpy(), -k)[:, -k:]
    return int(np.logical_or.reduce(best == labels.reshape((-1, 1)), axis=1).sum())


def test_async_get_hands_a_dict_of_blobs_to_the_metric_callback():
    net = make_train_net(flow.function_config(), benchmark_sgd)
    seen = []

    def metric_cb(epoch, step):
        def callback(outputs):
            seen.append((epoch, step, float(outputs["loss"].mean()), outputs["labels"].shape[0],
                         top_k_matches(outputs["predictions"], outputs["labels"], 1),
                         top_k_matches(outputs["predictions"], outputs["labels"], CLASSES)))
        return callback

    for i in range(3):
        assert net().async_get(metric_cb(0, i)) is None
    assert [s[:2] for s in seen] == [(0, 0), (0, 1), (0, 2)]
    assert all(s[3] == BATCH and s[5] == BATCH and 0 <= s[4] <= BATCH for s in seen)   # top-CLASSES matches all
    assert seen[2][2] < seen[0][2]                                                        # it trains
    blob = net().get()["predictions"]
    np.testing.assert_allclose(blob.numpy().sum(axis=1), 1.0, rtol=1e-5)
    with pytest.raises(TypeError, match="async_get: callback must be callable, got 3"):
        net().async_get(3)


def test_snapshots_save_into_directories_the_program_made(tmp_path):
    """util.Snapshot: CheckPoint().init() before any call, save into os.makedirs'd empty directories, load in a
    new session; the dynamic loss scale's state is saved with the model."""
    net = make_train_net(flow.function_config(),
                         lambda: benchmark_sgd(flow.optimizer.loss_scale.dynamic_loss_scale(initial_loss_scale=64)))
    check_point = flow.train.CheckPoint()
    check_point.init()
    initial = tmp_path / "snapshot_initial_model"
    os.makedirs(initial)
    check_point.save(str(initial))
    for _ in range(3):
        net().get()
    epoch = tmp_path / "snapshot_epoch_0"
    os.makedirs(epoch)
    check_point.save(str(epoch))
    trained = {k: v.numpy() for k, v in session.default().variables.items()}
    assert trained["System-Train-DynamicLossScale-TrainNet-GoodStepCounter"][0] == 3

    flow.clear_default_session()
    net = make_train_net(flow.function_config(),
                         lambda: benchmark_sgd(flow.optimizer.loss_scale.dynamic_loss_scale(initial_loss_scale=64)))
    flow.train.CheckPoint().load(str(epoch))
    net.compiled()
    for name, value in trained.items():
        np.testing.assert_array_equal(session.default().variables[name].numpy(), value, err_msg=name)
    with pytest.raises(CheckpointError, match="the directory is not empty"):
        flow.train.CheckPoint().save(str(epoch))


# --------------------------------------------------------------------------------------------- FunctionConfig

SETTINGS = config_module._JOB_SETTINGS


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_every_job_setting_is_checked_and_kept(name):
    kind, default, _ = SETTINGS[name]
    good, bad = {"bool": (False, 1), "count": (3, "3"), "number": (0.5, "0.5")}[kind]
    config = flow.function_config()
    getattr(config, name)(good)
    assert config.settings[name] == good
    if default is not None:
        getattr(config, name)()
        assert config.settings[name] == default
    with pytest.raises(TypeError, match=f"FunctionConfig.{name}: expected "):
        getattr(config, name)(bad)
    assert type(config.settings[name]) is type(good)       # the bad value was not kept
    assert "changes nothing in flowlab" in getattr(flow.FunctionConfig, name).__doc__
    if kind == "count":
        with pytest.raises(ValueError, match=f"FunctionConfig.{name}: expected an int >= 0, got -1"):
            getattr(config, name)(-1)


def test_settings_that_would_change_results_are_refused():
    config = flow.function_config()
    with pytest.raises(TypeError, match="indexed_slices_optimizer_conf: expected a dict"):
        config.indexed_slices_optimizer_conf(["embedding"])
    config.enable_quantization_aware_training(False)
    config.enable_qat(False)
    with pytest.raises(NotImplementedError, match=r"enable_quantization_aware_training\(True\): flowlab does not "
                                                  r"simulate quantization"):
        config.enable_qat()
    config.qat.symmetric(False)
    config.qat.moving_min_max_momentum(0.9)
    assert (config.settings["qat.symmetric"], config.settings["qat.moving_min_max_momentum"]) == (False, 0.9)
    config.use_tensorrt(True)
    config.tensorrt.use_fp16(False)
    with pytest.raises(NotImplementedError, match=r"tensorrt\.use_int8\(True\): flowlab runs float32 kernels"):
        config.tensorrt.use_int8()
    with pytest.raises(NotImplementedError, match="default_initializer_conf: flowlab has no job-wide default"):
        config.default_initializer_conf({"constant_conf": {"value": 0.0}})
    with pytest.raises(TypeError, match=r"FunctionConfig.enable_auto_mixed_precision: expected True or False, "
                                        r"got 'yes'"):
        config.enable_auto_mixed_precision("yes")
    assert "float32" in flow.FunctionConfig.enable_auto_mixed_precision.__doc__


def test_namespaced_and_choice_settings():
    config = flow.function_config()
    policies = config.static_mem_alloc_policy_white_list
    time_line = policies.policy_time_line()
    assert not policies.has(time_line) and policies.has(policies.policy_mem_size_first())
    policies.add(time_line)
    policies.remove(policies.policy_mutual_exclusion_first())
    assert policies.has(time_line) and not policies.has("use_mutual_exclusion_first_algo")
    assert config.static_mem_alloc_algo_white_list.show() == list(config_module.MEMORY_POLICIES)
    with pytest.raises(ValueError, match="static_mem_alloc_policy_white_list: expected one of"):
        policies.add("fastest")
    config.train.optimizer_placement_optimization_mode("distributed_split")
    config.enable_non_distributed_optimizer(True)
    assert config.settings["optimizer_placement_optimization_mode"] == "non_distributed"
    with pytest.raises(ValueError, match="expected 'non_distributed' or 'distributed_split', got 'split'"):
        config.optimizer_placement_optimization_mode("split")
    config.default_placement_scope(flow.scope.placement("gpu", "0:0"))
    with pytest.raises(TypeError, match="default_placement_scope: expected flow.scope.placement"):
        config.default_placement_scope("gpu")
    config.exp_run_conf({"enable_experiment_run": False})
    config.train.secondary_lr(0.01)
    assert config.settings["train.secondary_lr"] == 0.01


def test_train_loss_scale_factor_scales_the_add_loss_optimizer():
    seen = {}
    for factor in (None, 512.0):
        flow.clear_default_session()
        config = flow.function_config()
        config.train.primary_lr(0.1)
        config.train.model_update_conf({"momentum_conf": {"beta": 0.5}})
        if factor:
            config.train.loss_scale_factor(factor)

        @flow.global_function(config)
        def job(x=flow.FixedTensorDef((3,))):
            w = flow.get_variable("w", shape=(3,), initializer=flow.constant_initializer(1.0))
            y = w * x
            flow.watch_diff(y, lambda g, factor=factor: seen.setdefault(factor, g.copy()))
            flow.losses.add_loss(flow.math.square(y))
            return y

        for _ in range(2):
            job(np.array([1.0, -2.0, 3.0], np.float32)).get()
        seen[(factor, "w")] = session.default().variables["w"].numpy()
    np.testing.assert_allclose(seen[(512.0, "w")], seen[(None, "w")], rtol=1e-6)
    np.testing.assert_allclose(seen[512.0], 512 * seen[None], rtol=1e-6)     # the seed is the scale


# ------------------------------------------------------------------------------------------------ flow.config

@pytest.mark.parametrize("name", sorted(config_module._COLLECTIVE_BOXING_SETTINGS))
def test_collective_boxing_settings_are_checked_and_kept(name):
    kind, default, _ = config_module._COLLECTIVE_BOXING_SETTINGS[name]
    setter = getattr(flow.config.collective_boxing, name)
    good, bad = (False, "no") if kind == "bool" else (16, 1.5)
    setter(good)
    assert flow.config.settings()[f"collective_boxing.{name}"] == good
    with pytest.raises(TypeError, match=f"flow.config.collective_boxing.{name}: expected"):
        setter(bad)
    if default is None:
        with pytest.raises(TypeError, match="a value is required"):
            setter()
    flow.clear_default_session()                 # a session setting, as in OneFlow
    assert f"collective_boxing.{name}" not in flow.config.settings()


def test_session_settings_and_load_library():
    flow.config.enable_debug_mode(True)
    flow.config.reserved_device_mem_mbyte(512)
    flow.config.use_rdma()
    assert flow.config.settings() == {"enable_debug_mode": True, "reserved_device_mem_mbyte": 512, "use_rdma": True}
    with pytest.raises(TypeError, match=r"flow.config.enable_debug_mode: expected True or False, got 1"):
        flow.config.enable_debug_mode(1)
    with pytest.raises(ValueError, match=r"flow.config.compute_thread_pool_size: expected an int >= 0, got -4"):
        flow.config.compute_thread_pool_size(-4)
    with pytest.raises(NotImplementedError, match="cannot load OneFlow custom-op libraries"):
        flow.config.load_library("libcustom_op.so")
    assert "changes nothing in flowlab" in flow.config.collective_boxing.nccl_fusion_max_ops.__doc__


# --------------------------------------------------------------------------------------------------- flow.env

def test_env_accepts_one_machine_and_refuses_several():
    assert flow.env.init() is True
    flow.env.machine([{"addr": "192.168.1.1"}])
    flow.env.machine("192.168.1.2")
    flow.env.machine({"addr": "192.168.1.3", "ctrl_port_agent": 50051})
    assert flow.env.settings()["machine"] == [{"addr": "192.168.1.3", "ctrl_port_agent": 50051}]
    nodes = [{"addr": "192.168.1.1"}, {"addr": "192.168.1.2"}]
    with pytest.raises(ValueError, match=r"flow.env.machine: got 2 machines \(192.168.1.1, 192.168.1.2\); flowlab "
                                         r"runs on 1 machine with up to 8 logical devices\. .*"
                                         r"flow.config.gpu_device_num\(n\)"):
        flow.env.machine(nodes)
    assert flow.env.settings()["machine"] == [{"addr": "192.168.1.3", "ctrl_port_agent": 50051}]
    with pytest.raises(ValueError, match="machine addresses must differ"):
        flow.env.machine("10.0.0.1", "10.0.0.1")
    with pytest.raises(TypeError, match=r"each machine must be an address string or a dict with an 'addr' string"):
        flow.env.machine([{"host": "10.0.0.1"}])
    flow.env.ctrl_port(9788)
    flow.env.data_port(9789)
    assert (flow.env.settings()["ctrl_port"], flow.env.settings()["data_port"]) == (9788, 9789)
    with pytest.raises(ValueError, match=r"flow.env.ctrl_port: expected a port number in 1\.\.65535, got 70000"):
        flow.env.ctrl_port(70000)
    with pytest.raises(TypeError, match=r"flow.env.ctrl_port: expected a port number \(int\), got '9788'"):
        flow.env.ctrl_port("9788")
    with pytest.raises(TypeError, match=r"flow.env.logtostderr: expected an int"):
        flow.env.logtostderr(True)


def test_env_log_dir_writes_flowlabs_log_lines_there(tmp_path):
    first, second = tmp_path / "log", tmp_path / "output" / "log"
    flow.env.log_dir(str(first))
    logging.getLogger("flowlab").info("first line")
    flow.env.log_dir(str(second))                    # moves the file handler
    logging.getLogger("flowlab").info("second line")
    assert "first line" in (first / env_module.LOG_FILE).read_text()
    assert "second line" not in (first / env_module.LOG_FILE).read_text()
    assert "second line" in (second / env_module.LOG_FILE).read_text()
    with pytest.raises(TypeError, match="flow.env.log_dir: expected a directory path"):
        flow.env.log_dir("")
