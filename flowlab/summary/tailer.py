"""Incremental reading of a TensorBoard logdir: what the dashboard polls.

``LogdirTailer(logdir).poll()`` returns the items (:class:`Datum`) completed since the previous poll.

Design
- Discovery: every poll walks the logdir (``os.walk``), or for an fsspec URL (``s3://bucket/prefix``...) lists it
  recursively once (http(s):// URLs cannot be listed and are refused: ``LogdirError``). A run is a directory (the logdir itself is run ``"."``) holding files whose name contains
  ``tfevents``; its name is the path relative to the logdir with ``/`` separators. Runs are visited in name order and
  a run's files in name order, as TensorBoard orders them.
- Per file we keep the byte offset read so far and the unconsumed tail (a partial last record). A poll stats the file
  (remote files: the size the listing gave) and reads only the bytes beyond the offset (remote: byte-range reads), so
  polling an unchanged logdir reads nothing. A vanished or unreadable file is reported in ``stats()`` and never
  raises; an unreadable one is retried on later polls, and so is a remote listing that failed (the files already
  known are kept meanwhile).
- Files are known by more than their name: inode (local files), size, and the CRC-32C of their first bytes (the
  first record, widened to up to ``HEAD_BYTES`` of what was read; remote files have no inode, so only size and
  these). A file that grows and still begins with those bytes is the same file, even under a new inode (rsync's
  temporary copy renamed over it): it is read on from its offset. A new name that begins like a known file of its
  run and is at least as long takes over that file's reading when that file is gone or its path now holds
  something else (rotation to ``<name>.1`` with the writer going on under the old name, an object store's copy +
  delete); while that file is still there the new name is a copy (rsync's temporary file, a backup) and is not
  read. A file that shrank or no longer begins with its first bytes (truncated, rewritten, replaced) is read again
  from its start, after a ``kind="reread"`` item telling the consumer which steps of which tags the file had given
  so that it drops them: a step never shows twice from one file, and a rewritten step shows its new value.
  ``stats()`` counts both (``followed``, ``resets``) and lists the latest (``changes``).
- Framing: ``_hop`` walks from record to record in a tight loop computing each payload's CRC-32C; NumPy then checks
  every length checksum and data checksum at once. A bad record is skipped as ``record.RecordScanner`` skips it (find
  the next place where a length and its checksum agree and the data checks out, count one corrupt record per damaged
  stretch), but the search is ``record.next_record``, vectorised, so its cost is linear in the damaged bytes; see
  ``_split`` for why scattered damage stays linear too. Each file may search ``resync_budget`` bytes of damage per
  poll; the rest waits for the next poll, so a file of junk never delays the other files' new records.
- Decoding: plain scalar records (``Event{wall_time, step, summary{value{tag, simple_value or one-float tensor}}}``,
  the bulk of most logs, as tensorboardX, torch, TensorFlow and flowlab write them) are decoded column-wise with NumPy
  straight from the wire bytes; every other record is parsed with upb into an ``Event``. Legacy values
  (``simple_value``, ``histo``, ``image``, ``audio``) and tensor values are read alike; a tensor's meaning comes from
  its tag's plugin, fixed per run by the first metadata seen, as TensorBoard's ``EventAccumulator`` fixes it. Most
  writers send metadata only with a tag's first value, so when that record is damaged TensorBoard loses the whole
  tag; here the tag takes the plugin another run gave it, else one inferred from its value (``infer_plugin``), until
  real metadata arrives. A tensor's declared shape must agree with the data the record carries
  (``check_tensor_shape``), else the whole record is skipped and counted like a bad checksum: TensorBoard fills a
  shape from one value, so a record of under 100 bytes of shape [8192, 8192] cost 512 MiB and one of 2^40 elements
  raised ``MemoryError`` out of ``poll()``. Decoding a record thus costs memory proportional to its size.
- Restarts follow ``EventAccumulator``: in a run whose files declare ``brain.Event:2`` (every current writer), each
  ``SessionLog`` START after the first drops the run's data with step >= its step; in older files an event whose step
  is below the previous summary event's step drops its own tags' data with step >= its step. The tailer keeps no
  data, so it reports each such drop as a ``kind="purge"`` item, in order, for the consumer's store to apply.
"""
from __future__ import annotations

import collections
import math
import os
import struct
from typing import Any, NamedTuple

import numpy as np
from crc32c import crc32c
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from . import proto
from .record import FOOTER, HEADER, masked_crc, next_record
from .redact import redact

CHANGES_KEPT = 20                 # files re-read or followed that ``stats()["changes"]`` lists, newest last
HEAD_BYTES = 1 << 16              # a file's first bytes, up to this many (its whole first record at least), identify it
GRAPH_TAG = "__run_graph__"       # TensorBoard's tag for a run's graph
KINDS = frozenset({"scalar", "histogram", "image", "audio", "text", "tensor", "hparams", "health", "graph",
                   "meta_graph", "run_metadata", "session_log", "log_message"})


class Datum(NamedTuple):
    """One decoded item of a run.

    ``kind`` and ``value``:
      scalar       float
      histogram    float64 array [k, 3] of (left, right, count) rows (legacy buckets converted as TensorBoard does)
      image        :class:`Image`
      audio        list of encoded clips (bytes)
      text         str for a rank-0 tensor, else a NumPy object array of str
      tensor       NumPy array (any other plugin, or none: see ``plugin``)
      health       float64 array [layers, statistics] of a ``flow.watch_health`` report (``health_log.decode`` with
                   ``plugin_content`` names them)
      hparams      dict of the ``HParamsPluginData`` (proto3 JSON field names; fields at defaults are absent)
      graph        serialized GraphDef bytes (tag ``GRAPH_TAG``); meta_graph: MetaGraphDef bytes (tag None)
      run_metadata serialized RunMetadata bytes
      session_log  dict(status=, msg=, checkpoint_path=), tag None; log_message: the message str, tag None
      purge        the consumer drops data of ``run`` with step >= ``step``: of the tags in ``value`` (a tuple), or of
                   every tag when ``value`` is None
      reread       a file of ``run`` is read again from its start (truncated, rewritten or replaced); ``value`` is
                   dict(path=, reason=, spans={tag: (first, last)}): the consumer drops the data of each tag with
                   first <= step <= last (what the file had given) before the items that follow. tag/step None
    With ``poll(columnar=True)``, scalars decoded column-wise (plain scalar records) come several to a Datum whose
    ``step``, ``wall_time`` and ``value`` are equal-length NumPy arrays (int64, float64, float64); other scalars still
    come one to a Datum, so consumers test ``isinstance(d.step, np.ndarray)``.
    """
    run: str
    tag: str | None
    kind: str
    step: Any
    wall_time: Any
    value: Any
    plugin: str = ""
    plugin_content: bytes = b""


class Image(NamedTuple):
    width: int
    height: int
    encoded: list       # encoded images (PNG bytes), one per sample


