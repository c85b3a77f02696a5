"""Where a logdir's files are and how to read them: the local disk, or any filesystem fsspec can list.

``open_logdir(logdir)`` gives a ``LocalFiles`` (a path or file:// URL: ``os.walk``, ``os.stat`` and ``open``) or a
``RemoteFiles`` (``s3://``, ``gs://``, ``memory://``...: one recursive listing, which also gives every size, and
byte-range reads). Both offer the same calls: ``exists``, ``listing`` (every file, as run name, file name, path and
key), ``stat``, ``head`` and ``chunks`` (what the tailer reads of an event file), and for a log's other files (the
projector's, the structure graph), which are read whole, ``signature`` (what changes when the file does) and
``directory(run)``: a ``LocalDirectory`` or ``RemoteDirectory`` that reads paths named by a log confined to the run
directory (``confined_path``: relative, no ``..``, no symbolic link out) and size-capped (``read_file_capped``).
Nothing else on flowlab's reading side opens a logdir's files, so a local path and an fsspec URL behave alike.
"""
from __future__ import annotations

import errno
import os
import stat as stat_mode
from typing import Any, NamedTuple

from .redact import redact


class AssetFile(NamedTuple):
    """A file of a run that is not an event file, as the last listing found it: ``path`` to show, ``key`` to open,
    and for remote files the listed ``size`` and ``version`` (ETag or modification time), None for local ones."""
    run: str
    path: str
    key: str
    size: Any = None
    version: Any = None


class LocalFiles:
    """A logdir on the local disk: ``os.walk``, ``os.stat`` and ``open``, reading up to the end of each file."""

    chunk_size = 32 << 20

    def __init__(self, path):
        self.root = self.name = os.path.abspath(path)

    def exists(self):
        return os.path.isdir(self.root)

    def listing(self, errors):
        """Yields (run name, file name, path, None); errors[path] = reason for directories that could not be read."""
        def walk_error(err):
            errors[err.filename or self.root] = reason(err)

        for dirpath, dirnames, filenames in os.walk(self.root, onerror=walk_error):
            errors.pop(dirpath, None)
            rel = os.path.relpath(dirpath, self.root)
            run_name = "." if rel == "." else rel.replace(os.sep, "/")
            for n in filenames:
                yield run_name, n, os.path.join(dirpath, n), None

    @staticmethod
    def signature(asset: AssetFile):
        """What changes when ``asset`` does (modification time, inode, size: writers replace such files by a rename),
        or None when it is gone."""
        try:
            st = os.stat(asset.key)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_ino, st.st_size

    def directory(self, run):
        """The run directory ``run`` (``"."``: the logdir) for reading a log's own files."""
        return LocalDirectory(self.root if run == "." else os.path.join(self.root, *run.split("/")))

    @staticmethod
    def stat(f):
        """(size, inode, modification time in ns)."""
        st = os.stat(f.key)
        return st.st_size, st.st_ino, st.st_mtime_ns

    @staticmethod
    def head(f, n):
        with open(f.key, "rb") as fh:
            return fh.read(n)

    @staticmethod
    def chunks(f, size, chunk_size):
        with open(f.key, "rb") as fh:           # module-level name: tests replace it to simulate unreadable files
            fh.seek(f.offset)
            while chunk := fh.read(chunk_size):
                yield chunk


class RemoteFiles:
    """A logdir behind an fsspec URL (``s3://bucket/prefix``, ``memory://``, ...): discovery by one recursive
    listing per poll, which also gives every size, then byte-range reads of what each file gained. Objects cannot be
    appended to in place, so a growing log is an object replaced by a longer one: its new bytes are its tail."""

    chunk_size = 8 << 20

    def __init__(self, fs, root):
        self.fs, self.root = fs, root.rstrip("/") or root
        self.name = fs.unstrip_protocol(self.root)

    def exists(self):
        self.fs.invalidate_cache()              # listings are cached by fsspec; the logdir may appear at any time
        return self.fs.isdir(self.root)

    def listing(self, errors):
        self.fs.invalidate_cache()
        try:
            found = self.fs.find(self.root, detail=True)
        except FileNotFoundError:
            found = {}
        prefix = self.root + "/"
        for key, info in found.items():
            if info.get("type") != "file" or not key.startswith(prefix):
                continue
            directory, _, name = key[len(prefix):].rpartition("/")
            version = next((info[k] for k in ("ETag", "etag", "LastModified", "mtime", "created") if k in info), None)
            yield directory or ".", name, self.fs.unstrip_protocol(key), (key, int(info["size"]), str(version))

    @staticmethod
    def signature(asset: AssetFile):
        """What changes when ``asset`` does: its listed size and version (an object is replaced whole)."""
        return asset.size, asset.version

    def directory(self, run):
        """The run directory ``run`` (``"."``: the logdir) for reading a log's own files."""
        return RemoteDirectory(self.fs, self.root if run == "." else f"{self.root}/{run}")

    @staticmethod
    def stat(f):
        return f.listed_size, None, None

    def head(self, f, n):
        return self.fs.cat_file(f.key, start=0, end=min(n, f.listed_size))

    def chunks(self, f, size, chunk_size):
        offset = f.offset
        while offset < size:
            data = self.fs.cat_file(f.key, start=offset, end=min(size, offset + chunk_size))
            if not data:
                return
            offset += len(data)
            yield data


