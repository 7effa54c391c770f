"""Committed offsets, asked for: OffsetCommit, TxnOffsetCommit, OffsetFetch and OffsetDelete,
and the offsets' retention, over the store (broker.parent.groups.offset_store).

A commit needs READ on the group (GROUP_AUTHORIZATION_FAILED) and on each topic
(TOPIC_AUTHORIZATION_FAILED for its partitions); a member's commit is checked against its
generation (broker.parent.groups.state.member_problem) and keeps its session alive.
OffsetFetch needs DESCRIBE on the group (a fetch of all topics leaves out those the principal
may not DESCRIBE); OffsetDelete needs DELETE on the group and READ on each topic.  Each group,
topic and partition an OffsetFetch or OffsetDelete names is answered once, and the committed
offsets an OffsetFetch returns are charged to the answer's ResponseBudget
(broker.parent.forwarded) before it is built.  The offsets of a group empty for longer than
`offsets.retention.minutes` expire (`OffsetRequests.expire`, on the coordinator's timer).
A commit is answered once the store has written it; a TxnOffsetCommit's offsets stay pending
in the store until the transaction coordinator ends the transaction.
"""

from __future__ import annotations

import logging
import time

from broker.parent.forwarded import ResponseBudget, budget_of
from broker.parent.groups.consumer_state import ConsumerGroup
from broker.parent.groups.offset_store import OffsetStore, Record
from broker.parent.groups.state import Group, GroupState, member_problem
from broker.shared.access import Access
from broker.shared.acl import Operation, ResourceType
from broker.shared.clock import now_ms
from broker.shared.protocol.context import NO_THROTTLE, RequestContext
from broker.shared.protocol.errors import ErrorCode

log = logging.getLogger("broker.parent.groups.offsets")


