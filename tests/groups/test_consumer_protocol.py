"""Consumer groups of the KIP-848 protocol with a real client: confluent-kafka's consumer with
`group.protocol=consumer` (librdkafka's ConsumerGroupHeartbeat v1).  Members join and leave
while records flow, each record is consumed once and no partition is ever held by two members
(watched through the clients' own assign and revoke callbacks); a regular expression picks up
a topic created later; a broker restart in the middle keeps the group's members and epochs."""

import threading
import time

import pytest

from tests.harness import BrokerProcess, wait_until
from tests.helpers import free_port, produce
from tests.wire import KafkaSocket, create_topic, decode_response, frame, request

pytestmark = pytest.mark.system  # every test here starts a broker

# Members heartbeat every 300 ms and are removed after 4 s of silence (Kafka's bounds allow
# neither: its minimums are 5 s and 45 s).
BROKER_OVERRIDES = {"group.consumer.heartbeat.interval.ms": "300",
                    "group.consumer.min.heartbeat.interval.ms": "100",
                    "group.consumer.session.timeout.ms": "4000",
                    "group.consumer.min.session.timeout.ms": "1000"}
PARTITIONS = 6


class Owners:
    """Which member holds each partition, as the members' callbacks say; a partition assigned
    while another member holds it is a violation."""

    def __init__(self):
        self.lock = threading.Lock()
        self.holder: dict[tuple[str, int], str] = {}
        self.violations: list[str] = []

    def assigned(self, member: str, partitions) -> None:
        with self.lock:
            for tp in partitions:
                key = (tp.topic, tp.partition)
                if self.holder.get(key, member) != member:
                    self.violations.append(f"{key} given to {member} while {self.holder[key]} "
                                           f"holds it")
                self.holder[key] = member

    def released(self, member: str, partitions) -> None:
        with self.lock:
            for tp in partitions:
                if self.holder.get((tp.topic, tp.partition)) == member:
                    del self.holder[(tp.topic, tp.partition)]

    def of(self, member: str) -> set:
        with self.lock:
            return {key for key, holder in self.holder.items() if holder == member}


class ModernMember(threading.Thread):
    """A group.protocol=consumer member: poll, record, commit each record synchronously (so
    a partition that moves resumes exactly after it), until told to stop (a clean close:
    it leaves the group)."""

    def __init__(self, name: str, bootstrap: str, subscription: list[str], group: str,
                 seen: list, owners: Owners):
        super().__init__(daemon=True, name=name)
        self.bootstrap, self.subscription, self.group = bootstrap, subscription, group
        self.seen, self.owners = seen, owners
        self.stop_event = threading.Event()
        self.failure: BaseException | None = None
        self.member_id = ""

    def run(self):
        from confluent_kafka import Consumer, KafkaException

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group,
                             "group.protocol": "consumer", "enable.auto.commit": False,
                             "auto.offset.reset": "earliest",
                             "topic.metadata.refresh.interval.ms": 500,
                             "reconnect.backoff.max.ms": 500})
        try:
            consumer.subscribe(self.subscription,
                               on_assign=lambda c, ps: self.owners.assigned(self.name, ps),
                               on_revoke=lambda c, ps: self.owners.released(self.name, ps),
                               on_lost=lambda c, ps: self.owners.released(self.name, ps))
            while not self.stop_event.is_set():
                message = consumer.poll(0.1)
                self.member_id = consumer.memberid() or self.member_id
                if message is None or message.error() is not None:
                    continue
                self.seen.append((message.value().decode(), self.name))
                try:
                    consumer.commit(message=message, asynchronous=False)
                except KafkaException as error:  # e.g. the broker restarting: it retries
                    if not error.args[0].retriable():
                        raise
        except BaseException as error:  # reported by the test
            self.failure = error
        finally:
            consumer.close()

    def finish(self):
        self.stop_event.set()
        self.join(30)
        assert not self.is_alive() and self.failure is None, self.failure


def describe(address, group: str):
    """ConsumerGroupDescribe v0 on the wire: the group's entry."""
    with KafkaSocket(address) as sock:
        sock.send(frame(request(69, 0, {"group_ids": [group],
                                        "include_authorized_operations": False})))
        return decode_response(69, 0, sock.receive())[1].groups[0]


def values(seen: list) -> list[str]:
    return sorted(value for value, _ in seen)