class _File:
    __slots__ = ("name", "path", "key", "offset", "tail", "ino", "in_bad_run", "listed_size", "head", "spans",
                 "copy_of", "mtime")

    def __init__(self, name, path, key, listed_size=None):
        self.name, self.path, self.key = name, path, key     # key: what the file system opens; path: what we report
        self.offset, self.tail, self.ino, self.in_bad_run = 0, b"", None, False
        self.listed_size = listed_size          # remote files: the size the last listing gave
        self.head = None                        # (n, CRC-32C of the first n bytes) once the first record is read
        self.spans = {}                         # tag -> [first, last] step of what was emitted from this file
        self.copy_of = None                     # a copy of this tracked file (same first record): not read
        self.mtime = None                       # local files: st_mtime_ns at the last poll

    def take_over(self, other):
        """Continue the stream ``other`` was reading (the same file under a new name)."""
        self.offset, self.tail, self.ino, self.in_bad_run = other.offset, other.tail, other.ino, other.in_bad_run
        self.head, self.spans, self.mtime = other.head, other.spans, other.mtime


class _Run:
    __slots__ = ("name", "files", "plugins", "inferred", "plugins_version", "file_version", "seen_start",
                 "most_recent_step", "start_file")

    def __init__(self, name):
        self.name, self.files, self.plugins = name, {}, {}      # plugins: tag -> (plugin_name, content)
        self.inferred = set()                   # tags whose plugin was inferred from a value, not read in metadata
        self.plugins_version = 0                # bumped whenever ``plugins`` changes
        self.file_version, self.seen_start, self.most_recent_step = None, False, -1
        self.start_file = None                  # the file that gave the run's first SessionLog START

    @property
    def versioned(self):
        return self.file_version is not None and self.file_version >= 2

    def set_plugin(self, tag, plugin, content, inferred=False):
        self.plugins[tag] = (plugin, content)
        (self.inferred.add if inferred else self.inferred.discard)(tag)
        self.plugins_version += 1
        return plugin, content


class _LocalFiles:
    """A logdir on the local disk: ``os.walk``, ``os.stat`` and ``open``, reading up to the end of each file."""

    chunk_size = 32 << 20

    def __init__(self, path):
        self.root = self.name = os.path.abspath(path)

    def exists(self):
        return os.path.isdir(self.root)

    def listing(self, errors):
        """Yields (run name, file name, path, None); errors[path] = reason for directories that could not be read."""
        def walk_error(err):
            errors[err.filename or self.root] = _reason(err)

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


class _RemoteFiles:
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


def _files(logdir, storage_options):
    """The file access for ``logdir``: a local path (or file:// URL) reads the disk directly, other URLs go through
    fsspec. Raises ``LogdirError`` for a URL that cannot be a logdir (http:// and https:// among them)."""
    text = os.fspath(logdir)
    if "://" not in text and "::" not in text:
        return _LocalFiles(text)
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
        return _LocalFiles(root)
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    if protocols & set(UNLISTABLE):
        raise LogdirError(f"logdir {shown!r}: an http(s):// URL cannot be a logdir, because HTTP cannot list a "
                          f"directory (runs are found by listing the logdir and sizes are needed to tail each "
                          f"file); give {SUPPORTED}, or copy or mount the logs locally")
    return _RemoteFiles(fs, root)


