"""``flow.config`` (process settings) and ``flow.function_config()`` (per job settings)."""
from __future__ import annotations

from . import optim
from .dtypes import as_dtype, float32
from .runtime import session

# How many machines, and devices on each, flowlab can run a job on: flow.config's device settings and
# flow.unittest's skip_unless_<n>n<d>d() both ask devices_supported. Devices on one machine are replicas of the job
# (runtime/devices.py): threads on the CPU, one GPU each with CuPy.
MAX_MACHINE_NUM = 1
"""Machines flowlab runs on: one (OneFlow's multi-machine settings above it are refused)."""
MAX_DEVICE_NUM = 8
"""Devices of one machine a job may run on (``gpu_device_num`` / ``cpu_device_num``)."""


def devices_supported(machine_num, device_num):
    """Whether flowlab can run on ``machine_num`` machines with ``device_num`` devices each."""
    return 1 <= machine_num <= MAX_MACHINE_NUM and 1 <= device_num <= MAX_DEVICE_NUM


def gpu_device_num(n):
    """Run jobs on ``n`` devices of this machine: ``n`` GPUs with CuPy, or, without a GPU, ``n`` NumPy devices
    (threads). A setting of the session, as in OneFlow; with ``cpu_device_num`` the last call counts, since
    flowlab's backend (not the call) decides whether the devices are GPUs.

    Differs from OneFlow: one machine only, up to 8 devices. Under the consistent view a tensor inside the job has
    its per-device shape (a batch of 100 on 2 devices reads ``(50, ...)``); a batch size written into
    ``flow.reshape`` is read as the logical one and becomes each device's share. Data readers in the job read one
    batch a call and hand each device its rows (OneFlow gives each device its own part files).
    """
    _check_count("gpu_device_num", n, MAX_DEVICE_NUM, "device(s) per machine")
    session.default().device_num = n


def cpu_device_num(n):
    """See ``gpu_device_num``."""
    _check_count("cpu_device_num", n, MAX_DEVICE_NUM, "device(s) per machine")
    session.default().device_num = n


def device_num():
    """How many devices jobs run on (``gpu_device_num`` / ``cpu_device_num``; 1 by default)."""
    return session.default().device_num


def machine_num(n):
    """OneFlow's number of machines; flowlab runs on one, so only 1 is accepted (more is an error saying so)."""
    _check_count("machine_num", n, MAX_MACHINE_NUM, "machine(s)")


def _check_count(argument, n, most, what):
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"flow.config.{argument}: expected a positive int, got {n!r}")
    if n > most:
        raise ValueError(f"flow.config.{argument}({n}): flowlab runs on at most {most} {what}; use {most}")


def enable_legacy_model_io(val=True):
    """Choose ``flow.train.CheckPoint`` (True, flowlab's default, as OneFlow up to 0.2) or OneFlow's model I/O v2
    (False): ``flow.checkpoint.save`` / ``flow.load_variables(flow.checkpoint.get(path))``, where constructing a
    ``CheckPoint`` warns that it is deprecated and ``CheckPoint().init()`` does nothing (variables initialise
    themselves). Both APIs read and write the same checkpoint directories, and the v2 functions work either way.
    A setting of the session, as in OneFlow: ``flow.clear_default_session()`` resets it.
    """
    if not isinstance(val, bool):
        raise TypeError(f"flow.config.enable_legacy_model_io: val must be True or False, got {val!r}")
    session.default().legacy_model_io = val


def legacy_model_io_enabled():
    """Whether ``flow.train.CheckPoint`` is the model I/O in use (see ``enable_legacy_model_io``)."""
    return session.default().legacy_model_io


def enable_model_io_v2(val):
    """OneFlow's switch between two implementations of the legacy save/load jobs (``MakeModelIoV2Jobs``). flowlab
    has one implementation, whose files both APIs read, so the value is checked and kept, and changes nothing."""
    if not isinstance(val, bool):
        raise TypeError(f"flow.config.enable_model_io_v2: val must be True or False, got {val!r}")
    session.default().model_io_v2 = val


def model_io_v2_enabled():
    """Whether ``enable_model_io_v2(True)`` was set (OneFlow's model I/O v2, ``flow.checkpoint``)."""
    return session.default().model_io_v2