# ------------------------------------------------------------------------------------------ a log's own files

class UnsafePath(ValueError):
    """A path named by a log (a projector config's) that leaves its run directory or names no regular file of
    bounded size."""


def relative_parts(rel, what) -> list[str]:
    """The components of ``rel``, a path a log names, when it is relative and has no ``..`` component; else
    :class:`UnsafePath` naming ``what`` and the path."""
    if not isinstance(rel, str) or not rel:
        raise UnsafePath(f"{what} path is empty")
    if "\0" in rel:
        raise UnsafePath(f"{what} path {rel!r} holds a NUL character")
    parts = rel.replace("\\", "/").split("/")
    if os.path.isabs(rel) or rel.startswith("\\") or (len(parts[0]) == 2 and parts[0][1] == ":"):
        raise UnsafePath(f"{what} path {rel!r} is absolute; expected a path relative to the run directory")
    if ".." in parts:
        raise UnsafePath(f"{what} path {rel!r} climbs out with '..'; expected a path inside the run directory")
    return [p for p in parts if p not in ("", ".")]


def confined_path(logdir, rel, what) -> str:
    """The real path of ``rel`` (a path from ``logdir``'s projector config) when it stays inside ``logdir``: relative,
    no ``..`` component, no symbolic link leading out. Raises :class:`UnsafePath` naming ``what`` and the path."""
    parts = relative_parts(rel, what)
    root = os.path.realpath(logdir)
    real = os.path.realpath(os.path.join(root, *parts))
    if os.path.commonpath([root, real]) != root:
        raise UnsafePath(f"{what} path {rel!r} leads out of the run directory through a symbolic link (to {real!r})")
    return real


