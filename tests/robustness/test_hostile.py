"""Hostile clients against a real broker: none of them crashes, wedges or stalls it.

One regression test per finding of the adversarial review, each on a broker
process on 127.0.0.1.  After every test the broker must still be up, have restarted no worker
(`broker_worker_restarts_total` 0 through the whole module) and answer a new client.
"""

import os
import socket
import struct
import time

import pytest
from crc32c import crc32c
from kio.schema.errors import ErrorCode

from tests.batches import make_batch
from tests.harness import BrokerProcess, rss, wait_until
from tests.helpers import timed_create_topic
from tests.wire import (KafkaSocket, create_topic, decode_response, fetch_request, frame,
                        metadata_request, peer_closed, produce_errors, produce_request, raw_request)

pytestmark = pytest.mark.system  # every test here starts a broker

MIB = 1 << 20
INT_MAX = 2**31 - 1


@pytest.fixture(scope="module")
def broker():
    overrides = {"queued.max.requests": "20",  # 10 per worker: parked fetches must not fill it
                 "pybroker.request.receive.timeout.ms": "1500",
                 "pybroker.connection.send.stall.ms": "1500",  # clients that never read
                 "socket.send.buffer.bytes": "8192",
                 "auto.create.topics.enable": "true"}
    with BrokerProcess(workers=2, overrides=overrides) as running:
        create_topic(running.bootstrap, "t")
        yield running


@pytest.fixture(autouse=True)
def still_whole(broker):
    """Every test ends with the broker up, no worker restarted, and a new client served."""
    yield
    assert broker.proc.poll() is None, "the broker died"
    assert broker.metric("broker_worker_restarts_total") == 0
    for _ in range(2):  # one connection per worker (round-robin)
        assert_answers(broker)


def assert_answers(broker, timeout: float = 5.0):
    with KafkaSocket(broker.listeners["PLAINTEXT"], timeout=timeout) as client:
        client.send(metadata_request(12, correlation_id=77, topics=["t"]))
        assert struct.unpack_from(">i", client.receive())[0] == 77


def closed_with(broker, payload: bytes, reason: str) -> None:
    before = broker.metric("broker_invalid_requests_total", reason=reason)
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        client.send(payload)
        assert client.is_closed_by_peer()
    wait_until(lambda: broker.metric("broker_invalid_requests_total", reason=reason) > before)


def log_end(broker, topic: str = "t") -> int:
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        client.send(fetch_request(topic, offset=0, correlation_id=3))
        _, response = decode_response(1, 12, client.receive())
        return response.responses[0].partitions[0].high_watermark


def patched_batch(count: int, **fields) -> bytes:
    """A valid batch with header fields overwritten (CRC recomputed): last_offset_delta,
    record_count, attributes."""
    batch = bytearray(make_batch(count))
    offsets = {"attributes": (21, ">h"), "last_offset_delta": (23, ">i"),
               "record_count": (57, ">i")}
    for name, value in fields.items():
        position, layout = offsets[name]
        struct.pack_into(layout, batch, position, value)
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    return bytes(batch)


# --- 1. hostile counts never reach kio's native reader ------------------------------------


def test_the_24_bytes_that_killed_the_parent_only_close_their_connection(broker):
    # DescribeGroups v5: a compact array claiming 2**32 - 2 groups (a group API: forwarded).
    closed_with(broker, bytes.fromhex("00000014000f00050000000200017800ffffffff0f000000"),
                "malformed_body")
    # Metadata v12 (served by the worker): the same lie in its topics array.
    closed_with(broker, struct.pack(">i", 16) + bytes.fromhex("0003000c00000003000178")
                + bytes.fromhex("00ffffffff0f"), "malformed_body")


