"""The group coordinator (classic protocol), in the parent: the one table of every group, the
files that keep them, and the dispatch of the group APIs to the module of their role.

Workers forward the group APIs' raw frames to the parent (IPC ForwardedRequest, like config
requests); `GroupCoordinator.handle` decodes one and answers with bytes, or with a Future of
bytes when the answer must wait for a rebalance (JoinGroup, SyncGroup).  The worker keeps that
connection muted meanwhile, so its event loop never blocks.

    JoinGroup, SyncGroup, Heartbeat, LeaveGroup          membership.Membership
    OffsetCommit, TxnOffsetCommit, OffsetFetch,          offsets.OffsetRequests
      OffsetDelete
    ListGroups, DescribeGroups, DeleteGroups             listing.Listing

The coordinator owns what they share: the group table (group id -> state.Group), the
committed offsets (offset_store.OffsetStore) and the stable generations
(membership_store.MembershipStore), and the wall clock the offsets' retention is read by.
At start-up it lists again every group with committed offsets (Empty) and every saved
generation (Stable, its members' sessions starting with `start`).  Its timer checks sessions
every CHECK_EVERY seconds and the offsets' retention every
`offsets.retention.check.interval.ms`, and forgets a group once nothing is left of it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Callable

from broker.parent.forwarded import decode_forwarded
from broker.parent.group_configs import GroupConfigs
from broker.parent.groups.consumer import NO_TOPICS, ConsumerGroups
from broker.parent.groups.consumer_state import ConsumerGroup
from broker.parent.groups.consumer_store import ConsumerGroupStore
from broker.parent.groups.listing import Listing
from broker.parent.groups.share_fetch import ShareFetches
from broker.parent.groups.share_groups import ShareGroups
from broker.parent.groups.share_state import ShareGroup
from broker.parent.groups.share_store import ShareStore
from broker.parent.groups.membership import Membership
from broker.parent.groups.membership_store import MembershipStore
from broker.parent.groups.offset_store import OffsetStore
from broker.parent.groups.offsets import OffsetRequests
from broker.parent.groups.state import Group, GroupState
from broker.shared.access import Access
from broker.shared.apis import BY_NAME, GROUP_KEYS
from broker.shared.clock import now_ms
from broker.shared.events import EventLog

log = logging.getLogger("broker.parent.groups")

CHECK_EVERY = 0.25  # seconds between session expiry checks


class GroupCoordinator:
    def __init__(self, loop: asyncio.AbstractEventLoop, props, offsets: OffsetStore,
                 partitions_of, access: Access | None = None,
                 membership: MembershipStore | None = None,
                 clock: Callable[[], int] = now_ms, topics=None,
                 consumer_store: ConsumerGroupStore | None = None,
                 events: EventLog | None = None, share_store: ShareStore | None = None,
                 node_id: int = 0, group_configs: GroupConfigs | None = None):
        self.loop = loop
        self.clock = clock  # () -> epoch milliseconds: what the offsets' retention counts by
        self.access = access or Access(False)
        self.props = props
        self.offsets = offsets
        self.groups: dict[str, Group] = {}
        for group_id, committed in offsets.groups.items():  # known again after a restart
            newest = max((entry.committed_ms for entry in committed.values()), default=0)
            self.groups[group_id] = Group(group_id, empty_since_ms=newest)
        self.membership = membership or MembershipStore(
            os.path.dirname(offsets.path), fsync_every_write=offsets.file.fsync)
        self.members = Membership(loop, props, self.access, self.groups, offsets,
                                  self.membership)
        self.offset_requests = OffsetRequests(props, self.access, self.groups, offsets,
                                              partitions_of)
        self.consumer_store = consumer_store or ConsumerGroupStore(
            os.path.dirname(offsets.path), fsync_every_write=offsets.file.fsync)
        self.group_configs = group_configs or GroupConfigs(props)
        self.consumers = ConsumerGroups(props, self.access, self.groups,
                                        topics if topics is not None else NO_TOPICS,
                                        self.consumer_store, self.members.classic_members,
                                        events=events, group_configs=self.group_configs)
        self.members.events = events
        self.share_store = share_store or ShareStore(
            os.path.dirname(offsets.path), fsync_every_write=offsets.file.fsync)
        self.share_fetches = ShareFetches(loop, props, self.access, self.groups,
                                          self.consumers.topics, self.share_store,
                                          events=events, node_id=node_id,
                                          group_configs=self.group_configs)
        self.shares = ShareGroups(props, self.access, self.groups, self.consumers.topics,
                                  self.share_fetches,
                                  lambda: self.members.classic_members()
                                  + self.consumers.member_count, events=events,
                                  group_configs=self.group_configs)
        self.consumers.others_total = lambda: self.members.classic_members() \
            + self.shares.member_count
        self.members.consumer_members = lambda: self.consumers.member_count \
            + self.shares.member_count
        self.members.give_way = self._give_way
        self.listing = Listing(props, self.access, self.groups, offsets)
        self.listing.drop_consumer_group = self._give_way
        self._handlers = {BY_NAME[name].key: handler for name, handler in (
            ("JoinGroup", self.members.join), ("SyncGroup", self.members.sync),
            ("Heartbeat", self.members.heartbeat), ("LeaveGroup", self.members.leave),
            ("OffsetCommit", self.offset_requests.commit),
            ("TxnOffsetCommit", self.offset_requests.txn_commit),
            ("OffsetFetch", self.offset_requests.fetch),
            ("OffsetDelete", self.offset_requests.delete),
            ("ListGroups", self.listing.list_groups),
            ("DescribeGroups", self.listing.describe_groups),
            ("ConsumerGroupHeartbeat", self.consumers.heartbeat),
            ("ConsumerGroupDescribe", self.consumers.describe),
            ("ShareGroupHeartbeat", self.shares.heartbeat),
            ("ShareGroupDescribe", self.shares.describe),
            ("ShareFetch", self.share_fetches.fetch),
            ("ShareAcknowledge", self.share_fetches.acknowledge),
            ("DescribeShareGroupOffsets", self.shares.describe_offsets),
            ("AlterShareGroupOffsets", self.shares.alter_offsets),
            ("DeleteShareGroupOffsets", self.shares.delete_offsets),
            ("DeleteGroups", self.listing.delete_groups))}
        assert set(self._handlers) == GROUP_KEYS, "the API table and the coordinator disagree"
        self.members.restore()
        self.consumers.restore()
        self.share_fetches.restore_all()
        self._second = int(time.time())
        self._ticker = loop.call_later(CHECK_EVERY, self._tick)
        self._next_retention = time.monotonic() + props.offsets_retention_check_interval_ms / 1000

    @property
    def transaction_problem(self):
        """(transactional id, producer id, epoch, group, version) -> an error code or None:
        whether a TxnOffsetCommit's producer may commit offsets for the group."""
        return self.offset_requests.transaction_problem

    @transaction_problem.setter
    def transaction_problem(self, check) -> None:
        # Set by the transaction coordinator (broker.parent.transactions), which owns that state.
        self.offset_requests.transaction_problem = check

    def start(self) -> None:
        """The broker serves from now on: every member's session counts from here."""
        self.members.start()
        self.consumers.start()

    def abort_waiting(self) -> None:
        """Shutting down: every JoinGroup and SyncGroup still waiting is answered
        NOT_COORDINATOR (the client looks for the coordinator again), so no connection owes
        an answer and workers can drain at once; and sessions stop counting, so no member is
        removed for the silence of a broker going down (its group is saved as it is, and
        the member goes on after the restart)."""
        self._ticker.cancel()
        self.members.abort_waiting()
        self.share_fetches.abort_waiting()

    def _give_way(self, group_id: str) -> None:
        """An empty group of the newer kinds goes (for a classic one, or deleted)."""
        group = self.groups.get(group_id)
        if isinstance(group, ShareGroup):
            self.shares.drop(group_id)
        else:
            self.consumers.drop(group_id)

    def close(self) -> None:
        self._ticker.cancel()
        self.members.cancel_timers()
        self.offsets.close()
        self.membership.close()
        self.consumer_store.close()
        self.share_store.close()

    def handle(self, request: bytes, listener: int, peer: str, user: str = "ANONYMOUS"):
        ctx, body = decode_forwarded(request, listener, peer, user)
        return self._handlers[ctx.api_key](ctx, body, ctx.host)

    # --- the timer --------------------------------------------------------------------------

    def _tick(self) -> None:
        try:
            self._expire(time.monotonic())
        except Exception:  # noqa: BLE001 - a bad tick must not stop every later one
            log.exception("group coordinator tick failed")
        finally:
            self._ticker = self.loop.call_later(CHECK_EVERY, self._tick)

    def _expire(self, now: float) -> None:
        second = int(time.time())
        if second != self._second:  # a second ended: its share deliveries as events
            self.share_fetches.flush_events(self._second)
            self._second = second
        self.members.expire_sessions(now)
        self.consumers.expire(now)
        self.shares.expire(now)
        self.share_fetches.expire(now)
        if now >= self._next_retention:
            self._next_retention = now + self.props.offsets_retention_check_interval_ms / 1000
            try:
                self.expire_offsets()
            except OSError as error:
                log.error("expiring committed offsets failed: %s", error)

    def expire_offsets(self) -> int:
        """Drop the offsets of groups empty for longer than offsets.retention.minutes (a
        share group's share partitions too), then forget the groups nothing is left of; how
        many offsets were dropped."""
        now = self.clock()
        expired = self.offset_requests.expire(now)
        retention = self.props.offsets_retention_minutes * 60000
        for group_id, group in list(self.groups.items()):
            if isinstance(group, ShareGroup):
                if not group.members and not self.share_fetches.has_sessions(group_id) and \
                        (not group.shares or group.empty_since_ms + retention < now):
                    self._give_way(group_id)
            elif isinstance(group, ConsumerGroup):
                if not group.members and not self.offsets.get(group_id):
                    self._give_way(group_id)
            elif group.state is GroupState.EMPTY and not group.pending and \
                    not self.offsets.get(group_id):
                del self.groups[group_id]
        self.offsets.maybe_compact()
        return expired
