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
import typing

import numpy as np

from . import graph as g
from . import typing as tp
from .compiler import Delivery, compile_graph
from .config import FunctionConfig
from .errors import FeedError, TraceError
from . import watching
from .runtime import backend, devices, dispatch, session


class Blob:
    """A job result or watched value on the host: ``.numpy()`` (or OneFlow's older ``.ndarray()``) gives the array;
    NumPy attributes such as ``.mean()`` and ``.shape`` work directly. ``.numpy_list()`` (``.ndarray_list()``) gives
    one array a device under the mirrored view, else ``[array]``."""

    __slots__ = ("_array", "_pieces")

    def __init__(self, array, pieces=None):
        self._array = array
        self._pieces = pieces

    def numpy(self):
        return self._array

    ndarray = numpy

    def numpy_list(self):
        return [self._array] if self._pieces is None else self._pieces

    ndarray_list = numpy_list

    def __array__(self, dtype=None, copy=None):
        return self._array if dtype is None else self._array.astype(dtype)

    def __getattr__(self, name):
        return getattr(self._array, name)

    def __repr__(self):
        return f"Blob({self._array!r})"


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


def _return_kind(annotation):
    """Describe the return annotation as a small tree: 'numpy' | 'list' | 'blob' | 'none' | ('callback', kind) | ..."""
    if annotation is inspect.Signature.empty:
        return "blob"
    if annotation is None or annotation is type(None):
        return "none"
    if annotation is tp.Numpy:
        return "numpy"
    if annotation is tp.ListNumpy:
        return "list"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is tp.Callback:
        return ("callback", _return_kind(args[0]) if args else "numpy")
    if origin is tp.Bundle:
        return ("bundle", _return_kind(args[0]) if args else "numpy")
    if origin in (tuple, list):
        return ("tuple", [_return_kind(a) for a in args])
    if origin is dict:
        return ("dict", _return_kind(args[1]))
    raise TypeError(f"unsupported return annotation {annotation!r}: use tp.Numpy, tp.ListNumpy, tp.Callback[...], "
                    "Tuple[...], Dict[str, ...] or None")


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


def _convert(value, kind):
    """Host arrays -> what the annotation promises."""
    if isinstance(value, devices.DeviceValues):
        if kind == "list":
            return value.pieces
        if kind == "blob":
            return Blob(value.whole, value.pieces)
        value = value.whole
    if kind == "numpy":
        return value
    if kind == "list":
        return [value]
    if kind == "blob":
        return Blob(value)
    if isinstance(kind, tuple) and kind[0] in ("bundle", "callback"):
        return _convert_tree(value, kind[1])
    return value


def _convert_tree(value, kind):
    if isinstance(value, (tuple, list)):
        return type(value)(_convert_tree(v, kind) for v in value)
    if isinstance(value, dict):
        return {k: _convert_tree(v, kind) for k, v in value.items()}
    return _convert(value, kind)


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
    """One traced and compiled signature of a job, with the watch requests each plan delivery serves."""

    def __init__(self, graph, plan, rebuild, requests):
        self.graph = graph
        self.plan = plan
        self.rebuild = rebuild
        self.requests = requests        # delivery index -> watch requests
        self.variables_ready = False    # once its variables have values they keep them: check on the first call only

        self.delivered = []             # this call's (request, host copy, step), handed over in one piece

    def emit(self, k, copy, step):
        """Called by the plan as soon as a watched tensor is on its way to the host. A summary already on the host
        goes to its ``watch_summary`` handler right here (see ``runtime.dispatch``); the rest waits for ``dispatch``."""
        for request in self.requests[k]:
            if request.inline and not callable(copy):
                try:
                    request.call(copy, step)
                except BaseException as e:  # reported as the dispatcher reports its callbacks' errors
                    dispatch.default().report(f"{request.describe} (call {step} of job {self.graph.name})", e)
            else:
                self.delivered.append((request, copy, step))

    def dispatch(self):
        """Hand this call's other deliveries to the dispatcher as one batch: one wake-up a call, however many
        watches."""
        if not self.delivered:
            return
        batch, self.delivered = self.delivered, []
        dispatch.default().submit_batch(
            [(lambda r=r, c=c, s=s: r.call(c() if callable(c) else c, s),
              lambda r=r, s=s: f"{r.describe} (call {s} of job {self.graph.name})") for r, c, s in batch])