def test_a_huge_count_right_after_the_header_of_every_advertised_api(broker):
    """Every API key and version the broker advertises, with a body that starts with the
    largest compact (and legacy) array count: each connection is closed, nothing dies."""
    from tests.wire import api_versions_request

    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        client.send(api_versions_request(3))
        _, versions = decode_response(18, 3, client.receive())
    tried = 0
    for entry in versions.api_keys:
        for version in range(entry.min_version, entry.max_version + 1):
            for lie in (b"\xff\xff\xff\xff\x0f", b"\x7f\xff\xff\xff"):
                with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
                    client.send(raw_request(entry.api_key, version, 1, b"\0" + lie + b"\0" * 4))
                    try:
                        client.receive()  # a few APIs may answer (an error), then close or not
                    except (ConnectionError, socket.timeout):
                        pass
                tried += 1
    assert tried > 250


# --- 2. a lying batch never wedges a partition ------------------------------------------------


@pytest.mark.parametrize("fields", [
    {"last_offset_delta": INT_MAX},  # moved the log end by 2**31 per batch
    {"last_offset_delta": 5},  # 3 records claiming 6 offsets
    {"record_count": 1000},  # a count the records do not back
    {"attributes": 7},  # an unknown codec
    {"attributes": 0x20},  # a control batch from a client
])
def test_inconsistent_batches_are_refused_and_the_partition_keeps_serving(broker, fields):
    before = log_end(broker)
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        client.send(produce_request("t", patched_batch(3, **fields), correlation_id=1))
        [(code, base)] = produce_errors(client.receive())
        assert base == -1 and code in (ErrorCode.invalid_record, ErrorCode.corrupt_message)
        client.send(produce_request("t", make_batch(2), correlation_id=2))
        assert produce_errors(client.receive()) == [(ErrorCode.none, before)]
    assert log_end(broker) == before + 2


def wedged_segment(directory: str) -> None:
    """Write to a partition's segment what the broker used to accept: two batches whose last
    offset delta lies (2**31 - 1) and one more batch, as three appends would have written
    them; the third's offset no longer fits the segment's 32-bit relative offsets."""
    log_path = os.path.join(directory, "00000000000000000000.log")
    with open(log_path, "ab") as out:
        for base in (0, 2**31, 2**32):
            batch = bytearray(make_batch(1, value_size=5000))  # each gets an index entry
            if base < 2**32:
                struct.pack_into(">i", batch, 23, INT_MAX)
                struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
            struct.pack_into(">q", batch, 0, base)
            out.write(bytes(batch))


def test_a_partition_recovery_cannot_repair_goes_offline_and_the_rest_serves(tmp_path):
    data = str(tmp_path)
    with BrokerProcess(workers=1, data_dir=data) as broker:
        create_topic(broker.bootstrap, "bad")
        create_topic(broker.bootstrap, "good")
    wedged_segment(os.path.join(data, "logs", "bad-0"))
    os.unlink(os.path.join(data, "logs", ".pybroker-clean-shutdown"))  # as after kill -9
    with BrokerProcess(workers=1, data_dir=data) as broker:
        broker.wait_for_line("partition bad-0 is offline")
        address = broker.listeners["PLAINTEXT"]
        with KafkaSocket(address) as client:
            client.send(metadata_request(12, topics=["bad", "good"]))
            _, response = decode_response(3, 12, client.receive())
            by_name = {topic.name: topic.partitions[0] for topic in response.topics}
            assert int(by_name["bad"].error_code) == ErrorCode.leader_not_available
            assert by_name["bad"].leader_id == -1 and list(by_name["bad"].offline_replicas) == [0]
            assert int(by_name["good"].error_code) == ErrorCode.none
            client.send(produce_request("bad", make_batch(1), correlation_id=2))
            assert produce_errors(client.receive()) == [(ErrorCode.kafka_storage_error, -1)]
            client.send(produce_request("good", make_batch(1), correlation_id=3))
            assert produce_errors(client.receive()) == [(ErrorCode.none, 0)]
        assert broker.metric("broker_worker_restarts_total") == 0


# --- 3. every accepted batch can be read back --------------------------------------------------


