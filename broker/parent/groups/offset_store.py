"""Committed offsets, kept: `OffsetStore`, the committed and pending offsets of every group
and the file that keeps them, replayed at start-up.

`<first log dir>/.pybroker-offsets.jsonl` (broker.parent.record_file) holds one record per
committed partition offset (the latest record of a (group, topic, partition) wins) and
tombstones: a record with `"offset": null` deletes one partition's offset,
`{"group": g, "deleted": true}` a whole group.  A commit is written before it is acknowledged,
so it survives the death of any worker and `kill -9` of the broker, like an acknowledged
produce; as for the log, fsync follows `log.flush.interval.messages` (1: every commit is
fsynced).

Offsets committed inside a transaction (TxnOffsetCommit) are written at once with the
producer's id and stay pending: invisible to OffsetFetch until the transaction ends.  Its end
is a record `{"group": g, "producer_id": p, "outcome": "commit" | "abort"}`: a commit makes
the producer's pending offsets of that group committed, an abort drops them.  Replaying the
file rebuilds both, so a transaction the coordinator completes after a restart still finds
its offsets.

When the file holds more than twice the live records (and at least COMPACT_MIN of them), it is
rewritten with the live ones only: checked after every commit, so the file stays within about
twice what it holds (each rewrite costs O(live), paid once per as many commits).  Only the
parent writes it: it is the group coordinator.  The requests that read and change it are
broker.parent.groups.offsets's.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import msgspec

from broker.parent.record_file import RecordFile

log = logging.getLogger("broker.parent.groups.offset_store")

FILE_NAME = ".pybroker-offsets.jsonl"
COMPACT_MIN = 10000
NO_PRODUCER = -1


class Record(msgspec.Struct, omit_defaults=True):
    group: str
    topic: str = ""
    partition: int = -1
    offset: int | None = None
    leader_epoch: int = -1
    metadata: str | None = None
    committed_ms: int = 0
    deleted: bool = False
    producer_id: int = NO_PRODUCER  # a transaction's offset (pending), or the end of one
    outcome: str = ""  # "commit" or "abort": the end of producer_id's transaction


@dataclass
class Committed:
    offset: int
    leader_epoch: int
    metadata: str | None
    committed_ms: int
    written: int = 0  # when it was written, in the file's order (replay gives the same)


Offsets = dict[tuple[str, int], Committed]


class OffsetStore:
    """Every group's committed offsets (`groups`) and the offsets pending in a transaction
    (`pending`), as the file holds them: written first, then applied."""

    def __init__(self, directory: str, fsync_every_commit: bool = False):
        self.file = RecordFile(os.path.join(directory, FILE_NAME), Record, fsync_every_commit)
        self.groups: dict[str, Offsets] = {}
        self.pending: dict[str, dict[int, Offsets]] = {}  # group -> producer id -> offsets
        self._live = 0  # offsets held: the file is compacted when it has twice as many lines
        self._written = 0  # offsets applied so far: their order, as Kafka's log offsets
        for record in self.file.replay():
            self._apply(record)
        self.maybe_compact()

    @property
    def path(self) -> str:
        return self.file.path

    # --- reading ----------------------------------------------------------------------------

    def _apply(self, record: Record) -> None:
        if record.producer_id != NO_PRODUCER:
            self._apply_transactional(record)
        elif record.deleted:  # a transaction's pending offsets go with the group, as in Kafka
            self._live -= len(self.groups.pop(record.group, {}))
            self._live -= sum(map(len, self.pending.pop(record.group, {}).values()))
        elif record.offset is None:
            offsets = self.groups.get(record.group, {})
            self._live -= offsets.pop((record.topic, record.partition), None) is not None
            if not offsets:
                self.groups.pop(record.group, None)
        else:
            self._set(self.groups.setdefault(record.group, {}), record)

    def _set(self, offsets: Offsets, record: Record) -> None:
        key = (record.topic, record.partition)
        self._live += key not in offsets
        self._written += 1
        offsets[key] = Committed(record.offset, record.leader_epoch, record.metadata,
                                 record.committed_ms, self._written)

    def _apply_transactional(self, record: Record) -> None:
        producers = self.pending.setdefault(record.group, {})
        if not record.outcome:  # an offset waiting for its transaction's end
            self._set(producers.setdefault(record.producer_id, {}), record)
            return
        staged = producers.pop(record.producer_id, {})
        if not producers:
            del self.pending[record.group]
        self._live -= len(staged)
        if record.outcome == "commit":
            offsets = self.groups.setdefault(record.group, {})
            for key, committed in staged.items():
                current = offsets.get(key)
                # As Kafka: the offset written later wins; a plain commit after the
                # TxnOffsetCommit (before the transaction ended) is not overwritten.
                if current is None or committed.written > current.written:
                    self._live += current is None
                    offsets[key] = committed
            if not offsets:
                del self.groups[record.group]

    def get(self, group: str) -> Offsets:
        return self.groups.get(group, {})

    def pending_partitions(self, group: str) -> set[tuple[str, int]]:
        """Partitions with an offset waiting for a transaction's end (require_stable)."""
        return {key for staged in self.pending.get(group, {}).values() for key in staged}

    def live(self) -> int:
        return self._live

    # --- writing ----------------------------------------------------------------------------

    def commit(self, records: list[Record]) -> None:
        """Persist, then apply: raises OSError (nothing applied) if the write fails.  Records
        with a producer id are a transaction's: pending until `end_transaction`."""
        if not records:
            return
        self.file.append(records)
        for record in records:
            self._apply(record)
        self.maybe_compact()  # by size, as it grows: not only on the retention check's timer

    def end_transaction(self, group: str, producer_id: int, commit: bool,
                        now_ms: int = 0) -> None:
        """The producer's transaction ended: its pending offsets of `group` become committed
        (stamped `now_ms`) or are dropped."""
        staged = self.pending.get(group, {}).get(producer_id)
        if staged is None:
            return  # nothing staged (or completed before a restart already)
        for committed in staged.values():
            committed.committed_ms = now_ms or committed.committed_ms
        self.commit([Record(group=group, producer_id=producer_id,
                            outcome="commit" if commit else "abort")])

    def delete_group(self, group: str) -> None:
        self.delete_groups([group])

    def delete_groups(self, groups) -> None:
        """Every offset of these groups, committed or pending, in one write."""
        self.commit([Record(group=group, deleted=True) for group in groups
                     if group in self.groups or group in self.pending])

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:
        self.file.close()

    def maybe_compact(self) -> None:
        """Rewrite the file with the live offsets once it holds twice as many lines; a failed
        rewrite leaves it as it was (a commit already written stays acknowledged)."""
        if self.file.lines < COMPACT_MIN or self.file.lines <= 2 * self.live():
            return
        try:
            self.file.rewrite(self._live_records())
        except OSError as error:
            log.error("rewriting %s failed: %s", self.file.path, error)

    def _live_records(self) -> list[Record]:
        """Every offset held, committed and pending, in the order they were written (which
        one is later decides when a transaction's offsets are committed)."""
        held = [(found.written, group, key, found, NO_PRODUCER)
                for group, offsets in self.groups.items() for key, found in offsets.items()]
        held += [(found.written, group, key, found, producer_id)
                 for group, producers in self.pending.items()
                 for producer_id, offsets in producers.items()
                 for key, found in offsets.items()]
        held.sort(key=lambda item: item[0])
        return [Record(group=group, topic=topic, partition=partition, offset=found.offset,
                       leader_epoch=found.leader_epoch, metadata=found.metadata,
                       committed_ms=found.committed_ms, producer_id=producer_id)
                for _, group, (topic, partition), found, producer_id in held]
