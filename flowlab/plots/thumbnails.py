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
"""
from __future__ import annotations

import io
import struct
import threading
from collections import OrderedDict
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


def thumbnail_rgba(encoded: bytes, size: int) -> np.ndarray | Refused:
    """:func:`decode_thumbnail`, decoded once per process for every session (see the module docstring). The
    returned array is shared: do not modify it."""
    global _cache_bytes
    key = (encoded, int(size))
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit[0]
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


def clear_cache():
    """Forget every cached thumbnail (tests, and a server that wants its memory back)."""
    global _cache_bytes
    with _lock:
        _cache.clear()
        _cache_bytes = 0