class LogdirTailer:
    """Reads every event file under ``logdir`` incrementally; see the module docstring.

    ``logdir``: a local path, or any fsspec URL (``s3://bucket/prefix``, ``gs://...``, ``memory://...``), with
    ``storage_options`` passed to its filesystem (credentials otherwise come from the usual environment).
    ``.logdir`` is the absolute local path or the normalised URL; ``exists()`` says whether it is there now."""

    max_record = 1 << 31
    resync_budget = 16 << 20     # bytes of damage searched per file and poll before the file waits for the next poll

    def __init__(self, logdir, storage_options=None):
        self._files = _files(logdir, storage_options)
        self.logdir = self._files.name
        self._runs: dict[str, _Run] = {}
        self._errors: dict[str, str] = {}
        self._deferred: set[str] = set()
        self._tag_plugins: dict[str, tuple] = {}    # tag -> (plugin, content) from metadata, in any run
        self._counts = dict(records_read=0, records_skipped=0, bytes_read=0, bytes_skipped=0, values_skipped=0,
                            resets=0, followed=0)
        self._changes = collections.deque(maxlen=CHANGES_KEPT)   # the latest files re-read or followed
        self._budget, self._resumed_at = 0, 0
        self._left, self.more = None, False     # this poll's byte allowance (poll's max_bytes); bytes left over
        self._reading = None                    # the name of the file being decoded

    @property
    def chunk_size(self):
        """Bytes read at once from one file, bounding memory on big files (local files: 32 MiB, remote: 8 MiB)."""
        return self._files.chunk_size

    def exists(self) -> bool:
        """Whether the logdir is there now (a directory, or for object stores a prefix holding objects). Never
        raises: an unreachable remote logdir counts as absent."""
        try:
            return bool(self._files.exists())
        except Exception:                       # noqa: BLE001 - remote stores raise many kinds; absent is the answer
            return False

    def poll(self, kinds=None, columnar=False, max_bytes=None) -> list[Datum]:
        """Items completed since the last poll, in file order (runs and files in name order).

        ``kinds``: a subset of ``KINDS`` to decode; others are skipped (purges and rereads always come).
        ``columnar``: scalars come as NumPy columns, one Datum per tag and stretch between purges (only their order
        relative to purges and rereads is kept), which is much cheaper for large logs. Never raises for damaged
        logs or unreadable files (see ``stats()["errors"]``). A file with more damage than ``resync_budget`` bytes
        is read on over later polls (``stats()["deferred"]``), so one file of junk never holds up the others.

        ``max_bytes``: read about that many bytes at most (whole chunks), leaving the rest for the next poll, and set
        ``more``: a consumer that samples or drops what it gets (the dashboard's store) keeps its peak memory near
        ``max_bytes`` on a big logdir by polling until ``more`` is False.
        """
        wanted = None if kinds is None else frozenset(kinds)
        out: list[Datum] = []
        self._deferred.clear()
        resuming = self.more                    # the last poll stopped at max_bytes: go on without listing again
        self._left, self.more = max_bytes, False
        if not resuming:
            self._discover()
        for name in sorted(self._runs):
            run = self._runs[name]
            for file_name in sorted(run.files):
                self._read(run, run.files[file_name], wanted, columnar, out)
        return out

    def stats(self) -> dict:
        """Counters: runs (seen so far), files (tracked now), records_read (checksum-valid), records_skipped (corrupt
        stretches skipped, undecodable events, and events holding a tensor whose declared shape disagrees with its data:
        ``check_tensor_shape``), bytes_read, bytes_skipped, values_skipped (undecodable values),
        resets (files read again from the start: truncated, rewritten in place, or replaced by a file that does not
        begin with the same bytes), followed (files read on where they were under a new name or a new inode:
        renamed, or replaced by a longer copy as rsync does), changes (the latest ``CHANGES_KEPT`` of those, oldest
        first: dicts of path, reason and, for a re-read, ``spans`` {tag: (first, last) step} of what the file had
        given), deferred (files whose damaged bytes are searched on at the next poll, the budget of this one spent),
        and errors {path: reason} for paths unreadable at the last poll ("PermissionError: ...") or gone
        ("vanished"); remote paths are URLs, shown (as the reasons) with their credentials redacted
        (``redact.redact``)."""
        return dict(runs=len(self._runs), files=sum(len(r.files) for r in self._runs.values()), **self._counts,
                    deferred=len(self._deferred),
                    changes=[dict(c, path=redact(c["path"]), reason=redact(c["reason"])) for c in self._changes],
                    errors={redact(path): redact(why) for path, why in self._errors.items()})

    # -- discovery and reading ---------------------------------------------------------------------------------
    def _discover(self):
        present, new = set(), []
        try:
            for run_name, n, path, remote in self._files.listing(self._errors):
                if "tfevents" not in n or n.endswith(".profile-empty"):
                    continue
                run = self._runs.get(run_name) or self._runs.setdefault(run_name, _Run(run_name))
                present.add(path)
                f = run.files.get(n)
                if f is None:
                    f = run.files[n] = _File(n, path, *(remote or (path,)))
                    if self._errors.get(path) == "vanished":
                        del self._errors[path]
                    new.append((run, f))
                elif remote:
                    f.listed_size = remote[1]
                if f.copy_of is not None:
                    new.append((run, f))
        except Exception as err:                # noqa: BLE001 - a failed remote listing: keep what we know, retry
            self._errors[self.logdir] = _reason(err)
            return
        if isinstance(self._files, _RemoteFiles):
            self._errors.pop(self.logdir, None)
        for run, f in new:
            self._match(run, f, present)
        for run in self._runs.values():
            for n in [n for n, f in run.files.items() if f.path not in present]:
                g = run.files.pop(n)
                if g.copy_of is None:           # a copy that went away was never shown: nothing vanished
                    self._errors[g.path] = "vanished"

    def _match(self, run, f, present):
        """Whether the new file ``f`` is a file of ``run`` already read, under another name: one that begins with
        the same bytes (``head``) and is no shorter than what was read of it. If that file is gone from its path or
        its path now holds something else (renamed to ``<name>.1``, the writer going on under the old name; an
        object store's copy + delete), ``f`` takes over its stream and is read on from where it was. If it is still
        there, ``f`` is a copy (a backup, or rsync's temporary file, which is also a copy while it is shorter: all
        its bytes so far are the file's first bytes): it is not read, so no step shows twice, and it is looked at
        again at the next poll."""
        f.copy_of = None
        known = [g for g in run.files.values() if g is not f and g.head is not None and g.copy_of is None]
        if not known:
            return
        try:
            size, ino, mtime = self._files.stat(f)
            start = self._files.head(f, min(size, HEAD_BYTES))
        except Exception:                       # noqa: BLE001 - unreadable or gone: _read reports it
            return
        for g in known:
            if size >= g.offset:
                if len(start) < g.head[0] or self._head(start, g.head[0]) != g.head:
                    continue
            elif g.path not in present or not start or not self._begins(g, start):
                continue                        # shorter: only ever a copy being written, of a file still there
            if g.path in present:
                try:
                    verdict, _ = self._verdict(g, *self._files.stat(g))
                except Exception:               # noqa: BLE001 - it went away meanwhile
                    verdict = "gone"
                if verdict != "reread":
                    f.copy_of = g.name
                    return
                if size < g.offset:
                    continue
            f.take_over(g)
            f.ino, f.mtime = ino, mtime
            if run.start_file == g.name:
                run.start_file = f.name
            self._counts["followed"] += 1
            self._changes.append(dict(path=f.path, reason=f"renamed from {g.name}: read on where it was"))
            if g.path in present:               # the old name holds a new file now: read it from its start
                run.files[g.name] = _File(g.name, g.path, g.key, g.listed_size)
            else:
                del run.files[g.name]
            return

    def _begins(self, g, start) -> bool:
        """Whether the file ``g`` begins with the bytes ``start``."""
        try:
            return self._files.head(g, len(start)) == start
        except Exception:                       # noqa: BLE001 - unreadable or gone: no
            return False

    def _head(self, buf, limit):
        """(n, CRC-32C of the first n bytes) of ``buf``: its first ``limit`` bytes (at most ``HEAD_BYTES``), which
        must hold the whole first record (its header intact), else None. With the size and inode, this tells a file
        apart from another under the same name: a writer begins with a record holding its start time, and the next
        records are its first steps."""
        n = min(len(buf), limit, HEAD_BYTES)
        if n < HEADER:
            return None
        length = self._header(buf, 0)
        if length is None or n < min(HEADER + length + FOOTER, HEAD_BYTES):
            return None
        return n, crc32c(buf[:n])

    def _verdict(self, f, size, ino, mtime):
        """("same" | "followed" | "reread", reason): whether what ``f`` read so far is still the start of the file
        at its path, now of ``size`` bytes, inode ``ino`` and modification time ``mtime`` (None for remote files).
        An unchanged stat costs no read; otherwise the file's first bytes are read once (``_same_start``).

        Same inode and first bytes, and at least as long: the same file (appended to). New inode, same first
        bytes, at least as long: a longer copy renamed over it (rsync), followed from where it was. Anything else
        (shorter, or other first bytes: truncated and rewritten, or replaced) is read again from the start."""
        if not f.offset and not f.tail:
            return "same", ""
        moved = ino != f.ino
        if size == f.offset and not moved and mtime == f.mtime:
            return "same", ""
        if size >= f.offset:
            if f.head is None:                  # its first record was never read whole: nothing to compare
                return ("reread", "replaced by another file (new inode)") if moved else ("same", "")
            if self._same_start(f, size):
                return ("followed", "replaced by a longer copy (new inode): read on where it was") if moved \
                    else ("same", "")
            return "reread", ("replaced by another file (new inode, other first bytes)" if moved
                              else "rewritten in place (other first bytes)")
        if moved:
            return "reread", f"replaced by a shorter file ({size:,} bytes, {f.offset:,} were read)"
        return "reread", f"truncated to {size:,} bytes ({f.offset:,} were read)"

    def _same_start(self, f, size) -> bool:
        """Whether the file at ``f``'s path begins as ``f.head`` says; if so ``f.head`` is widened to up to
        ``HEAD_BYTES`` of what was read (two writers' first records can agree, say fixed-time test logs: their first
        steps then tell them apart). One read of at most ``HEAD_BYTES``."""
        n, crc = f.head
        m = max(n, min(HEAD_BYTES, size, f.offset))
        if size < n:
            return False
        data = self._files.head(f, m)
        if len(data) < n or crc32c(data[:n]) != crc:
            return False
        if len(data) > n:
            f.head = self._head(data, len(data)) or f.head
        return True

    def _reread(self, run, f, reason, out):
        """Read ``f`` again from its start, after telling the consumer which steps of which tags it had given, so
        that they are dropped first (each step then shows once, with its value as the file holds it now)."""
        spans = {tag: tuple(span) for tag, span in f.spans.items()}
        self._counts["resets"] += 1
        self._changes.append(dict(path=f.path, reason=reason, spans=spans))
        out.append(Datum(run.name, None, "reread", None, None, dict(path=redact(f.path), reason=redact(reason),
                                                                     spans=spans)))
        f.offset, f.tail, f.in_bad_run, f.head, f.spans = 0, b"", False, None, {}
        # Reading a file again is no restart of its run: its START, or its steps going back, must not purge.
        if run.start_file == f.name:
            run.seen_start, run.start_file = False, None
        if not run.versioned:
            run.most_recent_step = min((first for first, _ in spans.values()), default=0) - 1

    @staticmethod
    def _note_spans(f, items):
        """Widen ``f.spans`` by the steps of the items it gave (what a re-read must take back)."""
        spans = f.spans
        for d in items:
            if d.tag is None or d.kind in ("purge", "reread"):
                continue
            if isinstance(d.step, np.ndarray):
                if not len(d.step):
                    continue
                lo, hi = int(d.step.min()), int(d.step.max())
            else:
                lo = hi = int(d.step)
            span = spans.get(d.tag)
            if span is None:
                spans[d.tag] = [lo, hi]
            else:
                span[0], span[1] = min(span[0], lo), max(span[1], hi)

    def _read(self, run, f, wanted, columnar, out):
        if f.copy_of is not None:               # a copy of a file being read (see ``_match``)
            return
        self._budget = self.resync_budget
        chunks = None
        mark = len(out)
        self._reading = f.name
        try:
            size, ino, mtime = self._files.stat(f)
            verdict, reason = self._verdict(f, size, ino, mtime)
            if verdict == "reread":
                self._reread(run, f, reason, out)
                mark = len(out)
            elif verdict == "followed":
                self._counts["followed"] += 1
                self._changes.append(dict(path=f.path, reason=reason))
            f.ino, f.mtime = ino, mtime
            if size == f.offset:
                self._errors.pop(f.path, None)
                return
            base = f.offset - len(f.tail)       # the file offset of the next buffer's first byte
            if self._left is not None and self._left <= 0:
                self.more = True                # this poll's bytes are spent: the file goes on at the next one
                return
            chunk_size = self.chunk_size if self._left is None else max(1 << 16, min(self.chunk_size, self._left))
            chunks = self._files.chunks(f, size, chunk_size)
            for chunk in chunks:
                if self._left is not None:
                    self._left -= len(chunk)
                f.offset += len(chunk)
                self._counts["bytes_read"] += len(chunk)
                buf = f.tail + chunk if f.tail else chunk
                if f.head is None and base == 0:
                    f.head = self._head(buf, size)
                used, deferred = self._consume(run, f, buf, wanted, columnar, out)
                if deferred:                    # resume the search there at the next poll; drop what was read past it
                    f.offset, f.tail = base + used, b""
                    self._deferred.add(f.path)
                    break
                f.tail = buf[used:]
                base += used
                if self._left is not None and self._left <= 0 and f.offset < size:
                    self.more = True            # stop before the next chunk is read: the file goes on next poll
                    break
        except FileNotFoundError:
            run.files.pop(f.name, None)
            self._errors[f.path] = "vanished"
            return
        except OSError as err:                  # permission denied and the like: report, retry on the next poll
            self._errors[f.path] = _reason(err)
            return
        except Exception as err:                # noqa: BLE001 - remote clients raise their own kinds; report, retry
            if isinstance(self._files, _LocalFiles):
                raise
            self._errors[f.path] = _reason(err)
            return
        finally:
            if chunks is not None:
                chunks.close()
            self._note_spans(f, out[mark:])
        self._errors.pop(f.path, None)

    def _consume(self, run, f, buf, wanted, columnar, out) -> tuple[int, bool]:
        """Decode the complete records in ``buf``; return how many bytes were used up, and whether the file's
        resynchronisation budget for this poll ran out (the rest of the file then waits for the next poll)."""
        starts, lengths, pos, deferred = self._split(f, buf)
        if len(starts):
            self._counts["records_read"] += len(starts)
            self._decode(run, buf, starts, lengths, wanted, columnar, out)
        return pos, deferred

    # -- framing -----------------------------------------------------------------------------------------------
    def _split(self, f, buf):
        """(payload starts, lengths) of the valid records in ``buf``, the offset up to which it is consumed, and
        whether the resynchronisation budget ran out there.

        ``_hop`` follows the written lengths over a batch of records and ``_verify`` checks the whole batch at once.
        A record whose data is damaged but whose length is intact leaves the chain of starts in step: the search
        for the next record lands on the chain's next start and the batch goes on. Only a damaged length makes the
        chain diverge; then hopping starts again from where the search landed, with a small batch growing fourfold,
        so the hops wasted past a divergence stay proportional to the records read since the previous one."""
        b = np.frombuffer(buf, np.uint8)
        n = len(buf)
        found_starts, found_lengths = [], []
        pos, batch = 0, _FIRST_BATCH
        while True:
            starts, crcs, stop = _hop(buf, pos, batch)
            starts, lengths, ok = _verify(b, starts, crcs)
            bad_at = np.flatnonzero(~ok)
            hopped, i, diverged = len(starts), 0, False
            while True:
                j = int(np.searchsorted(bad_at, i))
                k = int(bad_at[j]) if j < len(bad_at) else hopped
                if k > i:
                    found_starts.append(starts[i:k] + HEADER)
                    found_lengths.append(lengths[i:k])
                    f.in_bad_run = False
                if k == hopped:
                    break
                q = self._resync(f, buf, int(starts[k]))
                if q is None:
                    return self._found(found_starts, found_lengths, self._resumed_at, True)
                i = int(np.searchsorted(starts, q))
                if i == hopped or starts[i] != q:
                    pos, batch, diverged = q, _FIRST_BATCH, True
                    break
            if diverged:
                continue
            if hopped == batch:                 # the batch limit stopped the hop, not the end of the data
                pos, batch = stop, min(batch * 4, _MAX_BATCH)
            elif n - stop >= HEADER and self._header(buf, stop) is None:
                q = self._resync(f, buf, stop)   # a corrupt length can look like a record still being written
                if q is None:
                    return self._found(found_starts, found_lengths, self._resumed_at, True)
                pos, batch = q, _FIRST_BATCH
            else:
                return self._found(found_starts, found_lengths, stop, False)

    @staticmethod
    def _found(found_starts, found_lengths, pos, deferred):
        if not found_starts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), pos, deferred
        return np.concatenate(found_starts), np.concatenate(found_lengths).astype(np.int64), pos, deferred

    def _header(self, buf, pos):
        """The record length at ``pos`` if its checksum agrees, else None."""
        (length,) = _u64.unpack_from(buf, pos)
        ok = _u32.unpack_from(buf, pos + 8)[0] == masked_crc(buf[pos:pos + 8]) and length <= self.max_record
        return length if ok else None

    def _resync(self, f, buf, bad) -> int | None:
        """Skip the damaged record at ``bad``: the next offset holding a valid (or still incomplete) record, or
        None when this file's budget of bytes to search ran out first (``_resumed_at`` then says where to resume).
        The budget keeps one file of junk from holding up every other file of the poll."""
        if not f.in_bad_run:
            self._counts["records_skipped"] += 1
            f.in_bad_run = True
        limit = bad + 1 + max(self._budget, 0)
        q = next_record(buf, bad + 1, limit, self.max_record)
        self._counts["bytes_skipped"] += q - bad
        self._budget -= q - bad
        if q == limit and len(buf) - q >= HEADER:
            self._resumed_at = q
            return None
        return q

    # -- decoding ----------------------------------------------------------------------------------------------
    def _decode(self, run, buf, starts, lengths, wanted, columnar, out):
        """Plain scalar records column-wise, the others one by one, keeping every purge in its place.

        In columnar mode, plain stretches are gathered and emitted grouped by tag just before the next purge (or at
        the end): order only matters relative to purges, and per-stretch NumPy work would cost more than it saves
        when plain scalars alternate with other records."""
        n = len(starts)
        plain, tensor, step, wall, value, tag_id, tags = _plain_scalars(np.frombuffer(buf, np.uint8), starts, lengths)
        starts, lengths = starts.tolist(), lengths.tolist()
        emit = wanted is None or "scalar" in wanted
        columns = np.zeros(n, bool) if columnar and emit else None     # plain records not yet emitted
        items = list(zip(tag_id.tolist(), step.tolist(), wall.tolist(), value.tolist())) if emit and not columnar \
            else None
        # A plain legacy tag's plugin ("scalars") is fixed when its first record is reached, as for any other record.
        tag_ids, first = np.unique(tag_id[plain & ~tensor], return_index=True)
        firsts = sorted(zip(np.flatnonzero(plain & ~tensor)[first].tolist(), tag_ids.tolist()), reverse=True)
        # A plain tensor is a scalar only under a "scalars" tag (its plugin comes from metadata earlier in the run);
        # otherwise it is parsed like any other record. ``scalar_tag`` is refreshed when parsing registers tags.
        tensors, next_tensor = np.flatnonzero(tensor), 0    # plain tensors, and the first one not yet passed
        known, scalar_tag = -1, None
        irregular, i = np.flatnonzero(~plain).tolist() + [n], 0
        a = 0
        while a <= n:
            j = irregular[i]
            if next_tensor < len(tensors):
                end = next_tensor + int(np.searchsorted(tensors[next_tensor:], j))
                if end > next_tensor:
                    if known != run.plugins_version:
                        known, scalar_tag = run.plugins_version, np.array(
                            [run.plugins.get(tag, ("",))[0] == "scalars" for tag in tags])
                    stray = np.flatnonzero(~scalar_tag[tag_id[tensors[next_tensor:end]]])
                    if len(stray):              # parse this one like any other record
                        end = next_tensor + int(stray[0])
                        j = int(tensors[end])
                        end += 1
                    next_tensor = end
            if j == irregular[i]:
                i += 1
            while firsts and firsts[-1][0] < j:
                tag = tags[firsts.pop()[1]]
                if tag not in run.plugins:
                    run.set_plugin(tag, "scalars", b"")
            if j > a:
                if not run.versioned and (step[a:j] < np.concatenate(([run.most_recent_step], step[a:j - 1]))).any():
                    if columns is not None:
                        out += self._columns(run, columns, step, wall, value, tag_id, tags)
                    self._purging_items(run, step[a:j], wall[a:j], value[a:j], tag_id[a:j], tags, emit, out)
                else:
                    run.most_recent_step = int(step[j - 1])
                    if columns is not None:
                        columns[a:j] = True
                    elif items is not None:
                        out += [Datum(run.name, tags[t], "scalar", s, w, v, "scalars") for t, s, w, v in items[a:j]]
            if j < n:
                purge_at = self._event(run, buf[starts[j]:starts[j] + lengths[j]], wanted, out)
                if purge_at is not None and columns is not None:
                    out[purge_at:purge_at] = self._columns(run, columns, step, wall, value, tag_id, tags)
            a = j + 1
        if columns is not None:
            out += self._columns(run, columns, step, wall, value, tag_id, tags)

    @staticmethod
    def _columns(run, columns, step, wall, value, tag_id, tags) -> list[Datum]:
        """One columnar Datum per tag for the records marked in ``columns``, which are then unmarked."""
        idx = np.flatnonzero(columns)
        if not len(idx):
            return []
        columns[:] = False
        idx = idx[np.argsort(tag_id[idx], kind="stable")]
        groups = np.split(idx, np.flatnonzero(np.diff(tag_id[idx])) + 1)
        return [Datum(run.name, tags[tag_id[g[0]]], "scalar", step[g], wall[g], value[g], "scalars") for g in groups]

    @staticmethod
    def _purging_items(run, step, wall, value, tag_id, tags, emit, out):
        """Plain scalars of an old-format run whose steps go back: TensorBoard purges tag by tag, record by record."""
        for s, w, v, t in zip(step.tolist(), wall.tolist(), value.tolist(), tag_id.tolist()):
            if s < run.most_recent_step:
                out.append(Datum(run.name, None, "purge", s, w, (tags[t],)))
            run.most_recent_step = s
            if emit:
                out.append(Datum(run.name, tags[t], "scalar", s, w, v, "scalars"))

    def _event(self, run, payload, wanted, out) -> int | None:
        """Any other record, parsed with upb. Returns where in ``out`` it put a purge, if it did."""
        try:
            ev = _Event.FromString(payload)
        except DecodeError:
            self._counts["records_skipped"] += 1
            return None
        what, step, wall = ev.WhichOneof("what"), ev.step, ev.wall_time
        if what == "summary" and not _shapes_agree(ev.summary):
            self._counts["records_skipped"] += 1    # as for a bad checksum: the record never happened
            return None
        if what == "file_version":
            run.file_version = _file_version(ev.file_version)
        # EventAccumulator._MaybePurgeOrphanedData (graphs and run metadata count as summaries there)
        summary_like = what in _SUMMARY_LIKE
        purge_at = None
        if run.versioned:
            if what == "session_log" and ev.session_log.status == _START:
                if run.seen_start:
                    purge_at = len(out)
                    out.append(Datum(run.name, None, "purge", step, wall, None))
                else:
                    run.start_file = self._reading
                run.seen_start = True
        elif summary_like and step < run.most_recent_step:
            purge_at = len(out)
            tags = (tuple(v.tag for v in ev.summary.value) if what == "summary" else (GRAPH_TAG,)
                    if what == "graph_def" else (ev.tagged_run_metadata.tag,))
            out.append(Datum(run.name, None, "purge", step, wall, tags))
        if summary_like:
            run.most_recent_step = step

        if what == "summary":
            for v in ev.summary.value:
                self._value(run, v, step, wall, wanted, out)
        elif what in _EVENT_KINDS and (wanted is None or _EVENT_KINDS[what] in wanted):
            out.append(_event_datum(run.name, what, ev))
        return purge_at

    def _value(self, run, v, step, wall, wanted, out):
        tag, field = v.tag or v.node_name, v.WhichOneof("value")
        legacy = _LEGACY.get(field)
        known = run.plugins.get(tag)
        if legacy:                              # TensorBoard's data_compat gives these their plugin's metadata
            plugin, content = known or run.set_plugin(tag, legacy[1], b"")
        else:
            own = v.metadata.plugin_data if v.HasField("metadata") else None
            if own is not None and own.plugin_name and (known is None or tag in run.inferred):
                # The first metadata seen fixes the tag's plugin, as in TensorBoard; it also replaces an inference.
                plugin, content = run.set_plugin(tag, own.plugin_name, own.content)
                if own.plugin_name != "hparams":
                    self._tag_plugins.setdefault(tag, (own.plugin_name, own.content))
            elif known is not None:
                plugin, content = known
            else:
                # No metadata yet: the tag's first record (the only one carrying it, for most writers) was damaged
                # or lost. TensorBoard then never shows the tag; we take the plugin another run gave the same tag,
                # else infer it from the value, until real metadata comes.
                plugin, content = run.set_plugin(tag, *(self._tag_plugins.get(tag) or (infer_plugin(v), b"")),
                                                 inferred=True)
            if plugin == "hparams" and own is not None:
                content = own.content           # hparams values each carry their own data in the metadata
        kind = legacy[0] if legacy else _TENSOR_KINDS.get(plugin, "tensor")
        if field is None and kind != "hparams" or not (wanted is None or kind in wanted):
            return
        try:
            if legacy:
                value = _LEGACY_DECODE[field](getattr(v, field))
            elif kind == "hparams":
                value = _hparams(content)
            elif kind == "scalar":
                value = _scalar_tensor(v.tensor)
            else:
                value = _TENSOR_DECODE.get(kind, _identity)(tensor_to_array(v.tensor))
        except (ValueError, TypeError, IndexError, DecodeError, json_format.Error):
            self._counts["values_skipped"] += 1
            return
        out.append(Datum(run.name, tag, kind, step, wall, value, plugin, content))