def seed(value):
    """Seed variable initialisation and dropout; call before jobs are first run."""
    session.set_seed(value)


# ------------------------------------------------------------------------------ session settings that change nothing
# OneFlow 0.3.4's other flow.config setters (config_util.py). Each value is checked as OneFlow checks it and kept in
# the session (``settings()``; ``flow.clear_default_session()`` forgets them, as OneFlow's session config). None of
# them changes what flowlab computes; the reason is given per setting.

_NO_NETWORK = "flowlab runs on one machine: there is no network layer between machines to tune"
_NO_RUNTIME = "flowlab runs a job as one generated function (compiler/plan.py), without OneFlow's actor runtime"

_SESSION_SETTINGS = {
    # name: (kind, value when called without one (None: required), why it changes nothing)
    "comm_net_worker_num": ("count", None, _NO_NETWORK),
    "rdma_mem_block_mbyte": ("count", None, _NO_NETWORK),
    "rdma_recv_msg_buf_mbyte": ("count", None, _NO_NETWORK),
    "use_rdma": ("bool", True, _NO_NETWORK),
    "max_mdsave_worker_num": ("count", None, "checkpoints are written by flowlab's own writer (train/checkpoint.py)"),
    "persistence_buf_byte": ("count", None, "checkpoints are written by flowlab's own writer (train/checkpoint.py)"),
    "save_downloaded_file_to_local_fs": ("bool", True, "flowlab reads checkpoints and datasets from local paths"),
    "enable_numa_aware_cuda_malloc_host": ("bool", True, "flowlab allocates through NumPy or CuPy's memory pool"),
    "reserved_host_mem_mbyte": ("count", None, "flowlab allocates through NumPy or CuPy's memory pool"),
    "reserved_device_mem_mbyte": ("count", None, "flowlab allocates through NumPy or CuPy's memory pool"),
    "compute_thread_pool_size": ("count", None, _NO_RUNTIME),
    "thread_enable_local_message_queue": ("bool", None, _NO_RUNTIME),
    "collect_act_event": ("bool", True, _NO_RUNTIME + " (no actor events to profile)"),
    "enable_debug_mode": ("bool", None, "OneFlow's debug mode dumps its compiled job protos; flowlab's compiled "
                                        "plan is printable instead (print(job.plan())), and "
                                        "FunctionConfig.detect_anomaly checks every op"),
    "enable_tensor_float_32_compute": ("bool", True, "flowlab leaves CuPy's matmul precision as CuPy sets it "
                                                     "(full float32 unless CUPY_TF32=1)"),
}

_NCCL = ("flowlab's replicas all-reduce each run of model gradients in one call (runtime/devices.py); these tune "
         "OneFlow's fusion of NCCL collectives")

_COLLECTIVE_BOXING_SETTINGS = {
    "enable_fusion": ("bool", True, _NCCL),
    "num_callback_threads": ("count", None, _NCCL),
    "nccl_num_streams": ("count", None, _NCCL),
    "nccl_fusion_threshold_mb": ("count", None, _NCCL),
    "nccl_fusion_all_reduce_use_buffer": ("bool", None, _NCCL),
    "nccl_fusion_all_reduce": ("bool", None, _NCCL),
    "nccl_fusion_reduce_scatter": ("bool", None, _NCCL),
    "nccl_fusion_all_gather": ("bool", None, _NCCL),
    "nccl_fusion_reduce": ("bool", None, _NCCL),
    "nccl_fusion_broadcast": ("bool", None, _NCCL),
    "nccl_fusion_max_ops": ("count", None, _NCCL),
    "nccl_enable_all_to_all": ("bool", None, _NCCL),
    "nccl_enable_mixed_fusion": ("bool", None, _NCCL),
}


def _checked(api, kind, value):
    """``value`` if it is of ``kind`` ("bool", "count": an int >= 0, "number", "str"); a TypeError/ValueError naming
    ``api`` otherwise."""
    if kind == "bool":
        if not isinstance(value, bool):
            raise TypeError(f"{api}: expected True or False, got {value!r}")
    elif kind == "count":
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{api}: expected an int, got {value!r}")
        if value < 0:
            raise ValueError(f"{api}: expected an int >= 0, got {value!r}")
    elif kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{api}: expected a number, got {value!r}")
    elif kind == "str":
        if not isinstance(value, str):
            raise TypeError(f"{api}: expected a string, got {value!r}")
    return value


