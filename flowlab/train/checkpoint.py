"""``flow.train.CheckPoint`` and the checkpoint directory format that it and ``flow.checkpoint`` share.

flowlab writes a checkpoint as a directory holding ``meta.json`` (format, version, and each variable's name, shape,
dtype and file), one ``.npy`` per variable (named by index, since variable names may hold any character) and the
marker ``snapshot_done``. Saving writes all of it into a temporary sibling directory and renames that onto the
target, so a crash never leaves a directory that loading accepts.

Loading also reads OneFlow's own layout: one directory per variable holding the raw bytes in ``out`` and, from
OneFlow's model I/O v2 on, the text ``meta`` (``shape { dim: 3 dim: 4 } data_type: kFloat``). A variable saved
without ``meta`` (OneFlow's legacy saves) takes its shape and dtype from the session variable it is loaded into.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import warnings

import numpy as np

from .. import config
from ..errors import CheckpointError
from ..initializers import zeros_initializer
from ..runtime import backend, session

FORMAT, VERSION = "flowlab-checkpoint", 1
META, DONE = "meta.json", "snapshot_done"
ONEFLOW_DATA, ONEFLOW_META = "out", "meta"     # OneFlow's per-variable file names
# OneFlow's DataType enum names (data_type.proto) for the dtypes flowlab has.
ONEFLOW_DTYPES = {"kChar": np.int8, "kFloat": np.float32, "kDouble": np.float64, "kInt8": np.int8,
                  "kInt32": np.int32, "kInt64": np.int64, "kUInt8": np.uint8, "kFloat16": np.float16}


def trace_all_jobs(sess):
    """Trace every job not traced yet, so the variables it declares are known (OneFlow knows them up front)."""
    for job in list(sess.jobs):
        if not job.traced:          # a job traced for other shapes already declared its variables
            job.compiled()


def _fsync_dir(path):
    if hasattr(os, "O_DIRECTORY"):  # POSIX only: makes the directory's entries (new files, renames) durable
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_synced(path, write):
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def _corrupt(path, why):
    return CheckpointError(f"incomplete or corrupt checkpoint at {path!r}: {why}")


def checked_path(path, caller):
    """``path`` as an absolute str; a clear error naming ``caller``'s argument when it is not a path at all."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{caller}: path must be a str or os.PathLike, got {type(path).__name__} {path!r}")
    path = os.fspath(path)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not path:
        raise CheckpointError(f"{caller}: path is empty")
    return os.path.abspath(path)


def _read_meta(path):
    """The checked variable entries of the checkpoint at ``path``: [(name, shape, dtype, file), ...]."""
    if not os.path.isfile(os.path.join(path, DONE)):
        raise _corrupt(path, f"{DONE!r} is missing (the save did not finish, or this is not a flowlab checkpoint)")
    try:
        with open(os.path.join(path, META), encoding="utf-8") as f:
            meta = json.load(f)
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise ValueError(f"format {meta.get('format')!r} version {meta.get('version')!r}, "
                             f"expected {FORMAT!r} version {VERSION}")
        entries = []
        for e in meta["variables"]:
            name, file = e["name"], e["file"]
            if not isinstance(name, str) or not isinstance(file, str) or os.path.basename(file) != file \
                    or file in ("", ".", ".."):
                raise ValueError(f"bad variable entry {e!r}")
            entries.append((name, tuple(int(d) for d in e["shape"]), np.dtype(e["dtype"]), file))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise _corrupt(path, f"{META}: {type(e).__name__}: {e}") from None
    return entries