def test_a_batch_just_under_message_max_bytes_is_fetched_whole(broker):
    from kafka import KafkaConsumer, TopicPartition

    create_topic(broker.bootstrap, "big")
    overhead = len(make_batch(1, value_size=1_000_000)) - 1_000_000  # header, record fields
    value_size = 1_048_584 - overhead  # the size from the review: over 1 MiB, under the limit
    batch = make_batch(1, value_size=value_size)
    assert len(batch) == 1_048_584
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        client.send(produce_request("big", batch, correlation_id=1))
        assert produce_errors(client.receive()) == [(ErrorCode.none, 0)]
        client.send(produce_request("big", make_batch(1), correlation_id=2))
        assert produce_errors(client.receive()) == [(ErrorCode.none, 1)]
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=10000,
                             max_partition_fetch_bytes=MIB)
    try:
        consumer.assign([TopicPartition("big", 0)])
        got = []
        for record in consumer:
            got.append((record.offset, len(record.value)))
            if len(got) == 2:
                break
    finally:
        consumer.close()
    assert got == [(0, value_size), (1, 10)]


# --- 4. IPC messages of any size ----------------------------------------------------------------


def test_a_describe_configs_of_5000_resources_is_answered_and_the_worker_kept(broker):
    """5,000 topics that do not exist: a 300 KB answer, carried in chunks from the parent."""
    from tests.wire import request

    resources = [{"resource_type": 2, "resource_name": f"no.such.topic.{i}",
                  "configuration_keys": None} for i in range(5000)]
    with KafkaSocket(broker.listeners["PLAINTEXT"], timeout=20) as client:
        client.send(frame(request(32, 4, {"resources": resources, "include_synonyms": False,
                                           "include_documentation": False})))
        _, response = decode_response(32, 4, client.receive())
        assert len(response.results) == 5000
        assert {result.error_code for result in response.results} == \
            {ErrorCode.unknown_topic_or_partition}
        client.send(metadata_request(12, correlation_id=6, topics=["t"]))  # same connection
        assert struct.unpack_from(">i", client.receive())[0] == 6


def client_id(n: int) -> str:
    return f"quota-client-with-a-longer-id-{n:04d}"  # 1000 of them: 75 KB in one IPC message


def test_a_quota_table_of_1000_entries_reaches_every_worker(broker):
    from kafka.protocol.admin.client_quotas import AlterClientQuotasRequest

    entry = AlterClientQuotasRequest.EntryData
    request = AlterClientQuotasRequest[1](validate_only=False, entries=[entry(
        entity=[entry.EntityData(entity_type="client-id", entity_name=client_id(i))],
        ops=[entry.OpData(key="producer_byte_rate", value=1024.0, remove=False)])
        for i in range(1000)])
    request.with_header(correlation_id=1, client_id="test-admin")
    with KafkaSocket(broker.listeners["PLAINTEXT"], timeout=20) as client:
        client.send(frame(bytes(request.encode(header=True))))
        _, response = decode_response(49, 1, client.receive())
        assert [int(e.error_code) for e in response.entries] == [ErrorCode.none] * 1000
    from kafka.protocol.producer.produce import ProduceRequest

    for _ in range(2):  # both workers (round-robin) throttle the last client id
        with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
            data = ProduceRequest.TopicProduceData
            produce = ProduceRequest[9](transactional_id=None, acks=1, timeout_ms=5000,
                                        topic_data=[data(name="t", partition_data=[
                                            data.PartitionProduceData(
                                                index=0, records=make_batch(20, value_size=500))])])
            wait_until(lambda: _throttled(client, produce), timeout=10)


def _throttled(client, produce) -> bool:
    produce.with_header(correlation_id=1, client_id=client_id(999))
    client.send(frame(bytes(produce.encode(header=True))))
    _, response = decode_response(0, 9, client.receive())
    return response.throttle_time.total_seconds() > 0


# --- 5. parked long polls -------------------------------------------------------------------