# How a setter's docstring names what it takes, by kind (see _checked).
_KIND_WORDS = {"bool": "True or False", "count": "an int >= 0", "number": "a number", "str": "a string"}


def _session_setter(api, key, kind, default, why):
    def setter(val=default):
        if val is None:
            raise TypeError(f"{api}: a value is required")
        session.default().config[key] = _checked(api, kind, val)
    setter.__name__ = api.rsplit(".", 1)[-1]
    bare = "" if default is None else f", {default!r} when called without one"
    setter.__doc__ = (f"OneFlow's ``{api}`` ({_KIND_WORDS[kind]}{bare}). Checked and kept (``flow.config.settings()``); changes "
                      f"nothing in flowlab: {why}.")
    return setter


for _name, (_kind, _default, _why) in _SESSION_SETTINGS.items():
    globals()[_name] = _session_setter(f"flow.config.{_name}", _name, _kind, _default, _why)


class _CollectiveBoxing:
    """``flow.config.collective_boxing``: OneFlow's NCCL collective settings (checked and kept; see each)."""


for _name, (_kind, _default, _why) in _COLLECTIVE_BOXING_SETTINGS.items():
    setattr(_CollectiveBoxing, _name, staticmethod(_session_setter(
        f"flow.config.collective_boxing.{_name}", f"collective_boxing.{_name}", _kind, _default, _why)))

collective_boxing = _CollectiveBoxing()
"""``flow.config.collective_boxing.*``: OneFlow's NCCL collective settings, checked and kept (there is no
NCCL fusion to tune here)."""


def settings() -> dict:
    """The values given to the settings above in this session, by name (``collective_boxing.<name>`` for those)."""
    return dict(session.default().config)


def load_library(val):
    """OneFlow loads a shared library of custom ops; flowlab's ops are Python classes (``flowlab.ops``)."""
    _checked("flow.config.load_library", "str", val)
    raise NotImplementedError(f"flow.config.load_library({val!r}): flowlab cannot load OneFlow custom-op libraries; "
                              "declare an op as a Python class instead (see flowlab/ops/__init__.py)")


load_library_now = load_library


class _TrainConfig:
    """``config.train``: OneFlow's oldest training settings, used by ``flow.losses.add_loss``."""

    def __init__(self, config):
        self._config = config
        self.lr = None
        self.model_update = None
        self.loss_scale = None

    def primary_lr(self, lr):
        if not isinstance(lr, (int, float)) or lr <= 0:
            raise ValueError(f"train.primary_lr: expected a positive number, got {lr!r}")
        self.lr = float(lr)

    def secondary_lr(self, lr):
        """Checked and kept; changes nothing: OneFlow 0.3.4's update passes read only ``primary_lr`` (and so does
        ``add_loss`` here)."""
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or lr < 0:
            raise ValueError(f"train.secondary_lr: expected a number >= 0, got {lr!r}")
        self._config.settings["train.secondary_lr"] = float(lr)

    def loss_scale_factor(self, factor):
        """A static loss scale for the ``add_loss`` optimizer (``flow.optimizer.loss_scale.static_loss_scale``)."""
        self.loss_scale = optim.loss_scale.static_loss_scale(factor).loss_scale_factor

    def model_update_conf(self, conf):
        known = {"naive_conf", "momentum_conf", "adam_conf"}
        if not isinstance(conf, dict) or len(conf) != 1 or next(iter(conf)) not in known:
            raise ValueError(f"train.model_update_conf: expected one of {sorted(known)} as the only key, got {conf!r}")
        self.model_update = conf

    def optimizer_placement_optimization_mode(self, mode):
        self._config.optimizer_placement_optimization_mode(mode)

    def optimizer_placement_optimization_threshold(self, value):
        self._config.optimizer_placement_optimization_threshold(value)

    @property
    def configured(self):
        return self.lr is not None or self.model_update is not None

    def make_optimizer(self):
        """The optimizer that ``flow.losses.add_loss`` trains with (OneFlow's oldest training style)."""
        if self.lr is None:
            raise ValueError("flow.losses.add_loss needs config.train.primary_lr(lr) in the job's function_config")
        kind, conf = next(iter((self.model_update or {"naive_conf": {}}).items()))
        schedule = optim.PiecewiseConstantScheduler([], [self.lr])
        if kind == "naive_conf":
            return optim.SGD(schedule, momentum=0.0, loss_scale_factor=self.loss_scale)
        if kind == "momentum_conf":
            return optim.SGD(schedule, momentum=conf.get("beta", 0.9), loss_scale_factor=self.loss_scale)
        return optim.Adam(schedule, beta1=conf.get("beta1", 0.9), beta2=conf.get("beta2", 0.999),
                          epsilon=conf.get("epsilon", 1e-8), do_bias_correction=conf.get("do_bias_correction", False),
                          loss_scale_factor=self.loss_scale)


