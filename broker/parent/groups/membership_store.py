"""Group membership, kept: `MembershipStore`, each group's last stable generation (its
protocol, leader, members and their assignments) and the file that keeps them, and the record
form of a group (`saved_form`, `stable_group`).

`<first log dir>/.pybroker-groups.jsonl` (broker.parent.record_file) gets one record of a
group each time a generation becomes stable (the leader's SyncGroup) or a static member takes
over a place, written before the answers go out, and a record without members when the group
becomes empty (it is forgotten), as Kafka's coordinator writes group metadata records to
__consumer_offsets.  The latest record of a group wins.  The file is rewritten with the live
records once it is more than twice their size (and past REWRITE_MIN_BYTES).  A write that
fails is logged and costs only this: after a restart the group's members join again.

The store is keyed by group id and knows of a record only its `group` and whether it has
members (a record without members forgets the group); broker.parent.groups.membership decides
when a group is saved and takes the saved groups back at start-up.
"""

from __future__ import annotations

import logging
import os

import msgspec

from broker.parent.groups.state import Group, GroupState, Member
from broker.parent.record_file import LatestRecords

log = logging.getLogger("broker.parent.groups.membership_store")

FILE_NAME = ".pybroker-groups.jsonl"
REWRITE_MIN_BYTES = 1 << 20


class SavedMember(msgspec.Struct):
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: list[tuple[str, bytes]]
    assignment: bytes


class SavedGroup(msgspec.Struct, omit_defaults=True):
    group: str
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: list[SavedMember] = []


def saved_form(group: Group) -> SavedGroup:
    return SavedGroup(group=group.group_id, generation=group.generation,
                      protocol_type=group.protocol_type, protocol=group.protocol,
                      leader=group.leader, members=[
                          SavedMember(m.member_id, m.instance_id, m.client_id, m.client_host,
                                      round(m.session_timeout * 1000),
                                      round(m.rebalance_timeout * 1000), m.protocols,
                                      m.assignment)
                          for m in group.members.values()])


def stable_group(saved: SavedGroup, now: float) -> Group:
    """The group a record describes, Stable, each member's session starting at `now`
    (monotonic seconds; infinity: not yet)."""
    group = Group(saved.group, state=GroupState.STABLE, generation=saved.generation,
                  protocol_type=saved.protocol_type, protocol=saved.protocol,
                  leader=saved.leader)
    for m in saved.members:
        session = m.session_timeout_ms / 1000
        group.add(Member(m.member_id, m.instance_id, m.client_id, m.client_host, session,
                         m.rebalance_timeout_ms / 1000,
                         [(name, bytes(data)) for name, data in m.protocols],
                         bytes(m.assignment), deadline=now + session))
    return group


class MembershipStore:
    """The saved groups (group id -> its last record with members) and their file."""

    def __init__(self, directory: str, fsync_every_write: bool = False):
        self.records = LatestRecords(os.path.join(directory, FILE_NAME), SavedGroup,
                                     key=lambda record: record.group,
                                     alive=lambda record: bool(record.members),
                                     fsync_every_write=fsync_every_write,
                                     rewrite_min_bytes=REWRITE_MIN_BYTES)
        self.saved: dict[str, SavedGroup] = self.records.saved

    @property
    def path(self) -> str:
        return self.records.path

    def save(self, group: Group) -> None:
        """The group's current generation, before its members hear of it; a write that
        fails is logged and costs only this: after a restart its members join again."""
        self._write(saved_form(group))

    def forget(self, group_id: str) -> None:
        if group_id in self.saved:
            self._write(SavedGroup(group=group_id))

    def _write(self, record: SavedGroup) -> None:
        try:
            self.records.write(record)
        except OSError as error:
            log.error("saving the members of group %s failed: %s", record.group, error)

    def close(self) -> None:
        self.records.close()
