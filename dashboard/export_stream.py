"""The Scalars tab's "all shown" export, written off the event loop and streamed to the browser.

Formatting every point of every shown series is Python work proportional to the points (3M points held the loop for
4.9 s when the whole file was built in a session callback and sent as one websocket message). Instead the button's
callback only picks the series and takes zero-copy slices of their columns (the store never writes a column in place
below its length, so a slice stays valid), and registers them as a job under an unguessable one-time token. The page
then downloads ``export/scalars/<token>.<fmt>``: ``ExportHandler`` formats the file ``CHUNK_POINTS`` points at a
time in a worker thread (``export_chunks``) and writes and flushes each chunk on the loop, so neither the file nor
the loop's time grows with the export: the loop only ever waits for one chunk's write.

A token is good for one download, within ``TOKEN_TTL_S`` of the click, on the server whose store it was made for.
"""
from __future__ import annotations

import json
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from tornado.iostream import StreamClosedError
from tornado.ioloop import IOLoop
from tornado.web import RequestHandler

from .export_cells import csv_number, csv_text, json_number

CHUNK_POINTS = 20_000        # points per streamed chunk: ~1 MB of CSV, some 30 ms to format in a worker thread
TOKEN_TTL_S = 600.0          # a job not downloaded by then is forgotten (with its column slices)
MIME = {"csv": "text/csv; charset=utf-8", "json": "application/json"}
ROUTE = r"/export/scalars/([A-Za-z0-9_-]{20,100})\.(csv|json)"
_WORKERS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="flowlab-export")


def export_chunks(columns, fmt, chunk_points=CHUNK_POINTS):
    """The export file of ``columns`` (``(run, tag, steps, wall_times, values)`` per series, in full) in pieces of
    at most ``chunk_points`` points. CSV: one row a point (``run,tag,step,wall_time,value``; names as quoted text
    cells with formulas quoted away, NaN and ±Inf as ``nan``, ``inf``, ``-inf``); JSON (strict: JSON has no such
    numbers): one object a series with ``step``, ``wall_time`` and ``value`` lists, NaN and ±Inf as the strings
    ``"NaN"``, ``"Infinity"``, ``"-Infinity"``. The cells are ``export_cells``'s, as the page's own download writes
    them. Joined, the pieces are the whole file."""
    if fmt not in MIME:
        raise ValueError(f"fmt must be 'csv' or 'json', got {fmt!r}")
    chunk_points = int(chunk_points)
    if chunk_points < 1:
        raise ValueError(f"chunk_points must be at least 1, got {chunk_points!r}")
    if fmt == "csv":
        yield "run,tag,step,wall_time,value\n"
        for run, tag, steps, walls, values in columns:
            prefix = f"{csv_text(run)},{csv_text(tag)},"
            for a in range(0, len(steps), chunk_points):
                b = a + chunk_points
                yield "".join(f"{prefix}{int(st)},{csv_number(w)},{csv_number(v)}\n"
                              for st, w, v in zip(steps[a:b], walls[a:b], values[a:b]))
        return
    dumps = json.JSONEncoder(allow_nan=False).encode
    yield "["
    for i, (run, tag, steps, walls, values) in enumerate(columns):
        yield f'{", " if i else ""}{{"run": {dumps(run)}, "tag": {dumps(tag)}'
        for key, column, cell in (("step", steps, int), ("wall_time", walls, json_number),
                                  ("value", values, json_number)):
            yield f', "{key}": ['
            for a in range(0, len(column), chunk_points):
                yield (", " if a else "") + ", ".join(dumps(cell(x)) for x in column[a:a + chunk_points])
            yield "]"
        yield "}"
    yield "]"


class _Job:
    def __init__(self, store, columns, fmt):
        self.store, self.columns, self.fmt = store, columns, fmt
        self.created = time.monotonic()


class ExportJobs:
    """The exports clicked and not yet downloaded, by token."""

    def __init__(self, ttl_s=TOKEN_TTL_S):
        self.ttl_s = ttl_s
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.Lock()           # sessions of servers on other threads share the registry

    def add(self, store, columns, fmt) -> str:
        """Register ``columns`` (see ``export_chunks``) of ``store`` as a ``fmt`` export; returns its token."""
        if fmt not in MIME:
            raise ValueError(f"fmt must be 'csv' or 'json', got {fmt!r}")
        token = secrets.token_urlsafe(24)
        with self._lock:
            self._expire()
            self._jobs[token] = _Job(store, columns, fmt)
        return token

    def take(self, token, store, fmt):
        """The job of ``token`` for ``store`` in format ``fmt``, removed from the registry; None when there is none
        (unknown, expired, already taken, or made for another server or format)."""
        with self._lock:
            self._expire()
            job = self._jobs.get(token)
            if job is None or job.store is not store or job.fmt != fmt:
                return None
            return self._jobs.pop(token)

    def __len__(self):
        return len(self._jobs)

    def _expire(self):
        now = time.monotonic()
        for token in [t for t, job in self._jobs.items() if now - job.created > self.ttl_s]:
            del self._jobs[token]


EXPORTS = ExportJobs()


class ExportHandler(RequestHandler):
    """``GET export/scalars/<token>.<fmt>``: the job's file, formatted in a worker thread and streamed in chunks."""

    def initialize(self, store, jobs=EXPORTS):
        self.store, self.jobs = store, jobs

    async def get(self, token, fmt):
        job = self.jobs.take(token, self.store, fmt)
        if job is None:
            self.set_status(404)
            self.set_header("Content-Type", "text/plain; charset=utf-8")
            self.finish("This export link is unknown, expired or already used: click the export button again.\n")
            return
        self.set_header("Content-Type", MIME[fmt])
        self.set_header("Content-Disposition", f'attachment; filename="scalars.{fmt}"')
        self.set_header("Cache-Control", "no-store")
        chunks = export_chunks(job.columns, fmt)
        loop = IOLoop.current()
        try:
            while True:
                chunk = await loop.run_in_executor(_WORKERS, next, chunks, None)
                if chunk is None:
                    break
                self.write(chunk)
                await self.flush()           # the chunk goes out before the next is made: memory stays one chunk
        except StreamClosedError:            # the browser went away (a cancelled download): nothing to send it
            chunks.close()
            return
        self.finish()