class _Namespace:
    """A group of FunctionConfig settings under one name (``config.qat.symmetric(True)``)."""

    def __init__(self, config):
        self._config = config


class _Qat(_Namespace):
    """``config.qat``: settings of quantization-aware training, which flowlab does not do
    (``enable_quantization_aware_training(True)`` raises); with it off they change nothing."""


class _TensorRT(_Namespace):
    """``config.tensorrt``: TensorRT's precision. flowlab runs its own float32 kernels, so reduced-precision
    TensorRT (``use_fp16`` / ``use_int8`` True) is refused rather than silently run in float32."""

    def use_fp16(self, value=True):
        self._config._reduced_precision_engine("tensorrt.use_fp16", value)

    def use_int8(self, value=True):
        self._config._reduced_precision_engine("tensorrt.use_int8", value)

    def int8_calibration(self, value):
        _checked("tensorrt.int8_calibration", "str", value)
        raise NotImplementedError("tensorrt.int8_calibration: flowlab does not run int8 TensorRT engines (OneFlow "
                                  "requires tensorrt.use_int8(True) first, which flowlab refuses)")


MEMORY_POLICIES = ("use_mem_size_first_algo", "use_mutual_exclusion_first_algo", "use_time_line_algo")
"""The memory allocation policies ``FunctionConfig`` accepts, as OneFlow names them."""


class _MemoryPolicies(_Namespace):
    """``config.static_mem_alloc_policy_white_list``: which of OneFlow's static memory planners may run. Kept and
    reported by ``has``; changes nothing: flowlab plans buffers with its own liveness pass (compiler/buffers.py)."""

    def _policies(self):
        return self._config.settings.setdefault("static_mem_alloc_policy_white_list",
                                                {"use_mem_size_first_algo", "use_mutual_exclusion_first_algo"})

    def _check(self, policy):
        if policy not in MEMORY_POLICIES:
            raise ValueError(f"static_mem_alloc_policy_white_list: expected one of {list(MEMORY_POLICIES)}, "
                             f"got {policy!r}")
        return policy

    def has(self, policy):
        return self._check(policy) in self._policies()

    def add(self, policy):
        self._policies().add(self._check(policy))

    def remove(self, policy):
        self._policies().discard(self._check(policy))

    def policy_mem_size_first(self):
        return "use_mem_size_first_algo"

    def policy_mutual_exclusion_first(self):
        return "use_mutual_exclusion_first_algo"

    def policy_time_line(self):
        return "use_time_line_algo"


class _MemoryAlgorithms(_Namespace):
    def show(self):
        """The planner policies OneFlow knows."""
        return list(MEMORY_POLICIES)


