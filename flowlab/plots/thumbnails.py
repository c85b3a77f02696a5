"""Encoded images from logs as small RGBA pictures, decoded once per process and never larger than needed.

A log's image is data from anyone: a 49 KB PNG can declare 20000 × 20000 pixels (Pillow then raises
``DecompressionBombError``), a 4 KB PNG of 6000 × 6000 decodes to 144 MB of RGBA. ``thumbnail_rgba`` bounds both:

- an image declaring more than ``MAX_PIXELS`` (16,777,216 = 4096 × 4096) is never decoded: it comes back as
  :class:`Refused`, whose ``reason`` says so, its size and the cap (so a card can show why); so does an image Pillow
  cannot read, or of a format other than PNG, JPEG, GIF, BMP and WebP (Pillow's other plugins, such as EPS, would run
  external programs);
- an allowed image is shrunk to fit ``size`` × ``size`` while it is decoded (``Image.draft`` lets JPEG decode at
  1/2 to 1/8 scale; PNG must be decoded whole, then ``reduce`` and a resize shrink it). The transient memory of one
  decode is at most about 5 bytes per declared pixel (80 MiB at the cap, for a palette image converted to RGBA), and
  it is freed before the call returns;
- results are kept in one process-wide cache (least recently used first out, at most ``CACHE_BYTES`` of thumbnails
  plus the encoded bytes they are keyed by), so every browser session showing the same image shares one decode.
  The key is the encoded ``bytes`` object itself: the store hands every session the same one, whose hash Python
  computes once.

A server must not decode on its event loop (a 4000 × 4000 PNG takes 0.1-0.5 s, seconds on a busy machine):
``thumbnail_later`` decodes in this module's one worker thread and calls back when the thumbnail is in the cache;
one decode serves every caller that asks for the same image meanwhile, and ``cached_thumbnail`` reads the cache
without ever decoding. (Pillow releases the GIL while it inflates and resamples, so the loop keeps running.) One
worker: at most one decode's transient memory at a time.
"""
from __future__ import annotations

import io
import struct
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

MAX_PIXELS = 4096 * 4096        # declared pixels above which an image is refused, not decoded
CACHE_BYTES = 64 << 20          # thumbnails (and their keys' encoded bytes) kept for every session
FORMATS = ("PNG", "JPEG", "GIF", "BMP", "WEBP")
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class Refused(NamedTuple):
    """An image that is not shown, and why (a sentence for the viewer)."""
    reason: str


def declared_size(encoded: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG's header without decoding anything, or None for other data."""
    if encoded[:8] == _PNG_MAGIC and encoded[12:16] == b"IHDR" and len(encoded) >= 24:
        return struct.unpack(">II", encoded[16:24])
    return None


def _too_big(width, height) -> Refused:
    return Refused(f"{width:,} × {height:,} pixels ({width * height:,}): above the dashboard's cap of "
                   f"{MAX_PIXELS:,} pixels, so it is not decoded")


def decode_thumbnail(encoded: bytes, size: int) -> np.ndarray | Refused:
    """``encoded`` decoded to fit ``size`` × ``size`` (never enlarged) as ``image_rgba`` wants it: ``uint32 [h, w]``
    of packed RGBA bytes, bottom row first (Bokeh's y axis points up); or :class:`Refused`. Uncached: use
    :func:`thumbnail_rgba`."""
    from PIL import Image, UnidentifiedImageError
    declared = declared_size(encoded)
    if declared is not None and declared[0] * declared[1] > MAX_PIXELS:
        return _too_big(*declared)                      # before Pillow sees it: not even its bomb check runs
    try:
        with Image.open(io.BytesIO(encoded), formats=FORMATS) as im:
            width, height = im.size
            if width * height > MAX_PIXELS:
                return _too_big(width, height)
            im.draft("RGBA" if "A" in im.mode else "RGB", (size, size))     # JPEG: decode at a reduced scale
            if im.mode == "1":
                im = im.convert("L")                    # bilevel: 1 byte a pixel, and resizable
            elif im.mode not in ("RGB", "RGBA", "L", "LA"):
                im = im.convert("RGBA")                 # palettes, 16-bit, CMYK...: resize needs a plain mode
            im.thumbnail((size, size), Image.Resampling.BOX, reducing_gap=2.0)
            rgba = np.asarray(im.convert("RGBA"), dtype=np.uint8)
    except Image.DecompressionBombError as err:         # other formats, past Pillow's own limit
        return Refused(f"{err}: not decoded")
    except UnidentifiedImageError:
        return Refused(f"not an image in a format the dashboard reads ({', '.join(FORMATS)})")
    except (OSError, ValueError, SyntaxError, struct.error) as err:     # what Pillow raises for damaged data
        return Refused(f"cannot be decoded ({type(err).__name__}: {err})")
    return np.ascontiguousarray(rgba[::-1]).view("<u4")[..., 0]


_cache: OrderedDict = OrderedDict()                 # (encoded, size) -> (thumbnail or Refused, cost in bytes)
_cache_bytes = 0
_lock = threading.Lock()


def cached_thumbnail(encoded: bytes, size: int) -> np.ndarray | Refused | None:
    """The cached :func:`thumbnail_rgba` of ``encoded`` at ``size``, or None when it is not decoded yet (this never
    decodes: cheap enough for an event loop)."""
    key = (encoded, int(size))
    with _lock:
        hit = _cache.get(key)
        if hit is None:
            return None
        _cache.move_to_end(key)
        return hit[0]


def thumbnail_rgba(encoded: bytes, size: int) -> np.ndarray | Refused:
    """:func:`decode_thumbnail`, decoded once per process for every session (see the module docstring), here and
    now: not on an event loop (see :func:`thumbnail_later`). The returned array is shared: do not modify it."""
    global _cache_bytes
    key = (encoded, int(size))
    hit = cached_thumbnail(encoded, size)
    if hit is not None:
        return hit
    picture = decode_thumbnail(encoded, size)
    if isinstance(picture, np.ndarray):
        picture.flags.writeable = False
    cost = len(encoded) + (picture.nbytes if isinstance(picture, np.ndarray) else 0)
    with _lock:
        if key not in _cache:
            _cache[key] = (picture, cost)
            _cache_bytes += cost
            while _cache_bytes > CACHE_BYTES and len(_cache) > 1:
                _cache_bytes -= _cache.popitem(last=False)[1][1]
    return picture


_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="flowlab-thumbnails")
_in_flight: dict = {}                               # (encoded, size) -> the Future of its decode


def thumbnail_later(encoded: bytes, size: int) -> Future:
    """A ``Future`` of :func:`thumbnail_rgba`, decoded in the worker thread (done at once when it is cached). Callers
    asking for the same image before it is decoded share one decode; ``add_done_callback`` runs in the worker
    thread."""
    key = (encoded, int(size))
    with _lock:
        future = _in_flight.get(key)
        if future is not None:
            return future
        hit = _cache.get(key)
        if hit is not None:
            done = Future()
            done.set_result(hit[0])
            return done
        future = _in_flight[key] = _worker.submit(_decode_in_worker, encoded, int(size))
    return future


def _decode_in_worker(encoded, size):
    try:
        return thumbnail_rgba(encoded, size)
    finally:
        with _lock:
            _in_flight.pop((encoded, size), None)


def clear_cache():
    """Forget every cached thumbnail (tests, and a server that wants its memory back)."""
    global _cache_bytes
    with _lock:
        _cache.clear()
        _cache_bytes = 0