# -- framing helpers -----------------------------------------------------------------------------------------------
_u64 = struct.Struct("<Q")
_u32 = struct.Struct("<I")
_Q = _u64.unpack_from


def _hop(buf, pos, limit):
    """Up to ``limit`` record starts from ``pos`` following the lengths as written, each payload's raw CRC-32C, and
    the stop offset (where the hop stopped: the limit, or less than a whole record left). Nothing is checked here:
    ``_verify`` does that for all at once."""
    n, starts, crcs = len(buf), [], []
    add_start, add_crc = starts.append, crcs.append
    for _ in range(limit):
        if n - pos < HEADER:
            break
        end = pos + HEADER + _Q(buf, pos)[0]
        if end + FOOTER > n:
            break
        add_start(pos)
        add_crc(crc32c(buf[pos + HEADER:end]))
        pos = end + FOOTER
    return starts, crcs, pos


_FIRST_BATCH, _MAX_BATCH = 1024, 1 << 18     # records per hop: the first, and the cap as it grows fourfold


def _at(b, dtype, at):
    """The little-endian ``dtype`` values at byte offsets ``at`` (clipped to the buffer), through an unaligned view."""
    view = np.ndarray((len(b) - np.dtype(dtype).itemsize + 1,), dtype, b, strides=(1,))
    return view[np.minimum(at, len(view) - 1)]


