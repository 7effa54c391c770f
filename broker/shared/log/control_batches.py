"""Transactions at the log level (KIP-98): control batches (commit/abort markers) and a
partition's aborted-transaction index.

A marker is one control batch, byte for byte as Kafka writes it (clients parse it):

    header   magic 2, attributes TRANSACTIONAL|CONTROL (0x30), the producer's id and epoch,
             base sequence -1, one record, last offset delta 0, both timestamps the broker's
    record   DefaultRecord v2: attributes 0, timestamp delta 0, offset delta 0,
             key   = int16 version 0, int16 type (0 ABORT, 1 COMMIT)
             value = int16 version 0, int32 coordinator epoch,   no headers

Clients may not write control batches (records.BatchCheck refuses them), so markers are built
here and checked by their own path (`marker_batch` validates what it built).

The aborted-transaction index, `<partition dir>/aborted-txns`, holds one 24-byte big-endian
entry per aborted transaction: producer id int64, first offset int64, last offset int64 (the
abort marker's offset).  Entries are appended under the partition lock in marker order (so by
last offset), written before the partition's state publishes their count: readers, without
the lock, read only that many.  The file only ever grows, except when a repair cuts entries
whose markers the log lost; entries below the log start offset are filtered by the reads
(a fetch never starts below it) rather than deleted.
"""

from __future__ import annotations

import bisect
import os
import struct
from array import array

from crc32c import crc32c

from broker.shared.log import records
from broker.shared.log.files import OpenFiles
from broker.shared.log.partition_state import W_ABORTED_COUNT, W_ABORTED_VERSION
from broker.shared.protocol.varint import zigzag

ABORTED_FILE = "aborted-txns"
ENTRY = struct.Struct(">qqq")  # producer id, first offset, last offset
ABORT, COMMIT = 0, 1  # Kafka's ControlRecordType
MARKER_ATTRIBUTES = records.TRANSACTIONAL | records.CONTROL
_KEY = struct.Struct(">hh")  # version, type
_VALUE = struct.Struct(">hi")  # version, coordinator epoch
_AFTER_CRC = struct.Struct(">hiqqqhii")  # attributes .. record count (bytes 21..60)
_BEFORE_CRC = struct.Struct(">qiib")  # base offset, batch length, leader epoch, magic


# --- markers ------------------------------------------------------------------------------


def marker_batch(producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                 timestamp_ms: int) -> bytes:
    """The control batch ending a transaction (base offset 0: set when written)."""
    key = _KEY.pack(0, COMMIT if commit else ABORT)
    value = _VALUE.pack(0, coordinator_epoch)
    body = (b"\x00" + zigzag(0) + zigzag(0) + zigzag(len(key)) + key
            + zigzag(len(value)) + value + zigzag(0))
    record = zigzag(len(body)) + body
    after_crc = _AFTER_CRC.pack(MARKER_ATTRIBUTES, 0, timestamp_ms, timestamp_ms, producer_id,
                                producer_epoch, -1, 1) + record
    batch = (_BEFORE_CRC.pack(0, records.HEADER_BYTES - records.LOG_OVERHEAD + len(record), 0, 2)
             + struct.pack(">I", crc32c(after_crc)) + after_crc)
    _check_marker(batch)
    return batch


def _check_marker(batch: bytes) -> None:
    """What was built is one sound control batch of one well-formed record (not through
    records.BatchCheck, which refuses every control batch)."""
    header = records.is_sound(batch, 0, len(batch))
    if header is None or header.size != len(batch) or header.record_count != 1 \
            or header.attributes != MARKER_ATTRIBUTES:
        raise ValueError("malformed transaction marker")
    records.walk_records(batch, records.HEADER_BYTES, len(batch), 1)
    if control_type(batch) is None:
        raise ValueError("malformed transaction marker")


def control_type(batch) -> int | None:
    """ABORT or COMMIT for a stored marker batch (None: not an uncompressed control batch
    whose first record has a 4-byte version-0 key, e.g. another kind of control record)."""
    header = records.read_header(batch, 0)
    if not header.attributes & records.CONTROL or header.attributes & records.CODEC_MASK:
        return None
    try:
        position = records.HEADER_BYTES
        _length, position = records._varint(batch, position)
        _stamp, position = records._varint(batch, position + 1)  # past the attributes
        _delta, position = records._varint(batch, position)
        key_length, position = records._varint(batch, position)
        if key_length != _KEY.size:
            return None
        version, kind = _KEY.unpack_from(batch, position)
    except (IndexError, struct.error, records.BatchError):
        return None
    return kind if version == 0 and kind in (ABORT, COMMIT) else None


# --- the aborted-transaction index ---------------------------------------------------------


