"""Consumer groups with real clients: partitions shared, taken over, consumed exactly once,
committed offsets surviving a killed worker and a killed broker."""

import asyncio
import datetime
import os
import signal
import threading
import time

import pytest
from kio.schema.errors import ErrorCode

from tests.harness import BrokerProcess, wait_until
from tests.helpers import produce
from tests.wire import (KafkaSocket, alter_client_quota, create_topic, decode_response, frame,
                        request)

pytestmark = pytest.mark.system  # every test here starts a broker

GROUPS = {"group.initial.rebalance.delay.ms": "100"}
PARTITIONS = 6
SPREAD = {"partitions": range(PARTITIONS), "linger_ms": 5}  # how produce() sends here


class Member(threading.Thread):
    """One group consumer in its own thread: poll, record, commit synchronously, repeat."""

    def __init__(self, client: str, bootstrap: str, topic: str, group: str, seen: list):
        super().__init__(daemon=True)
        self.client, self.bootstrap, self.topic, self.group = client, bootstrap, topic, group
        self.seen = seen  # shared: (value, member name)
        self.assigned: set = set()
        self.stop_event = threading.Event()
        self.failure: BaseException | None = None

    def run(self):
        try:
            getattr(self, f"_run_{self.client.replace('-', '_')}")()
        except BaseException as error:  # reported by the test
            self.failure = error

    def _record(self, values):
        for value in values:
            self.seen.append((value, self.name))

    def _run_kafka_python(self):
        from kafka import KafkaConsumer

        consumer = KafkaConsumer(self.topic, bootstrap_servers=self.bootstrap,
                                 group_id=self.group, enable_auto_commit=False,
                                 auto_offset_reset="earliest", heartbeat_interval_ms=300,
                                 session_timeout_ms=6000)
        try:
            while not self.stop_event.is_set():
                batches = consumer.poll(timeout_ms=100)
                self._record(r.value.decode() for rs in batches.values() for r in rs)
                if batches:
                    consumer.commit()
                self.assigned = {tp.partition for tp in consumer.assignment()}
        finally:
            consumer.close()

    def _run_confluent_kafka(self):
        from confluent_kafka import Consumer

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group,
                             "enable.auto.commit": False, "auto.offset.reset": "earliest",
                             "heartbeat.interval.ms": 300, "session.timeout.ms": 6000,
                             "partition.assignment.strategy": "range"})
        consumer.subscribe([self.topic])
        try:
            while not self.stop_event.is_set():
                messages = consumer.consume(100, 0.1)
                good = [m for m in messages if m.error() is None]
                self._record(m.value().decode() for m in good)
                if good:
                    consumer.commit(asynchronous=False)
                self.assigned = {tp.partition for tp in consumer.assignment()}
        finally:
            consumer.close()

    def _run_aiokafka(self):
        asyncio.run(self._aiokafka())

    async def _aiokafka(self):
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(self.topic, bootstrap_servers=self.bootstrap,
                                    group_id=self.group, enable_auto_commit=False,
                                    auto_offset_reset="earliest", heartbeat_interval_ms=300,
                                    session_timeout_ms=6000)
        await consumer.start()
        try:
            while not self.stop_event.is_set():
                batches = await consumer.getmany(timeout_ms=100)
                self._record(r.value.decode() for rs in batches.values() for r in rs)
                if batches:
                    await consumer.commit()
                self.assigned = {tp.partition for tp in consumer.assignment()}
        finally:
            await consumer.stop()

    def finish(self):
        self.stop_event.set()
        self.join(30)
        assert not self.is_alive() and self.failure is None, self.failure


def exactly_once(seen: list, expected: list[str]) -> None:
    values = [value for value, _ in seen]
    assert sorted(values) == sorted(expected), (
        f"{len(values)} consumed, {len(set(values))} distinct, {len(expected)} expected")