def _mask(crc):
    crc = crc.astype(np.uint64)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _verify(b, starts, crcs):
    """(starts, lengths, ok) where ok[i] says record i's length checksum and data checksum both agree."""
    starts = np.asarray(starts, np.int64)
    if not len(starts):
        return starts, np.zeros(0, np.uint64), np.zeros(0, bool)
    lengths = _at(b, "<u8", starts)
    # Few distinct lengths occur in a file: checksum each once.
    distinct, inverse = np.unique(lengths, return_inverse=True)
    expected = np.array([masked_crc(_u64.pack(x)) for x in distinct.tolist()], np.uint64)[inverse.ravel()]
    ok = _at(b, "<u4", starts + 8) == expected
    ok &= _at(b, "<u4", starts + HEADER + lengths.astype(np.int64)) == _mask(np.array(crcs, np.uint64))
    return starts, lengths, ok


# After a plain record's tag: a legacy simple_value (0x15, float), or a rank-0 DT_FLOAT tensor {dtype, [tensor_shape
# {}], float_val} as flowlab's and TensorFlow's writers encode scalars. The float is always the record's last 4 bytes.
_FLOAT_TENSORS = (b"\x42\x08\x08\x01\x2a\x04", b"\x42\x0a\x08\x01\x12\x00\x2a\x04")