class AbortedIndex:
    """One process's handle on a partition's aborted-transaction index, with the entries
    read so far cached (the partition's state says how many there are).  Entries whose
    marker fell below the log start are dropped from the cache (`trim`): memory follows the
    aborts the log still holds, not every abort since the partition began; the file keeps
    them (24 bytes each)."""

    TRIM_AT_LEAST = 256  # entries dropped at once (each drop moves the rest of the arrays)

    def __init__(self, directory: str, files: OpenFiles):
        self.path = os.path.join(directory, ABORTED_FILE)
        self._files = files  # the registry's bounded open files (files.py)
        self._fd = -1
        self._version = -1
        self._clear()

    def _clear(self) -> None:
        self._producers, self._firsts, self._lasts = array("q"), array("q"), array("q")
        self._least_first = array("q")  # [i]: the least first offset of entries i..end
        self._dropped = 0  # entries of the file before the first cached one (trimmed)
        self._last_read = -1  # the last offset of the last entry read from the file

    def close(self) -> None:
        self._files.close(self)
        self._fd = -1

    def files_evicted(self) -> None:
        self._fd = -1  # what was read stays cached: the file is only appended to or cut

    def _file(self) -> int:
        if self._fd < 0:
            self._fd = self._files.open(self, self.path, os.O_RDWR | os.O_CREAT)
        else:
            self._files.touch(self)
        return self._fd

    # --- reading (no lock) -----------------------------------------------------------------

    def refresh(self, count: int, version: int) -> None:
        """Know the first `count` entries: only those not cached yet are read, unless the
        file was cut since (`version` changed, or fewer entries than cached)."""
        if version != self._version or count < self._dropped + len(self._lasts):
            self._clear()
            self._version = version
        held = len(self._lasts)
        read = self._dropped + held
        if count <= read:
            return
        raw = os.pread(self._file(), (count - read) * ENTRY.size, read * ENTRY.size)
        whole = len(raw) // ENTRY.size * ENTRY.size  # a file a repair cut may hold fewer
        for producer_id, first, last in ENTRY.iter_unpack(raw[:whole]):
            self._producers.append(producer_id)
            self._firsts.append(first)
            self._lasts.append(last)
            self._least_first.append(first)
            self._last_read = last
        self._lower_minima(held)

    def trim(self, log_start: int) -> None:
        """Forget the cached entries whose marker lies below `log_start` (retention or
        DeleteRecords took their records): once there are TRIM_AT_LEAST of them, or half."""
        gone = bisect.bisect_left(self._lasts, log_start)
        if gone == 0 or (gone < self.TRIM_AT_LEAST and 2 * gone < len(self._lasts)):
            return
        for cached in (self._producers, self._firsts, self._lasts, self._least_first):
            del cached[:gone]
        self._dropped += gone

    def _lower_minima(self, old: int) -> None:
        """Suffix minima over the new entries from `old` on, then back into the older ones
        only as far as they are lowered (usually not at all: first offsets grow)."""
        least = self._least_first
        for entry in range(len(least) - 2, -1, -1):
            lowered = min(least[entry], least[entry + 1])
            if entry < old and lowered == least[entry]:
                break
            least[entry] = lowered

    def matching(self, fetch_offset: int, upper: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the cached entries whose transaction overlaps
        [fetch_offset, upper): last offset >= fetch_offset and first offset < upper.  Entries
        are ordered by last offset; the suffix minima end the walk once no later entry can
        start below `upper`."""
        found = []
        for entry in range(bisect.bisect_left(self._lasts, fetch_offset), len(self._lasts)):
            if self._least_first[entry] >= upper:
                break
            if self._firsts[entry] < upper:
                found.append((self._producers[entry], self._firsts[entry]))
        return found

    def ranges(self) -> dict[int, list[tuple[int, int]]]:
        """producer id -> the (first offset, last offset) of its cached aborted transactions."""
        found: dict[int, list[tuple[int, int]]] = {}
        for producer_id, first, last in zip(self._producers, self._firsts, self._lasts):
            found.setdefault(producer_id, []).append((first, last))
        return found

    def last_offset(self) -> int:
        """The last offset of the last entry read (-1: none): a replayed abort is not added twice."""
        return self._last_read

    # --- writing (under the partition lock) ----------------------------------------------

    def write(self, number: int, producer_id: int, first: int, last: int) -> None:
        """Write entry `number` (the caller then publishes number + 1 as the count)."""
        data = ENTRY.pack(producer_id, first, last)
        if os.pwrite(self._file(), data, number * ENTRY.size) != len(data):
            raise OSError(f"short write to {self.path}")

    def kept_below(self, log_end: int) -> int:
        """Repair: how many leading whole entries have their marker below `log_end` (a torn
        last entry, or one whose marker the log lost, and all after it, are not)."""
        if not os.path.exists(self.path):
            return 0
        fd = self._file()
        size = os.fstat(fd).st_size
        raw = os.pread(fd, size, 0)
        kept = 0
        for _producer_id, _first, last in ENTRY.iter_unpack(raw[:size // ENTRY.size * ENTRY.size]):
            if last >= log_end:
                break
            kept += 1
        return kept

    def truncate(self, entries: int) -> None:
        """Repair: the file holds `entries` entries from now on."""
        if os.path.exists(self.path):
            fd = self._file()
            if os.fstat(fd).st_size != entries * ENTRY.size:
                os.ftruncate(fd, entries * ENTRY.size)
        self._clear()
        self._version = -1

    def flush(self) -> None:
        """fsync the index, whichever process wrote it (fsync works on the file, not on the
        descriptor that wrote)."""
        if os.path.exists(self.path):
            os.fsync(self._file())


# --- a partition's transaction words (under its lock) -------------------------------------


def index_abort(state, index: AbortedIndex, producer_id: int, first: int,
                marker_offset: int) -> None:
    """Add an aborted transaction to the index (the entry before its count in `state`),
    unless the index has it already (a repair's replay)."""
    count = state[W_ABORTED_COUNT]
    index.refresh(count, state[W_ABORTED_VERSION])
    if marker_offset > index.last_offset():  # entries are in marker order
        index.write(count, producer_id, first, marker_offset)
        state[W_ABORTED_COUNT] = count + 1


def ongoing_word(producers) -> int:
    """The state's W_ONGOING_FIRST as the producer table has it: 1 + the least first offset
    of an ongoing transaction, 0 for none."""
    ongoing = producers.ongoing()
    return ongoing[0][2] + 1 if ongoing else 0
