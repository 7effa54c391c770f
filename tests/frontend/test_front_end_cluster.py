"""Two front-ends before a three-node KRaft Apache Kafka 4.4 cluster (replication 3,
min.insync.replicas 2), all on 127.0.0.1: confluent-kafka, kafka-python and Kafka's Java
clients produce, consume in groups (classic, KIP-848, KIP-932 share groups) and run
transactions through them; a client quota holds
across one front-end's workers; a connection storm leaves the cluster's connection count flat;
one Kafka node killed with SIGKILL mid-produce loses no acknowledged record."""

from __future__ import annotations

import threading
import time

import pytest
from kio.schema.errors import ErrorCode

from loadtest.apache_kafka import KafkaCluster
from tests.harness import BrokerProcess, wait_until
from tests.helpers import free_port, node_port_base
from tests.wire import (KafkaSocket, alter_client_quota, api_versions_request, decode_response,
                        metadata_request)

pytestmark = [pytest.mark.system, pytest.mark.long]  # three JVMs: `make compat`

CLUSTER = {"broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "500",
           "group.initial.rebalance.delay.ms": "0"}
LINKS_PER_NODE = 4  # front-end A's pybroker.upstream.max.connections.per.node
MB = 1_000_000


@pytest.fixture(scope="module")
def cluster():
    with KafkaCluster(3, overrides=CLUSTER) as running:
        yield running


def front_end(cluster, **overrides) -> BrokerProcess:
    settings = {"pybroker.upstream.bootstrap.servers": cluster.bootstrap,
                "pybroker.frontend.node.port.base": str(node_port_base((1, 2, 3)))}
    settings.update(overrides)
    return BrokerProcess(settings, workers=2)


@pytest.fixture(scope="module")
def front_a(cluster):
    """Two workers, a control-plane listener (the front-end's own admin: quotas), a small
    upstream pool and a per-IP connection limit."""
    control = free_port()
    with front_end(cluster, **{
            "listeners": f"PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:{control}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "control.plane.listener.name": "CONTROLLER", "quota.window.num": "2",
            "pybroker.upstream.max.connections.per.node": str(LINKS_PER_NODE),
            "max.connections.per.ip": "60"}) as running:
        yield running


@pytest.fixture(scope="module")
def front_b(cluster):
    with front_end(cluster) as running:
        yield running


def ports_of(bootstrap: str) -> set[int]:
    return {int(item.rpartition(":")[2]) for item in bootstrap.split(",")}