def _plain_scalars(b, start, length):
    """Decode, column-wise, records that are exactly ``Event{wall_time=1, step=2 (absent when 0),
    summary=5{value=1{tag=1, simple_value=2 | tensor=8}}}`` with one float, in the field order writers use.

    Returns (plain mask, tensor mask, step int64, wall_time float64, value float64, tag id, tag names); entries where
    the plain mask is False are meaningless and those records are left to the protobuf parser. A plain *tensor* is a
    scalar only if its tag's plugin is "scalars", which the caller checks.
    """
    n = len(start)
    if not n:
        return (np.zeros(0, bool), np.zeros(0, bool),
                *(np.zeros(0, d) for d in (np.int64, np.float64, np.float64, np.int64)), [])

    def byte(at):
        return _at(b, np.uint8, at).astype(np.int64)

    def bytes_are(at, pattern):                 # compares up to 8 bytes as one little-endian integer
        mask = (1 << 8 * len(pattern)) - 1
        return (_at(b, "<u8", at) & np.uint64(mask)) == np.uint64(int.from_bytes(pattern, "little"))

    plain = byte(start) == 0x09
    wall = _at(b, "<f8", start + 1)
    # step: absent (0) or a varint of up to 10 bytes at start + 10
    has_step = byte(start + 9) == 0x10
    step, vlen, more = np.zeros(n, np.uint64), np.zeros(n, np.int64), has_step.copy()
    for k in range(10):
        low = _at(b, np.uint8, start + 10 + k).astype(np.uint64)
        step |= np.where(more, (low & 0x7F) << np.uint64(7 * k), 0).astype(np.uint64)
        vlen += more
        more &= low >= 0x80
        if not more.any():
            break
    plain &= ~more
    step = step.view(np.int64)
    p = start + 9 + has_step + vlen
    summary_len, value_len, tag_len = byte(p + 1), byte(p + 3), byte(p + 5)
    after_tag = p + 6 + tag_len
    simple = (byte(after_tag) == 0x15) & (value_len == tag_len + 7)
    tensor = np.zeros(n, bool)
    for pattern in _FLOAT_TENSORS:
        tensor |= bytes_are(after_tag, pattern) & (value_len == tag_len + 2 + len(pattern) + 4)
    plain &= ((byte(p) == 0x2A) & (summary_len < 0x80) & (p + 2 + summary_len == start + length)
              & (byte(p + 2) == 0x0A) & (value_len == summary_len - 2) & (byte(p + 4) == 0x0A) & (simple | tensor))
    value = _at(b, "<f4", start + length - 4).astype(np.float64)
    # Tags: rows of (length, bytes...) padded with zeros, made unique by NumPy.
    tag_id = np.zeros(n, np.int64)
    tags = []
    if plain.any():
        width = int(tag_len[plain].max()) + 1
        cols = np.arange(width)
        rows = np.where(cols < tag_len[plain, None] + 1, byte(p[plain, None] + 5 + cols), 0).astype(np.uint8)
        distinct, inverse = np.unique(rows.view(f"V{width}").ravel(), return_inverse=True)
        tag_id[plain] = inverse.ravel()
        for k, raw in enumerate(map(bytes, distinct)):
            try:
                tags.append(raw[1:1 + raw[0]].decode("utf-8"))
            except UnicodeDecodeError:          # not a valid proto3 string: the parser will reject the record
                tags.append("")
                plain[plain & (tag_id == k)] = False
    return plain, tensor & plain, step, wall, value, tag_id, tags


