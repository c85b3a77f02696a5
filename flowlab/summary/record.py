"""TFRecord framing of event files: ``u64 length | u32 masked crc(length) | data | u32 masked crc(data)``.

CRC-32C (Castagnoli) comes from the native ``crc32c`` package; TensorBoard masks it so that a CRC of data that itself
holds CRCs stays well distributed.
"""
from __future__ import annotations

import struct

import numpy as np
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

    ``framing.RecordFramer`` applies the same rules with a vectorised fast path; tests hold the two to each other.

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


# -- finding the next record in damaged bytes, vectorised ----------------------------------------------------------
# CRC-32C of an 8-byte little-endian length below 2**32 (its high four bytes zero) depends on the low four bytes only:
# with slicing-by-8 tables T0..T7 it is ~(T7[b0] ^ T6[b1] ^ T5[b2] ^ T4[b3]) of those bytes xor 0xFFFFFFFF, the zero
# bytes contributing T3[0] ^ ... ^ T0[0] = 0. Pairs of tables merged into two 65536-entry ones make it two lookups.
def _crc_tables():
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & 1, (t >> 1) ^ np.uint32(0x82F63B78), t >> 1).astype(np.uint32)
    tables = [t]
    for _ in range(7):
        prev = tables[-1]
        tables.append((prev >> 8) ^ t[prev & 0xFF])
    x = np.arange(1 << 16, dtype=np.uint32)
    low = tables[7][x & 0xFF] ^ tables[6][x >> 8]         # bytes 0 and 1 of the length
    high = tables[5][x & 0xFF] ^ tables[4][x >> 8]        # bytes 2 and 3
    return low, high


_LOW16, _HIGH16 = _crc_tables()


def _masked_length_crcs(low32: np.ndarray) -> np.ndarray:
    """Masked CRC-32C of the 8-byte little-endian lengths ``low32`` (each below 2**32), as uint32."""
    w = low32 ^ np.uint32(0xFFFFFFFF)
    crc = (_LOW16[w & 0xFFFF] ^ _HIGH16[w >> 16]) ^ np.uint32(0xFFFFFFFF)
    return ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(_MASK_DELTA)   # uint32 wraps: mod 2**32


def next_record(buf, start, stop, max_record=1 << 31) -> int:
    """The first offset ``p`` in ``[start, stop)`` where ``buf`` holds a record header whose length checksum agrees,
    with a length of at most ``max_record``, and whose data checksum agrees too or whose data is not all in ``buf``
    yet (a record still being written). When there is none, ``min(stop, len(buf) - HEADER + 1)``: the search went
    that far (less than a header is left after it).

    This is ``RecordScanner``'s resynchronisation rule done in NumPy on growing windows, so its cost is linear in the
    bytes skipped, with a small constant when the next record is near."""
    b = np.frombuffer(buf, np.uint8)
    n = len(b)
    stop = min(stop, n - HEADER + 1)
    window = 256
    limit = np.uint32(min(max_record, (1 << 32) - 1))
    while start < stop:
        hi = min(stop, start + window)
        m = hi - start
        low = np.ndarray((m,), "<u4", b, offset=start, strides=(1,))
        high = np.ndarray((m,), "<u4", b, offset=start + 4, strides=(1,))
        stored = np.ndarray((m,), "<u4", b, offset=start + 8, strides=(1,))
        # Cheap filters on whole windows first, the checksum only where they pass. Twelve zero bytes are never a
        # header (the masked CRC of a zero length is 0x07980329): this keeps zero-filled stretches, which crashed
        # writers leave behind, as cheap as random bytes.
        maybe = high == 0
        maybe &= low <= limit
        maybe &= (low | stored) != 0
        cand = np.flatnonzero(maybe)
        if len(cand):
            cand = cand[_masked_length_crcs(low[cand]) == stored[cand]]
            for p in (cand + start).tolist():
                (length,) = _u64.unpack_from(buf, p)
                end = p + HEADER + length
                if end + FOOTER > n or _u32.unpack_from(buf, end)[0] == masked_crc(buf[p + HEADER:end]):
                    return p
        start = hi
        window = min(window * 4, 1 << 22)
    return stop