def test_parked_long_polls_block_nobody_and_are_released_when_their_clients_go(broker):
    address = broker.listeners["PLAINTEXT"]
    base = broker.metric("broker_connections", listener="PLAINTEXT")
    parked = []
    for n in range(100):  # 50 per worker; queued.max.requests gives each worker 10
        client = KafkaSocket(address, timeout=10)
        client.send(_forever_fetch(n))
        parked.append(client)
    wait_until(lambda: broker.metric("broker_delayed_fetches") == 100, timeout=15)
    for _ in range(4):
        assert_answers(broker, timeout=2)
    for client in parked:
        client.close()
    wait_until(lambda: broker.metric("broker_delayed_fetches") == 0, timeout=10,
               message="parked fetches of closed connections were not released")
    wait_until(lambda: broker.metric("broker_connections", listener="PLAINTEXT") <= base,
               timeout=10, message="closed connections still hold their slots")


def _forever_fetch(correlation: int) -> bytes:
    """A Fetch of the log end that asks to wait 24 days for 2 GiB."""
    from kafka.protocol.consumer.fetch import FetchRequest

    topic = FetchRequest.FetchTopic
    request = FetchRequest[12](
        replica_id=-1, max_wait_ms=INT_MAX, min_bytes=INT_MAX, max_bytes=MIB,
        isolation_level=0, session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
        topics=[topic(topic="t", partitions=[topic.FetchPartition(
            partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
            log_start_offset=-1, partition_max_bytes=0)])])
    request.with_header(correlation_id=correlation, client_id="parked")
    return frame(bytes(request.encode(header=True)))


# --- 6. half-sent requests ---------------------------------------------------------------------


def test_half_sent_requests_hold_no_memory_and_are_closed_at_their_deadline(broker):
    workers = [pid for name, pid in broker.worker_pids.items() if name.startswith("data-")]
    before = sum(rss(pid) for pid in workers)
    closed_before = broker.metric("broker_connections_closed_total", listener="PLAINTEXT",
                                  reason="receive_timeout")
    holders = []
    for _ in range(6):
        sock = socket.create_connection(broker.listeners["PLAINTEXT"], timeout=10)
        sock.sendall(struct.pack(">i", 100 * MIB - 1) + b"\0\1\0\0\0\0\0\1")  # 8 of 100 MiB
        holders.append(sock)
    time.sleep(0.3)  # let the workers read what was sent (nothing more will come)
    assert sum(rss(pid) for pid in workers) - before < 32 * MIB
    for sock in holders:
        assert peer_closed(sock, wait=10), "a half-sent request was never timed out"
        sock.close()
    wait_until(lambda: broker.metric("broker_connections_closed_total", listener="PLAINTEXT",
                                     reason="receive_timeout") >= closed_before + 6)


# --- 7. bounded work per request ------------------------------------------------------------


def test_a_partition_named_20000_times_is_read_and_answered_once(broker):
    from kafka.protocol.consumer.fetch import FetchRequest

    topic = FetchRequest.FetchTopic
    same = topic.FetchPartition(partition=0, current_leader_epoch=-1, fetch_offset=0,
                                last_fetched_epoch=-1, log_start_offset=-1,
                                partition_max_bytes=MIB)
    request = FetchRequest[12](
        replica_id=-1, max_wait_ms=200, min_bytes=INT_MAX, max_bytes=MIB, isolation_level=0,
        session_id=0, session_epoch=-1, forgotten_topics_data=[], rack_id="",
        topics=[topic(topic="t", partitions=[same] * 20000)])
    request.with_header(correlation_id=4, client_id="dup")
    with KafkaSocket(broker.listeners["PLAINTEXT"], timeout=10) as client:
        client.send(frame(bytes(request.encode(header=True))))
        _, response = decode_response(1, 12, client.receive())
    assert [len(t.partitions) for t in response.responses] == [1]