def test_members_join_and_leave_while_records_flow(broker):
    topic, group = "kip848-flow", "kip848-flow-group"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    spread = {"partitions": range(PARTITIONS), "linger_ms": 5}
    owners, seen = Owners(), []
    first = ModernMember("m1", broker.bootstrap, [topic], group, seen, owners)
    first.start()
    produce(broker.bootstrap, topic, [f"a{n}" for n in range(300)], **spread)
    wait_until(lambda: len(seen) >= 50, timeout=30, message="the first member reads nothing")
    others = [ModernMember(name, broker.bootstrap, [topic], group, seen, owners)
              for name in ("m2", "m3")]
    for member in others:
        member.start()
    produce(broker.bootstrap, topic, [f"b{n}" for n in range(300)], **spread)
    wait_until(lambda: sorted(len(owners.of(m)) for m in ("m1", "m2", "m3")) == [2, 2, 2],
               timeout=30, message=f"assignments {owners.holder}")
    first.finish()  # leaves: the other two take its partitions over
    produce(broker.bootstrap, topic, [f"c{n}" for n in range(150)], **spread)
    wait_until(lambda: sorted(len(owners.of(m)) for m in ("m2", "m3")) == [3, 3], timeout=30,
               message=f"assignments {owners.holder}")
    expected = sorted([f"a{n}" for n in range(300)] + [f"b{n}" for n in range(300)] +
                      [f"c{n}" for n in range(150)])
    wait_until(lambda: len(seen) >= len(expected), timeout=30,
               message=f"{len(seen)} of {len(expected)} consumed")
    time.sleep(0.3)  # room for a duplicate to show up
    for member in others:
        member.finish()
    assert owners.violations == []
    assert values(seen) == expected, "a record consumed twice or not at all"
    assert broker.metric("broker_requests_total", api="ConsumerGroupHeartbeat",
                         listener="PLAINTEXT") > 0
    described = describe(broker.listeners["PLAINTEXT"], group)
    assert (described.group_state, described.members) == ("Empty", ())


def test_a_regular_expression_picks_up_a_topic_created_later(broker):
    create_topic(broker.bootstrap, "kip848-re-1", 2)
    owners, seen = Owners(), []
    member = ModernMember("re", broker.bootstrap, ["^kip848-re-.*"], "kip848-re-group", seen,
                          owners)
    member.start()
    produce(broker.bootstrap, "kip848-re-1", ["one"])
    wait_until(lambda: values(seen) == ["one"], timeout=30)
    create_topic(broker.bootstrap, "kip848-re-2", 2)
    produce(broker.bootstrap, "kip848-re-2", ["two"])
    wait_until(lambda: values(seen) == ["one", "two"], timeout=30,
               message=f"seen {seen}, holding {owners.holder}")
    member.finish()
    assert owners.violations == []


def test_a_broker_restart_keeps_the_group(tmp_path):
    """The group's members, epochs and assignment survive a killed broker: the members go on
    with their epochs (no rebalance), and nothing acknowledged is lost."""
    port = free_port()
    # Sessions long enough for the members to come back: the broker is down meanwhile.
    overrides = dict(BROKER_OVERRIDES, listeners=f"PLAINTEXT://127.0.0.1:{port}",
                     **{"group.consumer.session.timeout.ms": "20000"})
    broker = BrokerProcess(workers=2, overrides=overrides, data_dir=str(tmp_path)).start()
    try:
        topic, group = "kip848-restart", "kip848-restart-group"
        create_topic(broker.bootstrap, topic, 4)
        owners, seen = Owners(), []
        members = [ModernMember(name, broker.bootstrap, [topic], group, seen, owners)
                   for name in ("r1", "r2")]
        for member in members:
            member.start()
        wait_until(lambda: sorted(len(owners.of(m.name)) for m in members) == [2, 2],
                   timeout=30, message=f"assignments {owners.holder}")
        produce(broker.bootstrap, topic, [f"x{n}" for n in range(100)], partitions=range(4))
        wait_until(lambda: len(seen) >= 100, timeout=30)
        address = broker.listeners["PLAINTEXT"]
        before = describe(address, group)
        assert before.group_state == "Stable"
        broker.kill()  # no clean shutdown: what the group is must already be on disk
        broker.start()
        after = describe(address, group)
        assert (after.group_epoch, sorted((m.member_id, m.member_epoch) for m in after.members)) \
            == (before.group_epoch, sorted((m.member_id, m.member_epoch) for m in before.members))
        produce(broker.bootstrap, topic, [f"y{n}" for n in range(100)], partitions=range(4))
        wait_until(lambda: {f"y{n}" for n in range(100)} <= {value for value, _ in seen},
                   timeout=30, message=f"{len(seen)} consumed")
        for member in members:
            member.finish()
        assert owners.violations == []
        assert set(values(seen)) == {f"x{n}" for n in range(100)} | {f"y{n}" for n in range(100)}
        assert describe(address, group).group_epoch == before.group_epoch + 2  # two leaves
    finally:
        broker.stop()