def established_to(ports: set[int]) -> int:
    """TCP connections established to these local ports (the server's side of each)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if fields[3] == "01" and int(fields[1].rpartition(":")[2], 16) in ports:
                    count += 1
    return count


def test_both_front_ends_name_their_own_ports_for_one_cluster(cluster, front_a, front_b):
    from confluent_kafka.admin import AdminClient

    direct = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(timeout=20)
    seen = {}
    for running in (front_a, front_b):
        through = AdminClient({"bootstrap.servers": running.bootstrap}).list_topics(timeout=20)
        assert through.cluster_id == direct.cluster_id
        assert set(through.brokers) == set(direct.brokers) == {1, 2, 3}
        seen[running.bootstrap] = {(b.host, b.port) for b in through.brokers.values()}
        assert not seen[running.bootstrap] & {(b.host, b.port) for b in direct.brokers.values()}
    assert not set.intersection(*seen.values())  # each front-end its own ports


def test_records_groups_and_transactions_through_two_front_ends(front_a, front_b):
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    from kafka import KafkaProducer

    admin = AdminClient({"bootstrap.servers": front_a.bootstrap})
    admin.create_topics([NewTopic("fe-all", 6, 3)])["fe-all"].result(30)
    producer = Producer({"bootstrap.servers": front_a.bootstrap, "enable.idempotence": True,
                         "acks": "all", "linger.ms": 5})
    for n in range(2000):
        producer.produce("fe-all", f"c{n}".encode())
        producer.poll(0)
    assert producer.flush(60) == 0
    python_producer = KafkaProducer(bootstrap_servers=front_b.bootstrap, acks="all")
    for n in range(200):
        python_producer.send("fe-all", f"p{n}".encode())
    python_producer.flush(60)
    python_producer.close(10)
    transactional = Producer({"bootstrap.servers": front_a.bootstrap,
                              "transactional.id": "fe-tx"})
    transactional.init_transactions(60)
    for outcome in ("commit", "abort"):
        transactional.begin_transaction()
        for n in range(50):
            transactional.produce("fe-all", f"{outcome}{n}".encode())
        getattr(transactional, f"{outcome}_transaction")(60)
    consumers = [Consumer({"bootstrap.servers": front_b.bootstrap, "group.id": "fe-readers",
                           "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
                 for _ in range(2)]
    for consumer in consumers:
        consumer.subscribe(["fe-all"])
    read: list[bytes] = []
    by_member = [0, 0]

    def read_all() -> bool:
        for index, consumer in enumerate(consumers):
            batch = [m.value() for m in consumer.consume(500, 0.2) if m.error() is None]
            read.extend(batch)
            by_member[index] += len(batch)
        return len(read) >= 2250

    wait_until(read_all, timeout=120, message="the records did not all come back")
    for consumer in consumers:
        consumer.close()
    expected = ([f"c{n}" for n in range(2000)] + [f"p{n}" for n in range(200)]
                + [f"commit{n}" for n in range(50)])
    assert sorted(read) == sorted(item.encode() for item in expected)
    assert all(by_member), by_member  # both members of the group were given partitions


def test_kafkas_java_clients_through_the_front_end(front_a):
    from tests.compat.helpers import facts, run_scenarios

    answers = run_scenarios(front_a.bootstrap, ["producer_idempotent", "transactions",
                                                "consumer_group", "consumer_protocol",
                                                "share_group"])
    assert facts(answers, "producer_idempotent")["one_producer_id"] is True
    assert facts(answers, "transactions")["read_committed_values"] == [
        f"IN-{n}" for n in range(5)]
    assert facts(answers, "consumer_group")["committed"] == [10, 10]
    found = facts(answers, "consumer_protocol")
    assert found["disjoint"] and found["split"] and found["consumed"] == 20
    shared = facts(answers, "share_group")  # KIP-932: two share consumers, Kafka's own state
    assert shared["consumed"] == shared["distinct"] == 10 and shared["described"][1] == 2


def test_a_client_quota_is_held_across_front_end_workers(front_a):
    """1 MB/s for one client id, set on the front-end's control plane; three producers of that
    client id, dealt over both workers, get that much together, not each."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    control = front_a.listeners["CONTROLLER"]
    assert alter_client_quota(control, {"client-id": "fe-q"}, "producer_byte_rate",
                              MB) == ErrorCode.none
    admin = AdminClient({"bootstrap.servers": front_a.bootstrap})  # held: futures need it
    admin.create_topics([NewTopic("fe-q", 3, 3)])["fe-q"].result(30)
    delivered = [0]
    lock = threading.Lock()
    stop = threading.Event()

    def on_delivery(error, message):
        if error is None:
            with lock:
                delivered[0] += len(message.value())

    def feed():
        producers = [Producer({"bootstrap.servers": front_a.bootstrap, "client.id": "fe-q",
                               "acks": 1, "linger.ms": 5, "batch.size": 100000,
                               "queue.buffering.max.kbytes": 4096,
                               "message.timeout.ms": 120000}) for _ in range(3)]
        while not stop.is_set():
            for producer in producers:
                for _ in range(50):
                    try:
                        producer.produce("fe-q", b"x" * 10240, on_delivery=on_delivery)
                    except BufferError:
                        break
                producer.poll(0)
            time.sleep(0.005)
        for producer in producers:
            producer.purge()
            producer.flush(10)

    thread = threading.Thread(target=feed)
    thread.start()
    try:
        time.sleep(3.0)  # past the burst
        with lock:
            start, started = delivered[0], time.monotonic()
        time.sleep(10.0)
        with lock:
            rate = (delivered[0] - start) / (time.monotonic() - started)
    finally:
        stop.set()
        thread.join(60)
    assert 0.85 * MB <= rate <= 1.15 * MB, rate
    assert front_a.metric("broker_throttle_time_seconds_total", quota="producer_byte_rate") > 1


