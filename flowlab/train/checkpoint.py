"""``flow.train.CheckPoint``: initialise, save and load every session variable (OneFlow 0.x semantics).

A checkpoint is a directory holding ``meta.json`` (format, version, and each variable's name, shape, dtype and
file), one ``.npy`` per variable (named by index, since variable names may hold any character) and the marker
``snapshot_done``. ``save`` writes all of it into a temporary sibling directory and renames that onto the target,
so a crash never leaves a directory that ``load`` accepts.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import warnings

import numpy as np

from ..errors import CheckpointError
from ..initializers import zeros_initializer
from ..runtime import backend, session

FORMAT, VERSION = "flowlab-checkpoint", 1
META, DONE = "meta.json", "snapshot_done"


def _trace_all_jobs(sess):
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


def _read_meta(path):
    """The checked variable entries of the checkpoint at ``path``: [(name, shape, dtype, file), ...]."""
    if not os.path.exists(path):
        raise CheckpointError(f"no checkpoint at {path!r}: the path does not exist")
    if not os.path.isdir(path):
        raise CheckpointError(f"no checkpoint at {path!r}: not a directory")
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


class CheckPoint:
    """``check_point = flow.train.CheckPoint(); check_point.init()`` or ``.load(path)``; ``.save(path)``."""

    def init(self):
        """Declare the variables of every defined job and (re)set all variables from their initializers."""
        sess = session.default()
        sess.sync()
        _trace_all_jobs(sess)
        with sess.lock:
            for var in sess.variables.values():
                var.initialize(sess.seed)

    def save(self, path):
        """Write every variable that has a value into the new checkpoint directory ``path`` (absent or empty)."""
        path = os.path.abspath(os.fspath(path))
        if os.path.lexists(path):
            if not os.path.isdir(path):
                raise CheckpointError(f"cannot save checkpoint to {path!r}: it exists and is not a directory")
            inside = sorted(os.listdir(path))
            if inside:
                shown = ", ".join(inside[:5]) + (f", ... ({len(inside)} entries)" if len(inside) > 5 else "")
                raise CheckpointError(f"cannot save checkpoint to {path!r}: the directory is not empty "
                                      f"(it holds {shown}); choose a new or empty directory")
        parent = os.path.dirname(path)
        os.makedirs(parent, exist_ok=True)
        sess = session.default()
        sess.sync()                 # no job call changes variables while we copy them
        be = backend.current()
        tmp = os.path.join(parent, f".{os.path.basename(path)}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        os.mkdir(tmp)
        try:
            entries = []
            with sess.lock:
                variables = [v for v in sess.variables.values() if v.value is not None]
                for i, var in enumerate(variables):
                    host = np.ascontiguousarray(be.to_host(var.value))
                    file = f"var{i:05d}.npy"
                    _write_synced(os.path.join(tmp, file), lambda f, a=host: np.save(f, a, allow_pickle=False))
                    entries.append({"name": var.name, "shape": list(host.shape), "dtype": str(host.dtype),
                                    "file": file})
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

    def load(self, path):
        """Set the session's variables from the checkpoint at ``path``; nothing changes if anything does not fit."""
        path = os.path.abspath(os.fspath(path))
        entries = _read_meta(path)
        arrays = {}
        for name, shape, dtype, file in entries:   # read everything first: a bad file must not half-load
            arrays[name] = _read_npy(os.path.join(path, file), name, shape, dtype, path)

        sess = session.default()
        sess.sync()
        _trace_all_jobs(sess)
        be = backend.current()
        with sess.lock:
            known = sess.variables
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
                if var.value is not None and var.value.shape == host.shape and var.value.dtype == host.dtype:
                    var.value[...] = be.asarray(host)   # in place: arrays captured elsewhere stay current
                else:
                    var.value = be.asarray(host)
            sess.initialize_missing()
        if missing:
            warnings.warn(f"checkpoint {path!r} has no values for variables {missing}; they keep their current or "
                          "initial values", stacklevel=2)


__all__ = ["CheckPoint"]