# -- inferring a tag's plugin from its value -------------------------------------------------------------------------
_IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"BM")
_STRING, _FLOATS = 7, frozenset({1, 2, 19})           # DataType numbers: DT_STRING; DT_FLOAT, DT_DOUBLE, DT_HALF


def _is_image(data: bytes) -> bool:
    return data.startswith(_IMAGE_MAGIC) or (data[:4] == b"RIFF" and data[8:12] == b"WEBP")


def infer_plugin(value) -> str:
    """The plugin a ``Summary.Value`` without metadata most likely belongs to, from its tensor's dtype and shape as
    TensorBoard's plugins write them: a rank-0 number -> "scalars"; a float [k, 3] -> "histograms" (left, right,
    count rows); a string vector [width, height, encoded images...] -> "images"; a string [k, 2] of WAV clips and
    labels -> "audio"; any other string tensor -> "text"; anything else -> "" (a plain tensor)."""
    if value.WhichOneof("value") != "tensor":
        return ""
    t = value.tensor
    shape = [d.size for d in t.tensor_shape.dim]
    if t.dtype == _STRING:
        strings = t.string_val
        if (len(shape) == 1 and shape[0] >= 3 and len(strings) == shape[0] and strings[0].isdigit()
                and strings[1].isdigit() and all(_is_image(x) for x in strings[2:])):
            return "images"
        if (len(shape) == 2 and shape[1] == 2 and shape[0] >= 1 and len(strings) == 2 * shape[0]
                and all(x[:4] == b"RIFF" and x[8:12] == b"WAVE" for x in strings[::2])):
            return "audio"
        return "text"
    if t.dtype not in _DTYPES:
        return ""
    if not shape:
        return "scalars"
    if len(shape) == 2 and shape[1] == 3 and t.dtype in _FLOATS:
        return "histograms"
    return ""


# -- value decoding ------------------------------------------------------------------------------------------------
_Event = proto.Event
_HParams = proto.HParamsPluginData
_START = proto.enum_value("tensorboard.SessionLog.SessionStatus", "START")
_SESSION_STATUS = {v.number: v.name for v in proto.descriptor("tensorboard.SessionLog").enum_types_by_name[
    "SessionStatus"].values}

_DTYPES = {  # DataType number -> (NumPy dtype, TensorProto field holding values when tensor_content is empty)
    1: (np.float32, "float_val"), 2: (np.float64, "double_val"), 3: (np.int32, "int_val"),
    4: (np.uint8, "int_val"), 5: (np.int16, "int_val"), 6: (np.int8, "int_val"), 7: (object, "string_val"),
    8: (np.complex64, "scomplex_val"), 9: (np.int64, "int64_val"), 10: (np.bool_, "bool_val"),
    17: (np.uint16, "int_val"), 18: (np.complex128, "dcomplex_val"), 19: (np.float16, "half_val"),
    22: (np.uint32, "uint32_val"), 23: (np.uint64, "uint64_val"),
}


class ShapeMismatch(ValueError):
    """A TensorProto whose declared shape disagrees with the values it carries."""


def check_tensor_shape(t) -> None:
    """Raise :class:`ShapeMismatch` unless ``t``'s declared shape agrees with the data present.

    TensorBoard's ``make_ndarray`` fills a shape from a single value (or from none: zeros), so a 50-byte record of
    shape [8192, 8192] costs 512 MiB, and one declaring 2^40 elements raises ``MemoryError``. Here every dimension
    must be >= 0 and the record must carry exactly one value per element (``tensor_content`` of exactly that many
    bytes, or that many typed values; complex numbers two each); the only fill kept is TensorFlow's empty rank-0
    tensor, read as one zero. So decoding a value never allocates more than a small multiple of its record's size.
    Tensors of unsupported dtypes are left to :func:`tensor_to_array`, which refuses them."""
    if t.dtype not in _DTYPES:
        return
    dims = [d.size for d in t.tensor_shape.dim]
    if any(d < 0 for d in dims):
        raise ShapeMismatch(f"tensor shape {dims}: expected dimensions >= 0")
    size = math.prod(dims)
    dtype, field = _DTYPES[t.dtype]
    if t.tensor_content and dtype is not object:
        present, unit = len(t.tensor_content), np.dtype(dtype).itemsize
        what = "bytes of tensor_content"
    else:
        present, unit = len(getattr(t, field)), 2 if dtype in (np.complex64, np.complex128) else 1
        what = f"values in {field}"
    if present != size * unit and not (present == 0 and size == 1 and not dims):
        raise ShapeMismatch(f"tensor shape {dims} declares {size:,} elements, expected {size * unit:,} {what}, "
                            f"but the record has {present:,}")