class FunctionConfig:
    """Settings of one job function: default dtype, the old-style training config, anomaly detection, the logical
    view, and OneFlow 0.3.4's other job settings (``function_util.py``).

    Those other settings are checked (type and range, as OneFlow's job config proto takes them) and kept in
    ``settings`` (name -> value). Most tune how OneFlow compiles and runs a job (cuDNN algorithms, fusion passes,
    memory reuse, XLA, NCCL) and change nothing in flowlab, whose compiler already does the equivalent or has no
    such mechanism: each setter's docstring says which and why. Three change results in OneFlow and are refused
    rather than silently ignored: ``enable_quantization_aware_training(True)``, reduced-precision
    ``tensorrt.use_fp16/use_int8(True)`` and ``default_initializer_conf``. ``indexed_slices_optimizer_conf`` makes
    the updates of the embedding tables it names sparse. ``enable_auto_mixed_precision`` runs matrix products and convolutions in float16
    on CuPy, with float32 master weights; on NumPy the job computes in float32 (see it).
    """

    def __init__(self):
        self.default_dtype = float32
        self.settings = {}
        self.train = _TrainConfig(self)
        self.qat = _Qat(self)
        self.tensorrt = _TensorRT(self)
        self.static_mem_alloc_policy_white_list = _MemoryPolicies(self)
        self.static_mem_alloc_algo_white_list = _MemoryAlgorithms(self)
        self.logical_view = "consistent"
        self.anomaly_detection = False

    def default_data_type(self, dtype):
        """The dtype of the job's variables created without one (``flow.get_variable(dtype=None)``), as in OneFlow.
        Placeholders keep their own dtype (``tp.Numpy.Placeholder(shape, dtype=flow.float32)``, as OneFlow's) and
        layers make their weights in their input's dtype."""
        self.default_dtype = as_dtype(dtype, "default_data_type")

    def detect_anomaly(self, enabled=True):
        """Check every op's output and gradient for NaN/Inf and raise ``AnomalyError`` naming the first op that made
        one (its logical blob name, its inputs' statistics and your source line). Slower: for debugging."""
        if not isinstance(enabled, bool):
            raise TypeError(f"detect_anomaly: expected True or False, got {enabled!r}")
        self.anomaly_detection = enabled

    def default_logical_view(self, view):
        """``flow.scope.consistent_view()`` (the default: arguments and results are whole batches, split over the
        devices and joined back) or ``flow.scope.mirrored_view()`` (``tp.ListNumpy``: one piece a device). On one
        device both are the same. See ``runtime/devices.py``."""
        if view not in ("consistent", "mirrored"):
            raise ValueError(f"default_logical_view: expected flow.scope.consistent_view() or mirrored_view(), "
                             f"got {view!r}")
        self.logical_view = view

    default_distribute_strategy = default_logical_view     # OneFlow 0.2's name

    def enable_auto_mixed_precision(self, value=True):
        """OneFlow rewrites the job so that matmuls, convolutions and their neighbours compute in float16 while the
        variables stay float32 master weights (updated from gradients cast back to float32); programs pair it with
        ``loss_scale_policy=flow.optimizer.loss_scale.dynamic_loss_scale()``.

        flowlab keeps the flag (``settings``) and its compiler does the rewrite (``compiler.amp``, the pass
        ``auto_mixed_precision`` in ``print(plan)``): on CuPy every matrix product, batched product, convolution and
        convolution gradient (OneFlow 0.3.4's white list; ops declaring ``amp = "float16"``) reads float16 casts of
        its float32 inputs, computes in float16 with float32 accumulation (cuBLAS ``cublasGemmEx``) and is cast
        back to float32. Everything else stays float32: variables (the master weights) and their updates, losses,
        softmax, reductions, batch normalization, and every tensor the job names, so ``watch``, ``watch_diff`` and
        ``watch_health`` see float32 values. Unlike OneFlow, bias adds, activations and pooling between two
        products are not moved to float16 (each product casts its own inputs). Gradients that overflow float16 are
        Inf in float32: a dynamic loss scale skips that step and lowers the scale, as in OneFlow.

        On NumPy the job computes in float32: NumPy has no fast float16 arithmetic, so the rewrite would only be
        slower. ``FLOWLAB_AMP_NUMPY=1`` (or ``flowlab.compiler.amp.ON_NUMPY = True`` before the job compiles)
        turns it on there too, to check a program's float16 numerics on the CPU."""
        self._set("enable_auto_mixed_precision", "bool", value)

    def enable_quantization_aware_training(self, value=True):
        """Refused when True: OneFlow inserts fake-quantization ops that change every result, and flowlab has none.
        False is checked and kept."""
        self._set("enable_quantization_aware_training", "bool", value)
        if value:
            raise NotImplementedError("enable_quantization_aware_training(True): flowlab does not simulate "
                                      "quantization (OneFlow's fake-quant ops); leave it off")

    enable_qat = enable_quantization_aware_training

    def use_tensorrt(self, value=True):
        """Checked and kept; changes nothing: float32 TensorRT computes what flowlab's own kernels compute, and
        flowlab compiles every job itself (compiler/plan.py). Reduced precision: see ``tensorrt``."""
        self._set("use_tensorrt", "bool", value)

    def _reduced_precision_engine(self, name, value):
        self._set(name, "bool", value)
        if value:
            self._set("use_tensorrt", "bool", True)         # as OneFlow's setter does
            raise NotImplementedError(f"{name}(True): flowlab runs float32 kernels and does not emulate TensorRT's "
                                      "reduced precision; leave it off")

    def optimizer_placement_optimization_mode(self, mode):
        """``"non_distributed"`` or ``"distributed_split"``: where OneFlow keeps optimizer state across devices.
        Checked and kept; changes nothing: flowlab's replicas keep one copy of every variable and its state,
        updated by device 0 (runtime/devices.py)."""
        if mode not in ("non_distributed", "distributed_split"):
            raise ValueError(f"optimizer_placement_optimization_mode: expected 'non_distributed' or "
                             f"'distributed_split', got {mode!r}")
        self.settings["optimizer_placement_optimization_mode"] = mode

    def enable_non_distributed_optimizer(self, value=True):
        """``optimizer_placement_optimization_mode("non_distributed")`` when True (OneFlow's shorthand)."""
        if _checked("enable_non_distributed_optimizer", "bool", value):
            self.optimizer_placement_optimization_mode("non_distributed")

    def indexed_slices_optimizer_conf(self, value):
        """Sparse updates of embedding tables: ``{"include_op_names": {"op_name": [variable names]}}`` (and
        ``"enable"``, default True), as OneFlow's ``IndexedSlicesOptimizerConf``. A listed variable whose gradient
        comes from ``flow.gather`` (axis 0) is updated on the gathered rows only, at a cost that grows with the
        batch, not the table: repeated ids are summed first, then SGD (with or without momentum) or Adam (LazyAdam,
        AdamW, SGDW) runs on those rows alone, so rows no id touched keep their value and optimizer state exactly
        (LazyAdam's semantics: their moments do not decay, they do not move by old momentum). As in OneFlow's
        IndexedSlicesOptimizerRewritePass the update stays dense, with a warning naming the variable and why, when
        the variable is also used other than through gathers, has a regularizer, or the optimizer clips gradients,
        scales the loss or is not one of those (``flowlab.optim.optimizers``)."""
        if not isinstance(value, dict):
            raise TypeError(f"indexed_slices_optimizer_conf: expected a dict such as "
                            f"{{'include_op_names': {{'op_name': [...]}}}}, got {value!r}")
        unknown = sorted(set(value) - {"enable", "include_op_names"})
        names = value.get("include_op_names")
        names = names.get("op_name") if isinstance(names, dict) and set(names) <= {"op_name"} else None
        names = [names] if isinstance(names, str) else names
        enable = value.get("enable", True)
        if unknown or not isinstance(names, (list, tuple)) or not all(isinstance(n, str) and n for n in names) \
                or not isinstance(enable, bool):
            raise ValueError(f"indexed_slices_optimizer_conf: expected {{'include_op_names': {{'op_name': [variable "
                             f"names]}}}} and optionally 'enable': True/False, got {value!r}")
        self.settings["indexed_slices_optimizer_conf"] = {"enable": enable,
                                                          "include_op_names": {"op_name": list(names)}}

    def indexed_slices_variables(self):
        """The variable names whose updates ``indexed_slices_optimizer_conf`` asks to be sparse (empty when off)."""
        conf = self.settings.get("indexed_slices_optimizer_conf")
        return frozenset(conf["include_op_names"]["op_name"]) if conf and conf["enable"] else frozenset()

    def default_initializer_conf(self, value):
        """Refused: OneFlow's job-wide default initializer (an ``InitializerConf`` dict). Give
        ``flow.get_variable(initializer=...)`` / the layers' ``kernel_initializer`` instead."""
        if not isinstance(value, dict):
            raise TypeError(f"default_initializer_conf: expected a dict, got {value!r}")
        raise NotImplementedError("default_initializer_conf: flowlab has no job-wide default initializer; pass "
                                  "initializer= to flow.get_variable (or kernel_initializer= to the layers)")

    def exp_run_conf(self, value):
        """OneFlow's experiment-run settings (a dict). Checked and kept; changes nothing: flowlab runs a job as one
        generated function (compiler/plan.py), without OneFlow's actor runtime."""
        if not isinstance(value, dict):
            raise TypeError(f"exp_run_conf: expected a dict, got {value!r}")
        self.settings["exp_run_conf"] = dict(value)

    def default_placement_scope(self, value):
        """The placement of ops outside any ``flow.scope.placement`` (a ``flow.scope.placement(...)``). Checked and
        kept; changes nothing: flowlab runs every op on its backend's device (``flow.config.gpu_device_num``)."""
        from .scope import placement
        if not isinstance(value, type(placement("cpu", "0:0"))):
            raise TypeError(f"default_placement_scope: expected flow.scope.placement(device_tag, "
                            f"machine_device_ids), got {value!r}")
        self.settings["default_placement_scope"] = value

    def _set(self, name, kind, value):
        if value is None:
            raise TypeError(f"FunctionConfig.{name}: a value is required")
        self.settings[name] = _checked(f"FunctionConfig.{name}", kind, value)


