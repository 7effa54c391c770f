"""Front-end mode before a small upstream: this broker with a log of its own, in a process of
its own, as the cluster (cheap to start; the three-node Apache Kafka cluster is
test_front_end_cluster.py's).  Real confluent-kafka clients reach the upstream only through
the front-end: Metadata names the front-end's ports, records go through once each, acks=0
works, ApiVersions never promises what the upstream does not serve, and an upstream that goes
away closes clients' connections (reason upstream) until it is back, with no restart of the
front-end; the front-end reaches an upstream over TLS with SASL (PLAIN, SCRAM) as itself; with
an authorizer, the edge's ACLs decide each topic and group of a request."""

from __future__ import annotations

import pytest

from tests.harness import BrokerProcess, wait_until
from tests.helpers import consume_all, create_topics, free_port, node_port_base, produce
from tests.security.helpers import (ACL_JAAS, STANDARD, add_scram_user, binding, client,
                                   create_acls, sasl_broker)
from tests.wire import KafkaSocket, api_versions_request, decode_response, metadata_request

pytestmark = pytest.mark.system

UPSTREAM_NODE = 7


@pytest.fixture(scope="module")
def upstream():
    port = free_port()
    with BrokerProcess({"node.id": str(UPSTREAM_NODE), "num.partitions": "2",
                        "listeners": f"PLAINTEXT://127.0.0.1:{port}",
                        "group.initial.rebalance.delay.ms": "0"}, workers=1) as running:
        yield running


@pytest.fixture(scope="module")
def front_end(upstream):
    base = node_port_base([UPSTREAM_NODE])
    with BrokerProcess({"pybroker.upstream.bootstrap.servers": upstream.bootstrap,
                        "pybroker.frontend.node.port.base": str(base),
                        "pybroker.upstream.metadata.refresh.ms": "300"}, workers=2) as running:
        running.node_port = base + UPSTREAM_NODE
        yield running


def api_versions(address) -> dict[int, tuple[int, int]]:
    with KafkaSocket(address) as sock:
        sock.send(api_versions_request(3))
        _, answer = decode_response(18, 3, sock.receive())
    return {item.api_key: (item.min_version, item.max_version) for item in answer.api_keys}


def test_clients_see_the_front_end_ports_and_the_upstream_cluster(front_end, upstream):
    from confluent_kafka.admin import AdminClient

    direct = AdminClient({"bootstrap.servers": upstream.bootstrap}).list_topics(timeout=10)
    through = AdminClient({"bootstrap.servers": front_end.bootstrap}).list_topics(timeout=10)
    assert {node: (broker.host, broker.port) for node, broker in through.brokers.items()} == {
        UPSTREAM_NODE: ("127.0.0.1", front_end.node_port)}
    assert through.cluster_id == direct.cluster_id


def test_records_go_through_once_each(front_end):
    create_topics(front_end.bootstrap, "fe-once", partitions=2)
    values = [f"v{n}" for n in range(300)]
    produce(front_end.bootstrap, "fe-once", values, partitions=(0, 1),
            **{"enable.idempotence": True, "acks": "all"})
    produce(front_end.bootstrap, "fe-once", [f"z{n}" for n in range(20)], acks=0)
    read = consume_all(front_end.bootstrap, "fe-once", "read_committed", 320, "fe-group")
    assert sorted(read) == sorted(item.encode() for item in values + [f"z{n}" for n in range(20)])
    wait_until(lambda: front_end.metric("broker_upstream_requests_total") >= 20
               and front_end.metric("broker_upstream_connections") >= 1, timeout=5,
               message="the upstream metrics did not show the traffic")


def test_the_edges_view_and_event_log_see_the_clients_of_a_front_end(front_end):
    """/connections lists a client connected through the front-end, with its routed
    requests; the event log aggregates them, as for a broker with a log of its own."""
    import json
    import urllib.request

    from broker.shared.events import Requests

    host, port = front_end.metrics_address
    with KafkaSocket(("127.0.0.1", front_end.port)) as sock:
        for _ in range(3):
            sock.send(metadata_request(12))
            sock.receive()
        with urllib.request.urlopen(f"http://{host}:{port}/connections?top=50&by=requests",
                                    timeout=5) as response:
            rows = json.load(response)["rows"]
    assert any(row["client_id"] == "test" and row["requests"] >= 3 for row in rows), rows
    wait_until(lambda: sum(event.count for event in front_end.events(Requests)
                           if event.api == "Metadata") >= 3, timeout=5,
               message="the event log has no Metadata requests of the front-end")