def _read_npy(file_path, name, shape, dtype, path):
    """The array in ``file_path``, after checking its ``.npy`` header against ``meta.json`` and against the file's
    size: ``np.load`` would otherwise allocate whatever a damaged header declares (2^40 elements: a MemoryError)
    before finding the data missing."""
    where = f"variable {name!r} ({file_path})"
    try:
        with open(file_path, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                header = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                header = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f".npy format version {version} (np.save writes 1.0 or 2.0)")
            got_shape, fortran, got_dtype = header
            if got_shape != shape or got_dtype != dtype:
                raise _corrupt(path, f"{where}: its header declares shape {got_shape} dtype {got_dtype}, "
                                     f"{META} says shape {shape} dtype {dtype}")
            if got_dtype.hasobject:
                raise ValueError(f"dtype {got_dtype} holds Python objects")
            declared = int(np.prod(got_shape, dtype=object)) * got_dtype.itemsize
            held = os.fstat(f.fileno()).st_size - f.tell()
            if held != declared:
                raise _corrupt(path, f"{where}: its header declares shape {got_shape} dtype {got_dtype} "
                                     f"({declared:,} bytes of data), but the file holds {held:,} bytes")
            data = np.fromfile(f, dtype=got_dtype, count=int(np.prod(got_shape, dtype=object)))
            return data.reshape(got_shape, order="F" if fortran else "C")
    except CheckpointError:
        raise
    except MemoryError:
        raise MemoryError(f"not enough memory to load {where} of shape {shape} dtype {dtype} from checkpoint "
                          f"{path!r}") from None
    except (OSError, ValueError) as e:
        raise _corrupt(path, f"{where}: {type(e).__name__}: {e}") from None


def _read_oneflow_meta(meta_path, path):
    """(shape, dtype) from OneFlow's text-format ``VariableMetaInfo`` file."""
    try:
        with open(meta_path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, ValueError) as e:
        raise _corrupt(path, f"{meta_path}: {type(e).__name__}: {e}") from None
    kind = re.search(r"data_type\s*:\s*(\w+)", text)
    if kind is None or kind.group(1) not in ONEFLOW_DTYPES:
        raise _corrupt(path, f"{meta_path}: data_type {kind and kind.group(1)!r} is not one of "
                             f"{sorted(ONEFLOW_DTYPES)}")
    shape = re.search(r"shape\s*\{([^}]*)\}", text)
    dims = re.findall(r"dim\s*:\s*(-?\d+)", shape.group(1)) if shape else []
    if any(int(d) < 0 for d in dims):
        raise _corrupt(path, f"{meta_path}: negative dimension in shape {dims}")
    return tuple(int(d) for d in dims), np.dtype(ONEFLOW_DTYPES[kind.group(1)])


class SavedVariable:
    """One variable of a checkpoint on disk (``flow.checkpoint.get``): ``shape``, ``dtype``, and ``numpy()``,
    which reads (and checks) the file each time it is called.

    ``shape`` and ``dtype`` are None for a OneFlow variable saved without its ``meta`` file; loading it into a
    session variable reads it with that variable's shape and dtype.
    """

    def __init__(self, name, file_path, shape, dtype, checkpoint_path, layout):
        self.name, self.file_path, self.checkpoint_path, self.layout = name, file_path, checkpoint_path, layout
        self.shape, self.dtype = shape, dtype

    def numpy(self):
        if self.shape is None:
            raise CheckpointError(f"variable {self.name!r} of checkpoint {self.checkpoint_path!r} was saved without "
                                  f"its {ONEFLOW_META!r} file, so its shape and dtype are unknown; load it into a "
                                  "variable with flow.load_variables, which reads it with that variable's shape")
        return self.read_as(self.shape, self.dtype)

    def read_as(self, shape, dtype):
        """The values, read as ``shape`` and ``dtype`` (the saved ones when the file records them)."""
        if self.layout == "flowlab":
            return _read_npy(self.file_path, self.name, self.shape, self.dtype, self.checkpoint_path)
        shape, dtype = tuple(shape), np.dtype(dtype)
        declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
        try:
            held = os.path.getsize(self.file_path)
            if held != declared:
                raise _corrupt(self.checkpoint_path, f"variable {self.name!r} ({self.file_path}): shape {shape} "
                                                     f"dtype {dtype} needs {declared:,} bytes, the file holds "
                                                     f"{held:,}")
            return np.fromfile(self.file_path, dtype=dtype).reshape(shape)
        except OSError as e:
            raise _corrupt(self.checkpoint_path, f"variable {self.name!r}: {type(e).__name__}: {e}") from None

    def __repr__(self):
        return f"SavedVariable({self.name!r}, shape={self.shape}, dtype={self.dtype}, file={self.file_path!r})"