class OffsetRequests:
    """The offset APIs over the store, for the groups of the coordinator's table."""

    def __init__(self, props, access: Access, groups: dict[str, Group], store: OffsetStore,
                 partitions_of):
        self.props = props
        self.access = access
        self.groups = groups  # the coordinator's table, shared
        self.store = store
        self.partitions_of = partitions_of  # topic name -> partition count, or None
        # (transactional id, producer id, epoch, group) -> an error code or None: set by the
        # transaction coordinator (broker.parent.transactions), which owns that state.
        self.transaction_problem = lambda *_: ErrorCode.coordinator_not_available

    def _may(self, ctx: RequestContext, operation: Operation, group_id: str) -> bool:
        return self.access.check(ctx, operation, ResourceType.GROUP, group_id)

    # --- OffsetCommit, TxnOffsetCommit -----------------------------------------------------

    def commit(self, ctx: RequestContext, body, _host: str) -> bytes:
        group = self.groups.get(body.group_id)
        generation = body.generation_id_or_member_epoch
        problem = None
        if not self._may(ctx, Operation.READ, body.group_id):
            problem = ErrorCode.group_authorization_failed
        elif not body.group_id:
            problem = ErrorCode.invalid_group_id
        elif isinstance(group, ConsumerGroup):
            problem = group.offset_problem(body.member_id, generation, ctx.version)
        elif group is not None and not isinstance(group, Group):  # a share group: no offsets
            problem = ErrorCode.group_id_not_found
        elif generation >= 0 or (group is not None and group.members):
            # Kafka's order: who commits (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION) first; only a
            # current member of the current generation hears REBALANCE_IN_PROGRESS, which
            # librdkafka would otherwise take as final.
            problem = member_problem(group, body.member_id, generation,
                                     getattr(body, "group_instance_id", None))
            if problem is None and group.state is GroupState.COMPLETING:
                problem = ErrorCode.rebalance_in_progress
            elif problem is None and group.state in (GroupState.STABLE, GroupState.PREPARING):
                # As Kafka's classic coordinator: a member's commit keeps its session alive
                # (one that commits but heartbeats late is not expired meanwhile).
                group.members[body.member_id].keep_alive(time.monotonic())
        records, results = [], []
        now = now_ms()
        limit = self.props.offset_metadata_max_bytes
        for topic in body.topics:
            partitions = self.partitions_of(topic.name)
            answers = []
            topic_problem = problem
            if problem is None and not self.access.check(ctx, Operation.READ,
                                                         ResourceType.TOPIC, topic.name):
                topic_problem = ErrorCode.topic_authorization_failed
            for part in topic.partitions:
                code = topic_problem
                metadata = part.committed_metadata
                if code is None and (partitions is None or
                                     not 0 <= part.partition_index < partitions):
                    code = ErrorCode.unknown_topic_or_partition
                if code is None and metadata is not None and len(metadata.encode()) > limit:
                    code = ErrorCode.offset_metadata_too_large
                if code is None:
                    records.append(Record(group=body.group_id, topic=topic.name,
                                          partition=part.partition_index,
                                          offset=part.committed_offset,
                                          leader_epoch=getattr(part, "committed_leader_epoch", -1),
                                          metadata=metadata, committed_ms=now))
                answers.append({"partition_index": part.partition_index,
                                "error_code": code or ErrorCode.none})
            results.append({"name": topic.name, "partitions": answers})
        self._persist(records, results, body.group_id)
        if records and group is None:
            self.groups[body.group_id] = Group(body.group_id, empty_since_ms=now)
        return ctx.respond({"throttle_time": NO_THROTTLE, "topics": results})

    def txn_commit(self, ctx: RequestContext, body, _host: str) -> bytes:
        """Offsets committed inside a transaction: written at once, pending (invisible to
        OffsetFetch) until the transaction coordinator ends the transaction."""
        group = self.groups.get(body.group_id)
        problem = None
        if not self.access.check(ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID,
                                 body.transactional_id):
            problem = ErrorCode.transactional_id_authorization_failed
        elif not self._may(ctx, Operation.READ, body.group_id):
            problem = ErrorCode.group_authorization_failed
        else:
            problem = self.transaction_problem(body.transactional_id, body.producer_id,
                                               body.producer_epoch, body.group_id, ctx.version)
        generation = getattr(body, "generation_id", -1)
        if problem is None and group is not None and group.kind == "share":
            problem = ErrorCode.group_id_not_found
        elif problem is None and generation >= 0 and isinstance(group, ConsumerGroup):
            problem = group.offset_problem(body.member_id, generation, transactional=True)
        elif problem is None and generation >= 0:  # KIP-447: the member's generation is checked
            problem = member_problem(group, body.member_id, generation,
                                     getattr(body, "group_instance_id", None))
        records, results = [], []
        now = now_ms()
        for topic in body.topics:
            topic_problem = problem
            if problem is None and not self.access.check(ctx, Operation.READ,
                                                         ResourceType.TOPIC, topic.name):
                topic_problem = ErrorCode.topic_authorization_failed
            partitions = self.partitions_of(topic.name)
            answers = []
            for part in topic.partitions:
                code = topic_problem
                if code is None and (partitions is None or
                                     not 0 <= part.partition_index < partitions):
                    code = ErrorCode.unknown_topic_or_partition
                if code is None:
                    records.append(Record(
                        group=body.group_id, topic=topic.name, partition=part.partition_index,
                        offset=part.committed_offset,
                        leader_epoch=getattr(part, "committed_leader_epoch", -1),
                        metadata=part.committed_metadata, committed_ms=now,
                        producer_id=body.producer_id))
                answers.append({"partition_index": part.partition_index,
                                "error_code": code or ErrorCode.none})
            results.append({"name": topic.name, "partitions": answers})
        self._persist(records, results, body.group_id)
        return ctx.respond({"throttle_time": NO_THROTTLE, "topics": results})

    def _persist(self, records: list[Record], results: list[dict], group_id: str) -> None:
        """Write a commit's offsets; if that fails, the partitions it would have committed
        answer COORDINATOR_NOT_AVAILABLE (the client retries)."""
        try:
            self.store.commit(records)
        except OSError as error:
            log.error("committing offsets of group %s failed: %s", group_id, error)
            for topic in results:
                for part in topic["partitions"]:
                    if part["error_code"] == ErrorCode.none:
                        part["error_code"] = ErrorCode.coordinator_not_available

    # --- OffsetFetch ------------------------------------------------------------------------

    def _fetched(self, ctx: RequestContext, group_id: str, wanted: dict | None,
                 require_stable: bool, budget: ResponseBudget) -> list[dict]:
        """The committed offsets of `wanted` (topic -> partitions, each once), or of every
        topic (None), each row charged to `budget` before it is built."""
        committed = self.store.get(group_id)
        # require_stable (v7+): a partition whose offset waits for a transaction's end says so
        # (UNSTABLE_OFFSET_COMMIT, retriable) instead of answering the older offset.
        unstable = self.store.pending_partitions(group_id) if require_stable else set()
        denied: set[str] = set()
        if wanted is None:  # all of them: those the principal may not see are left out
            wanted = {}
            for topic, partition in sorted(committed):
                if self.access.allowed(ctx, Operation.DESCRIBE, ResourceType.TOPIC, topic):
                    wanted.setdefault(topic, {})[partition] = None
        else:
            denied = {name for name in wanted if not self.access.check(
                ctx, Operation.DESCRIBE, ResourceType.TOPIC, name)}
        found = []
        for topic, partitions in wanted.items():
            budget.charge(len(topic))
            rows = []
            for partition in partitions:
                entry = None if topic in denied else committed.get((topic, partition))
                code = ErrorCode.topic_authorization_failed if topic in denied else \
                    ErrorCode.unstable_offset_commit if (topic, partition) in unstable else ErrorCode.none
                if code == ErrorCode.unstable_offset_commit:
                    entry = None
                metadata = (entry.metadata if entry else "") or ""
                budget.charge(len(metadata))
                rows.append({"partition_index": partition, "error_code": code,
                             "committed_offset": entry.offset if entry else -1,
                             "committed_leader_epoch": entry.leader_epoch if entry else -1,
                             "metadata": metadata})
            found.append({"name": topic, "partitions": rows})
        return found

    def fetch(self, ctx: RequestContext, body, _host: str) -> bytes:
        """Each group, topic and partition once however often the request names it (as
        Fetch): a partition named 100,000 times with 4 KB of committed metadata would be
        400 MB of answer.  Clients read the answer by group, topic and partition."""
        budget = budget_of(self.props)
        if ctx.version >= 8:
            groups = []
            groups_asked = {group.group_id: group for group in body.groups}
            for group_id, wanted in _wanted_groups(body.groups).items():
                budget.charge(len(group_id))
                if not self._may(ctx, Operation.DESCRIBE, group_id):
                    groups.append({"group_id": group_id, "topics": [],
                                   "error_code": ErrorCode.group_authorization_failed})
                    continue
                problem = self._member_fetch_problem(group_id, groups_asked[group_id])
                if problem is not None:
                    groups.append({"group_id": group_id, "topics": [], "error_code": problem})
                    continue
                groups.append({"group_id": group_id, "error_code": ErrorCode.none,
                               "topics": self._fetched(ctx, group_id, wanted,
                                                       body.require_stable, budget)})
            return ctx.respond({"throttle_time": NO_THROTTLE, "groups": groups})
        if not self._may(ctx, Operation.DESCRIBE, body.group_id):
            return ctx.respond({"throttle_time": NO_THROTTLE,
                                "error_code": ErrorCode.group_authorization_failed, "topics": []})
        return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": ErrorCode.none,
                            "topics": self._fetched(ctx, body.group_id,
                                                    _wanted_topics(body.topics),
                                                    getattr(body, "require_stable", False),
                                                    budget)})

    def _member_fetch_problem(self, group_id: str, asked) -> ErrorCode | None:
        """OffsetFetch v9 of a member of a consumer group (KIP-848): the member must exist and
        be at its epoch; a fetch that names no member (an admin's) is not checked."""
        group = self.groups.get(group_id)
        member_id = getattr(asked, "member_id", None)
        epoch = getattr(asked, "member_epoch", -1)
        if not isinstance(group, ConsumerGroup) or (member_id is None and epoch < 0):
            return None
        return group.offset_problem(member_id, epoch)

    # --- OffsetDelete, retention ------------------------------------------------------------

    def delete(self, ctx: RequestContext, body, _host: str) -> bytes:
        """OffsetDelete (kafka-consumer-groups --delete-offsets): the committed offsets of
        partitions the group no longer consumes.  DELETE on the group, READ on each topic;
        a topic the group's live members subscribe to is refused (GROUP_SUBSCRIBED_TO_TOPIC)."""
        if not self._may(ctx, Operation.DELETE, body.group_id):
            return _offset_delete_answer(ctx, ErrorCode.group_authorization_failed, [])
        group = self.groups.get(body.group_id)
        if group is None and not self.store.get(body.group_id):
            return _offset_delete_answer(ctx, ErrorCode.group_id_not_found, [])
        subscribed = group.subscribed if group is not None else frozenset()
        committed = self.store.get(body.group_id)
        answers: dict[str, dict[int, ErrorCode]] = {}  # each partition once, as Kafka's answer maps
        doomed: dict[tuple[str, int], None] = {}
        for topic in body.topics:
            code, partitions = ErrorCode.none, self.partitions_of(topic.name)
            if not self.access.check(ctx, Operation.READ, ResourceType.TOPIC, topic.name):
                code = ErrorCode.topic_authorization_failed
            elif partitions is None:
                code = ErrorCode.unknown_topic_or_partition
            rows = answers.setdefault(topic.name, {})
            for part in topic.partitions:
                index, row = part.partition_index, code
                if row == ErrorCode.none and not 0 <= index < partitions:
                    row = ErrorCode.unknown_topic_or_partition
                elif row == ErrorCode.none and topic.name in subscribed:
                    row = ErrorCode.group_subscribed_to_topic
                elif row == ErrorCode.none and (topic.name, index) in committed:
                    doomed[(topic.name, index)] = None  # a tombstone only for an offset held
                rows[index] = row
        try:
            self.store.commit([Record(group=body.group_id, topic=topic, partition=partition)
                               for topic, partition in doomed])
        except OSError as error:
            log.error("deleting offsets of group %s failed: %s", body.group_id, error)
            return _offset_delete_answer(ctx, ErrorCode.coordinator_not_available, [])
        return _offset_delete_answer(ctx, ErrorCode.none, [
            {"name": name, "partitions": [{"partition_index": index, "error_code": row}
                                          for index, row in rows.items()]}
            for name, rows in answers.items()])

    def expire(self, now: int) -> int:
        """Drop the offsets of groups empty for longer than offsets.retention.minutes, as of
        `now` (epoch milliseconds); how many were dropped."""
        retention = self.props.offsets_retention_minutes * 60000
        records = []
        for group_id, committed in list(self.store.groups.items()):
            group = self.groups.get(group_id)
            if group is not None and group.members:
                continue
            since = group.empty_since_ms if group is not None else 0
            for (topic, partition), entry in committed.items():
                if max(since, entry.committed_ms) + retention < now:
                    records.append(Record(group=group_id, topic=topic, partition=partition))
        if records:
            self.store.commit(records)
            log.info("expired %d committed offsets past offsets.retention.minutes",
                     len(records))
        return len(records)


def _wanted_topics(topics) -> dict[str, dict[int, None]] | None:
    """An OffsetFetch's topics as topic -> partitions, each once, in the order first named;
    None (every committed topic) stays None."""
    if topics is None:
        return None
    wanted: dict[str, dict[int, None]] = {}
    for topic in topics:
        wanted.setdefault(topic.name, {}).update(dict.fromkeys(topic.partition_indexes))
    return wanted


def _wanted_groups(groups) -> dict[str, dict | None]:
    """OffsetFetch v8+: each group once, what its mentions ask merged (None: every topic)."""
    wanted: dict[str, dict | None] = {}
    for group in groups:
        topics = _wanted_topics(group.topics)
        if group.group_id not in wanted:
            wanted[group.group_id] = topics
            continue
        known = wanted[group.group_id]
        if known is None or topics is None:
            wanted[group.group_id] = None
            continue
        for name, partitions in topics.items():
            known.setdefault(name, {}).update(partitions)
    return wanted


def _offset_delete_answer(ctx: RequestContext, code, topics: list) -> bytes:
    return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": code, "topics": topics})