def tensor_to_array(t) -> np.ndarray:
    """A TensorProto as a NumPy array (strings as an object array of bytes): raw ``tensor_content`` if present,
    else the typed values. Raises :class:`ShapeMismatch` (a ``ValueError``) when the declared shape disagrees with
    the data (see :func:`check_tensor_shape`), ``ValueError`` for unsupported dtypes."""
    if t.dtype not in _DTYPES:
        raise ValueError(f"unsupported tensor dtype {t.dtype}")
    check_tensor_shape(t)
    dtype, field = _DTYPES[t.dtype]
    shape = [d.size for d in t.tensor_shape.dim]
    size = math.prod(shape)
    if t.tensor_content and dtype is not object:
        return np.frombuffer(t.tensor_content, dtype).reshape(shape).copy()
    values = getattr(t, field)
    if dtype is object:
        flat = np.empty(len(values), object)
        flat[:] = list(values)
    elif field == "half_val":
        flat = np.array(values, np.uint16).view(np.float16)
    elif dtype in (np.complex64, np.complex128):
        flat = np.array(values, np.float64).view(np.complex128).astype(dtype)
    else:
        flat = np.array(values, dtype)
    if not len(flat):                           # an empty rank-0 tensor (the one fill check_tensor_shape allows)
        flat = np.zeros(size, dtype)
    return flat.reshape(shape)


def _shapes_agree(summary) -> bool:
    """Whether every tensor value of ``summary`` carries the data its shape declares (``check_tensor_shape``)."""
    for v in summary.value:
        if v.WhichOneof("value") == "tensor":
            try:
                check_tensor_shape(v.tensor)
            except ShapeMismatch:
                return False
    return True


def _legacy_histogram(h) -> np.ndarray:
    """HistogramProto -> [k, 3] (left, right, count), as TensorBoard's data_compat: empty buckets at both ends are
    dropped and the outer edges become min and max (kept in float64 here; TensorBoard rounds to float32)."""
    counts = np.array(h.bucket, np.float64)
    limits = np.array(h.bucket_limit, np.float64)
    nonzero = np.flatnonzero(counts > 0)
    if not len(nonzero):
        return np.zeros((0, 3))
    first, last = nonzero[0], nonzero[-1]
    inner = limits[first:last]
    return np.stack([np.concatenate([[h.min], inner]), np.concatenate([inner, [h.max]]), counts[first:last + 1]], 1)


def _hparams(content: bytes) -> dict:
    """HParamsPluginData as a dict (proto3 JSON names, defaults absent), google.protobuf.Values as Python values.
    Values are converted here rather than by json_format, which refuses infinities (an hparam may well be inf)."""
    data = _HParams.FromString(content)
    which = data.WhichOneof("data")
    if which == "session_start_info":
        values = {k: _python(v) for k, v in data.session_start_info.hparams.items()}
        data.session_start_info.ClearField("hparams")
    elif which == "experiment":
        domains = {i: [_python(x) for x in h.domain_discrete.values]
                   for i, h in enumerate(data.experiment.hparam_infos) if h.HasField("domain_discrete")}
        for i in domains:
            data.experiment.hparam_infos[i].ClearField("domain_discrete")
    out = json_format.MessageToDict(data, preserving_proto_field_name=True)
    if which == "session_start_info":
        out.setdefault(which, {})["hparams"] = values
    elif which == "experiment":
        for i, domain in domains.items():
            out[which]["hparam_infos"][i]["domain_discrete"] = domain
    return out


def _python(v):
    """A google.protobuf.Value as None, float, str, bool, list or dict."""
    kind = v.WhichOneof("kind")
    if kind == "list_value":
        return [_python(x) for x in v.list_value.values]
    if kind == "struct_value":
        return {k: _python(x) for k, x in v.struct_value.fields.items()}
    return None if kind in (None, "null_value") else getattr(v, kind)


def _strings(a: np.ndarray):
    """Text values: a str, or an object array of str. Not a fixed-width ``str`` array: that pads every element to
    the longest, so one 1 MB string among 1,000 short ones would cost 4 GB."""
    decoded = [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in a.ravel()]
    if a.ndim == 0:
        return decoded[0]
    out = np.empty(len(decoded), object)
    out[:] = decoded
    return out.reshape(a.shape)


def _image_tensor(a: np.ndarray) -> Image:
    flat = list(a.ravel())
    return Image(int(flat[0]), int(flat[1]), flat[2:])


def _scalar_tensor(t) -> float:
    """A one-element TensorProto's value; the common one-float case without going through NumPy."""
    dtype, field = _DTYPES.get(t.dtype, (None, ""))
    if not t.tensor_content and field in ("float_val", "double_val", "int_val", "int64_val"):
        values = getattr(t, field)
        if len(values) == 1 and all(d.size == 1 for d in t.tensor_shape.dim):
            return float(values[0])
    return float(tensor_to_array(t).item())


def _identity(x):
    return x


def _file_version(text) -> float | None:
    try:
        return float(text.split(":")[-1])
    except ValueError:
        return None


def _audio_tensor(a: np.ndarray) -> list:
    return list(a.reshape(len(a), -1)[:, 0]) if a.ndim else [a.item()]     # rows of (clip, label)


# Legacy value field -> (kind, the plugin TensorBoard's data_compat assigns it), and its decoder.
_LEGACY = {"simple_value": ("scalar", "scalars"), "histo": ("histogram", "histograms"),
           "image": ("image", "images"), "audio": ("audio", "audio")}
_LEGACY_DECODE = {"simple_value": float, "histo": _legacy_histogram,
                  "image": lambda im: Image(im.width, im.height, [im.encoded_image_string]),
                  "audio": lambda au: [au.encoded_audio_string]}
# Tensor values: plugin -> kind (anything else is kind "tensor", the array itself), and kind -> decoder.
_TENSOR_KINDS = {"scalars": "scalar", "histograms": "histogram", "images": "image", "audio": "audio",
                 "text": "text", "hparams": "hparams", "flowlab_health": "health"}
_TENSOR_DECODE = {"histogram": lambda a: a.astype(np.float64).reshape(-1, 3), "health": lambda a: a.astype(np.float64),
                  "image": _image_tensor, "audio": _audio_tensor, "text": _strings}


_SUMMARY_LIKE = frozenset({"summary", "graph_def", "tagged_run_metadata"})
_EVENT_KINDS = {"graph_def": "graph", "meta_graph_def": "meta_graph", "tagged_run_metadata": "run_metadata",
                "session_log": "session_log", "log_message": "log_message"}


def _event_datum(run, what, ev) -> Datum:
    step, wall = ev.step, ev.wall_time
    if what == "graph_def":
        return Datum(run, GRAPH_TAG, "graph", step, wall, ev.graph_def, "graphs")
    if what == "meta_graph_def":
        return Datum(run, None, "meta_graph", step, wall, ev.meta_graph_def)
    if what == "tagged_run_metadata":
        trm = ev.tagged_run_metadata
        return Datum(run, trm.tag, "run_metadata", step, wall, trm.run_metadata, "graph_run_metadata")
    if what == "session_log":
        sl = ev.session_log
        return Datum(run, None, "session_log", step, wall, dict(
            status=_SESSION_STATUS.get(sl.status, str(sl.status)), msg=sl.msg, checkpoint_path=sl.checkpoint_path))
    return Datum(run, None, "log_message", step, wall, ev.log_message.message)


def _reason(err: Exception) -> str:
    return f"{type(err).__name__}: {getattr(err, 'strerror', None) or err}"
