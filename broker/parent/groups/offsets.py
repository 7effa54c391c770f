"""Committed offsets, durable: an append-only file of JSON lines, replayed at start-up.

`<first log dir>/.pybroker-offsets.jsonl` holds one record per committed partition offset
(the latest record of a (group, topic, partition) wins) and tombstones: a record with
`"offset": null` deletes one partition's offset, `{"group": g, "deleted": true}` a whole group.
A commit is written (one `write` of all its records, O_APPEND) before it is acknowledged, so it
survives the death of any worker and `kill -9` of the broker, like an acknowledged produce;
as for the log, fsync follows `log.flush.interval.messages` (1: every commit is fsynced).
When the file holds more than twice the live records (and at least COMPACT_MIN of them), it is
rewritten with the live ones only (temporary file, fsync, rename): checked after every commit,
so the file stays within about twice what it holds (each rewrite costs O(live), paid once per
as many commits).  Only the parent writes it: it is the group coordinator.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import msgspec

log = logging.getLogger("broker.parent.groups.offsets")

FILE_NAME = ".pybroker-offsets.jsonl"
COMPACT_MIN = 10000


class Record(msgspec.Struct, omit_defaults=True):
    group: str
    topic: str = ""
    partition: int = -1
    offset: int | None = None
    leader_epoch: int = -1
    metadata: str | None = None
    committed_ms: int = 0
    deleted: bool = False


@dataclass
class Committed:
    offset: int
    leader_epoch: int
    metadata: str | None
    committed_ms: int


class OffsetStore:
    def __init__(self, directory: str, fsync_every_commit: bool = False):
        self.path = os.path.join(directory, FILE_NAME)
        self.fsync = fsync_every_commit
        self.groups: dict[str, dict[tuple[str, int], Committed]] = {}
        self._records = 0  # lines in the file
        self._live = 0  # offsets held: the file is compacted when it has twice as many lines
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder(Record)
        self._load()
        self._cut_torn_tail()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.maybe_compact()

    # --- reading ----------------------------------------------------------------------------

    def _load(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                for number, line in enumerate(handle, 1):
                    self._records += 1
                    try:
                        self._apply(self._decoder.decode(line))
                    except msgspec.DecodeError:
                        # Only a torn last line can be bad (a crash mid-write): skip it.
                        log.warning("%s:%d: unreadable offset record skipped", self.path, number)
        except FileNotFoundError:
            pass

    def _cut_torn_tail(self) -> None:
        """A crash mid-write can leave a last line without its newline: cut it off, or the
        next commit would be glued to it and lost at the following start-up."""
        try:
            with open(self.path, "rb+") as handle:
                data = handle.read()
                if data and not data.endswith(b"\n"):
                    handle.truncate(data.rfind(b"\n") + 1)
        except FileNotFoundError:
            pass

    def _apply(self, record: Record) -> None:
        if record.deleted:
            self._live -= len(self.groups.pop(record.group, {}))
            return
        offsets = self.groups.setdefault(record.group, {})
        key = (record.topic, record.partition)
        if record.offset is None:
            self._live -= offsets.pop(key, None) is not None
            if not offsets:
                del self.groups[record.group]
        else:
            self._live += key not in offsets
            offsets[key] = Committed(record.offset, record.leader_epoch, record.metadata,
                                     record.committed_ms)

    def get(self, group: str) -> dict[tuple[str, int], Committed]:
        return self.groups.get(group, {})

    def live(self) -> int:
        return self._live

    # --- writing ----------------------------------------------------------------------------

    def commit(self, records: list[Record]) -> None:
        """Persist, then apply: raises OSError (nothing applied) if the write fails."""
        if not records:
            return
        data = b"".join(self._encoder.encode(record) + b"\n" for record in records)
        os.write(self._fd, data)
        if self.fsync:
            os.fsync(self._fd)
        self._records += len(records)
        for record in records:
            self._apply(record)
        self.maybe_compact()  # by size, as it grows: not only on the retention check's timer

    def delete_group(self, group: str) -> None:
        if group in self.groups:
            self.commit([Record(group=group, deleted=True)])

    def flush(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1

    def maybe_compact(self) -> None:
        live = self.live()
        if self._records < COMPACT_MIN or self._records <= 2 * live:
            return
        temporary = self.path + ".tmp"
        with open(temporary, "wb") as handle:
            for group, offsets in self.groups.items():
                for (topic, partition), found in offsets.items():
                    handle.write(self._encoder.encode(Record(
                        group=group, topic=topic, partition=partition, offset=found.offset,
                        leader_epoch=found.leader_epoch, metadata=found.metadata,
                        committed_ms=found.committed_ms)) + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        log.info("compacted committed offsets: %d records -> %d", self._records, live)
        self._records = live