@pytest.mark.parametrize("client", ["kafka-python", "aiokafka", "confluent-kafka"])
def test_three_members_share_take_over_and_consume_exactly_once(client):
    with BrokerProcess(workers=2, overrides=GROUPS) as broker:
        topic, group = f"orders-{client}", f"billing-{client}"
        create_topic(broker.bootstrap, topic, PARTITIONS)
        first = [f"a{n}" for n in range(300)]
        produce(broker.bootstrap, topic, first, **SPREAD)
        seen: list = []
        members = [Member(client, broker.bootstrap, topic, group, seen) for _ in range(3)]
        for member in members:
            member.start()
        wait_until(lambda: sorted(len(m.assigned) for m in members) == [2, 2, 2], timeout=60,
                   message=f"assignments {[m.assigned for m in members]}")
        assert set().union(*(m.assigned for m in members)) == set(range(PARTITIONS))
        wait_until(lambda: len(seen) >= 300, timeout=30)
        leaving = members.pop()
        leaving.finish()  # a clean close: LeaveGroup, the others take its partitions over
        wait_until(lambda: sorted(len(m.assigned) for m in members) == [3, 3], timeout=60,
                   message=f"assignments {[m.assigned for m in members]}")
        second = [f"b{n}" for n in range(300)]
        produce(broker.bootstrap, topic, second, **SPREAD)
        wait_until(lambda: len(seen) >= 600, timeout=30)
        time.sleep(0.5)  # room for a duplicate to show up
        for member in members:
            member.finish()
        exactly_once(seen, first + second)
        assert broker.metric("broker_requests_total", api="JoinGroup", listener="PLAINTEXT") > 0
        assert broker.metric("broker_requests_total", api="OffsetCommit", listener="PLAINTEXT") > 0
        # A restarted consumer resumes from the committed offsets: only what is new.
        third = [f"c{n}" for n in range(12)]
        produce(broker.bootstrap, topic, third, **SPREAD)
        later: list = []
        restarted = Member(client, broker.bootstrap, topic, group, later)
        restarted.start()
        wait_until(lambda: len(later) >= 12, timeout=60)
        time.sleep(0.5)
        restarted.finish()
        exactly_once(later, third)


def committed(address, group: str, topic: str, throttles: list | None = None) -> dict[int, int]:
    """OffsetFetch v8 on the wire (its throttle_time_ms appended to `throttles`)."""
    from kafka.protocol.consumer.group import OffsetFetchRequest

    from tests.wire import decode_response

    request = OffsetFetchRequest[8](groups=[OffsetFetchRequest.OffsetFetchRequestGroup(
        group_id=group, topics=[OffsetFetchRequest.OffsetFetchRequestGroup.OffsetFetchRequestTopics(
            name=topic, partition_indexes=list(range(PARTITIONS)))])], require_stable=False)
    request.with_header(correlation_id=1, client_id="test")
    with KafkaSocket(address) as client:
        client.send(frame(bytes(request.encode(header=True))))
        _, response = decode_response(9, 8, client.receive())
    if throttles is not None:
        throttles.append(response.throttle_time.total_seconds() * 1000)
    return {p.partition_index: p.committed_offset for p in response.groups[0].topics[0].partitions}


class RawMember:
    """A group member on the wire: JoinGroup (MEMBER_ID_REQUIRED, then the join) and the
    leader's SyncGroup; then heartbeats and descriptions of its group."""

    def __init__(self, address, group: str, session: float = 30.0):
        self.address, self.group, self.session = address, group, session
        self.member_id, self.generation = "", -1

    def _ask(self, api_key: int, version: int, values: dict):
        from tests.wire import request
        from tests.wire import decode_response

        with KafkaSocket(self.address, timeout=15) as client:
            client.send(frame(request(api_key, version, values)))
            return decode_response(api_key, version, client.receive())[1]

    def join_and_sync(self, assignment: bytes) -> None:
        import datetime

        for _ in range(2):  # the second join carries the member id the first one got
            answer = self._ask(11, 5, {
                "group_id": self.group, "member_id": self.member_id, "group_instance_id": None,
                "session_timeout": datetime.timedelta(seconds=self.session),
                "rebalance_timeout": datetime.timedelta(seconds=10), "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": b"\x00\x01"}]})
            self.member_id = answer.member_id
        assert answer.error_code == ErrorCode.none and answer.leader == self.member_id
        self.generation = answer.generation_id
        synced = self._ask(14, 3, {"group_id": self.group, "generation_id": self.generation,
                                   "member_id": self.member_id, "group_instance_id": None,
                                   "assignments": [{"member_id": self.member_id,
                                                    "assignment": assignment}]})
        assert synced.error_code == ErrorCode.none and synced.assignment == assignment

    def heartbeat(self) -> int:
        return self._ask(12, 3, {"group_id": self.group, "generation_id": self.generation,
                                 "member_id": self.member_id,
                                 "group_instance_id": None}).error_code

    def described(self) -> tuple[str, list[tuple[str, bytes]]]:
        (group,) = self._ask(15, 5, {"groups": [self.group],
                                     "include_authorized_operations": False}).groups
        return group.group_state, [(m.member_id, m.member_assignment) for m in group.members]