def test_metadata_with_a_million_names_is_refused_without_stalling(broker):
    names = b"".join(struct.pack(">h", 6) + b"x%05d" % (i % 100000) for i in range(10**6))
    body = struct.pack(">i", 10**6) + names + b"\0"  # Metadata v4: names, allow auto-create
    closed_with(broker, raw_request(3, 4, 1, body), "too_many_entries")


def test_metadata_names_repeated_are_answered_once(broker):
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        client.send(metadata_request(12, correlation_id=2, topics=["t"] * 5000))
        _, response = decode_response(3, 12, client.receive())
    assert [topic.name for topic in response.topics] == ["t"]


def delete_topics(broker, names: list[str]) -> list[int]:
    """DeleteTopics, then wait until the parent removed their directories: each topic's error
    code.  A test that created thousands of partitions deletes them after: the module broker's
    clean shutdown fsyncs every partition it still has (8,000 of them took 8 to 25 s here),
    removing them is quicker, and over before the next test starts."""
    from kafka.protocol.admin.topics import DeleteTopicsRequest

    request = DeleteTopicsRequest[4](topic_names=names, timeout_ms=30000)
    request.with_header(correlation_id=9, client_id="admin")
    with KafkaSocket(broker.listeners["PLAINTEXT"], timeout=30) as client:
        client.send(frame(bytes(request.encode(header=True))))
        _, response = decode_response(20, 4, client.receive())
    logs = os.path.join(broker.data_dir, "logs")
    wait_until(lambda: not any(entry.startswith(tuple(f"{name}-" for name in names))
                               for entry in os.listdir(logs)),
               timeout=60, message="the deleted partitions' directories removed")
    return [int(item.error_code) for item in response.responses]


def test_create_topics_with_an_absurd_partition_count_is_refused(broker):
    assert timed_create_topic(broker, "huge", INT_MAX)[0] == ErrorCode.invalid_partitions


def test_creating_2000_partitions_never_holds_a_worker(broker):
    import threading

    result = {}
    creator = threading.Thread(target=lambda: result.update(
        answer=timed_create_topic(broker, "wide", 2000)))
    creator.start()
    pings = 0
    while creator.is_alive() and pings < 200:
        for _ in range(2):  # both workers, one of them is creating
            assert_answers(broker, timeout=1)
        pings += 1
    creator.join(60)
    assert result["answer"][0] == ErrorCode.none
    assert pings >= 2, "the creation ended before anyone could ask (too fast to tell)"
    assert delete_topics(broker, ["wide"]) == [ErrorCode.none]


def test_deleting_2000_partitions_leaves_their_files_to_the_parent(broker):
    """DeleteTopics renames the partitions and answers; their files are removed by the
    parent's maintenance thread within seconds, not in the worker's loop."""
    from kafka.protocol.admin.topics import DeleteTopicsRequest

    if timed_create_topic(broker, "wide-gone", 2000)[0] != ErrorCode.none:
        raise AssertionError("could not create the topic to delete")
    request = DeleteTopicsRequest[4](topic_names=["wide-gone"], timeout_ms=30000)
    request.with_header(correlation_id=9, client_id="admin")
    logs = os.path.join(broker.data_dir, "logs")
    with KafkaSocket(broker.listeners["PLAINTEXT"], timeout=30) as client:
        started = time.monotonic()
        client.send(frame(bytes(request.encode(header=True))))
        _, response = decode_response(20, 4, client.receive())
        elapsed = time.monotonic() - started
    assert response.responses[0].error_code == ErrorCode.none
    # Renaming 2,000 directories takes about 0.1 s here; removing their files too, 0.9 s.
    assert elapsed < 0.45, f"the deletion held its worker {elapsed:.2f} s"
    wait_until(lambda: not any(name.startswith("wide-gone-") for name in os.listdir(logs)),
               timeout=30, message="the deleted partitions' directories removed")


