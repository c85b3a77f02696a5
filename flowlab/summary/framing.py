"""Finding the records of an event file in its bytes, and skipping the damaged ones.

A TFRecord is ``length (u64) | masked CRC-32C of length (u32) | data | masked CRC-32C of data (u32)``
(``record.py``). ``RecordFramer.split`` finds a buffer's complete records: ``_hop`` walks from record to record in
a tight loop computing each payload's CRC-32C, then NumPy checks every length checksum and data checksum at once
(``_verify``). A bad record is skipped as ``record.RecordScanner`` skips it (find the next place where a length and
its checksum agree and the data checks out, count one corrupt record per damaged stretch), but the search is
``record.next_record``, vectorised, so its cost is linear in the damaged bytes; see ``split`` for why scattered
damage stays linear too. Each file may search ``budget`` bytes of damage per poll; the rest waits for the next poll,
so a file of junk never delays the other files' new records.
"""
from __future__ import annotations

import struct

import numpy as np
from crc32c import crc32c

from .record import FOOTER, HEADER, masked_crc, next_record


class RecordFramer:
    """The framing of one tailer's files. ``counts`` (shared with the tailer's ``stats()``) gains
    ``records_skipped``, ``bytes_skipped``; ``budget`` is the bytes of damage the file being read may still search
    in this poll (the tailer sets it per file), ``resumed_at`` where a search that ran out of it stopped. A file's
    own state is its ``in_bad_run`` flag: whether its last record read was damaged (one count per stretch)."""

    def __init__(self, counts, max_record=1 << 31):
        self.counts, self.max_record = counts, max_record
        self.budget, self.resumed_at = 0, 0

    def split(self, f, buf):
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
                q = self.resync(f, buf, int(starts[k]))
                if q is None:
                    return self._found(found_starts, found_lengths, self.resumed_at, True)
                i = int(np.searchsorted(starts, q))
                if i == hopped or starts[i] != q:
                    pos, batch, diverged = q, _FIRST_BATCH, True
                    break
            if diverged:
                continue
            if hopped == batch:                 # the batch limit stopped the hop, not the end of the data
                pos, batch = stop, min(batch * 4, _MAX_BATCH)
            elif n - stop >= HEADER and self.header(buf, stop) is None:
                q = self.resync(f, buf, stop)   # a corrupt length can look like a record still being written
                if q is None:
                    return self._found(found_starts, found_lengths, self.resumed_at, True)
                pos, batch = q, _FIRST_BATCH
            else:
                return self._found(found_starts, found_lengths, stop, False)

    @staticmethod
    def _found(found_starts, found_lengths, pos, deferred):
        if not found_starts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), pos, deferred
        return np.concatenate(found_starts), np.concatenate(found_lengths).astype(np.int64), pos, deferred

    def header(self, buf, pos):
        """The record length at ``pos`` if its checksum agrees, else None."""
        (length,) = _u64.unpack_from(buf, pos)
        ok = _u32.unpack_from(buf, pos + 8)[0] == masked_crc(buf[pos:pos + 8]) and length <= self.max_record
        return length if ok else None

    def resync(self, f, buf, bad) -> int | None:
        """Skip the damaged record at ``bad``: the next offset holding a valid (or still incomplete) record, or
        None when this file's budget of bytes to search ran out first (``resumed_at`` then says where to resume).
        The budget keeps one file of junk from holding up every other file of the poll."""
        if not f.in_bad_run:
            self.counts["records_skipped"] += 1
            f.in_bad_run = True
        limit = bad + 1 + max(self.budget, 0)
        q = next_record(buf, bad + 1, limit, self.max_record)
        self.counts["bytes_skipped"] += q - bad
        self.budget -= q - bad
        if q == limit and len(buf) - q >= HEADER:
            self.resumed_at = q
            return None
        return q


# -- helpers -----------------------------------------------------------------------------------------------------
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


def at_offsets(b, dtype, at):
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
    lengths = at_offsets(b, "<u8", starts)
    # Few distinct lengths occur in a file: checksum each once.
    distinct, inverse = np.unique(lengths, return_inverse=True)
    expected = np.array([masked_crc(_u64.pack(x)) for x in distinct.tolist()], np.uint64)[inverse.ravel()]
    ok = at_offsets(b, "<u4", starts + 8) == expected
    ok &= at_offsets(b, "<u4", starts + HEADER + lengths.astype(np.int64)) == _mask(np.array(crcs, np.uint64))
    return starts, lengths, ok

