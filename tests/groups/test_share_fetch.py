"""ShareFetch and ShareAcknowledge in process (KIP-932): the group coordinator over a real log
in a temporary directory, requests as a worker forwards them.  Share sessions and their errors,
acknowledgement batches Kafka refuses, transaction markers never delivered, the long poll, a
leaving member's records going to another, the bounds, and the share_deliveries events."""

import asyncio
import datetime
import uuid

import pytest
from kio.schema.errors import ErrorCode

from broker.parent.groups.coordinator import GroupCoordinator
from broker.parent.groups.offsets import OffsetStore
from broker.shared.config import load_config
from broker.shared.log.settings import LogSettings
from broker.shared.log.topics import Epoch, TopicRegistry
from tests.batches import make_batch
from tests.groups.helpers import Events
from tests.wire import decode_response, request

ACCEPT, RELEASE = 1, 2


class Shares:
    """A coordinator with topic "t" (one partition) and a share group "q" it knows."""

    def __init__(self, tmp_path, **settings):
        raw = {"log.dirs": str(tmp_path), "group.share.min.heartbeat.interval.ms": "10",
               "group.share.heartbeat.interval.ms": "100"}
        raw.update({key.replace("_", "."): value for key, value in settings.items()})
        props = load_config(raw).props
        self.registry = TopicRegistry((str(tmp_path),), LogSettings(), Epoch())
        assert self.registry.create("t", 1) in (None, "topic_already_exists")
        self.partition = self.registry.partition("t", 0)
        self.topic_id = self.registry.get("t").topic_id
        self.loop = asyncio.new_event_loop()
        self.events = Events()
        self.coordinator = GroupCoordinator(
            self.loop, props, OffsetStore(str(tmp_path)),
            lambda name: 1 if name == "t" else None, topics=self.registry, events=self.events)
        self.coordinator.start()

    def close(self):
        self.coordinator.close()
        self.registry.close()
        self.loop.close()

    def send(self, api_key: int, version: int, values: dict):
        answer = self.coordinator.handle(request(api_key, version, values), 0, "10.0.0.1:1")
        if isinstance(answer, asyncio.Future):
            answer = self.loop.run_until_complete(asyncio.wait_for(answer, 5))
        return decode_response(api_key, version, answer[4:])[1]

    def join(self, member: str):
        answer = self.send(76, 1, {"group_id": "q", "member_id": member, "member_epoch": 0,
                                   "rack_id": None, "subscribed_topic_names": ["t"]})
        assert answer.error_code == ErrorCode.none, answer
        return answer

    def earliest(self):
        answer = self.send(91, 0, {"group_id": "q", "topics": [
            {"topic_name": "t", "partitions": [{"partition_index": 0, "start_offset": 0}]}]})
        assert answer.error_code == ErrorCode.none

    def fetch(self, member: str, epoch: int, acks=(), wait_ms: int = 0, max_records: int = 100):
        return self.send(78, 1, {
            "group_id": "q", "member_id": member, "share_session_epoch": epoch,
            "max_wait": datetime.timedelta(milliseconds=wait_ms), "min_bytes": 1,
            "max_bytes": 1 << 20, "max_records": max_records, "batch_size": max_records,
            "topics": [{"topic_id": self.topic_id, "partitions": [
                {"partition_index": 0, "acknowledgement_batches": [
                    {"first_offset": first, "last_offset": last, "acknowledge_types": [kind]}
                    for first, last, kind in acks]}]}],
            "forgotten_topics_data": []})

    def acknowledge(self, member: str, epoch: int, acks):
        return self.send(79, 1, {
            "group_id": "q", "member_id": member, "share_session_epoch": epoch,
            "topics": [{"topic_id": self.topic_id, "partitions": [
                {"partition_index": 0, "acknowledgement_batches": [
                    {"first_offset": first, "last_offset": last, "acknowledge_types": kinds}
                    for first, last, kinds in acks]}]}]})


@pytest.fixture
def shares(tmp_path):
    made = Shares(tmp_path)
    yield made
    made.close()


def acquired(answer) -> list[tuple[int, int, int]]:
    return [(r.first_offset, r.last_offset, r.delivery_count)
            for topic in answer.responses for part in topic.partitions
            for r in part.acquired_records]


def test_share_sessions_open_advance_and_refuse_what_kafka_refuses(shares):
    shares.join("m")
    assert shares.fetch("m", 1).error_code == ErrorCode.share_session_not_found
    assert shares.fetch("m", 0, acks=[(0, 0, ACCEPT)]).error_code == ErrorCode.invalid_request
    assert shares.fetch("m", 0).error_code == ErrorCode.none
    assert shares.fetch("m", 5).error_code == ErrorCode.invalid_share_session_epoch
    assert shares.fetch("m", 1).error_code == ErrorCode.none
    assert shares.acknowledge("m", 0, []).error_code == ErrorCode.invalid_share_session_epoch
    assert shares.fetch("", 0).error_code == ErrorCode.invalid_request