class _DeviceCompiled(_Compiled):
    """One signature on several devices: a replica plan a device (``self.plan`` is device 0's, for ``job.plan()``),
    each delivery's and output's pieces joined into ``DeviceValues`` (``runtime.devices``)."""

    def __init__(self, graph, replicas, rebuild, requests, view, kinds):
        super().__init__(graph, replicas.plans[0], rebuild, requests)
        self.replicas = replicas
        self.view = view
        self.output_kinds = [kinds.get(t.id) for t in graph.outputs]
        self.delivery_kinds = [kinds.get(r[0].target.id) for r in requests]

    def run(self, per_device_feeds, step):
        n = len(per_device_feeds)
        pieces = [[None] * n for _ in self.requests]

        def emitter(r):
            def emit(k, copy, step):
                pieces[k][r] = copy
            return emit
        try:
            results = self.replicas.run(per_device_feeds, step, [emitter(r) for r in range(n)])
        finally:
            self._deliver(pieces, step)
        return [devices.join(list(p), kind, self.view) for p, kind in zip(zip(*results), self.output_kinds)]

    def _deliver(self, pieces, step):
        for k, (copies, kind) in enumerate(zip(pieces, self.delivery_kinds)):
            if any(c is None for c in copies):
                continue            # not this call (every=N), or a replica failed before delivering
            requests = [r for r in self.requests[k] if r.when is None or r.when()]
            if requests:
                joined = _LazyJoin(copies, kind, self.view)
                self.delivered.extend((r, joined, step) for r in requests)


class _LazyJoin:
    """The joined value of one delivery, made on first use in the dispatcher thread (CuPy copies resolved there)."""

    def __init__(self, copies, kind, view):
        self._copies, self._kind, self._view, self._value = copies, kind, view, None

    def __call__(self):
        if self._value is None:
            self._value = devices.join([c() if callable(c) else c for c in self._copies], self._kind, self._view)
        return self._value