def test_a_connection_storm_leaves_the_clusters_connections_flat(cluster, front_a):
    """600 connections (ApiVersions, then Metadata) against front-end A, each storming thread
    holding its last 20 open, while a producer already connected keeps sending: the per-IP
    limit refuses part of the storm, the cluster sees at most the pool's connections more,
    and the producer's p99 holds."""
    from confluent_kafka import Producer

    cluster_ports = ports_of(cluster.bootstrap)
    producer = Producer({"bootstrap.servers": front_a.bootstrap, "acks": "all",
                         "linger.ms": 0})
    quiet: list[float] = []
    during: list[float] = []
    phase = ["warm-up"]  # the first seconds (connections, metadata) are no one's p99
    stop = threading.Event()

    def steady():
        while not stop.is_set():
            sent = time.monotonic()
            producer.produce("fe-all", b"steady", on_delivery=lambda e, m, s=sent, p=phase[0]: (
                {"quiet": quiet, "storm": during}.get(p, []).append(time.monotonic() - s)))
            producer.poll(0.01)

    refused, answered = [0], [0]

    def storm(count: int):
        held: list[KafkaSocket] = []
        for _ in range(count):
            try:
                sock = KafkaSocket(front_a.listeners["PLAINTEXT"], timeout=5)
                held.append(sock)
                sock.send(api_versions_request(3))
                if decode_response(18, 3, sock.receive())[1].error_code != ErrorCode.none:
                    raise EOFError("refused")
                sock.send(metadata_request(12, topics=["fe-all"]))
                sock.receive()
                answered[0] += 1
            except Exception:  # noqa: BLE001 - refused: closed, or answered POLICY_VIOLATION
                refused[0] += 1
            while len(held) > 20:
                held.pop(0).close()
        for sock in held:
            sock.close()

    steady_thread = threading.Thread(target=steady)
    steady_thread.start()
    try:
        time.sleep(2.0)
        phase[0] = "quiet"
        time.sleep(3.0)
        before = established_to(cluster_ports)
        phase[0] = "storm"
        storms = [threading.Thread(target=storm, args=(100,)) for _ in range(6)]
        for thread in storms:
            thread.start()
        peak = before
        while any(thread.is_alive() for thread in storms):
            peak = max(peak, established_to(cluster_ports))
            time.sleep(0.05)
        time.sleep(1.0)
        phase[0] = "after"
    finally:
        stop.set()
        steady_thread.join(30)
        producer.flush(30)
    assert refused[0] > 0 and answered[0] > 0, (refused, answered)
    assert peak - before <= 2 * 3 * LINKS_PER_NODE, (before, peak)
    assert len(quiet) > 50 and len(during) > 20
    calm, busy = (sorted(items)[int(len(items) * 0.99)] for items in (quiet, during))
    assert busy <= max(3 * calm, calm + 0.2), (calm, busy)


def test_a_node_killed_mid_produce_loses_no_acknowledged_record(cluster, front_a, front_b):
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": front_a.bootstrap})  # held: futures need it
    admin.create_topics([NewTopic("fe-kill", 3, 3)])["fe-kill"].result(30)
    producer = Producer({"bootstrap.servers": front_a.bootstrap, "enable.idempotence": True,
                         "acks": "all", "linger.ms": 5, "message.timeout.ms": 90000})
    acknowledged: list[str] = []
    failed: list = []

    def delivered(error, message):
        (failed if error else acknowledged).append(error or message.value().decode())

    for n in range(1500):
        producer.produce("fe-kill", f"k{n}".encode(), on_delivery=delivered)
        producer.poll(0.002)
        if n == 500:
            cluster.kill(2)
    assert producer.flush(120) == 0
    cluster.restart(2)
    assert failed == [] and len(acknowledged) == 1500
    consumer = Consumer({"bootstrap.servers": front_b.bootstrap, "group.id": "fe-kill",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe(["fe-kill"])
    seen: list[str] = []

    def read_all() -> bool:
        seen.extend(m.value().decode() for m in consumer.consume(500, 0.5) if m.error() is None)
        return len(seen) >= 1500

    wait_until(read_all, timeout=120, message="the records did not all come back")
    consumer.close()
    assert sorted(seen) == sorted(acknowledged)
    assert front_a.metric("broker_connections_closed_total", listener="PLAINTEXT",
                          reason="upstream") >= 1