def create_many(broker, topics: list[tuple[str, int]], version: int = 5):
    from kafka.protocol.admin.topics import CreateTopicsRequest

    request = CreateTopicsRequest[version](topics=[
        CreateTopicsRequest[version].CreatableTopic(name=name, num_partitions=count,
                                                    replication_factor=1, assignments=[],
                                                    configs=[]) for name, count in topics],
        timeout_ms=60000, validate_only=False)
    request.with_header(correlation_id=8, client_id="admin")
    with KafkaSocket(broker.listeners["PLAINTEXT"], timeout=60) as client:
        client.send(frame(bytes(request.encode(header=True))))
        _, response = decode_response(19, version, client.receive())
    return response


def test_one_create_topics_builds_a_bounded_number_of_partitions(broker):
    """10,000 partitions per request at most: the topic past the budget gets
    THROTTLING_QUOTA_EXCEEDED and a throttle time (KIP-599), duplicates INVALID_REQUEST."""
    response = create_many(broker, [("budget-a", 6000), ("budget-b", 6000), ("twice", 1),
                                    ("twice", 1)])
    codes = {topic.name: int(topic.error_code) for topic in response.topics}
    assert codes == {"budget-a": 0, "budget-b": ErrorCode.throttling_quota_exceeded,
                     "twice": ErrorCode.invalid_request}
    assert response.throttle_time.total_seconds() > 0
    assert delete_topics(broker, ["budget-a"]) == [ErrorCode.none]


def test_deleting_thousands_of_topics_takes_one_lock(broker):
    from kafka.protocol.admin.topics import DeleteTopicsRequest

    create_many(broker, [(f"gone-{n}", 1) for n in range(200)])
    names = [f"gone-{n}" for n in range(200)] + [f"never-{n}" for n in range(20000)]
    request = DeleteTopicsRequest[5](topic_names=names + ["gone-0"], timeout_ms=30000)
    request.with_header(correlation_id=3, client_id="admin")
    with KafkaSocket(broker.listeners["PLAINTEXT"], timeout=30) as client:
        client.send(frame(bytes(request.encode(header=True))))
        _, response = decode_response(20, 5, client.receive())
    codes = [int(item.error_code) for item in response.responses]
    assert codes.count(0) == 199 and codes.count(3) == 20000 and codes.count(42) == 2


def test_list_offsets_refuses_duplicate_partitions_without_looking_them_up(broker):
    from kafka.protocol.consumer.offsets import ListOffsetsRequest

    topic = ListOffsetsRequest[4].ListOffsetsTopic
    same = topic.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=-1)
    request = ListOffsetsRequest[4](replica_id=-1, isolation_level=0, topics=[
        topic(name="t", partitions=[same] * 3000)])
    request.with_header(correlation_id=2, client_id="dup")
    with KafkaSocket(broker.listeners["PLAINTEXT"], timeout=10) as client:
        client.send(frame(bytes(request.encode(header=True))))
        _, response = decode_response(2, 4, client.receive())
    assert {int(p.error_code) for p in response.topics[0].partitions} == {ErrorCode.invalid_request}


def test_a_stored_batch_that_lies_about_its_count_cannot_drive_a_lookup(tmp_path):
    """A batch written before validation existed: 65 bytes claiming 2**31 - 1 records."""
    data = str(tmp_path)
    with BrokerProcess(workers=1, data_dir=data) as broker:
        create_topic(broker.bootstrap, "liar")
        with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
            client.send(produce_request("liar", make_batch(1, timestamp_ms=1000), correlation_id=1))
            assert produce_errors(client.receive()) == [(ErrorCode.none, 0)]
    lying = bytearray(make_batch(1, timestamp_ms=2000))
    struct.pack_into(">q", lying, 0, 1)
    struct.pack_into(">i", lying, 57, INT_MAX)  # record count
    struct.pack_into(">I", lying, 17, crc32c(bytes(lying[21:])))
    with open(os.path.join(data, "logs", "liar-0", "00000000000000000000.log"), "ab") as out:
        out.write(bytes(lying))
    os.unlink(os.path.join(data, "logs", ".pybroker-clean-shutdown"))
    with BrokerProcess(workers=1, data_dir=data) as broker:
        from kafka.protocol.consumer.offsets import ListOffsetsRequest

        request = ListOffsetsRequest[4](replica_id=-1, isolation_level=0, topics=[
            ListOffsetsRequest[4].ListOffsetsTopic(name="liar", partitions=[
                ListOffsetsRequest[4].ListOffsetsTopic.ListOffsetsPartition(
                    partition_index=0, current_leader_epoch=-1, timestamp=1500)])])
        request.with_header(correlation_id=9, client_id="lookup")
        with KafkaSocket(broker.listeners["PLAINTEXT"], timeout=10) as client:
            for _ in range(3):
                client.send(frame(bytes(request.encode(header=True))))
                _, response = decode_response(2, 4, client.receive())
                part = response.topics[0].partitions[0]
                assert (int(part.error_code), part.offset) == (ErrorCode.none, 1)
        assert broker.metric("broker_worker_restarts_total") == 0


