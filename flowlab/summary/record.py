"""TFRecord framing of event files: ``u64 length | u32 masked crc(length) | data | u32 masked crc(data)``.

CRC-32C (Castagnoli) comes from the native ``crc32c`` package; TensorBoard masks it so that a CRC of data that itself
holds CRCs stays well distributed.
"""
from __future__ import annotations

import struct

from crc32c import crc32c

HEADER = 12          # length (8) + its crc (4)
FOOTER = 4
_MASK_DELTA = 0xA282EAD8
_u64 = struct.Struct("<Q")
_u32 = struct.Struct("<I")


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    """One record holding ``data``."""
    length = _u64.pack(len(data))
    return b"".join((length, _u32.pack(masked_crc(length)), data, _u32.pack(masked_crc(data))))


class RecordScanner:
    """Pull complete records out of a growing byte stream, surviving corruption: the plain reference reader.

    ``tailer.LogdirTailer`` applies the same rules with a vectorised fast path; tests hold the two to each other.

    ``feed(chunk)`` appends bytes; ``read()`` returns each complete, checksum-valid payload. A partial record at
    the end waits for more bytes. A record whose length or data checksum is wrong is skipped: the scanner moves one
    byte on and looks for the next position where a length and its checksum agree (resynchronisation), counting
    what it skipped in ``corrupt_records`` / ``skipped_bytes``.
    """

    def __init__(self, max_record=1 << 31):
        self._buffer = bytearray()
        self._pos = 0
        self.max_record = max_record
        self.corrupt_records = 0
        self.skipped_bytes = 0
        self.offset = 0          # bytes consumed from the stream so far (complete records and skipped bytes)
        self._in_bad_run = False

    def feed(self, chunk: bytes):
        if self._pos:
            del self._buffer[:self._pos]
            self._pos = 0
        self._buffer += chunk

    def pending_bytes(self) -> int:
        return len(self._buffer) - self._pos

    def read(self) -> list[bytes]:
        """Every complete, checksum-valid payload fed so far and not yet returned."""
        buf, out = self._buffer, []
        while len(buf) - self._pos >= HEADER:
            pos = self._pos
            length_bytes = bytes(buf[pos:pos + 8])
            (length,) = _u64.unpack(length_bytes)
            (length_crc,) = _u32.unpack_from(buf, pos + 8)
            if length_crc != masked_crc(length_bytes) or length > self.max_record:
                self._skip(1)
                continue
            end = pos + HEADER + length + FOOTER
            if end > len(buf):
                break                           # the rest of this record has not been written yet
            data = bytes(buf[pos + HEADER:pos + HEADER + length])
            (data_crc,) = _u32.unpack_from(buf, pos + HEADER + length)
            if data_crc != masked_crc(data):
                self._skip(1)
                continue
            self._in_bad_run = False
            self._pos = end
            self.offset += end - pos
            out.append(data)
        return out

    def _skip(self, n):
        if not self._in_bad_run:
            self.corrupt_records += 1
            self._in_bad_run = True
        self._pos += n
        self.offset += n
        self.skipped_bytes += n