def test_share_sessions_are_bounded(tmp_path):
    shares = Shares(tmp_path, group_share_max_share_sessions="1")
    try:
        assert shares.fetch("a", 0).error_code == ErrorCode.group_id_not_found  # no such group
        shares.join("a")
        assert shares.fetch("a", 0).error_code == ErrorCode.none
        assert shares.fetch("b", 0).error_code == ErrorCode.share_session_limit_reached
    finally:
        shares.close()


def test_acknowledgements_kafka_refuses(shares):
    shares.earliest()
    shares.join("a")
    shares.join("b")
    shares.partition.append(make_batch(4))
    assert acquired(shares.fetch("a", 0, max_records=2)) == [(0, 1, 1)]
    shares.fetch("b", 0)
    overlapping = shares.acknowledge("a", 1, [(0, 1, [ACCEPT]), (1, 1, [ACCEPT])])
    assert overlapping.responses[0].partitions[0].error_code == ErrorCode.invalid_request
    theirs = shares.acknowledge("a", 2, [(2, 3, [ACCEPT])])  # "b" holds 2 and 3
    assert theirs.responses[0].partitions[0].error_code == ErrorCode.invalid_record_state
    mine = shares.acknowledge("a", 3, [(0, 1, [ACCEPT, RELEASE])])
    assert mine.responses[0].partitions[0].error_code == ErrorCode.none


def test_transaction_markers_are_never_delivered(shares):
    shares.earliest()
    shares.join("m")
    shares.partition.append(make_batch(2, producer_id=7, epoch=0, sequence=0))
    shares.partition.append_marker(7, 0, commit=True)
    shares.partition.append(make_batch(1))
    answer = shares.fetch("m", 0)
    assert acquired(answer) == [(0, 1, 1), (3, 3, 1)]  # offset 2 is the marker
    shares.fetch("m", 1, acks=[(0, 1, ACCEPT), (3, 3, ACCEPT)])
    group = shares.coordinator.groups["q"]
    assert group.shares[(shares.topic_id, 0)].start == 4


def test_a_fetch_waits_for_records(shares):
    shares.join("m")
    shares.fetch("m", 0)  # the share partition starts at the log end (latest)

    async def produce_soon():
        await asyncio.sleep(0.1)
        shares.partition.append(make_batch(2))

    shares.loop.create_task(produce_soon())
    answer = shares.fetch("m", 1, wait_ms=2000)
    assert acquired(answer) == [(0, 1, 1)]


def test_a_member_leaving_gives_its_records_to_another(shares):
    shares.earliest()
    shares.join("a")
    shares.join("b")
    shares.partition.append(make_batch(3))
    assert acquired(shares.fetch("a", 0)) == [(0, 2, 1)]
    left = shares.send(76, 1, {"group_id": "q", "member_id": "a", "member_epoch": -1,
                               "rack_id": None, "subscribed_topic_names": None})
    assert (left.error_code, left.member_epoch) == (ErrorCode.none, -1)
    assert acquired(shares.fetch("b", 0)) == [(0, 2, 2)]
    shares.coordinator.share_fetches.flush_events(1)
    event, = shares.events.emitted[-1:]
    assert (event.group, event.topic, event.partition, event.acquired, event.redelivered,
            event.released) == ("q", "t", 0, 6, 3, 3)


def test_a_share_group_is_bounded_in_members_and_kinds(tmp_path):
    shares = Shares(tmp_path, group_share_max_size="1")
    try:
        shares.join("a")
        full = shares.send(76, 1, {"group_id": "q", "member_id": "b", "member_epoch": 0,
                                   "rack_id": None, "subscribed_topic_names": ["t"]})
        assert full.error_code == ErrorCode.group_max_size_reached
        listed = shares.send(16, 5, {"states_filter": [], "types_filter": ["share"]})
        assert [(g.group_id, g.group_type, g.protocol_type) for g in listed.groups] == [
            ("q", "share", "share")]
        consumer = shares.send(68, 1, {
            "group_id": "q", "member_id": "c", "member_epoch": 0, "instance_id": None,
            "rack_id": None, "rebalance_timeout": datetime.timedelta(seconds=5),
            "subscribed_topic_names": ["t"], "subscribed_topic_regex": None,
            "server_assignor": None, "topic_partitions": []})
        assert consumer.error_code == ErrorCode.group_id_not_found
        described = shares.send(77, 1, {"group_ids": ["q"],
                                        "include_authorized_operations": False}).groups[0]
        assert (described.group_state, [m.member_id for m in described.members]) == (
            "Stable", ["a"])
        assert described.members[0].assignment.topic_partitions[0].topic_name == "t"
    finally:
        shares.close()