def _oneflow_variable(var_dir, name, path):
    meta_path = os.path.join(var_dir, ONEFLOW_META)
    shape, dtype = _read_oneflow_meta(meta_path, path) if os.path.isfile(meta_path) else (None, None)
    variable = SavedVariable(name, os.path.join(var_dir, ONEFLOW_DATA), shape, dtype, path, "oneflow")
    if shape is not None:      # checked now, without reading the data: get() must not hand out a bad file
        declared, held = int(np.prod(shape, dtype=object)) * dtype.itemsize, os.path.getsize(variable.file_path)
        if held != declared:
            raise _corrupt(path, f"variable {name!r} ({variable.file_path}): its meta says shape {shape} dtype "
                                 f"{dtype} ({declared:,} bytes), the file holds {held:,} bytes")
    return variable


def read_checkpoint(path, caller="flow.checkpoint.get"):
    """The variables saved at ``path``, by name, as ``SavedVariable`` objects (nothing read yet but the metadata).

    ``path`` is a flowlab checkpoint, a OneFlow model directory (one ``<name>/out`` per variable), or one OneFlow
    variable directory; the last gives a single ``SavedVariable``, as in OneFlow.
    """
    path = checked_path(path, caller)
    if not os.path.exists(path):
        raise CheckpointError(f"{caller}: no checkpoint at path {path!r}: the path does not exist")
    if not os.path.isdir(path):
        raise CheckpointError(f"{caller}: no checkpoint at path {path!r}: not a directory")
    if os.path.isfile(os.path.join(path, ONEFLOW_DATA)):
        return _oneflow_variable(path, os.path.basename(path), path)
    oneflow_dirs = [entry for entry in sorted(os.listdir(path))
                    if os.path.isfile(os.path.join(path, entry, ONEFLOW_DATA))]
    # OneFlow writes snapshot_done too: a flowlab checkpoint is one with meta.json, or one with no variable dirs.
    if os.path.exists(os.path.join(path, META)) or (not oneflow_dirs and os.path.exists(os.path.join(path, DONE))):
        return {name: SavedVariable(name, os.path.join(path, file), shape, dtype, path, "flowlab")
                for name, shape, dtype, file in _read_meta(path)}
    variables = {entry: _oneflow_variable(os.path.join(path, entry), entry, path) for entry in oneflow_dirs}
    if not variables:
        raise _corrupt(path, f"it holds neither {META!r} (flowlab) nor <variable>/{ONEFLOW_DATA} directories "
                             "(OneFlow)")
    return variables


