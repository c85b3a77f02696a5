"""The lazy graph a job function is traced into.

A ``Graph`` is a list of ``Node`` s in the order they were created, which is already a topological order: a node can
only consume tensors that exist. Each node applies one op (an ``flowlab.ops.Op`` subclass) to input ``LazyTensor`` s and
makes output ``LazyTensor`` s. Names follow OneFlow: a node has an ``op_name`` and each output a *logical blob name*
(``lbn``) ``"<op_name>/<arg>_<i>"``, e.g. ``Dense_6_matmul/out_0``; variables are ``"<name>/out"``.

``print(graph)`` shows the IR, one node a line. The graph imports no op: ``flowlab.ops.operators`` gives lazy tensors
their Python operators.
"""
from __future__ import annotations

import contextlib
import itertools
import linecache
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import TraceError

_FLOWLAB_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_EXAMPLES_DIR = os.path.join(_FLOWLAB_DIR, "examples")


def _internal(filename):
    """A file of flowlab's own machinery; its bundled examples are user code (a demo's NaN names its model's line)."""
    path = os.path.abspath(filename)
    return path.startswith(_FLOWLAB_DIR + os.sep) and not path.startswith(_EXAMPLES_DIR + os.sep)


def describe_location(filename, lineno) -> str:
    """Where a line is, for a message: ``Cell In[3], line 7`` for a notebook cell's code, as IPython's own tracebacks
    name it (the kernel runs each cell from a temporary file, ``/tmp/ipykernel_24236/….py``, that means nothing to
    the reader), else ``file:line``."""
    cell = _cell_name(filename)
    return f"{cell}, line {lineno}" if cell else f"{filename}:{lineno}"