# --- 8. every advertised Fetch version ------------------------------------------------------


@pytest.mark.parametrize("version", [4, 5, 6])
def test_fetch_v4_to_v6_are_answered(broker, version):
    from kafka.protocol.consumer.fetch import FetchRequest

    topic = FetchRequest.FetchTopic
    fields = {"isolation_level": 0} if version >= 4 else {}
    request = FetchRequest[version](replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=MIB,
                                    topics=[topic(topic="t", partitions=[topic.FetchPartition(
                                        partition=0, fetch_offset=0, log_start_offset=-1,
                                        partition_max_bytes=MIB)])], **fields)
    request.with_header(correlation_id=version, client_id="old")
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        client.send(frame(bytes(request.encode(header=True))))
        _, response = decode_response(1, version, client.receive())
    assert int(response.responses[0].partitions[0].error_code) == ErrorCode.none


# --- 9. topic names ----------------------------------------------------------------------------


def test_a_topic_name_ending_in_a_newline_is_refused_and_leaves_nothing(broker):
    assert timed_create_topic(broker, "evil\n", 1)[0] == ErrorCode.invalid_topic_exception
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        for n in range(3):  # Metadata auto-creation, three times
            client.send(metadata_request(4, correlation_id=n, topics=["evil\n"]))
            _, response = decode_response(3, 4, client.receive())
            assert int(response.topics[0].error_code) == ErrorCode.invalid_topic_exception
    log_dir = os.path.join(broker.data_dir, "logs")
    assert not [name for name in os.listdir(log_dir) if "evil" in name or "staging" in name]


# --- 9. clients that never read their answers ---------------------------------------------------


def test_clients_that_never_read_are_cut_off_and_hold_nothing_after(broker):
    """100 clients each ask for 256 KiB and read none of it: their answers stall in the
    workers' buffers, and within pybroker.connection.send.stall.ms (1.5 s here) they are cut
    off (reason send_stalled); a client that reads is answered all along."""
    create_topic(broker.bootstrap, "never-read")
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        client.send(produce_request("never-read", make_batch(64, value_size=4000)))
        assert produce_errors(client.receive()) == [(ErrorCode.none, 0)]
    closed_before = broker.metric("broker_connections_closed_total", listener="PLAINTEXT",
                                  reason="send_stalled")
    readers_never = []
    for _ in range(100):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small
        sock.settimeout(10)  # window, so the answer stays on the broker's side
        sock.connect(broker.listeners["PLAINTEXT"])
        sock.sendall(fetch_request("never-read"))
        readers_never.append(sock)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and broker.metric(
                "broker_connections_closed_total", listener="PLAINTEXT",
                reason="send_stalled") < closed_before + 100:
            assert_answers(broker)  # the others are served meanwhile
        assert broker.metric("broker_connections_closed_total", listener="PLAINTEXT",
                             reason="send_stalled") == closed_before + 100
    finally:
        for sock in readers_never:
            sock.close()