def write_checkpoint(path, collect, caller):
    """Save the ``(name, host array)`` pairs that ``collect()`` yields into the new directory ``path``.

    ``path`` must be absent or empty. ``collect`` runs under the session lock, so no job changes a variable while
    it is written. Everything goes into a temporary sibling first and is renamed onto ``path`` at the end.
    """
    path = checked_path(path, caller)
    if os.path.lexists(path):
        if not os.path.isdir(path):
            raise CheckpointError(f"{caller}: cannot save checkpoint to path {path!r}: it exists and is not a "
                                  "directory")
        inside = sorted(os.listdir(path))
        if inside:
            shown = ", ".join(inside[:5]) + (f", ... ({len(inside)} entries)" if len(inside) > 5 else "")
            raise CheckpointError(f"{caller}: cannot save checkpoint to path {path!r}: the directory is not empty "
                                  f"(it holds {shown}); choose a new or empty directory")
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    sess = session.default()
    sess.sync()                 # no job call changes variables while we copy them
    tmp = os.path.join(parent, f".{os.path.basename(path)}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    os.mkdir(tmp)
    try:
        entries = []
        with sess.lock:
            for i, (name, host) in enumerate(collect()):
                host = np.ascontiguousarray(host)
                file = f"var{i:05d}.npy"
                _write_synced(os.path.join(tmp, file), lambda f, a=host: np.save(f, a, allow_pickle=False))
                entries.append({"name": name, "shape": list(host.shape), "dtype": str(host.dtype), "file": file})
        meta = {"format": FORMAT, "version": VERSION, "variables": entries}
        _write_synced(os.path.join(tmp, META), lambda f: f.write(json.dumps(meta, indent=1).encode()))
        _write_synced(os.path.join(tmp, DONE), lambda f: None)     # last: marks the snapshot complete
        _fsync_dir(tmp)
        try:
            os.rename(tmp, path)    # POSIX renames onto an empty directory atomically
        except OSError:
            if not os.path.isdir(path) or os.listdir(path):
                raise
            os.rmdir(path)          # platforms that refuse to rename onto an existing directory
            os.rename(tmp, path)
        _fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def assign(var, host, be):
    """Set ``var`` to the host array ``host`` (same shape and dtype), in place when it already has an array:
    arrays captured elsewhere (compiled plans) stay current. Call under the session lock."""
    if var.value is not None and var.value.shape == host.shape and var.value.dtype == host.dtype:
        var.value[...] = be.asarray(host)
        var.fresh = False               # (set in place: no longer its initializer's value)
    else:
        var.value = be.asarray(host)


class CheckPoint:
    """``check_point = flow.train.CheckPoint(); check_point.init()`` or ``.load(path)``; ``.save(path)``.

    With ``flow.config.enable_legacy_model_io(False)`` (OneFlow's model I/O v2), constructing one warns that the
    API is deprecated and ``init()`` does nothing: variables initialise themselves before their first use and
    values set by ``flow.load_variables`` stay. ``save`` and ``load`` work the same either way.
    """

    def __init__(self):
        if not config.legacy_model_io_enabled():
            warnings.warn("flow.train.CheckPoint is deprecated with flow.config.enable_legacy_model_io(False); use "
                          "flow.checkpoint.save(path) for save(path), flow.load_variables(flow.checkpoint.get(path)) "
                          "for load(path); init() is not needed any more", FutureWarning, stacklevel=2)

    def init(self):
        """Declare the variables of every defined job and (re)set all variables from their initializers."""
        if not config.legacy_model_io_enabled():
            return
        sess = session.default()
        sess.sync()
        trace_all_jobs(sess)
        with sess.lock:
            for var in sess.variables.values():
                var.initialize(sess.seed)

    def save(self, path):
        """Write every variable that has a value into the new checkpoint directory ``path`` (absent or empty)."""
        def collect():
            be = backend.current()
            for var in session.default().variables.values():
                if var.value is not None:
                    yield var.name, be.to_host(var.value)
        write_checkpoint(path, collect, "flow.train.CheckPoint.save")

    def load(self, path):
        """Set the session's variables from the checkpoint at ``path``; nothing changes if anything does not fit.

        Variables the checkpoint holds that no job declares yet are kept, so a job defined later starts from them.
        """
        saved = read_checkpoint(path, "flow.train.CheckPoint.load")
        path = checked_path(path, "flow.train.CheckPoint.load")
        if isinstance(saved, SavedVariable):
            raise CheckpointError(f"flow.train.CheckPoint.load: path {path!r} is one variable's directory; pass "
                                  "the model directory that holds it")
        sess = session.default()
        sess.sync()
        trace_all_jobs(sess)
        known = sess.variables
        arrays, shapeless = {}, []
        for name, variable in saved.items():   # read everything first: a bad file must not half-load
            if variable.shape is None:
                if name not in known:
                    shapeless.append(name)      # a OneFlow file without meta that no job declares: no shape known
                    continue
                arrays[name] = variable.read_as(known[name].shape, known[name].dtype)
            else:
                arrays[name] = variable.numpy()

        be = backend.current()
        with sess.lock:
            mismatched = [f"{name!r}: expected shape {known[name].shape} dtype {known[name].dtype} (session), "
                          f"got shape {a.shape} dtype {a.dtype} (checkpoint)"
                          for name, a in arrays.items()
                          if name in known and (known[name].shape != a.shape or known[name].dtype != a.dtype)]
            if mismatched:
                raise CheckpointError(f"cannot load checkpoint {path!r}; variables do not match:\n  "
                                      + "\n  ".join(mismatched))
            missing = [name for name in known if name not in arrays]
            for name, host in arrays.items():
                var = known.get(name)
                if var is None:
                    # Not declared by any job yet: keep it, so a job declaring it later starts from these values.
                    var = sess.declare(name, host.shape, host.dtype, zeros_initializer(), False,
                                       source=f"checkpoint {path}", provisional=True)
                assign(var, host, be)
            sess.initialize_missing()
        if missing:
            warnings.warn(f"checkpoint {path!r} has no values for variables {missing}; they keep their current or "
                          "initial values", stacklevel=2)
        if shapeless:
            warnings.warn(f"checkpoint {path!r}: skipped {shapeless}, saved by OneFlow without their meta files and "
                          "declared by no defined job, so their shapes are unknown", stacklevel=2)


__all__ = ["CheckPoint"]