def test_share_offsets_change_only_in_an_empty_group(shares):
    shares.join("m")
    busy = shares.send(91, 0, {"group_id": "q", "topics": [
        {"topic_name": "t", "partitions": [{"partition_index": 0, "start_offset": 0}]}]})
    assert busy.error_code == ErrorCode.non_empty_group
    refused = shares.send(92, 0, {"group_id": "q", "topics": [{"topic_name": "t"}]})
    assert refused.error_code == ErrorCode.non_empty_group
    assert uuid.UUID(int=0) != shares.topic_id


def test_an_idle_share_session_is_closed_and_its_records_go_back(shares):
    fetches = shares.coordinator.share_fetches
    now = [1000.0]
    fetches.clock = lambda: now[0]
    shares.earliest()
    shares.partition.append(make_batch(2))
    assert acquired(shares.fetch("gone", 0)) == [(0, 1, 1)]  # a client that never comes back
    now[0] += 31  # its locks (30 s) ran out; the records wait for someone
    fetches.expire(now[0])
    now[0] += 15  # 46 s without a request: past the share session timeout (45 s)
    fetches.expire(now[0])
    assert shares.fetch("gone", 1).error_code == ErrorCode.share_session_not_found
    assert acquired(shares.fetch("next", 0)) == [(0, 1, 2)]


def test_the_groups_own_configs_decide_where_it_starts_and_how_long_locks_last(shares):
    configs = shares.coordinator.group_configs
    shares.partition.append(make_batch(2))
    configs.set("q", "share.auto.offset.reset", "earliest")
    configs.set("q", "share.record.lock.duration.ms", "20000")
    shares.join("m")
    answer = shares.fetch("m", 0)
    assert acquired(answer) == [(0, 1, 1)]
    assert answer.acquisition_lock_timeout == datetime.timedelta(seconds=20)


def test_by_duration_starts_at_the_first_record_that_recent(tmp_path):
    from broker.shared.clock import now_ms

    shares = Shares(tmp_path)
    try:
        shares.partition.append(make_batch(2, timestamp_ms=now_ms() - 3_600_000))  # an hour ago
        shares.partition.append(make_batch(1))
        shares.coordinator.group_configs.set("q", "share.auto.offset.reset",
                                             "by_duration:PT10M")
        shares.join("m")
        assert acquired(shares.fetch("m", 0)) == [(2, 2, 1)]
    finally:
        shares.close()


def test_acls_of_the_share_apis(tmp_path):
    from broker.shared.access import Access
    from broker.shared.acl import Acl, Operation, PatternType, Permission, ResourceType

    shares = Shares(tmp_path)
    try:
        access = shares.coordinator.access = Access(True)
        for part in (shares.coordinator.shares, shares.coordinator.share_fetches):
            part.access = access

        def allow(resource_type, name, operation):
            return Acl(resource_type, name, PatternType.LITERAL, "User:ANONYMOUS", "*",
                       operation, Permission.ALLOW)

        access.update([allow(ResourceType.GROUP, "q", Operation.READ)])
        refused = shares.send(76, 1, {"group_id": "q", "member_id": "m", "member_epoch": 0,
                                      "rack_id": None, "subscribed_topic_names": ["t"]})
        assert refused.error_code == ErrorCode.topic_authorization_failed  # no DESCRIBE on t
        shares.earliest()  # the group exists (its start offsets refused: no READ on t)
        assert shares.fetch("m", 0).responses[0].partitions[0].error_code == \
            ErrorCode.topic_authorization_failed  # no READ on t
        access.update([allow(ResourceType.TOPIC, "t", Operation.READ)])
        assert shares.fetch("m", 0).error_code == ErrorCode.group_authorization_failed
        offsets = shares.send(90, 1, {"groups": [{"group_id": "q", "topics": None}]})
        assert offsets.groups[0].error_code == ErrorCode.group_authorization_failed
        deleted = shares.send(92, 0, {"group_id": "q", "topics": [{"topic_name": "t"}]})
        assert deleted.error_code == ErrorCode.group_authorization_failed
    finally:
        shares.close()