def test_killed_worker_or_broker_loses_no_committed_offset(tmp_path):
    with BrokerProcess(workers=2, overrides=GROUPS, data_dir=str(tmp_path)) as broker:
        topic, group = "ledger", "auditors"
        create_topic(broker.bootstrap, topic, PARTITIONS)
        survivor = RawMember(broker.listeners["PLAINTEXT"], "survivors")
        survivor.join_and_sync(b"its assignment")
        produce(broker.bootstrap, topic, [f"x{n}" for n in range(120)], **SPREAD)
        seen: list = []
        members = [Member("kafka-python", broker.bootstrap, topic, group, seen)
                   for _ in range(3)]
        for member in members:
            member.start()
        wait_until(lambda: len(seen) >= 120, timeout=60)
        wait_until(lambda: committed(broker.listeners["PLAINTEXT"], group, topic) ==
                   {p: 20 for p in range(PARTITIONS)}, timeout=30)
        # Members are spread over both workers (round-robin hand-off); kill one of them.
        killed = broker.worker_pids["data-0"]
        os.kill(killed, signal.SIGKILL)
        wait_until(lambda: broker.worker_pids["data-0"] != killed, timeout=15)
        wait_until(lambda: broker.metric("broker_worker_up", worker="data-0") == 1, timeout=15)
        assert committed(broker.listeners["PLAINTEXT"], group, topic) == \
            {p: 20 for p in range(PARTITIONS)}
        produce(broker.bootstrap, topic, [f"y{n}" for n in range(60)], **SPREAD)
        wait_until(lambda: len(seen) >= 180, timeout=60)
        wait_until(lambda: committed(broker.listeners["PLAINTEXT"], group, topic) ==
                   {p: 30 for p in range(PARTITIONS)}, timeout=60)
        for member in members:
            member.finish()
        assert sorted(v for v, _ in seen) == sorted([f"x{n}" for n in range(120)] +
                                                    [f"y{n}" for n in range(60)])
        os.kill(broker.pid, signal.SIGKILL)  # the whole broker, no clean shutdown
        broker.proc.wait(10)
    for process in broker.worker_pids.values():
        wait_until(lambda: not os.path.exists(f"/proc/{process}"), timeout=10)
    with BrokerProcess(workers=2, overrides=GROUPS, data_dir=str(tmp_path)) as restarted:
        assert committed(restarted.listeners["PLAINTEXT"], group, topic) == \
            {p: 30 for p in range(PARTITIONS)}
        # A member of a stable group goes on with its generation and assignment, as Kafka
        # loads its groups: no rebalance (which makes Kafka Streams wipe its state).
        survivor.address = restarted.listeners["PLAINTEXT"]
        assert survivor.heartbeat() == 0
        assert survivor.described() == ("Stable", [(survivor.member_id, b"its assignment")])


@pytest.fixture(scope="module")
def shared():
    """One broker for the tests that start no consumers: short sessions allowed, and quota
    windows short enough to throttle at once (only the client id "test" gets a quota)."""
    overrides = dict(GROUPS, **{"quota.window.num": "2", "pybroker.quota.burst.windows": "1",
                                "group.min.session.timeout.ms": "100"})
    with BrokerProcess(workers=1, overrides=overrides) as running:
        create_topic(running.bootstrap, "quiet", PARTITIONS)
        yield running


def test_group_requests_of_a_client_over_its_request_quota_are_throttled(shared):
    broker = shared
    address = broker.listeners["PLAINTEXT"]
    assert alter_client_quota(address, {"client-id": "test"}, "request_percentage",
                              0.001) == 0
    deadline, throttles = time.monotonic() + 20, []
    while not any(throttles):  # the parent's handling time is charged to the client
        assert time.monotonic() < deadline, "never throttled"
        committed(address, "g", "quiet", throttles)
    assert broker.metric("broker_throttle_time_seconds_total",
                         quota="request_percentage") > 0
    assert broker.metric("broker_requests_total", api="OffsetFetch",
                         listener="PLAINTEXT") > 0