def test_api_versions_promise_only_what_upstream_serves(front_end, upstream):
    theirs = api_versions(("127.0.0.1", upstream.port))
    ours = api_versions(("127.0.0.1", front_end.port))
    for key, (low, high) in ours.items():
        if key in (17, 18, 36):  # answered by the front-end itself
            continue
        assert key in theirs and theirs[key][0] <= low <= high <= theirs[key][1], key
    assert ours[1][1] == min(14, theirs[1][1])  # Fetch: a replica_id in the body, no leaders named


def test_an_upstream_gone_closes_clients_until_it_is_back(front_end, upstream):
    from confluent_kafka.admin import AdminClient

    create_topics(front_end.bootstrap, "fe-back")
    before = front_end.metric("broker_connections_closed_total", listener="PLAINTEXT",
                              reason="upstream")
    upstream.stop()
    try:
        with pytest.raises(Exception):
            AdminClient({"bootstrap.servers": front_end.bootstrap}).list_topics(timeout=3)
        wait_until(lambda: front_end.metric("broker_connections_closed_total",
                                            listener="PLAINTEXT", reason="upstream") > before
                   and front_end.metric("broker_upstream_request_failures_total") > 0,
                   timeout=10, message="no connection closed for the upstream")
    finally:
        upstream.start()
    produce(front_end.bootstrap, "fe-back", ["after"], **{"message.timeout.ms": 20000})
    assert consume_all(front_end.bootstrap, "fe-back", "read_uncommitted", 1, "fe-back") == [
        b"after"]


@pytest.fixture(scope="module")
def secure_upstream(pki):
    """This broker as an upstream that takes SASL over TLS (PLAIN) and SASL_PLAINTEXT (SCRAM)."""
    with BrokerProcess(sasl_broker(pki), workers=1) as running:
        add_scram_user(running.bootstrap, "frontend", "frontend-secret", "SCRAM-SHA-256")
        yield running


def secure_front_end(upstream, listener: str, **settings) -> BrokerProcess:
    host, port = upstream.listeners[listener]
    return BrokerProcess({"pybroker.upstream.bootstrap.servers": f"{host}:{port}",
                          "pybroker.frontend.node.port.base": str(node_port_base([0])),
                          "pybroker.upstream.security.protocol": listener, **settings},
                         workers=1)


def test_the_front_end_reaches_its_upstream_over_sasl_ssl(secure_upstream, pki):
    with secure_front_end(secure_upstream, "SASL_SSL", **{
            "pybroker.upstream.ssl.ca.location": pki["ca"],
            "pybroker.upstream.sasl.username": "admin",
            "pybroker.upstream.sasl.password": "admin-secret"}) as running:
        create_topics(running.bootstrap, "fe-sasl-ssl")
        produce(running.bootstrap, "fe-sasl-ssl", ["secure"])
        assert consume_all(running.bootstrap, "fe-sasl-ssl", "read_uncommitted", 1,
                           "fe-sasl") == [b"secure"]


@pytest.mark.long
def test_the_front_end_authenticates_with_scram_and_a_bad_password_reaches_nothing(
        secure_upstream):
    with secure_front_end(secure_upstream, "SASL_PLAINTEXT", **{
            "pybroker.upstream.sasl.mechanism": "SCRAM-SHA-256",
            "pybroker.upstream.sasl.username": "frontend",
            "pybroker.upstream.sasl.password": "frontend-secret"}) as running:
        create_topics(running.bootstrap, "fe-scram")
        produce(running.bootstrap, "fe-scram", ["scram"])
    with secure_front_end(secure_upstream, "SASL_PLAINTEXT", **{
            "pybroker.upstream.sasl.mechanism": "SCRAM-SHA-256",
            "pybroker.upstream.sasl.username": "frontend",
            "pybroker.upstream.sasl.password": "wrong"}) as refused:
        refused.wait_for_line(r"upstream cluster unreachable: .*SASL SCRAM-SHA-256 as frontend")
        with KafkaSocket(("127.0.0.1", refused.port)) as sock:
            sock.send(metadata_request(12))
            with pytest.raises((EOFError, OSError)):
                sock.receive()


