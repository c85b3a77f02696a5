"""Where a logdir's files are and how to read them: the local disk, or any filesystem fsspec can list.

``open_logdir(logdir)`` gives a ``LocalFiles`` (a path or file:// URL: ``os.walk``, ``os.stat`` and ``open``) or a
``RemoteFiles`` (``s3://``, ``gs://``, ``memory://``...: one recursive listing, which also gives every size, and
byte-range reads). Both offer the same calls: ``exists``, ``listing`` (every file, as run name, file name, path and
key), ``stat``, ``head`` and ``chunks`` (what the tailer reads of an event file).
"""
from __future__ import annotations

import os

from .redact import redact


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
            yield directory or ".", name, self.fs.unstrip_protocol(key), (key, int(info["size"]))

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
        return LocalFiles(text)
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
        return LocalFiles(root)
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    if protocols & set(UNLISTABLE):
        raise LogdirError(f"logdir {shown!r}: an http(s):// URL cannot be a logdir, because HTTP cannot list a "
                          f"directory (runs are found by listing the logdir and sizes are needed to tail each "
                          f"file); give {SUPPORTED}, or copy or mount the logs locally")
    return RemoteFiles(fs, root)



def reason(err: Exception) -> str:
    """An error as the short text ``stats()["errors"]`` shows: its type and its message."""
    return f"{type(err).__name__}: {getattr(err, 'strerror', None) or err}"