_NO_CUDNN = ("flowlab's convolutions are its own NumPy/CuPy kernels (ops/conv.py), without cuDNN algorithms to "
             "choose or workspace to limit")
_FLOAT32 = ("flowlab's convolutions and products compute in float32, or where enable_auto_mixed_precision puts "
            "them in float16 with float32 accumulation (see it)")
_DEPRECATED = "deprecated in OneFlow 0.3.4 itself, where it has no effect either"

# name: (kind, value when called without one (None: required), why it changes nothing in flowlab)
_JOB_SETTINGS = {
    "enable_cudnn": ("bool", True, _NO_CUDNN),
    "cudnn_buf_limit_mbyte": ("count", None, _NO_CUDNN),
    "cudnn_conv_force_fwd_algo": ("count", None, _NO_CUDNN),
    "cudnn_conv_force_bwd_data_algo": ("count", None, _NO_CUDNN),
    "cudnn_conv_force_bwd_filter_algo": ("count", None, _NO_CUDNN),
    "cudnn_conv_heuristic_search_algo": ("bool", None, _NO_CUDNN),
    "cudnn_conv_use_deterministic_algo_only": ("bool", None, _NO_CUDNN + "; they are deterministic already"),
    "enable_cudnn_fused_normalization_add_relu": ("bool", None, "a fused cuDNN kernel for batch normalization + "
                                                                "add + relu with the same results as the three ops"),
    "cudnn_conv_enable_pseudo_half": ("bool", None, _FLOAT32),
    "enable_cudnn_conv_pseudo_half": ("bool", None, _FLOAT32),
    "cudnn_conv_enable_true_half": ("bool", True, _FLOAT32),
    "enable_true_half_config_when_conv": ("bool", True, _FLOAT32),
    "enable_float_compute_for_half_gemm": ("bool", True, _FLOAT32),
    "enable_fuse_add_to_output": ("bool", None, "OneFlow fuses an add into the op producing one of its operands, "
                                                "a rewrite with identical results; flowlab's compiler fuses "
                                                "elementwise chains itself on CuPy (compiler/fuse.py)"),
    "enable_fuse_cast_scale": ("bool", True, "OneFlow fuses the cast and scaling of float16 gradients; flowlab "
                                             "folds gradient scaling into its update kernels"),
    "enable_fuse_model_update_ops": ("bool", True, "OneFlow fuses cast, loss-scale and 1/n scaling, regularization "
                                                   "and the update into one op; flowlab's update kernels always do "
                                                   "all of it in one op (optim/optimizers.py), with sign(0) = 0 "
                                                   "for l1 as OneFlow's fused and GPU kernels"),
    "enable_gradients_stats_aggregation": ("bool", True, "flowlab takes a minimize's global gradient norm and its "
                                                         "NaN/Inf count in one op each already"),
    "enable_reused_mem": ("bool", True, "flowlab's compiler always plans reusable buffers (compiler/buffers.py)"),
    "enable_inplace": ("bool", True, "flowlab's compiler always lets elementwise ops and updates write over an "
                                     "input that dies there (compiler/buffers.py)"),
    "enable_inplace_in_reduce_struct": ("bool", True, _DEPRECATED),
    "use_memory_allocation_algorithm_v2": ("bool", None, "flowlab plans buffers with its own liveness pass "
                                                         "(compiler/buffers.py)"),
    "do_parallel_cast_before_widening_type_cast": ("bool", True, "flowlab has no parallel-cast ops between devices"),
    "prune_parallel_cast_ops": ("bool", True, "flowlab has no parallel-cast ops to prune"),
    "prune_cast_to_static_shape_ops": ("bool", True, "flowlab has no cast-to-static-shape ops to prune"),
    "optimizer_placement_optimization_threshold": ("count", None, "see optimizer_placement_optimization_mode"),
    "enable_keep_header_only": ("bool", True, "flowlab's shape-only ops (reshape and the like) are views already "
                                              "(ops/array.py)"),
    "concurrency_width": ("count", None, _NO_RUNTIME),
    "use_xla_jit": ("bool", True, "flowlab compiles every job into one generated function (compiler/plan.py) and, "
                                  "on CuPy, replays it as a CUDA graph; XLA would compute the same values"),
    "allow_cpu_return_op": ("bool", None, "flowlab returns host arrays from every job"),
    "enable_nccl": ("bool", True, _DEPRECATED),
    "use_nccl_inter_node_communication": ("bool", True, _DEPRECATED),
    "use_boxing_v2": ("bool", True, _DEPRECATED),
    "enable_all_reduce_group": ("bool", True, _DEPRECATED),
    "all_reduce_group_num": ("count", None, _DEPRECATED),
    "all_reduce_lazy_ratio": ("number", None, _DEPRECATED),
    "all_reduce_group_min_mbyte": ("count", None, _DEPRECATED),
    "all_reduce_group_size_warmup": ("number", None, _DEPRECATED),
    "all_reduce_fp16": ("bool", True, _DEPRECATED),
    "disable_all_reduce_sequence": ("bool", True, _DEPRECATED),
    "non_distributed_optimizer_group_size_mbyte": ("count", None, _DEPRECATED),
}

