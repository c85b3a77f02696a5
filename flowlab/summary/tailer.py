"""Incremental reading of a TensorBoard logdir: what the dashboard polls.

``LogdirTailer(logdir).poll()`` returns the items (:class:`Datum`) completed since the previous poll. Its jobs are
split by module: ``logdir_files`` finds and reads the files (local disk or fsspec), ``framing`` finds the records in
their bytes and skips damage, ``decode`` turns records into items, ``plugin_inference`` says which plugin a tag is;
this module follows each file over time and keeps the runs' restarts in order.

Design
- Discovery: every poll lists the logdir (``logdir_files``: ``os.walk``, or for an fsspec URL such as
  ``s3://bucket/prefix`` one recursive listing; http(s):// URLs cannot be listed and are refused: ``LogdirError``). A
  run is a directory (the logdir itself is run ``"."``) holding files whose name contains ``tfevents``; its name is
  the path relative to the logdir with ``/`` separators. Runs are visited in name order and a run's files in name
  order, as TensorBoard orders them.
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
- Framing (``framing.RecordFramer``): each file may search ``resync_budget`` bytes of damage per poll; the rest waits
  for the next poll, so a file of junk never delays the other files' new records.
- Decoding (``decode``): plain scalar records column-wise with NumPy, every other record with upb. A record holding a
  tensor whose declared shape disagrees with its data is skipped whole and counted like a bad checksum.
- Restarts follow ``EventAccumulator``: in a run whose files declare ``brain.Event:2`` (every current writer), each
  ``SessionLog`` START after the first drops the run's data with step >= its step; in older files an event whose step
  is below the previous summary event's step drops its own tags' data with step >= its step. The tailer keeps no
  data, so it reports each such drop as a ``kind="purge"`` item, in order, for the consumer's store to apply.
"""
from __future__ import annotations

import collections

import numpy as np
from crc32c import crc32c
from google.protobuf.message import DecodeError

from .decode import (EVENT_KINDS, GRAPH_TAG, KINDS, START, SUMMARY_LIKE, VALUE_ERRORS, Datum, Event, Image,
                     ShapeMismatch, decode_value, event_datum, file_version, plain_scalars, shapes_agree,
                     tensor_to_array, value_kind)
from .framing import RecordFramer
from .logdir_files import (SUPPORTED, UNLISTABLE, AssetFile, LocalFiles, LogdirError, RemoteFiles, open_logdir,
                           reason)
from .plugin_inference import infer_plugin, tag_plugin
from .record import FOOTER, HEADER
from .redact import redact

__all__ = ["LogdirTailer", "LogdirError", "Datum", "Image", "KINDS", "GRAPH_TAG", "SUPPORTED", "UNLISTABLE",
           "ShapeMismatch", "tensor_to_array", "infer_plugin"]

CHANGES_KEPT = 20                 # files re-read or followed that ``stats()["changes"]`` lists, newest last
HEAD_BYTES = 1 << 16              # a file's first bytes, up to this many (its whole first record at least), identify it


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