def test_the_newer_group_protocols_are_throttled_like_any_request(shared):
    """ConsumerGroupHeartbeat (KIP-848) and ShareGroupHeartbeat (KIP-932) of a client over its
    request quota carry throttle_time_ms (KIP-219: those clients back off by themselves)."""
    address = shared.listeners["PLAINTEXT"]
    assert alter_client_quota(address, {"client-id": "test"}, "request_percentage",
                              0.001) == ErrorCode.none
    requests = (
        (68, 1, {"group_id": "quota-848", "member_id": "m", "member_epoch": 0,
                 "instance_id": None, "rack_id": None,
                 "rebalance_timeout": datetime.timedelta(seconds=5),
                 "subscribed_topic_names": ["quiet"], "subscribed_topic_regex": None,
                 "server_assignor": None, "topic_partitions": []}),
        (76, 1, {"group_id": "quota-932", "member_id": "m", "member_epoch": 0,
                 "rack_id": None, "subscribed_topic_names": ["quiet"]}))
    for api_key, version, values in requests:
        deadline, throttled = time.monotonic() + 20, datetime.timedelta(0)
        while not throttled:  # a connection each: a throttled one is muted a while
            assert time.monotonic() < deadline, f"API {api_key} never throttled"
            with KafkaSocket(address) as sock:
                sock.send(frame(request(api_key, version, values)))
                answer = decode_response(api_key, version, sock.receive())[1]
            assert answer.error_code == ErrorCode.none
            throttled = answer.throttle_time


def ask(sock: KafkaSocket, api_key: int, version: int, values: dict):
    """One raw group request of the client id "sessions" (no quota), decoded."""
    from tests.wire import request
    from tests.wire import decode_response

    sock.send(frame(request(api_key, version, values, client_id="sessions")))
    return decode_response(api_key, version, sock.receive())[1]


def lone_member(sock: KafkaSocket, group: str, session_s: float) -> tuple[str, int]:
    """(member id, generation) of the only member of a new, Stable group."""
    joined = ask(sock, 11, 2, {
        "group_id": group, "session_timeout": datetime.timedelta(seconds=session_s),
        "rebalance_timeout": datetime.timedelta(seconds=5), "member_id": "",
        "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b"m"}]})
    assert joined.error_code == ErrorCode.none
    synced = ask(sock, 14, 2, {"group_id": group, "generation_id": joined.generation_id,
                               "member_id": joined.member_id, "assignments": [
                                   {"member_id": joined.member_id, "assignment": b"a"}]})
    assert synced.error_code == ErrorCode.none
    return joined.member_id, joined.generation_id


def test_a_member_that_commits_keeps_its_session_one_that_does_not_expires(shared):
    """Kafka's classic coordinator restarts a member's session timer on its OffsetCommit: a
    member that commits but never heartbeats stays past its session timeout."""
    session = 1.0
    with KafkaSocket(shared.listeners["PLAINTEXT"]) as sock:
        committer = lone_member(sock, "committing", session)
        lone_member(sock, "idle", session)
        until = time.monotonic() + 1.5 * session
        while time.monotonic() < until:
            answer = ask(sock, 8, 2, {
                "group_id": "committing", "generation_id_or_member_epoch": committer[1],
                "member_id": committer[0], "retention_time_ms": -1, "topics": [
                    {"name": "quiet", "partitions": [{"partition_index": 0,
                                                      "committed_offset": 1,
                                                      "committed_metadata": None}]}]})
            assert [p.error_code for t in answer.topics for p in t.partitions] == [ErrorCode.none]
            time.sleep(0.2 * session)  # a pace, not a wait for a condition
        heartbeat = ask(sock, 12, 2, {"group_id": "committing", "generation_id": committer[1],
                                      "member_id": committer[0]})
        assert heartbeat.error_code == ErrorCode.none  # still a member, past its session timeout

        def members(group: str) -> list:  # DescribeGroups restarts no session timer
            return ask(sock, 15, 0, {"groups": [group]}).groups[0].members

        wait_until(lambda: not members("idle"), timeout=5)  # expired: checked every 0.25 s
        assert [m.member_id for m in members("committing")] == [committer[0]]