def _cell_name(filename):
    """``Cell In[3]`` when ``filename`` is the code of an input cell of the running IPython, else None. IPython's
    compiler keeps the map from its code names to execution counts (``CachingCompiler.format_code_name``, what
    ``IPython.core.ultratb`` formats tracebacks with); IPython is only asked when it is already imported."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    format_code_name = getattr(getattr(shell, "compile", None), "format_code_name", None)
    if format_code_name is None:
        return None
    named = format_code_name(filename)
    return f"{named[0]} {named[1]}" if named else None


def user_source_line() -> str:
    """Where the user called the op: the innermost stack frame outside flowlab, as ``describe_location`` says it."""
    frame = sys._getframe(1)
    while frame is not None:
        if not _internal(frame.f_code.co_filename):
            return describe_location(frame.f_code.co_filename, frame.f_lineno)
        frame = frame.f_back
    return "<unknown>"


def user_frames() -> tuple:
    """``(file, line, function)`` of each stack frame outside flowlab, outermost first: the user's code that led to
    the op (OneFlow's ``BlobDef.location`` shows them; the code lines are read only when it is asked for)."""
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        if not _internal(frame.f_code.co_filename):
            frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return tuple(reversed(frames))


def format_frames(frames) -> str:
    """``frames`` (see ``user_frames``) as ``traceback.format_list`` writes a stack; a notebook cell's frame as
    IPython writes it (``Cell In[3], line 7, in job``)."""
    out = []
    for filename, lineno, name in frames:
        cell = _cell_name(filename)
        out.append(f"  {cell}, line {lineno}, in {name}\n" if cell else
                   f'  File "{filename}", line {lineno}, in {name}\n')
        line = linecache.getline(filename, lineno).strip()
        if line:
            out.append(f"    {line}\n")
    return "".join(out)


class LazyTensor:
    """A value that will exist when the job runs: shape, dtype and where it comes from, no data."""

    __slots__ = ("graph", "id", "shape", "dtype", "node", "index", "logical_blob_name", "__weakref__")

    def __init__(self, graph, id, shape, dtype, node, index, lbn):
        self.graph = graph
        self.id = id
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.node = node
        self.index = index
        self.logical_blob_name = lbn

    @property
    def op_name(self) -> str:
        return self.node.name

    @property
    def location(self) -> str:
        """Where the tensor was made, as a stack of the user's frames (OneFlow's ``BlobDef.location``); a gradient's
        is that of the forward op it differentiates."""
        return self.node.location

    @property
    def lbn(self) -> str:
        return self.logical_blob_name

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def __repr__(self):
        return f"LazyTensor({self.logical_blob_name!r}, shape={self.shape}, dtype={self.dtype})"

    def __bool__(self):
        raise TraceError(
            f"the truth value of lazy tensor {self.logical_blob_name} is not known while the job is traced; "
            "use flow.math ops instead of Python control flow on tensor values")

    def __len__(self):
        return self.shape[0]

    # Python operators (x + y, -x, x @ w) become ops: flowlab.ops.operators installs them, so this module, which
    # every op builds on, imports no op.


class Node:
    """One op applied to input tensors. ``attrs`` are the op's static arguments."""

    __slots__ = ("op", "name", "inputs", "attrs", "outputs", "source", "device_tag", "frames")

    def __init__(self, op, name, inputs, attrs, source, device_tag, frames=()):
        self.op = op
        self.name = name
        self.inputs = tuple(inputs)
        self.attrs = attrs
        self.outputs: list[LazyTensor] = []
        self.source = source                # file:line of the user's call
        self.device_tag = device_tag
        self.frames = frames                # the user's frames (user_frames), for location
    @property
    def output(self) -> LazyTensor:
        return self.outputs[0]

    @property
    def location(self) -> str:
        """The user's frames that made this node, as ``traceback.format_list`` writes a stack."""
        return format_frames(self.frames) if self.frames else f"  {self.source}\n"

    def __repr__(self):
        outs = ", ".join(f"%{t.id}:{_spec(t)}" for t in self.outputs) or "()"
        ins = ", ".join(f"%{t.id}" for t in self.inputs)
        attrs = ", ".join(f"{k}={_short(v)}" for k, v in self.attrs.items())
        return f"{outs} = {self.op.__name__}({ins}{', ' if ins and attrs else ''}{attrs})  # {self.name}"


def _spec(t):
    return f"{t.dtype}{list(t.shape)}"


def _short(v):
    if isinstance(v, np.dtype):
        return str(v)
    if isinstance(v, np.ndarray):
        return f"array{list(v.shape)}"
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass(frozen=True)
class VariableDecl:
    """A variable a job reads, as ``flow.get_variable`` asked for it. Tracing only records these in
    ``Graph.declarations``; the job declares them to the session once the trace has succeeded."""
    name: str
    shape: tuple
    dtype: np.dtype
    initializer: Any
    trainable: bool
    source: str                 # the user's line, for messages


class Graph:
    """A traced job: nodes in creation order, the placeholders fed per call and what the job returns.
    ``default_dtype`` is the dtype of variables created without one (``FunctionConfig.default_data_type``)."""

    def __init__(self, name: str, is_train: bool = False, default_dtype=np.float32):
        self.name = name
        self.is_train = is_train
        self.default_dtype = np.dtype(default_dtype)
        self.nodes: list[Node] = []
        self.tensors: list[LazyTensor] = []
        self.placeholders: list[LazyTensor] = []
        self.variables: dict[str, LazyTensor] = {}   # variable name -> its read in this graph
        self.declarations: dict[str, VariableDecl] = {}   # variable name -> what the job declares to the session
        self.losses: list[tuple[Any, LazyTensor]] = []  # (optimizer or None, loss)
        self.side_effects: list[Node] = []           # nodes kept although nothing reads them (updates, summaries)
        self.grad_of: dict[int, LazyTensor] = {}     # forward tensor id -> its total gradient (train jobs)
        self.watches: list[Any] = []                 # watch requests recorded while tracing
        self.outputs: list[LazyTensor] = []
        # A replica's graph under the consistent view of several devices: logical batch size -> this device's.
        # Shapes a program writes out (flow.reshape(x, [100, -1])) are logical, as in OneFlow.
        self.split_batches: dict[int, int] = {}
        # The devices each running a replica of this graph (flow.config.gpu_device_num) and their logical view: under
        # the consistent view with several devices every batch is split along axis 0, one piece a device.
        self.devices = 1
        self.logical_view = "consistent"
        self._local_counter = itertools.count()

    @property
    def splits_batches(self) -> bool:
        """Whether this graph is one device's replica under the consistent view of several devices."""
        return self.devices > 1 and self.logical_view == "consistent"

    def add_node(self, op, inputs, attrs, name, out_specs, out_names, device_tag=None) -> list[LazyTensor]:
        if _state.grad_of is not None:      # a gradient op: where its forward op was made
            source, frames = _state.grad_of.source, _state.grad_of.frames
        else:
            frames = user_frames()
            source = describe_location(*frames[-1][:2]) if frames else "<unknown>"
        node = Node(op, name, inputs, attrs, source, device_tag, frames)
        self.nodes.append(node)
        for i, ((shape, dtype), arg) in enumerate(zip(out_specs, out_names)):
            lbn = f"{name}/{arg}" if op.is_variable else f"{name}/{arg}_0"   # OneFlow: user-op outputs are lists
            t = LazyTensor(self, len(self.tensors), shape, dtype, node, i, lbn)
            self.tensors.append(t)
            node.outputs.append(t)
        return node.outputs

    def compiler_tensor(self, node, shape, dtype, lbn) -> LazyTensor:
        """Output ``len(node.outputs)`` of ``node``, a node a compiler pass adds to one plan (not to ``nodes``, which
        stay the traced job): it gets an id of this graph, so that plans and reports can name it."""
        t = LazyTensor(self, len(self.tensors), shape, dtype, node, len(node.outputs), lbn)
        self.tensors.append(t)
        node.outputs.append(t)
        return t

    def local_name(self, prefix: str) -> str:
        """Names for nodes flowlab adds itself (gradients, updates): unique in this graph, no global counter."""
        return f"{prefix}{next(self._local_counter)}"

    def consumers(self) -> dict[int, list[Node]]:
        users: dict[int, list[Node]] = {}
        for node in self.nodes:
            for t in node.inputs:
                users.setdefault(t.id, []).append(node)
        return users

    def __str__(self):
        head = f"graph {self.name}({', '.join(f'%{t.id}:{_spec(t)}' for t in self.placeholders)})"
        body = [f"  {node!r}" for node in self.nodes]
        tail = f"  return {', '.join(f'%{t.id}' for t in self.outputs)}"
        return "\n".join([head, *body, tail])


# ---------------------------------------------------------------------------------------------------------------------
# Tracing context: which graph ops go into, the name counter and scopes.

class _TraceState(threading.local):
    def __init__(self):
        self.graph: Graph | None = None
        self.device_tag: str | None = None
        self.name_scopes: list[str] = []
        self.grad_scope: str | None = None
        self.grad_of: Node | None = None       # the forward node whose gradient ops are being made


_state = _TraceState()
_next_id = 0                      # OneFlow's one global counter behind every "<Prefix><n>" name
_id_lock = threading.Lock()


def new_unique_id() -> int:
    global _next_id
    with _id_lock:
        value = _next_id
        _next_id += 1
        return value


def peek_unique_id() -> int:
    return _next_id


def reset_unique_ids():
    global _next_id
    with _id_lock:
        _next_id = 0


def current_graph(what: str = "this op") -> Graph:
    graph = _state.graph
    if graph is None:
        raise TraceError(
            f"{what} was called outside a job function: build ops inside a function decorated with "
            "@flow.global_function, which flowlab traces when the job is first needed")
    return graph


def tracing() -> bool:
    return _state.graph is not None


@contextlib.contextmanager
def trace_into(graph: Graph, replay_from: int | None = None):
    """Make ``graph`` the target of ops. ``replay_from`` re-uses a job's own names when it is traced again."""
    global _next_id
    if _state.graph is not None:
        raise TraceError(f"cannot trace job {graph.name!r} while job {_state.graph.name!r} is being traced: "
                         "call job functions from outside other job functions")
    saved = _next_id
    _state.graph = graph
    if replay_from is not None:
        _next_id = replay_from
    try:
        yield graph
    finally:
        _state.graph = None
        _state.device_tag = None
        _state.name_scopes = []
        if replay_from is not None:
            _next_id = saved


def unique_name(prefix: str) -> str:
    """OneFlow's ``id_util.UniqueStr``: ``prefix`` + the next value of one global counter, inside name scopes."""
    if _state.grad_scope is not None:
        return f"{_state.grad_scope}/{current_graph().local_name(prefix)}"
    return scoped_name(f"{prefix}{new_unique_id()}")


def scoped_name(name: str) -> str:
    return "".join(scope + "-" for scope in _state.name_scopes) + name


@contextlib.contextmanager
def grad_scope(forward_node: Node):
    """Gradient ops are named after the forward op they differentiate (without touching the global counter) and
    carry its source line and frames, so errors in a gradient point at the user's code."""
    saved = _state.grad_scope, _state.grad_of
    _state.grad_scope = f"System-AutoGrad-{forward_node.name}"
    _state.grad_of = forward_node
    try:
        yield
    finally:
        _state.grad_scope, _state.grad_of = saved


@contextlib.contextmanager
def name_scope(name: str):
    """``flow.scope.namespace``: prefixes names of ops and variables created inside with ``"<name>-"``."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name_scope: expected a non-empty string, got {name!r}")
    _state.name_scopes.append(name)
    try:
        yield
    finally:
        _state.name_scopes.pop()


@contextlib.contextmanager
def device_scope(device_tag: str):
    saved = _state.device_tag
    _state.device_tag = device_tag
    try:
        yield
    finally:
        _state.device_tag = saved


def current_device_tag():
    return _state.device_tag