class JobFunction:
    """A callable job. ``job.graph()`` and ``job.plan()`` show the IR and the generated code of its last trace."""

    def __init__(self, fn, is_train, config: FunctionConfig):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.name = fn.__name__
        self.is_train = is_train
        self.config = config
        self.arg_names, self.arg_defs = self._arg_defs(fn)
        self.return_kind = _return_kind(_signature(fn).return_annotation)
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
    def _trace(self, shapes, devices=1):
        graph = g.Graph(self.name, self.is_train)
        replay = self._first_id
        if replay is None:
            self._first_id = g.peek_unique_id()
        from .ops import apply
        from .ops.array import Input
        with g.trace_into(graph, replay):
            for d, shape in zip(self.arg_defs, shapes):
                graph.placeholders.append(apply(Input, (), None, shape=shape, dtype=d.dtype))
            result = self.fn(*graph.placeholders)
            if self.return_kind == "none" and result is not None:
                raise TypeError(f"job {self.name} is annotated `-> None` but returned {type(result).__name__}")
            outputs, rebuild = _flatten(result, f"the return value of job {self.name}")
            graph.outputs = outputs
            if self.is_train:
                self._build_training(graph)
            elif graph.losses:
                raise TraceError(f"job {self.name} calls minimize/add_loss but is a predict job; use "
                                 "@flow.global_function(type=\"train\")")
            watching.resolve(graph, host=not backend.current().is_gpu, devices=devices)
        return graph, rebuild

    def _build_training(self, graph):
        if not graph.losses:
            raise TraceError(f"train job {self.name} never calls optimizer.minimize(loss) (or flow.losses.add_loss)")
        watched = watching.gradient_targets(graph)
        for optimizer, loss in graph.losses:
            (optimizer or self.config.train.make_optimizer()).build(graph, loss, watched)

    def _compile(self, shapes):
        graph, rebuild = self._trace(shapes)
        sess = session.default()
        index, deliveries, requests = {}, [], []
        for request in graph.watches:          # one host copy serves every request on the same tensor and calls
            delivery = Delivery(request.target, request.every, request.when, request.bins, request.put)
            key = (request.target.id, *delivery[1:])
            if key not in index:
                index[key] = len(deliveries)
                deliveries.append(delivery)
                requests.append([])
            requests[index[key]].append(request)
        plan = compile_graph(graph, graph.outputs, backend.current(), sess.variables, deliveries,
                             rng_seed=[sess.seed, len(sess.jobs), sum(map(ord, self.name))],
                             check_anomaly=self.config.anomaly_detection)
        return _Compiled(graph, plan, rebuild, requests)

    def _compile_on_devices(self, device_shapes):
        """One replica plan a device; devices with the same feed shapes share one traced graph."""
        n, sess, be = len(device_shapes), session.default(), backend.current()
        traced = {}
        for shapes in device_shapes:
            if shapes not in traced:
                traced[shapes] = self._trace(shapes, devices=n)
        graph, rebuild = traced[device_shapes[0]]
        view = self.config.logical_view
        kinds = devices.join_kinds(graph) if view == "consistent" else {}
        requests, deliveries, index = [], [], {}
        for request in graph.watches:          # the multi-device requests deliver tensors: one key a tensor
            key = (request.target.id, request.every)
            if key not in index:
                index[key] = len(deliveries)
                deliveries.append(Delivery(request.target, request.every))
                requests.append([])
            requests[index[key]].append(request)
        if view == "consistent":
            devices.check_joinable(graph, list(graph.outputs) + [d.tensor for d in deliveries], kinds, n)
        mode = devices.gradient_mode(graph, view)
        if be.is_gpu:
            mirrors = devices.gpu_mirrors(be.xp, sess.variables, n)
            reducer = devices.NcclReduce(n, mode, be.xp, mirrors)
        else:
            mirrors, reducer = [sess.variables] * n, devices.HostReduce(n, mode)
        plans = []
        for k, shapes in enumerate(device_shapes):
            replica_graph = traced[shapes][0]
            # each replica's own graph: its deliveries are the same requests, in the same order
            replica_deliveries = [Delivery(t, d.every) for t, d in zip(_delivery_targets(replica_graph), deliveries)]
            replica_be = be if k == 0 or not be.is_gpu else backend.Backend("cupy", be.xp)
            compile_now = functools.partial(
                compile_graph, replica_graph, replica_graph.outputs, replica_be, mirrors[k], replica_deliveries,
                rng_seed=[sess.seed, len(sess.jobs), sum(map(ord, self.name)), k],
                check_anomaly=self.config.anomaly_detection, replica=devices.Replica(k, reducer))
            if be.is_gpu:
                with be.xp.cuda.Device(k):
                    plans.append(compile_now())
            else:
                plans.append(compile_now())
        return _DeviceCompiled(graph, devices.Replicas(plans, reducer, gpu=be.is_gpu), rebuild, requests, view, kinds)

    def compiled(self, shapes=None):
        """The compiled signature for these argument shapes (declared shapes by default); traces on first use."""
        shapes = tuple(tuple(d.shape) for d in self.arg_defs) if shapes is None else shapes
        compiled = self._compiled.get(shapes)
        if compiled is None:
            compiled = self._compiled[shapes] = self._compile(shapes)
        self._last = compiled
        return compiled

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
        # and a handler's error is raised here, before the next step runs.
        dispatcher.wait()
        dispatcher.raise_pending()
        with self._lock:
            compiled = self.compiled(tuple(a.shape for a in arrays))
            if not compiled.variables_ready:
                session.default().initialize_missing()
                compiled.variables_ready = True
            be = compiled.plan.backend
            feeds = [be.asarray(a) for a in arrays] if be.is_gpu else arrays
            try:
                outputs = compiled.plan(feeds, self.step, compiled.emit)
            finally:
                compiled.dispatch()     # what was delivered before a failure (an anomaly, say) is still shown
                if self.is_train:
                    session.default().last_train_step = self.step
                self.step += 1          # a failed call still used its number: watch steps never repeat
        ticket = dispatcher.ticket()
        return self._result(compiled.rebuild(list(outputs)), ticket)

    def _call_on_devices(self, n, args, kwargs):
        per_device = devices.split_feeds(self.name, self.arg_names, self.arg_defs, self._feed_values(args, kwargs), n,
                                         self._check_array)
        dispatcher = dispatch.default()
        dispatcher.wait()
        dispatcher.raise_pending()
        with self._lock:
            key = (n,) + tuple(tuple(a.shape for a in feeds) for feeds in per_device)
            compiled = self._compiled.get(key)
            if compiled is None:
                compiled = self._compiled[key] = self._compile_on_devices(key[1:])
            self._last = compiled
            if not compiled.variables_ready:
                session.default().initialize_missing()
                compiled.variables_ready = True
            try:
                outputs = compiled.run(per_device, self.step)
            finally:
                compiled.dispatch()
                if self.is_train:
                    session.default().last_train_step = self.step
                self.step += 1
        ticket = dispatcher.ticket()
        return self._result(compiled.rebuild(list(outputs)), ticket)

    def _result(self, value, ticket):
        """Jobs that hand back a value wait for their watch callbacks first; ``-> None`` jobs and handles do not."""
        kind = self.return_kind
        if kind == "blob":
            return None if value is None else JobResult(_convert_tree(value, "blob"), ticket)
        if kind != "none" and not (isinstance(kind, tuple) and kind[0] == "callback"):
            dispatch.default().wait(ticket)
            dispatch.default().raise_pending()
        if kind == "none":
            return None
        if isinstance(kind, tuple) and kind[0] == "callback":
            converted = _convert_tree(value, kind[1])

            def take_callback(callback):
                if not callable(callback):
                    raise TypeError(f"job {self.name} returns tp.Callback: pass a callable, got {callback!r}")
                dispatch.default().submit(lambda: callback(converted),
                                          lambda: f"the tp.Callback of job {self.name}")
            return take_callback
        if isinstance(kind, tuple) and kind[0] == "tuple":
            return type(value)(_convert_tree(v, k) for v, k in zip(value, kind[1]))
        if isinstance(kind, tuple) and kind[0] == "dict":
            return {k: _convert_tree(v, kind[1]) for k, v in value.items()}
        return _convert_tree(value, kind)

    def sync(self):
        """Every call of this job has finished when this returns (its watch callbacks: see ``Session.sync``)."""
        with self._lock:
            pass


def _delivery_targets(graph):
    """The tensors a multi-device graph's watches deliver, one a (tensor, every), in the order ``_compile_on_devices``
    makes its deliveries."""
    seen, targets = set(), []
    for request in graph.watches:
        key = (request.target.id, request.every)
        if key not in seen:
            seen.add(key)
            targets.append(request.target)
    return targets


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
