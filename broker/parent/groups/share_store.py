"""The durable form of share partitions (KIP-932): one record per (group, topic id, partition),
its latest wins.

`<first log dir>/.pybroker-share-partitions.jsonl` (broker.parent.record_file) gets a share
partition's start offset, its end, and its in-flight records as runs of (first offset, last
offset, state, delivery count), written after every request or timer that changed it and
before the answer goes out.  A restart takes each back with every record it held ACQUIRED
made AVAILABLE again, its delivery count kept: what was acquired but not acknowledged is
delivered again, and what was accepted never is (as Kafka's share coordinator keeps the share
group state).  A share partition deleted (DeleteShareGroupOffsets, the group deleted) is a
record without the `alive` mark.
"""

from __future__ import annotations

import logging
import os
import uuid

import msgspec

from broker.parent.groups.share_partition import InFlight, Limits, RecordState, SharePartition
from broker.parent.record_file import LatestRecords

log = logging.getLogger("broker.parent.groups.share_store")

FILE_NAME = ".pybroker-share-partitions.jsonl"
REWRITE_MIN_BYTES = 1 << 20


class SavedShare(msgspec.Struct, array_like=True):
    group: str
    topic: str  # the topic id
    partition: int
    alive: bool = True
    start: int = 0
    end: int = 0
    runs: list[tuple[int, int, int, int]] = []  # first, last, state, deliveries


def saved_form(group_id: str, key: tuple[uuid.UUID, int], share: SharePartition) -> SavedShare:
    runs: list[list[int]] = []
    for offset in sorted(share.records):
        record = share.records[offset]
        state = int(record.state)
        if runs and runs[-1][1] + 1 == offset and runs[-1][2] == state and \
                runs[-1][3] == record.deliveries:
            runs[-1][1] = offset
        else:
            runs.append([offset, offset, state, record.deliveries])
    return SavedShare(group_id, str(key[0]), key[1], True, share.start, share.end,
                      [tuple(run) for run in runs])


def restored(saved: SavedShare, limits: Limits) -> SharePartition:
    """The share partition a record describes; what was ACQUIRED is AVAILABLE again."""
    share = SharePartition(saved.start, limits)
    share.end = saved.end
    for first, last, state, deliveries in saved.runs:
        state = RecordState(state)
        if state is RecordState.ACQUIRED:
            state = RecordState.AVAILABLE
        for offset in range(first, last + 1):
            share.records[offset] = InFlight(state, deliveries)
    return share


class ShareStore:
    """The saved share partitions: (group, topic id, partition) -> the latest live record."""

    def __init__(self, directory: str, fsync_every_write: bool = False):
        self.records = LatestRecords(os.path.join(directory, FILE_NAME), SavedShare,
                                     key=lambda r: (r.group, r.topic, r.partition),
                                     alive=lambda r: r.alive,
                                     fsync_every_write=fsync_every_write,
                                     rewrite_min_bytes=REWRITE_MIN_BYTES)

    def of_group(self, group_id: str) -> list[SavedShare]:
        return [saved for (group, _, _), saved in self.records.saved.items() if group == group_id]

    def groups(self) -> set[str]:
        return {group for group, _, _ in self.records.saved}

    def save(self, group_id: str, key: tuple[uuid.UUID, int], share: SharePartition) -> None:
        self._write(saved_form(group_id, key, share))

    def forget(self, group_id: str, key: tuple[uuid.UUID, int]) -> None:
        if (group_id, str(key[0]), key[1]) in self.records.saved:
            self._write(SavedShare(group_id, str(key[0]), key[1], alive=False))

    def _write(self, record: SavedShare) -> None:
        try:
            self.records.write(record)
        except OSError as error:
            log.error("saving share partition %s of group %s failed: %s",
                      (record.topic, record.partition), record.group, error)

    def close(self) -> None:
        self.records.close()