class LogdirTailer:
    """Reads every event file under ``logdir`` incrementally; see the module docstring.

    ``logdir``: a local path, or any fsspec URL (``s3://bucket/prefix``, ``gs://...``, ``memory://...``), with
    ``storage_options`` passed to its filesystem (credentials otherwise come from the usual environment).
    ``.logdir`` is the absolute local path or the normalised URL; ``exists()`` says whether it is there now.
    ``asset_names``: names of other files (not event files) whose places the same listing notes, per run, for
    ``assets(name)`` (the provider reads projector configs and structure graphs so, without a walk of its own)."""

    max_record = 1 << 31
    resync_budget = 16 << 20     # bytes of damage searched per file and poll before the file waits for the next poll

    def __init__(self, logdir, storage_options=None, asset_names=()):
        self._files = open_logdir(logdir, storage_options)
        self.logdir = self._files.name
        self._asset_names = frozenset(asset_names)
        self._assets: dict[str, dict[str, AssetFile]] = {name: {} for name in self._asset_names}
        self._runs: dict[str, _Run] = {}
        self._errors: dict[str, str] = {}
        self._deferred: set[str] = set()
        self._tag_plugins: dict[str, tuple] = {}    # tag -> (plugin, content) from metadata, in any run
        self._counts = dict(records_read=0, records_skipped=0, bytes_read=0, bytes_skipped=0, values_skipped=0,
                            resets=0, followed=0)
        self._changes = collections.deque(maxlen=CHANGES_KEPT)   # the latest files re-read or followed
        self._framer = RecordFramer(self._counts, self.max_record)
        self._left, self.more = None, False     # this poll's byte allowance (poll's max_bytes); bytes left over
        self._resume_at = None                  # (run, file) where a poll's allowance ran out: the next goes on there
        self._reading = None                    # the name of the file being decoded

    @property
    def files(self):
        """The logdir's file access (``logdir_files.LocalFiles`` or ``RemoteFiles``)."""
        return self._files

    def assets(self, name) -> dict[str, AssetFile]:
        """{run: ``AssetFile``} of the files called ``name`` (one of ``asset_names``) the last listing found."""
        return self._assets[name]

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
        start = self._resume_at if resuming else None
        self._left, self.more, self._resume_at = max_bytes, False, None
        if not resuming:
            self._discover()
        # A poll that spends its allowance stops at that file, and the next one goes on from it: the files before it
        # were read in this round, and looking at them again (a stat each) for every allowance made a big logdir's
        # first read quadratic (10,000 runs in 41 allowances of 1 MiB: 410,000 stats).
        for name in sorted(self._runs):
            if start is not None and name < start[0]:
                continue
            run = self._runs[name]
            for file_name in sorted(run.files):
                if start is not None and name == start[0] and file_name < start[1]:
                    continue
                self._read(run, run.files[file_name], wanted, columnar, out)
                if self.more and self._left is not None and self._left <= 0:
                    self._resume_at = (name, file_name)
                    return out
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
        assets = {name: {} for name in self._asset_names}
        try:
            for run_name, n, path, remote in self._files.listing(self._errors):
                if n in assets:
                    assets[n][run_name] = AssetFile(run_name, path, *(remote or (path,)))
                if "tfevents" not in n or n.endswith(".profile-empty"):
                    continue
                run = self._runs.get(run_name) or self._runs.setdefault(run_name, _Run(run_name))
                present.add(path)
                f = run.files.get(n)
                if f is None:
                    f = run.files[n] = _File(n, path, *(remote[:2] if remote else (path,)))
                    if self._errors.get(path) == "vanished":
                        del self._errors[path]
                    new.append((run, f))
                elif remote:
                    f.listed_size = remote[1]
                if f.copy_of is not None:
                    new.append((run, f))
        except Exception as err:                # noqa: BLE001 - a failed remote listing: keep what we know, retry
            self._errors[self.logdir] = reason(err)
            return
        if isinstance(self._files, RemoteFiles):
            self._errors.pop(self.logdir, None)
        self._assets = assets
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
        length = self._framer.header(buf, 0)
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
        self._framer.budget = self.resync_budget
        chunks = None
        mark = len(out)
        self._reading = f.name
        try:
            size, ino, mtime = self._files.stat(f)
            verdict, why = self._verdict(f, size, ino, mtime)
            if verdict == "reread":
                self._reread(run, f, why, out)
                mark = len(out)
            elif verdict == "followed":
                self._counts["followed"] += 1
                self._changes.append(dict(path=f.path, reason=why))
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
            self._errors[f.path] = reason(err)
            return
        except Exception as err:                # noqa: BLE001 - remote clients raise their own kinds; report, retry
            if isinstance(self._files, LocalFiles):
                raise
            self._errors[f.path] = reason(err)
            return
        finally:
            if chunks is not None:
                chunks.close()
            self._note_spans(f, out[mark:])
        self._errors.pop(f.path, None)

    def _consume(self, run, f, buf, wanted, columnar, out) -> tuple[int, bool]:
        """Decode the complete records in ``buf``; return how many bytes were used up, and whether the file's
        resynchronisation budget for this poll ran out (the rest of the file then waits for the next poll)."""
        starts, lengths, pos, deferred = self._framer.split(f, buf)
        if len(starts):
            self._counts["records_read"] += len(starts)
            self._decode(run, buf, starts, lengths, wanted, columnar, out)
        return pos, deferred

    # -- decoding ----------------------------------------------------------------------------------------------
    def _decode(self, run, buf, starts, lengths, wanted, columnar, out):
        """Plain scalar records column-wise, the others one by one, keeping every purge in its place.

        In columnar mode, plain stretches are gathered and emitted grouped by tag just before the next purge (or at
        the end): order only matters relative to purges, and per-stretch NumPy work would cost more than it saves
        when plain scalars alternate with other records."""
        n = len(starts)
        plain, tensor, step, wall, value, tag_id, tags = plain_scalars(np.frombuffer(buf, np.uint8), starts, lengths)
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
            ev = Event.FromString(payload)
        except DecodeError:
            self._counts["records_skipped"] += 1
            return None
        what, step, wall = ev.WhichOneof("what"), ev.step, ev.wall_time
        if what == "summary" and not shapes_agree(ev.summary):
            self._counts["records_skipped"] += 1    # as for a bad checksum: the record never happened
            return None
        if what == "file_version":
            run.file_version = file_version(ev.file_version)
        # EventAccumulator._MaybePurgeOrphanedData (graphs and run metadata count as summaries there)
        summary_like = what in SUMMARY_LIKE
        purge_at = None
        if run.versioned:
            if what == "session_log" and ev.session_log.status == START:
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
        elif what in EVENT_KINDS and (wanted is None or EVENT_KINDS[what] in wanted):
            out.append(event_datum(run.name, what, ev))
        return purge_at

    def _value(self, run, v, step, wall, wanted, out):
        tag, field = v.tag or v.node_name, v.WhichOneof("value")
        plugin, content = tag_plugin(run, self._tag_plugins, tag, field, v)
        kind = value_kind(field, plugin)
        if field is None and kind != "hparams" or not (wanted is None or kind in wanted):
            return
        try:
            value = decode_value(v, field, kind, content)
        except VALUE_ERRORS:
            self._counts["values_skipped"] += 1
            return
        out.append(Datum(run.name, tag, kind, step, wall, value, plugin, content))
