"""``@flow.global_function``: a Python function traced once (per input signature) into a graph, compiled, run often.

Arguments are declared by annotation (``x: tp.Numpy.Placeholder((8, 10))``) or, in the older style, by default
values (``x=flow.FixedTensorDef((8, 10))``). The return annotation says what a call gives back (``flowlab.typing``);
an unannotated job returns a handle whose ``.get()`` is a ``Blob``.

With ``flow.config.gpu_device_num(n)``, n > 1, a call runs one replica plan a device (``runtime.devices``: it splits
the feeds and joins the results); with one device the call path is the one-plan path, untouched.
"""
from __future__ import annotations

import functools
import inspect
import threading

import numpy as np

from . import graph as g
from . import typing as tp
from . import watching
from .blob import return_converter
from .compiler import compile_graph
from .config import FunctionConfig
from .delivery import Deliveries, resolve
from .errors import FeedError, TraceError
from .ops import apply
from .ops import operators  # noqa: F401 - gives lazy tensors their Python operators (x + y) before any trace
from .ops.array import Input
from .ops.placement import box_partials
from .runtime import backend, devices, dispatch, session


class JobResult:
    """What an unannotated job returns: ``.get()`` waits for the call's watch callbacks and gives the result (a Blob,
    or a tuple/dict of them)."""

    def __init__(self, value, ticket):
        self._value = value
        self._ticket = ticket

    def get(self):
        dispatch.default().wait(self._ticket)
        dispatch.default().raise_pending()
        return self._value

    def async_get(self, callback):
        if not callable(callback):
            raise TypeError(f"async_get: callback must be callable, got {callback!r}")
        callback(self.get())


def _flatten(value, where="the job's return value"):
    """Tensors of a returned structure, in order, and a function that rebuilds the structure from values."""
    if value is None:
        return [], lambda vals: None
    if isinstance(value, g.LazyTensor):
        return [value], lambda vals: vals[0]
    if isinstance(value, (tuple, list)):
        parts = [_flatten(v, where) for v in value]
        counts = [len(p[0]) for p in parts]

        def rebuild(vals, parts=parts, counts=counts, kind=type(value)):
            out, start = [], 0
            for (_, build), n in zip(parts, counts):
                out.append(build(vals[start:start + n]))
                start += n
            return kind(out)
        return [t for p in parts for t in p[0]], rebuild
    if isinstance(value, dict):
        keys = list(value)
        tensors, rebuild_list = _flatten([value[k] for k in keys], where)
        return tensors, lambda vals: dict(zip(keys, rebuild_list(vals)))
    raise TypeError(f"{where} must be a tensor, a tuple/list/dict of tensors or None, got {type(value).__name__}")


def _signature(fn):
    """The job's signature with string annotations (``from __future__ import annotations``) evaluated."""
    try:
        return inspect.signature(fn, eval_str=True)
    except NameError as e:
        raise TypeError(f"job function {fn.__qualname__}: its annotations are strings (from __future__ import "
                        f"annotations) and cannot be evaluated: {e}. Python evaluates them in the module's globals, "
                        "so a placeholder shape there cannot use the enclosing function's local variables; drop the "
                        "__future__ import or use module-level names") from None


class _Compiled:
    """One traced and compiled signature of a job, with its watch deliveries (``flowlab.delivery``)."""

    def __init__(self, graph, plan, rebuild, deliveries, quiet_plan=None):
        self.graph = graph
        self.plan = plan
        self.rebuild = rebuild
        self.deliveries = deliveries
        self.quiet_plan = quiet_plan    # the plan without watch deliveries, for calls on which none is due
        self.variables_ready = False    # once its variables have values they keep them: check on the first call only

    def plan_for(self, step):
        """The plan call ``step`` runs: the quiet plan when there is one and no delivery is due."""
        if self.quiet_plan is None or self.plan.due(step):
            return self.plan
        return self.quiet_plan


class _DeviceCompiled(_Compiled):
    """One signature on several devices: a replica plan a device (``self.plan`` is device 0's, for ``job.plan()``),
    each output's pieces joined into ``DeviceValues`` (``runtime.devices``), each delivery's by ``deliveries``."""

    def __init__(self, graph, replicas, rebuild, deliveries, view, kinds):
        super().__init__(graph, replicas.plans[0], rebuild, deliveries)
        self.replicas = replicas
        self.view = view
        self.output_kinds = [kinds.get(t.id) for t in graph.outputs]

    def run(self, per_device_feeds, step):
        emitters, pieces = self.deliveries.replica_emitters(len(per_device_feeds))
        try:
            results = self.replicas.run(per_device_feeds, step, emitters)
        finally:
            self.deliveries.join_replicas(pieces, step)
        return [devices.join(list(p), kind, self.view) for p, kind in zip(zip(*results), self.output_kinds)]