def test_deleting_an_empty_share_group_forgets_its_share_partitions(tmp_path):
    shares = Shares(tmp_path)
    shares.earliest()
    shares.partition.append(make_batch(2))
    shares.join("m")
    shares.fetch("m", 0)
    shares.send(76, 1, {"group_id": "q", "member_id": "m", "member_epoch": -1,
                        "rack_id": None, "subscribed_topic_names": None})
    assert shares.send(42, 2, {"groups_names": ["q"]}).results[0].error_code == ErrorCode.none
    shares.close()
    shares = Shares(tmp_path)  # the same directory after a restart: nothing of "q" left
    try:
        assert shares.coordinator.share_store.groups() == set()
        assert shares.send(16, 5, {"states_filter": [], "types_filter": []}).groups == ()
    finally:
        shares.close()


def test_a_deleted_topics_share_partitions_are_forgotten(shares):
    shares.earliest()
    shares.partition.append(make_batch(2))
    shares.fetch("m", 0)
    fetches = shares.coordinator.share_fetches
    fetches.expire(0)
    assert (shares.topic_id, 0) in shares.coordinator.groups["q"].shares
    assert shares.registry.delete("t") is None
    fetches.expire(0)
    assert shares.coordinator.groups["q"].shares == {}
    assert fetches.sessions[("q", "m")].partitions == {}
    assert shares.coordinator.share_store.groups() == set()


def test_the_sessions_of_a_deleted_group_go_with_it(shares):
    shares.join("m")
    shares.fetch("m", 0)
    shares.send(76, 1, {"group_id": "q", "member_id": "m", "member_epoch": -1,
                        "rack_id": None, "subscribed_topic_names": None})
    shares.earliest()
    shares.fetch("other", 0)  # not a member: a session all the same, as Kafka
    assert shares.send(42, 2, {"groups_names": ["q"]}).results[0].error_code == ErrorCode.none
    assert shares.coordinator.share_fetches.sessions == {}


def test_no_partitions_backlog_starves_another(tmp_path):
    shares = Shares(tmp_path)
    try:
        assert shares.registry.create("two", 2) is None
        topic_id = shares.registry.get("two").topic_id
        for index in (0, 1):
            shares.registry.partition("two", index).append(make_batch(20))
        shares.send(91, 0, {"group_id": "q", "topics": [{"topic_name": "two", "partitions": [
            {"partition_index": p, "start_offset": 0} for p in (0, 1)]}]})
        seen = set()
        for epoch in range(4):
            answer = shares.send(78, 1, {
                "group_id": "q", "member_id": "m", "share_session_epoch": epoch,
                "max_wait": datetime.timedelta(0), "min_bytes": 1, "max_bytes": 1 << 20,
                "max_records": 5, "batch_size": 5, "forgotten_topics_data": [],
                "topics": [{"topic_id": topic_id, "partitions": [
                    {"partition_index": p, "acknowledgement_batches": []} for p in (0, 1)]}]})
            seen.update(part.partition_index for topic in answer.responses
                        for part in topic.partitions if part.acquired_records)
        assert seen == {0, 1}
    finally:
        shares.close()


def test_a_waiting_fetch_ends_when_its_session_closes(shares):
    shares.join("m")
    shares.fetch("m", 0)
    frame = request(78, 1, {
        "group_id": "q", "member_id": "m", "share_session_epoch": 1,
        "max_wait": datetime.timedelta(hours=1), "min_bytes": 1, "max_bytes": 1 << 20,
        "max_records": 10, "batch_size": 10, "topics": [], "forgotten_topics_data": []})
    waiting = shares.coordinator.handle(frame, 0, "10.0.0.1:1")
    assert isinstance(waiting, asyncio.Future)
    shares.acknowledge("m", -1, [])  # the client closes its session
    answer = shares.loop.run_until_complete(asyncio.wait_for(waiting, 2))
    assert decode_response(78, 1, answer[4:])[1].error_code == ErrorCode.none


def test_share_heartbeats_take_the_previous_epoch_and_refuse_long_member_ids(shares):
    first = shares.join("a")
    shares.join("b")  # a new group epoch: "a" moves on at its next heartbeat
    beat = {"group_id": "q", "member_id": "a", "rack_id": None, "subscribed_topic_names": None}
    moved = shares.send(76, 1, dict(beat, member_epoch=first.member_epoch))
    assert moved.member_epoch > first.member_epoch
    again = shares.send(76, 1, dict(beat, member_epoch=first.member_epoch))  # answer lost
    assert again.error_code == ErrorCode.none
    long_id = shares.send(76, 1, dict(beat, member_id="x" * 37, member_epoch=0,
                                      subscribed_topic_names=["t"]))
    assert long_id.error_code == ErrorCode.invalid_request