def read_file_capped(path, what, cap) -> bytes:
    """The bytes of ``path`` when it is a regular file of at most ``cap`` bytes, else :class:`UnsafePath` naming
    ``what``. Opened non-blocking (a FIFO would otherwise block the open) and checked on the open descriptor."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0))
    except OSError as e:
        if e.errno == getattr(errno, "ELOOP", None):    # O_NOFOLLOW met a link swapped in after the check
            raise UnsafePath(f"{what} ({path!r}) became a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat_mode.S_ISREG(st.st_mode):
            mode = st.st_mode
            kind = ("a FIFO" if stat_mode.S_ISFIFO(mode) else "a device" if stat_mode.S_ISCHR(mode)
                    or stat_mode.S_ISBLK(mode) else "a directory" if stat_mode.S_ISDIR(mode) else "not a regular file")
            raise UnsafePath(f"{what} ({path!r}) is {kind}; expected a regular file")
        if st.st_size > cap:
            raise UnsafePath(f"{what} ({path!r}) holds {st.st_size} bytes; at most {cap} are read")
        chunks, size = [], 0
        while size <= cap:
            chunk = os.read(fd, min(1 << 20, cap + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > cap:                                      # grew after the fstat
        raise UnsafePath(f"{what} ({path!r}) holds more than {cap} bytes; at most {cap} are read")
    return b"".join(chunks)


class LocalDirectory:
    """A run directory on the local disk, read as a log's own files are: paths confined to it, files size-capped.
    ``locate`` gives what ``read_located`` reads (a real path), so a path checked once is read later as it was."""

    def __init__(self, root):
        self.root = self.name = os.fspath(root)

    def lexists(self, rel) -> bool:
        return os.path.lexists(os.path.join(self.root, rel))

    def locate(self, rel, what) -> str:
        return confined_path(self.root, rel, what)

    def read(self, rel, what, cap) -> bytes:
        return read_file_capped(self.locate(rel, what), f"{what} {rel!r}", cap)

    @staticmethod
    def read_located(located, what, cap) -> bytes:
        return read_file_capped(located, what, cap)


class RemoteDirectory:
    """A run directory behind an fsspec URL, read as ``LocalDirectory`` reads (objects have no symbolic links: a
    path is confined by its components alone)."""

    def __init__(self, fs, root):
        self.fs, self.root = fs, root
        self.name = fs.unstrip_protocol(root)

    def _key(self, rel, what):
        return "/".join([self.root, *relative_parts(rel, what)])

    def lexists(self, rel) -> bool:
        return self.fs.exists(f"{self.root}/{rel}")

    def locate(self, rel, what) -> str:
        return self._key(rel, what)

    def read(self, rel, what, cap) -> bytes:
        return self.read_located(self.locate(rel, what), f"{what} {rel!r}", cap)

    def read_located(self, key, what, cap) -> bytes:
        info = self.fs.info(key)
        shown = redact(self.fs.unstrip_protocol(key))
        if info.get("type") != "file":
            raise UnsafePath(f"{what} ({shown!r}) is a directory; expected a regular file")
        if int(info.get("size") or 0) > cap:
            raise UnsafePath(f"{what} ({shown!r}) holds {info['size']} bytes; at most {cap} are read")
        data = self.fs.cat_file(key, start=0, end=cap + 1)
        if len(data) > cap:                             # grew after the listing
            raise UnsafePath(f"{what} ({shown!r}) holds more than {cap} bytes; at most {cap} are read")
        return data


class LogdirError(ValueError):
    """A logdir that cannot be read at all (not a path, a URL fsspec cannot open, or one that cannot be listed);
    the message names it with its credentials redacted."""


# fsspec protocols whose filesystems cannot list a directory: HTTP has no listing, and fsspec's HTTP filesystem
# only scrapes the links of an HTML index page, without sizes (its entries say ``size: None``), so runs could be
# neither discovered nor tailed reliably.
UNLISTABLE = ("http", "https")
SUPPORTED = ("a local path or file:// URL, or the URL of a filesystem fsspec can list recursively: s3://, gs://, "
             "az:// / abfs://, hdfs://, sftp://, memory://...")


def open_logdir(logdir, storage_options=None):
    """The file access for ``logdir``: a local path (or file:// URL) reads the disk directly, other URLs go through
    fsspec. Raises ``LogdirError`` for a URL that cannot be a logdir (http:// and https:// among them)."""
    text = os.fspath(logdir)
    if "://" not in text and "::" not in text:
        return _not_a_file(LocalFiles(text), os.path.exists(text) and not os.path.isdir(text))
    import fsspec
    from fsspec.implementations.local import LocalFileSystem
    shown = redact(text)
    try:
        fs, root = fsspec.core.url_to_fs(text, **(storage_options or {}))
    except ImportError as err:
        raise ImportError(f"logdir {shown!r}: its protocol needs a package that is not installed "
                          f"({redact(err)}); for s3:// URLs install flowlab[s3]") from None
    except ValueError as err:
        raise LogdirError(f"logdir {shown!r}: expected a local path or an fsspec URL such as s3://bucket/prefix, "
                          f"but fsspec cannot open it: {redact(err)}") from None
    if isinstance(fs, LocalFileSystem):
        return _not_a_file(LocalFiles(root), os.path.exists(root) and not os.path.isdir(root))
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    if protocols & set(UNLISTABLE):
        raise LogdirError(f"logdir {shown!r}: an http(s):// URL cannot be a logdir, because HTTP cannot list a "
                          f"directory (runs are found by listing the logdir and sizes are needed to tail each "
                          f"file); give {SUPPORTED}, or copy or mount the logs locally")
    files = RemoteFiles(fs, root)
    try:
        is_file = fs.isfile(files.root)
    except Exception:                           # noqa: BLE001 - unreachable now: the polls will say so
        is_file = False
    return _not_a_file(files, is_file)


def _not_a_file(files, is_file):
    """``files``, unless its logdir is a file (an event file given for its folder, say): ``LogdirError`` then, where
    the polls would otherwise wait forever for a folder to appear."""
    if is_file:
        name = redact(files.name)
        hint = (f"; its folder {redact(os.path.dirname(files.name)) or '.'!r} holds it as a run"
                if "tfevents" in os.path.basename(files.name) else "")
        raise LogdirError(f"logdir {name!r} is a file; expected a folder of runs (a folder holding *tfevents* "
                          f"files, or their parent folder){hint}")
    return files



def reason(err: Exception) -> str:
    """An error as the short text ``stats()["errors"]`` shows: its type and its message."""
    return f"{type(err).__name__}: {getattr(err, 'strerror', None) or err}"