class JobFunction:
    """A callable job. ``job.graph()`` and ``job.plan()`` show the IR and the generated code of its last trace."""

    def __init__(self, fn, is_train, config: FunctionConfig):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.name = fn.__name__
        self.is_train = is_train
        self.config = config
        self.arg_names, self.arg_defs = self._arg_defs(fn)
        self.return_kind, self._convert = return_converter(_signature(fn).return_annotation,
                                                           f"job function {fn.__qualname__}")
        self._compiled: dict[tuple, _Compiled] = {}
        self.step = 0                   # calls so far, over every signature: the train step of LR schedules, watches
        self._first_id = None
        self._last = None
        self._lock = threading.Lock()
        session.default().jobs.append(self)

    @staticmethod
    def _arg_defs(fn):
        names, defs = [], []
        for p in _signature(fn).parameters.values():
            d = p.annotation if isinstance(p.annotation, tp.ArgDef) else p.default
            if not isinstance(d, tp.ArgDef):
                raise TypeError(f"job function {fn.__name__}: argument {p.name!r} needs a placeholder, e.g. "
                                f"`{p.name}: tp.Numpy.Placeholder((8, 10))` or `{p.name}=flow.FixedTensorDef((8, 10))`")
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise TypeError(f"job function {fn.__name__}: *args and **kwargs are not supported")
            names.append(p.name)
            defs.append(d)
        return names, defs

    # ------------------------------------------------------------------------------------------------------ feeding
    def _check_feeds(self, args, kwargs):
        arrays = []
        for name, d, value in zip(self.arg_names, self.arg_defs, self._feed_values(args, kwargs)):
            where = f"job {self.name} argument {name!r}"
            if d.dynamic:
                if not isinstance(value, (list, tuple)) or len(value) != 1:
                    raise FeedError(f"{where}: expected a list holding one numpy.ndarray (tp.ListNumpy), "
                                    f"got {type(value).__name__}{'' if not isinstance(value, (list, tuple)) else ' of length ' + str(len(value))}")
                value = value[0]
            arrays.append(self._check_array(where, d, value))
        return arrays

    def _feed_values(self, args, kwargs):
        """The arguments in declaration order."""
        if len(args) + len(kwargs) != len(self.arg_defs):
            raise FeedError(f"job {self.name} takes {len(self.arg_defs)} argument(s) ({', '.join(self.arg_names)}), "
                            f"got {len(args) + len(kwargs)}")
        values = list(args)
        for name in self.arg_names[len(args):]:
            if name not in kwargs:
                raise FeedError(f"job {self.name}: argument {name!r} is missing")
            values.append(kwargs.pop(name))
        if kwargs:
            raise FeedError(f"job {self.name}: unexpected argument(s) {sorted(kwargs)}")
        return values

    @staticmethod
    def _check_array(where, d, value):
        if not isinstance(value, np.ndarray):
            raise FeedError(f"{where}: expected a numpy.ndarray of shape {d.shape} and dtype {d.dtype}, "
                            f"got {type(value).__name__}")
        if value.dtype != d.dtype:
            raise FeedError(f"{where}: expected dtype {d.dtype}, got {value.dtype} (convert with .astype)")
        if d.dynamic:
            if value.ndim != len(d.shape) or any(a > b for a, b in zip(value.shape, d.shape)):
                raise FeedError(f"{where}: expected at most shape {d.shape}, got {value.shape}")
        elif value.shape != d.shape:
            raise FeedError(f"{where}: expected shape {d.shape}, got {value.shape}")
        return value

    # ------------------------------------------------------------------------------------------------ trace/compile
    def _trace(self, shapes, undo, devices=1):
        """Trace the job function for these argument shapes into a graph, then declare its variables to the session
        (``undo`` collects how to take the declarations back if compiling fails later)."""
        graph = g.Graph(self.name, self.is_train, self.config.default_dtype)
        graph.devices, graph.logical_view = devices, self.config.logical_view
        if graph.splits_batches:
            graph.split_batches = {d.shape[0]: s[0] for d, s in zip(self.arg_defs, shapes)
                                   if not d.dynamic and len(s) and s[0] != d.shape[0]}
        replay = self._first_id
        if replay is None:
            self._first_id = g.peek_unique_id()
        sess = session.default()
        with g.trace_into(graph, replay):
            for d, shape in zip(self.arg_defs, shapes):
                graph.placeholders.append(apply(Input, (), None, shape=shape, dtype=d.dtype))
            result = self.fn(*graph.placeholders)
            if self.return_kind == "none" and result is not None:
                raise TypeError(f"job {self.name} is annotated `-> None` but returned {type(result).__name__}")
            outputs, rebuild = _flatten(result, f"the return value of job {self.name}")
            graph.outputs = outputs
            if graph.splits_batches:    # per-device reductions over the batch made whole where ops need them
                box_partials(graph)
            if self.is_train:
                # the forward trace succeeded; optimizers ask the session which of its variables are trainable
                undo.append(sess.declare_all(list(graph.declarations.values()), self.name, True))
                self._build_training(graph)
            elif graph.losses:
                raise TraceError(f"job {self.name} calls minimize/add_loss but is a predict job; use "
                                 "@flow.global_function(type=\"train\")")
            resolve(graph, host=not backend.current().is_gpu, devices=devices)
        # every variable (optimizer state included) once the whole trace has succeeded
        undo.append(sess.declare_all(list(graph.declarations.values()), self.name, self.is_train))
        return graph, rebuild

    def _build_training(self, graph):
        if not graph.losses:
            raise TraceError(f"train job {self.name} never calls optimizer.minimize(loss) (or flow.losses.add_loss)")
        watched = watching.gradient_targets(graph)
        sparse = self.config.indexed_slices_variables()
        for optimizer, loss in graph.losses:
            (optimizer or self.config.train.make_optimizer()).build(graph, loss, watched, sparse)

    @property
    def _mixed_precision(self):
        return bool(self.config.settings.get("enable_auto_mixed_precision", False))

    def _compile(self, shapes, undo):
        graph, rebuild = self._trace(shapes, undo)
        sess = session.default()
        deliveries = Deliveries(graph)
        plan = compile_graph(graph, graph.outputs, backend.current(), sess.variables, deliveries.plan_deliveries,
                             rng_seed=[sess.seed, len(sess.jobs), sum(map(ord, self.name))],
                             check_anomaly=self.config.anomaly_detection, mixed_precision=self._mixed_precision)
        quiet = None
        if deliveries.plan_deliveries and not plan.always_due:
            # watches that skip calls (every > 1) may keep the passes from work they would do without them (a
            # watched gradient is not folded into its update): such calls run the plan compiled without them
            quiet = compile_graph(graph, graph.outputs, plan.backend, sess.variables, (), rng=plan.rng,
                                  check_anomaly=self.config.anomaly_detection, buffers_from=plan,
                                  mixed_precision=self._mixed_precision)
            if [n.name for n in quiet.nodes] == [n.name for n in plan.nodes]:
                quiet = None            # the same work: one plan (and one set of buffers) is enough
        return _Compiled(graph, plan, rebuild, deliveries, quiet)

    def _compile_on_devices(self, device_shapes, undo):
        """One replica plan a device; devices with the same feed shapes share one traced graph."""
        n, sess, be = len(device_shapes), session.default(), backend.current()
        traced = {}
        for shapes in device_shapes:
            if shapes not in traced:
                traced[shapes] = self._trace(shapes, undo, devices=n)
        graph, rebuild = traced[device_shapes[0]]
        if len(traced) > 1 and any(node.op.takes_device for g_, _ in traced.values() for node in g_.nodes):
            raise TraceError(f"job {self.name}: its data ops hand each of the {n} devices its rows of one batch a "
                             "call, so every device's arguments must have the same shapes; got "
                             f"{', '.join(str(list(s)) for s in device_shapes)}")
        view = self.config.logical_view
        kinds = devices.join_kinds(graph) if view == "consistent" else {}
        deliveries = Deliveries(graph, view, kinds)
        if view == "consistent":
            devices.check_joinable(graph, list(graph.outputs) + [d.tensor for d in deliveries.plan_deliveries],
                                   kinds, n)
        mode = devices.gradient_mode(graph, view)
        if be.is_gpu:
            mirrors = devices.gpu_mirrors(be.xp, sess.variables, n)
            reducer = devices.NcclReduce(n, mode, be.xp, mirrors)
        else:
            mirrors, reducer = [sess.variables] * n, devices.HostReduce(n, mode)
        plans = []
        for k, shapes in enumerate(device_shapes):
            replica_graph = traced[shapes][0]
            replica_deliveries = deliveries.for_replica(replica_graph)
            replica_be = be if k == 0 or not be.is_gpu else backend.Backend("cupy", be.xp)
            compile_now = functools.partial(
                compile_graph, replica_graph, replica_graph.outputs, replica_be, mirrors[k], replica_deliveries,
                rng_seed=[sess.seed, len(sess.jobs), sum(map(ord, self.name)), k],
                check_anomaly=self.config.anomaly_detection, replica=devices.Replica(k, reducer),
                mixed_precision=self._mixed_precision)
            if be.is_gpu:
                with be.xp.cuda.Device(k):
                    plans.append(compile_now())
            else:
                plans.append(compile_now())
        return _DeviceCompiled(graph, devices.Replicas(plans, reducer, gpu=be.is_gpu), rebuild, deliveries, view,
                               kinds)

    def compiled(self, shapes=None):
        """The compiled signature for these argument shapes (declared shapes by default); traces on first use. On
        several devices the declared shapes give each device its piece: under the consistent view a share of the
        batch, under the mirrored view the declared shape itself."""
        n = session.default().device_num
        if n > 1 and shapes is None:
            return self._compiled_on_devices(n, tuple(self._device_shapes(n) for _ in range(n)))
        shapes = tuple(tuple(d.shape) for d in self.arg_defs) if shapes is None else shapes
        compiled = self._compiled.get(shapes)
        if compiled is None:
            compiled = self._compiled[shapes] = self._declaring(self._compile, shapes)
        self._last = compiled
        return compiled

    def _device_shapes(self, n):
        """Each argument's shape on one of ``n`` devices, from its declared shape."""
        shapes = []
        for name, d in zip(self.arg_names, self.arg_defs):
            shape = tuple(d.shape)
            if not d.dynamic and self.config.logical_view == "consistent":
                if not shape or shape[0] % n:
                    raise FeedError(f"job {self.name} argument {name!r}: the consistent view splits the batch (axis "
                                    f"0) evenly over {n} devices, but its placeholder has shape {shape}; declare a "
                                    f"batch size divisible by {n}")
                shape = (shape[0] // n,) + shape[1:]
            shapes.append(shape)
        return tuple(shapes)

    def _compiled_on_devices(self, n, device_shapes):
        """The compiled signature of ``n`` devices whose feeds have ``device_shapes`` (one tuple of shapes a
        device); traces on first use."""
        key = (n,) + device_shapes
        compiled = self._compiled.get(key)
        if compiled is None:
            compiled = self._compiled[key] = self._declaring(self._compile_on_devices, device_shapes)
        self._last = compiled
        return compiled

    @staticmethod
    def _declaring(compile_, shapes):
        """``compile_(shapes, undo)``; if it fails, the session's variables are as they were before."""
        undo = []
        try:
            return compile_(shapes, undo)
        except BaseException:
            for step in reversed(undo):
                step()
            raise

    def _ready_variables(self, compiled, stacklevel):
        """Give the variables values on the first call of a signature; a predict job warns about variables that no
        train job declares and no checkpoint loaded (``Session.warn_untrained``)."""
        if compiled.variables_ready:
            return
        sess = session.default()
        sess.initialize_missing()
        if not self.is_train:
            sess.warn_untrained(self.name, list(compiled.graph.declarations), stacklevel + 1)
        compiled.variables_ready = True

    @property
    def traced(self) -> bool:
        """Whether the job has been traced (for any argument shapes) and so has declared its variables."""
        return bool(self._compiled)

    def graph(self):
        return (self._last or self.compiled()).graph

    def plan(self):
        return (self._last or self.compiled()).plan

    # -------------------------------------------------------------------------------------------------------- call
    def __call__(self, *args, **kwargs):
        device_num = session.default().device_num
        if device_num > 1:
            return self._call_on_devices(device_num, args, kwargs)
        arrays = self._check_feeds(args, kwargs)
        dispatcher = dispatch.default()
        # Earlier calls' callbacks finish first: the queue stays bounded when handlers are slower than the job,
        # and a handler's error is raised here, before the next step runs (a trailing batch: see runtime.dispatch).
        dispatcher.settle()
        dispatcher.raise_pending()
        with self._lock:
            compiled = self.compiled(tuple(a.shape for a in arrays))
            self._ready_variables(compiled, stacklevel=2)
            try:   # host arrays: on CuPy the plan copies them to the device (into a CUDA graph's inputs)
                outputs = compiled.plan_for(self.step)(arrays, self.step, compiled.deliveries.emit)
            finally:
                # what was delivered before a failure (an anomaly) is still shown
                previous = compiled.deliveries.hand_over()
                if self.is_train:
                    session.default().last_train_step = self.step
                self.step += 1          # a failed call still used its number: watch steps never repeat
        if previous:
            dispatcher.raise_pending(upto=previous)     # the previous call's trailing handlers' errors
        ticket = dispatcher.ticket()
        return self._result(compiled.rebuild(list(outputs)), ticket)

    def _call_on_devices(self, n, args, kwargs):
        per_device = devices.split_feeds(self.name, self.arg_names, self.arg_defs, self._feed_values(args, kwargs), n,
                                         self._check_array)
        dispatcher = dispatch.default()
        dispatcher.settle()
        dispatcher.raise_pending()
        with self._lock:
            compiled = self._compiled_on_devices(n, tuple(tuple(a.shape for a in feeds) for feeds in per_device))
            self._ready_variables(compiled, stacklevel=3)
            try:
                outputs = compiled.run(per_device, self.step)
            finally:
                previous = compiled.deliveries.hand_over()
                if self.is_train:
                    session.default().last_train_step = self.step
                self.step += 1
        if previous:
            dispatcher.raise_pending(upto=previous)
        ticket = dispatcher.ticket()
        return self._result(compiled.rebuild(list(outputs)), ticket)

    def _result(self, value, ticket):
        """Jobs that hand back a value wait for their watch callbacks first; ``-> None`` jobs and handles do not."""
        kind = self.return_kind
        if kind == "handle":
            return None if value is None else JobResult(self._convert(value), ticket)
        if kind == "none":
            return None
        if kind == "callback":
            converted = self._convert(value)

            def take_callback(callback):
                if not callable(callback):
                    raise TypeError(f"job {self.name} returns tp.Callback: pass a callable, got {callback!r}")
                dispatch.default().submit(lambda: callback(converted),
                                          lambda: f"the tp.Callback of job {self.name}")
            return take_callback
        dispatch.default().wait(ticket)
        dispatch.default().raise_pending()
        return self._convert(value)

    def sync(self):
        """Every call of this job has finished when this returns (its watch callbacks: see ``Session.sync``)."""
        with self._lock:
            pass


def global_function(type="predict", function_config=None):  # noqa: A002 - OneFlow's argument name
    """Decorator making a job function. Also accepts OneFlow's older ``global_function(function_config)`` form, where
    a config with training settings (``config.train.primary_lr``) makes a train job."""
    if isinstance(type, FunctionConfig):
        type, function_config = ("train" if type.train.configured else "predict"), type
    if callable(type) and not isinstance(type, str):
        raise TypeError("global_function must be called: write @flow.global_function() with parentheses")
    if type not in ("predict", "train"):
        raise ValueError(f"global_function: type must be 'predict' or 'train', got {type!r}")
    if function_config is not None and not isinstance(function_config, FunctionConfig):
        raise TypeError(f"global_function: function_config must come from flow.function_config(), "
                        f"got {function_config!r}")
    config = function_config or FunctionConfig()

    def decorate(fn):
        return JobFunction(fn, type == "train", config)
    return decorate


def add_loss(loss):
    """``flow.losses.add_loss``: train ``loss`` with the optimizer described by the job's function_config."""
    graph = g.current_graph("flow.losses.add_loss")
    if not isinstance(loss, g.LazyTensor):
        raise TypeError(f"add_loss: loss must be a tensor of the job, got {type(loss).__name__}")
    if not graph.is_train:
        raise TraceError(f"add_loss: job {graph.name!r} has no training settings; give its function_config "
                         "config.train.primary_lr(...) and config.train.model_update_conf(...)")
    graph.losses.append((None, loss))
