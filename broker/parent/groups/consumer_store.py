"""The durable form of consumer groups (KIP-848): one record per group, its latest wins.

`<first log dir>/.pybroker-consumer-groups.jsonl` (broker.parent.record_file) gets the whole
group each time a heartbeat or a timer changes it: its epochs, assignor, subscribed topics'
partition counts, target assignment, and every member with its subscription, epoch, state,
assignment and partitions still to revoke, written before the answer goes out (as Kafka's
coordinator writes its records to __consumer_offsets before it answers).  A group deleted is a
record without the `alive` mark.  The file is rewritten with the live records once it is more
than twice their size (and past REWRITE_MIN_BYTES).

What a group costs to write grows with its members and partitions; it is written only when
something changed, never for a heartbeat that changes nothing.
"""

from __future__ import annotations

import logging
import math
import os
import uuid

import msgspec

from broker.parent.groups.consumer_state import ConsumerGroup, ConsumerMember, MemberState
from broker.parent.record_file import LatestRecords

log = logging.getLogger("broker.parent.groups.consumer_store")

FILE_NAME = ".pybroker-consumer-groups.jsonl"
REWRITE_MIN_BYTES = 1 << 20

Parts = list[tuple[str, list[int]]]  # (topic id, partitions)


class SavedConsumer(msgspec.Struct, omit_defaults=True):
    member_id: str
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    epoch: int
    previous_epoch: int
    state: str
    instance_id: str | None = None
    rack_id: str | None = None
    topic_names: list[str] = []
    topic_regex: str | None = None
    server_assignor: str | None = None
    assigned: Parts = []
    revoking: Parts = []
    left: bool = False
    user: str = "ANONYMOUS"
    host: str = ""


class SavedConsumerGroup(msgspec.Struct, omit_defaults=True):
    group: str
    alive: bool = False
    group_epoch: int = 0
    assignment_epoch: int = 0
    assignor: str = ""
    partitions: list[tuple[str, int]] = []
    target: list[tuple[str, Parts]] = []  # (member id, its target)
    members: list[SavedConsumer] = []
    empty_since_ms: int = 0
    topic_names: list[str] = []  # the subscribed topics' names (OffsetDelete refuses theirs)


def _parts(assignment) -> Parts:
    return [(str(topic), sorted(partitions)) for topic, partitions in assignment.items()]


def _assignment(parts: Parts) -> dict:
    return {uuid.UUID(topic): frozenset(partitions) for topic, partitions in parts}


def saved_form(group: ConsumerGroup) -> SavedConsumerGroup:
    return SavedConsumerGroup(
        group=group.group_id, alive=True, group_epoch=group.group_epoch,
        assignment_epoch=group.assignment_epoch, assignor=group.assignor,
        partitions=[(str(topic), count) for topic, count in group.partitions.items()],
        target=[(member, _parts(goal)) for member, goal in group.target.items()],
        members=[SavedConsumer(
            m.member_id, m.client_id, m.client_host, m.rebalance_timeout_ms, m.epoch,
            m.previous_epoch, m.state.value, m.instance_id, m.rack_id, list(m.topic_names),
            m.topic_regex, m.server_assignor, _parts(m.assigned), _parts(m.revoking), m.left,
            m.user, m.host)
            for m in group.members.values()],
        empty_since_ms=group.empty_since_ms, topic_names=sorted(group.topic_names))


def restored_group(saved: SavedConsumerGroup) -> ConsumerGroup:
    """The group a record describes, its members' sessions not started (infinite deadlines:
    `ConsumerGroups.start` starts them when the broker serves)."""
    group = ConsumerGroup(saved.group, group_epoch=saved.group_epoch,
                          assignment_epoch=saved.assignment_epoch, assignor=saved.assignor,
                          partitions={uuid.UUID(t): count for t, count in saved.partitions},
                          target={member: _assignment(goal) for member, goal in saved.target},
                          empty_since_ms=saved.empty_since_ms,
                          topic_names=frozenset(saved.topic_names))
    for m in saved.members:
        member = ConsumerMember(
            m.member_id, m.instance_id, m.rack_id, m.client_id, m.client_host,
            m.rebalance_timeout_ms, tuple(m.topic_names), m.topic_regex, m.server_assignor,
            m.epoch, m.previous_epoch, MemberState(m.state), left=m.left, user=m.user,
            host=m.host, deadline=math.inf)
        group.add(member)
        group.set_owned(member, _assignment(m.assigned), _assignment(m.revoking))
    return group


class ConsumerGroupStore:
    """The saved consumer groups (group id -> its latest live record) and their file."""

    def __init__(self, directory: str, fsync_every_write: bool = False):
        self.records = LatestRecords(os.path.join(directory, FILE_NAME), SavedConsumerGroup,
                                     key=lambda record: record.group,
                                     alive=lambda record: record.alive,
                                     fsync_every_write=fsync_every_write,
                                     rewrite_min_bytes=REWRITE_MIN_BYTES)
        self.saved: dict[str, SavedConsumerGroup] = self.records.saved

    def save(self, group: ConsumerGroup) -> None:
        """The group as it is now; a write that fails is logged and costs what the record
        held: after a restart the group is as it was last saved."""
        self._write(saved_form(group))

    def forget(self, group_id: str) -> None:
        if group_id in self.saved:
            self._write(SavedConsumerGroup(group=group_id))

    def _write(self, record: SavedConsumerGroup) -> None:
        try:
            self.records.write(record)
        except OSError as error:
            log.error("saving consumer group %s failed: %s", record.group, error)

    def close(self) -> None:
        self.records.close()