@pytest.fixture(scope="module")
def guarded(upstream):
    """A front-end with an authorizer: SASL users at its edge, its ACLs on its control plane."""
    base = node_port_base([UPSTREAM_NODE])
    with BrokerProcess({
            "pybroker.upstream.bootstrap.servers": upstream.bootstrap,
            "pybroker.frontend.node.port.base": str(base),
            "listeners": "SASL_PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:0",
            "listener.security.protocol.map": "SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT",
            "control.plane.listener.name": "CONTROLLER",
            "inter.broker.listener.name": "SASL_PLAINTEXT",
            "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": ACL_JAAS,
            "authorizer.class.name": STANDARD,
            "super.users": "User:admin;User:ANONYMOUS"}, workers=2) as running:
        control = "127.0.0.1:%d" % running.listeners["CONTROLLER"][1]
        create_topics(client(running, "admin"), "edge-a", "edge-b", "edge-c")
        create_acls({"bootstrap.servers": control},
                    *(binding("TOPIC", "edge-a", "LITERAL", "User:alice", operation)
                      for operation in ("WRITE", "READ", "DESCRIBE")),
                    binding("TOPIC", "edge-b", "LITERAL", "User:alice", "DESCRIBE"),
                    binding("GROUP", "edge-g", "LITERAL", "User:alice", "READ"))
        yield running


def test_the_edges_acls_decide_entry_by_entry(guarded):
    from confluent_kafka import Consumer, KafkaError, Producer
    from confluent_kafka.admin import AdminClient

    alice = client(guarded, "alice", listener="SASL_PLAINTEXT")
    assert set(AdminClient(alice).list_topics(timeout=10).topics) == {"edge-a", "edge-b"}
    producer = Producer(dict(alice, **{"linger.ms": 50}))
    outcomes: dict[str, list] = {"edge-a": [], "edge-b": []}
    for topic in ("edge-a", "edge-b"):  # lingered together: one Produce names both topics
        producer.produce(topic, b"x", on_delivery=lambda error, message: outcomes[
            message.topic()].append(error.code() if error else None))
    producer.flush(20)
    assert outcomes == {"edge-a": [None], "edge-b": [KafkaError.TOPIC_AUTHORIZATION_FAILED]}
    consumer = Consumer(dict(alice, **{"group.id": "edge-g", "auto.offset.reset": "earliest"}))
    consumer.subscribe(["edge-a"])
    wait_until(lambda: (message := consumer.poll(0.5)) is not None and message.error() is None,
               timeout=20, message="alice read nothing of edge-a")
    consumer.close()
    bob = Consumer(dict(client(guarded, "bob", listener="SASL_PLAINTEXT"),
                        **{"group.id": "edge-g"}))
    bob.subscribe(["edge-a"])
    errors = []
    wait_until(lambda: (message := bob.poll(0.5)) is not None and message.error() is not None
               and errors.append(message.error().code()) is None, timeout=20,
               message="bob's group request was not refused")
    bob.close()
    assert KafkaError.GROUP_AUTHORIZATION_FAILED in errors or \
        KafkaError.TOPIC_AUTHORIZATION_FAILED in errors
    assert guarded.metric("broker_authorization_denied_total", api="Produce") >= 1


def test_a_killed_front_end_worker_costs_only_its_own_clients(front_end):
    """Two connections, dealt to the two workers; one worker killed: its client's connection
    drops, the other client's goes on reaching the upstream."""
    import os
    import signal

    sockets = [KafkaSocket(("127.0.0.1", front_end.port)) for _ in range(2)]
    mark = len(front_end.lines)
    try:
        for sock in sockets:  # each one's first request: both are served, by their workers
            sock.send(metadata_request(12))
            assert decode_response(3, 12, sock.receive())[1].brokers
        os.kill(front_end.worker_pids["data-0"], signal.SIGKILL)
        alive = []
        for sock in sockets:
            try:
                sock.send(metadata_request(12))
                alive.append(bool(decode_response(3, 12, sock.receive())[1].brokers))
            except (EOFError, OSError):
                alive.append(False)
        assert sorted(alive) == [False, True]
    finally:
        for sock in sockets:
            sock.close()
    front_end.wait_for_line(r"worker data-0 serving", timeout=20, start=mark)  # respawned