_QAT_SETTINGS = {
    "per_channel_weight_quantization": ("bool", True),
    "symmetric": ("bool", True),
    "moving_min_max_momentum": ("number", None),
    "moving_min_max_stop_update_after_iters": ("count", None),
}


def _job_setter(name, kind, default, why, key=None):
    key = key or name

    def setter(self, value=default):
        target = self if isinstance(self, FunctionConfig) else self._config
        target._set(key, kind, value)
    setter.__name__ = name
    bare = "" if default is None else f", {default!r} when called without one"
    setter.__doc__ = (f"OneFlow's ``{key}`` ({_KIND_WORDS[kind]}{bare}). Checked and kept in ``settings``; changes nothing in "
                      f"flowlab: {why}.")
    return setter


for _name, (_kind, _default, _why) in _JOB_SETTINGS.items():
    setattr(FunctionConfig, _name, _job_setter(_name, _kind, _default, _why))
for _name, (_kind, _default) in _QAT_SETTINGS.items():
    setattr(_Qat, _name, _job_setter(_name, _kind, _default, "quantization-aware training is off in flowlab",
                                     key=f"qat.{_name}"))


def function_config():
    """A new ``FunctionConfig``: the settings of one job, passed as ``global_function(function_config=...)``."""
    return FunctionConfig()


__all__ = [
    "gpu_device_num", "cpu_device_num", "device_num", "machine_num", "devices_supported", "enable_legacy_model_io",
    "legacy_model_io_enabled", "enable_model_io_v2", "model_io_v2_enabled", "seed", "comm_net_worker_num",
    "rdma_mem_block_mbyte", "rdma_recv_msg_buf_mbyte", "use_rdma", "max_mdsave_worker_num", "persistence_buf_byte",
    "save_downloaded_file_to_local_fs", "enable_numa_aware_cuda_malloc_host", "reserved_host_mem_mbyte",
    "reserved_device_mem_mbyte", "compute_thread_pool_size", "thread_enable_local_message_queue", "collect_act_event",
    "enable_debug_mode", "enable_tensor_float_32_compute", "collective_boxing", "settings", "load_library",
    "load_library_now", "FunctionConfig", "function_config", "MAX_MACHINE_NUM", "MAX_DEVICE_NUM", "MEMORY_POLICIES",
]
