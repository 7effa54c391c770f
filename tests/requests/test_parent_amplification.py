"""Requests the parent answers (groups, configs, quotas, SCRAM) that once made it build huge
answers or do huge work from a few bytes, on a real broker with one worker, so the client
that asks and the others share it: each group, partition, resource and user is answered
once, Kafka's duplicate checks refuse what Kafka refuses, an answer past
pybroker.forwarded.response.max.bytes closes only the connection that asked, and neither a
huge answer nor a huge forwarded request can break the worker's channel to the parent (which
took the worker and every client on it).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import struct

import pytest
from kio.schema.errors import ErrorCode

from tests.harness import BrokerProcess, wait_until
from tests.helpers import MEMBER_METADATA, ask, stable_group
from tests.wire import request
from tests.wire import KafkaSocket, create_topic, frame

pytestmark = pytest.mark.system  # every test here starts a broker

GROUPS = {"group.initial.rebalance.delay.ms": "0"}


@pytest.fixture(scope="module")
def shared():
    """One broker for the tests that change nothing the others look at."""
    with BrokerProcess(workers=1) as running:
        yield running


def worker_survived(broker: BrokerProcess, pid: int) -> None:
    assert broker.worker_pids == {"data-0": pid}
    assert not [line for line in broker.lines if "channel" in line and "data-0" in line]


def test_a_group_named_thousands_of_times_is_described_once():
    """The review's attack, smaller: a 110 KB member, its group named 2,000 times (220 MB of
    answer, 1.1 GB at 10,000, which broke the channel and took the worker)."""
    with BrokerProcess(workers=1, overrides=GROUPS) as broker:
        pid, address = broker.worker_pids["data-0"], broker.listeners["PLAINTEXT"]
        with KafkaSocket(address, 30) as member, KafkaSocket(address, 30) as asker, \
                KafkaSocket(address, 30) as other:
            stable_group(member, "g")
            size, answer, took = ask(asker, 15, 5, {"groups": ["g"] * 2000,
                                                    "include_authorized_operations": False})
            assert [group.group_id for group in answer.groups] == ["g"]
            assert len(answer.groups[0].members[0].member_metadata) == MEMBER_METADATA
            assert size < MEMBER_METADATA + 1000 and took < 2.0
            _, listed, took = ask(other, 16, 4, {"states_filter": []})
            assert [group.group_id for group in listed.groups] == ["g"] and took < 1.0
        worker_survived(broker, pid)


def test_an_answer_past_the_bound_closes_only_the_connection_that_asked():
    """Twelve distinct 110 KB groups are 1.3 MB of DescribeGroups answer: past a 1 MiB bound
    the parent does not build it, the asker's connection is closed with a log line and a
    metric, and the worker and its other clients carry on."""
    bound = 1 << 20
    overrides = dict(GROUPS, **{"pybroker.forwarded.response.max.bytes": str(bound)})
    with BrokerProcess(workers=1, overrides=overrides) as broker:
        pid, address = broker.worker_pids["data-0"], broker.listeners["PLAINTEXT"]
        members = [KafkaSocket(address, 30) for _ in range(12)]
        try:
            for number, member in enumerate(members):
                stable_group(member, f"g{number}")
            with KafkaSocket(address, 30) as asker, KafkaSocket(address, 30) as other:
                asker.send(frame(request(15, 5, {"groups": [f"g{n}" for n in range(12)],
                                                 "include_authorized_operations": False})))
                with pytest.raises(ConnectionError):
                    asker.receive()
                size, answer, took = ask(other, 15, 5, {"groups": ["g0", "g1", "g2"],
                                                        "include_authorized_operations": False})
                assert len(answer.groups) == 3 and size < bound and took < 1.0
        finally:
            for member in members:
                member.close()
        broker.wait_for_line(r"DescribeGroups from 127\.0\.0\.1:\d+ \(ANONYMOUS\) refused: "
                             r"the answer would take more than 1048576 bytes")
        assert broker.metric("broker_invalid_requests_total", reason="response_too_large") == 1
        worker_survived(broker, pid)


def test_offset_fetch_answers_each_group_and_partition_once():
    """A committed offset with 4 KB of metadata, its partition named 40,000 times (160 MB of
    answer) and its group 20,000 times (v8: 80 MB): one row each."""
    with BrokerProcess(workers=1) as broker:
        create_topic(broker.bootstrap, "t")
        with KafkaSocket(broker.listeners["PLAINTEXT"], 30) as sock:
            committed = ask(sock, 8, 8, {
                "group_id": "g", "generation_id_or_member_epoch": -1, "member_id": "",
                "group_instance_id": None, "topics": [{"name": "t", "partitions": [{
                    "partition_index": 0, "committed_offset": 5, "committed_leader_epoch": -1,
                    "committed_metadata": "x" * 4000}]}]})[1]
            assert committed.topics[0].partitions[0].error_code == ErrorCode.none
            size, fetched, took = ask(sock, 9, 7, {
                "group_id": "g", "topics": [{"name": "t", "partition_indexes": [0] * 40_000}],
                "require_stable": False})
            rows = fetched.topics[0].partitions
            assert [(row.partition_index, row.committed_offset) for row in rows] == [(0, 5)]
            assert size < 5000 and took < 2.0
            size, fetched, took = ask(sock, 9, 8, {
                "groups": [{"group_id": "g", "topics": None}] * 20_000, "require_stable": False})
            assert [group.group_id for group in fetched.groups] == ["g"]
            assert fetched.groups[0].topics[0].partitions[0].committed_offset == 5
            assert size < 5000 and took < 2.0


def test_describe_configs_answers_each_resource_and_known_key_once(shared):
    """The broker resource named 5,000 times with every key documented, and one key named
    90,000 times: each resource once, each key once, unknown keys left out (as Kafka)."""
    broker = shared
    with KafkaSocket(broker.listeners["PLAINTEXT"], 30) as sock:
        resource = {"resource_type": 4, "resource_name": "0", "configuration_keys": None}
        _, single, _ = ask(sock, 32, 4, {"resources": [resource], "include_synonyms": False,
                                        "include_documentation": True})
        size, answer, took = ask(sock, 32, 4, {"resources": [resource] * 5000,
                                               "include_synonyms": False,
                                               "include_documentation": True})
        assert len(answer.results) == 1 and took < 2.0
        assert len(answer.results[0].configs) == len(single.results[0].configs) > 100
        keys = ["max.connections"] * 90_000 + ["no.such.key"]
        size, answer, took = ask(sock, 32, 4, {"resources": [
            dict(resource, configuration_keys=keys)], "include_synonyms": False,
            "include_documentation": True})
        assert [config.name for config in answer.results[0].configs] == ["max.connections"]
        assert size < 2000 and took < 2.0


def test_alter_configs_refuses_a_resource_or_key_named_twice_as_kafka(shared):
    """3,000 alterations of the broker resource were 3,000 writes and fsyncs of the dynamic
    config (about 11 s here); Kafka refuses each (INVALID_REQUEST), and so do we."""
    broker = shared
    with KafkaSocket(broker.listeners["PLAINTEXT"], 30) as sock:
        change = {"resource_type": 4, "resource_name": "0", "configs": [
            {"name": "max.connections", "config_operation": 0, "value": "1000"}]}
        _, answer, took = ask(sock, 44, 1, {"resources": [change] * 3000,
                                            "validate_only": False})
        assert {result.error_code for result in answer.responses} == {ErrorCode.invalid_request}
        assert len(answer.responses) == 3000 and took < 2.0
        twice = dict(change, configs=change["configs"] * 2)
        _, answer, _ = ask(sock, 44, 1, {"resources": [twice], "validate_only": False})
        assert answer.responses[0].error_code == ErrorCode.invalid_request
        assert answer.responses[0].error_message == "Error due to duplicate config keys"
        _, answer, _ = ask(sock, 44, 1, {"resources": [change], "validate_only": False})
        assert answer.responses[0].error_code == ErrorCode.none  # once is fine


def test_describe_client_quotas_checks_its_filter_as_kafka(shared):
    """2,000 quota entities and a filter repeating one component 50,000 times were 10**8
    matches in the parent's loop; Kafka refuses a type named twice (INVALID_REQUEST) and an
    unknown type (UNSUPPORTED_VERSION)."""
    broker = shared
    with KafkaSocket(broker.listeners["PLAINTEXT"], 30) as sock:
        entries = [{"entity": [{"entity_type": "user", "entity_name": "a"},
                               {"entity_type": "client-id", "entity_name": f"c{n}"}],
                    "ops": [{"key": "producer_byte_rate", "value": 1e6, "remove": False}]}
                   for n in range(2000)]
        _, altered, _ = ask(sock, 49, 1, {"entries": entries, "validate_only": False})
        assert {entry.error_code for entry in altered.entries} == {ErrorCode.none}
        user_a = {"entity_type": "user", "match_type": 0, "match": "a"}
        _, described, took = ask(sock, 48, 1, {"components": [user_a] * 50_000,
                                               "strict": False})
        assert described.error_code == ErrorCode.invalid_request and took < 2.0
        assert described.error_message == \
            "Entity type user cannot appear more than once in the filter."
        _, described, _ = ask(sock, 48, 1, {"components": [
            {"entity_type": "group", "match_type": 2, "match": None}], "strict": False})
        assert described.error_code == ErrorCode.unsupported_version
        _, described, _ = ask(sock, 48, 1, {"components": [user_a], "strict": False})
        assert described.error_code == ErrorCode.none and len(described.entries) == 2000


def test_scram_credentials_name_each_user_once_in_linear_time(shared):
    """A user named 50,000 times was counted against the whole list for each mention (10**9
    comparisons); Kafka answers it once, DUPLICATE_RESOURCE."""
    broker = shared
    with KafkaSocket(broker.listeners["PLAINTEXT"], 60) as sock:
        _, described, took = ask(sock, 50, 0, {"users": [{"name": "alice"}] * 50_000})
        assert [(r.user, r.error_code) for r in described.results] == \
            [("alice", ErrorCode.duplicate_resource)] and took < 2.0
        _, described, _ = ask(sock, 50, 0, {"users": [{"name": "bob"}]})
        assert described.results[0].error_message == \
            "Attempt to describe a user credential that does not exist: bob"
        deletion = {"name": "alice", "mechanism": 1}
        _, altered, took = ask(sock, 51, 0, {"deletions": [deletion] * 50_000,
                                             "upsertions": []})
        assert [(r.user, r.error_code) for r in altered.results] == \
            [("alice", ErrorCode.duplicate_resource)] and took < 2.0


def test_delete_groups_and_offset_delete_answer_each_once_and_write_only_what_is_held():
    """DeleteGroups names each group once (Kafka's `distinct`); OffsetDelete of a partition
    named 50,000 times without an offset wrote 50,000 tombstones: none now (as Kafka)."""
    with BrokerProcess(workers=1) as broker:
        create_topic(broker.bootstrap, "t", partitions=2)
        offsets_file = os.path.join(broker.data_dir, "logs", ".pybroker-offsets.jsonl")
        with KafkaSocket(broker.listeners["PLAINTEXT"], 30) as sock:
            for group in ("g", "h"):
                ask(sock, 8, 8, {"group_id": group, "generation_id_or_member_epoch": -1,
                                 "member_id": "", "group_instance_id": None, "topics": [
                                     {"name": "t", "partitions": [{
                                         "partition_index": 0, "committed_offset": 5,
                                         "committed_leader_epoch": -1,
                                         "committed_metadata": None}]}]})
            written = os.path.getsize(offsets_file)
            _, deleted, took = ask(sock, 47, 0, {"group_id": "g", "topics": [
                {"name": "t", "partitions": [{"partition_index": 1}] * 50_000}]})
            assert deleted.error_code == ErrorCode.none and took < 2.0
            assert [(p.partition_index, p.error_code) for p in deleted.topics[0].partitions] \
                == [(1, ErrorCode.none)]
            assert os.path.getsize(offsets_file) == written
            _, deleted, _ = ask(sock, 42, 2, {"groups_names": ["h", "h", "h"]})
            assert [(r.group_id, r.error_code) for r in deleted.results] == [("h", ErrorCode.none)]


@contextlib.contextmanager
def group_of(address, group: str, size: int):
    """A group of `size` members, each on a connection of its own, kept in PreparingRebalance
    (the first member never rejoins; the others wait up to their 60 s rebalance timeout);
    yields a further connection once the parent holds them all."""
    joining = [KafkaSocket(address, 60) for _ in range(size)]
    try:
        join = frame(request(11, 2, {
            "group_id": group, "session_timeout": datetime.timedelta(seconds=60),
            "rebalance_timeout": datetime.timedelta(seconds=60), "member_id": "",
            "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b"m"}]}))
        for sock in joining:
            sock.send(join)
        with KafkaSocket(address, 60) as sock:
            def members() -> int:
                return len(ask(sock, 15, 5, {"groups": [group],
                                             "include_authorized_operations": False}
                               )[1].groups[0].members)
            wait_until(lambda: members() == size, timeout=60,
                       message="the joins did not all reach the parent")
            yield sock
    finally:
        for sock in joining:
            sock.close()


def test_a_leave_naming_many_instances_does_not_scan_the_group_for_each():
    """A group of 1,000 members and a LeaveGroup naming 99,000 static instances: each was
    looked for through every member, twice (2 * 10**8 steps, seconds of the parent's loop)."""
    with BrokerProcess(workers=1, overrides=GROUPS) as broker, \
            group_of(broker.listeners["PLAINTEXT"], "big", 1000) as sock:
        leaving = [{"member_id": f"m{n}", "group_instance_id": f"i{n}"} for n in range(99_000)]
        _, left, took = ask(sock, 13, 5, {"group_id": "big", "members": leaving})
        assert {member.error_code for member in left.members} == {ErrorCode.unknown_member_id}
        _, _, unknown_group = ask(sock, 13, 5, {"group_id": "none", "members": leaving})
        assert took < 2 * unknown_group + 0.5  # the members cost nothing per name


def join_frame_of_metadata_bytes(size: int) -> tuple[bytes, int]:
    """The start of a JoinGroup v2 frame whose one protocol's metadata (its last field) is
    `size` bytes, and the frame's whole size: the metadata is sent in chunks, never held."""
    small = request(11, 2, {
        "group_id": "g", "session_timeout": datetime.timedelta(seconds=60),
        "rebalance_timeout": datetime.timedelta(seconds=60), "member_id": "",
        "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b""}]})
    assert small.endswith(struct.pack(">i", 0))  # the empty metadata's length, last
    head = small[:-4] + struct.pack(">i", size)
    return struct.pack(">i", len(head) + size) + head, len(head) + size


def test_a_forwarded_request_too_big_for_the_channel_closes_only_its_connection():
    """A JoinGroup of 1.06 GB (socket.request.max.bytes raised to allow it) was queued whole
    on the worker's channel to the parent, past what breaks it: the worker shut down with
    every client.  It is refused now, with a log line and a metric."""
    overrides = dict(GROUPS, **{"socket.request.max.bytes": str(1100 << 20)})
    with BrokerProcess(workers=1, overrides=overrides) as broker:
        pid, address = broker.worker_pids["data-0"], broker.listeners["PLAINTEXT"]
        with KafkaSocket(address, 120) as asker, KafkaSocket(address, 30) as other:
            size = (1 << 30) + (16 << 20)  # past the 1 GiB a channel queues for a peer
            start, _ = join_frame_of_metadata_bytes(size)
            asker.send(start)
            chunk = b"m" * (16 << 20)
            for _ in range(size // len(chunk)):
                asker.send(chunk)
            with pytest.raises(ConnectionError):
                asker.receive()
            assert stable_group(other, "small", b"m")
        broker.wait_for_line(r"JoinGroup: \d+ bytes to forward")
        assert broker.metric("broker_invalid_requests_total", reason="forward_backlog") == 1
        worker_survived(broker, pid)


def test_a_join_costs_the_same_in_a_group_of_thousands():
    """Whether a joining member's protocols are supported by every member was found by
    building every member's protocol set, for each join: a join into a group of 5,000 cost
    a millisecond of the parent's loop, a whole group rejoining seconds.  1,000 joins into
    that group (answered MEMBER_ID_REQUIRED, no rebalance waited for) now take about what
    they take into an empty one."""
    with BrokerProcess(workers=1, overrides=GROUPS) as broker, \
            group_of(broker.listeners["PLAINTEXT"], "big", 5000) as sock:
        def joins(group: str) -> float:
            took = 0.0
            for _ in range(1000):
                _, joined, seconds = ask(sock, 11, 5, {
                    "group_id": group, "session_timeout": datetime.timedelta(seconds=60),
                    "rebalance_timeout": datetime.timedelta(seconds=60), "member_id": "",
                    "group_instance_id": None, "protocol_type": "consumer",
                    "protocols": [{"name": "range", "metadata": b"m"}]})
                assert joined.error_code == ErrorCode.member_id_required
                took += seconds
            return took

        into_empty, into_big = joins("empty"), joins("big")
        assert into_big < 2 * into_empty + 0.5, (into_big, into_empty)


def subscription(*topics: str) -> bytes:
    """A consumer's JoinGroup metadata (ConsumerProtocolSubscription v0)."""
    names = b"".join(struct.pack(">h", len(topic)) + topic.encode() for topic in topics)
    return struct.pack(">hi", 0, len(topics)) + names + struct.pack(">i", -1)


def test_offset_delete_reads_the_subscriptions_once_a_generation():
    """OffsetDelete refuses a topic the group subscribes to (GROUP_SUBSCRIBED_TO_TOPIC), as
    read from the members' metadata when the generation formed (Kafka's
    initNextGeneration): every OffsetDelete parsed every member's metadata, 10**7 steps for
    twenty members of 1 MB each, seconds of the parent's loop per request."""
    with BrokerProcess(workers=1, overrides=GROUPS) as broker:
        create_topic(broker.bootstrap, "t")
        create_topic(broker.bootstrap, "u")
        address = broker.listeners["PLAINTEXT"]
        with KafkaSocket(address, 60) as sock:
            member = stable_group(sock, "g", subscription("t"))
            for group, generation, member_id in (("g", 1, member), ("h", -1, "")):
                ask(sock, 8, 8, {"group_id": group, "generation_id_or_member_epoch": generation,
                                 "member_id": member_id, "group_instance_id": None, "topics": [
                                     {"name": name, "partitions": [{
                                         "partition_index": 0, "committed_offset": 5,
                                         "committed_leader_epoch": -1,
                                         "committed_metadata": None}]} for name in ("t", "u")]})
            deletion = {"group_id": "g", "topics": [{"name": name, "partitions": [
                {"partition_index": 0}]} for name in ("t", "u")]}
            _, deleted, _ = ask(sock, 47, 0, deletion)
            assert [(t.name, t.partitions[0].error_code) for t in deleted.topics] == \
                [("t", ErrorCode.group_subscribed_to_topic), ("u", ErrorCode.none)]
            # Twenty more members of 1 MB each: 500,000 empty topic names apiece.
            heavy = struct.pack(">hi", 0, 500_000) + bytes(1_000_000)
            joining = [KafkaSocket(address, 60) for _ in range(20)]
            try:
                for other in joining:
                    other.send(frame(request(11, 2, {
                        "group_id": "g", "session_timeout": datetime.timedelta(seconds=60),
                        "rebalance_timeout": datetime.timedelta(seconds=60), "member_id": "",
                        "protocol_type": "consumer",
                        "protocols": [{"name": "range", "metadata": heavy}]})))
                wait_until(lambda: len(ask(sock, 15, 5, {
                    "groups": ["g"], "include_authorized_operations": False}
                )[1].groups[0].members) == 21, timeout=30)
                _, deleted, took = ask(sock, 47, 0, deletion)
                assert deleted.topics[0].partitions[0].error_code == \
                    ErrorCode.group_subscribed_to_topic
                _, _, without_members = ask(sock, 47, 0, dict(deletion, group_id="h"))
                assert took < 2 * without_members + 0.5, (took, without_members)
            finally:
                for other in joining:
                    other.close()


def test_a_quota_change_logs_what_it_changed_not_the_whole_table(shared):
    """Each AlterClientQuotas logged every quota held: with 2,000 entities, a 100 KB line for
    a change of one (10,000 entities: half a MB a line, at the client's pace)."""
    broker = shared
    with KafkaSocket(broker.listeners["PLAINTEXT"], 30) as sock:
        entries = [{"entity": [{"entity_type": "client-id", "entity_name": f"c{n}"}],
                    "ops": [{"key": "producer_byte_rate", "value": 1e6, "remove": False}]}
                   for n in range(2000)]
        ask(sock, 49, 1, {"entries": entries, "validate_only": False})
        start = len(broker.lines)
        ask(sock, 49, 1, {"entries": [dict(entries[0], entity=[
            {"entity_type": "client-id", "entity_name": "one-more"}])],
            "validate_only": False})
        line = broker.wait_for_line(r"quotas changed by .*", start=start).group(0)
        assert "one-more" in line and "c1999" not in line and len(line) < 500
