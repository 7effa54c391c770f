"""KIP-291's control plane: its own listener, acceptor and worker process, usable in a storm."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from kio.schema.errors import ErrorCode

from broker.shared.config import ConfigError, load_config
from tests.batches import make_batch
from tests.harness import BrokerProcess, wait_until
from tests.admission.helpers import Probe, served_probes
from tests.wire import (KafkaSocket, alter_client_quota, alter_raw, api_versions_request,
                        create_topic, decode_response, describe_configs_request, frame,
                        metadata_request, peer_closed, produce_request)

MIB = 1 << 20
CONTROL = {
    "listeners": "CLIENT://127.0.0.1:0,CONTROLLER://127.0.0.1:0",
    "listener.security.protocol.map": "CLIENT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "control.plane.listener.name": "CONTROLLER",
}
CONTROL_APIS = {3, 17, 18, 19, 20, 29, 30, 31, 32, 33, 35, 36, 37, 44, 48, 49, 50, 51, 60, 65, 66}


# --- configuration ---------------------------------------------------------------------------

def config(**raw):
    return load_config({key.replace("_", "."): value for key, value in raw.items()})


def base(**raw):
    return dict({"listeners": "CLIENT://:9092,CONTROLLER://:9094",
                 "listener.security.protocol.map": "CLIENT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                 "control.plane.listener.name": "CONTROLLER"}, **raw)


@pytest.mark.parametrize("raw, message", [
    (base(**{"control.plane.listener.name": "ADMIN"}),
     "control.plane.listener.name: ADMIN has no security protocol in "
     "listener.security.protocol.map"),
    (base(**{"listener.security.protocol.map": "CLIENT:PLAINTEXT,CONTROLLER:PLAINTEXT,X:PLAINTEXT",
             "control.plane.listener.name": "X"}),
     "control.plane.listener.name: X is not a listener in listeners (CLIENT, CONTROLLER)"),
    (base(**{"advertised.listeners": "CLIENT://host:9092"}),
     "control.plane.listener.name: CONTROLLER is not in advertised.listeners"),
    (base(**{"inter.broker.listener.name": "CONTROLLER"}),
     "control.plane.listener.name: CONTROLLER must differ from inter.broker.listener.name"),
    (base(**{"listeners": "CONTROLLER://:9094"}),
     "control.plane.listener.name: CONTROLLER is the only listener; clients need a data-plane "
     "listener too"),
    ({"pybroker.control.plane.cpu": "0"},
     "pybroker.control.plane.cpu: set, but control.plane.listener.name is not"),
    (base(**{"pybroker.control.plane.cpu": "4000"}),
     "pybroker.control.plane.cpu: CPU 4000 is not available to this process"),
    (base(**{"pybroker.control.plane.queue.size": "0"}),
     "pybroker.control.plane.queue.size: invalid value '0'"),
])
def test_bad_control_plane_settings_stop_start_up_with_one_line(raw, message):
    with pytest.raises(ConfigError) as error:
        load_config(raw)
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


def test_control_plane_settings_and_defaults():
    unset = load_config({"listeners": "CLIENT://:9092,CONTROLLER://:9094",
                         "listener.security.protocol.map": "CLIENT:PLAINTEXT,CONTROLLER:PLAINTEXT"})
    assert unset.control_plane_listener is None
    assert unset.data_listener_indexes() == [0, 1]
    assert unset.may_alter(0) and unset.may_alter(1)
    configured = load_config(base(**{"listeners": "CONTROLLER://:9094,CLIENT://:9092"}))
    assert configured.control_plane_listener == "CONTROLLER"
    assert configured.inter_broker_listener == "CLIENT"  # the default skips the control plane
    assert configured.control_plane_index() == 0
    assert configured.data_listener_indexes() == [1]
    assert configured.may_alter(0) and not configured.may_alter(1)
    allowed = load_config(base(**{"pybroker.control.plane.alter.on.data.listeners": "true"}))
    assert allowed.may_alter(0) and allowed.may_alter(1)
    pooled = load_config(base(**{"queued.max.request.bytes": str(16 * MIB),
                                 "socket.request.max.bytes": str(MIB)}))
    assert pooled.pool_reserved == {"CONTROLLER": MIB}  # reserved by default
    small = load_config(base(**{"queued.max.request.bytes": str(2 * MIB),
                                "socket.request.max.bytes": str(MIB)}))
    assert small.pool_reserved == {"CONTROLLER": MIB // 2}
    explicit = load_config(base(**{"queued.max.request.bytes": str(16 * MIB),
                                   "socket.request.max.bytes": str(MIB),
                                   "pybroker.queued.max.request.bytes.reserved": "CONTROLLER:4096"}))
    assert explicit.pool_reserved == {"CONTROLLER": 4096}
    cpu = max(os.sched_getaffinity(0))
    pinned = load_config(base(**{"pybroker.control.plane.cpu": str(cpu)}))
    assert pinned.props.pybroker_control_plane_cpu == cpu


# --- helpers ---------------------------------------------------------------------------------

def request(address, api_key: int, version: int, request_frame: bytes):
    with KafkaSocket(address) as client:
        client.send(request_frame)
        return decode_response(api_key, version, client.receive())[1]


def encoded(request_object, client_id="test") -> bytes:
    request_object.with_header(correlation_id=1, client_id=client_id)
    return frame(bytes(request_object.encode(header=True)))


def create_topics_frame(name: str) -> bytes:
    from kafka.protocol.admin.topics import CreateTopicsRequest

    topic = CreateTopicsRequest.CreatableTopic
    return encoded(CreateTopicsRequest[5](topics=[topic(
        name=name, num_partitions=1, replication_factor=1, assignments=[], configs=[])],
        timeout_ms=5000, validate_only=False))


def delete_topics_frame(name: str) -> bytes:
    from kafka.protocol.admin.topics import DeleteTopicsRequest

    return encoded(DeleteTopicsRequest[4](topic_names=[name], timeout_ms=5000))


def describe_cluster_frame() -> bytes:
    from kafka.protocol.admin.cluster import DescribeClusterRequest

    return encoded(DescribeClusterRequest[1](include_cluster_authorized_operations=False,
                                             endpoint_type=1))


def api_keys(address) -> set[int]:
    response = request(address, 18, 3, api_versions_request(3))
    return {key.api_key for key in response.api_keys}


def worker_pid(broker: BrokerProcess, name: str) -> int:
    return broker.worker_pids[name]


# --- what each plane serves ------------------------------------------------------------------

@pytest.mark.system
def test_the_control_plane_serves_admin_apis_and_data_listeners_refuse_changes():
    with BrokerProcess(workers=1, overrides=CONTROL) as broker:
        control, client = broker.listeners["CONTROLLER"], broker.listeners["CLIENT"]
        assert api_keys(control) == CONTROL_APIS
        assert CONTROL_APIS < api_keys(client)
        # Each listener's Metadata and DescribeCluster name that listener's own endpoint.
        for address in (control, client):
            metadata = request(address, 3, 9, metadata_request(version=9))
            assert [(b.host, b.port) for b in metadata.brokers] == [address]
            cluster = request(address, 60, 1, describe_cluster_frame())
            assert cluster.error_code == ErrorCode.none
            assert [(b.host, b.port) for b in cluster.brokers] == [address]
        # Changes: refused on the data listener, served on the control plane.
        assert alter_raw(client, "0", "max.connections", "100") == \
            ErrorCode.cluster_authorization_failed
        assert alter_client_quota(client, {"client-id": "x"}, "producer_byte_rate", 1e6) == \
            ErrorCode.cluster_authorization_failed
        created = request(client, 19, 5, create_topics_frame("t1"))
        assert [t.error_code for t in created.topics] == [ErrorCode.cluster_authorization_failed]
        assert alter_raw(control, "0", "max.connections", "100") == ErrorCode.none
        assert alter_client_quota(control, {"client-id": "x"}, "producer_byte_rate", 1e6) == ErrorCode.none
        created = request(control, 19, 5, create_topics_frame("t1"))
        assert [t.error_code for t in created.topics] == [ErrorCode.none]
        deleted = request(client, 20, 4, delete_topics_frame("t1"))
        assert [r.error_code for r in deleted.responses] == [ErrorCode.cluster_authorization_failed]
        deleted = request(control, 20, 4, delete_topics_frame("t1"))
        assert [r.error_code for r in deleted.responses] == [ErrorCode.none]
        # Reading configuration stays open to data listeners.
        from confluent_kafka.admin import AdminClient, ConfigResource

        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{client[1]}"})
        resource = ConfigResource("broker", "0")
        entries = admin.describe_configs([resource])[resource].result(10)
        assert entries["max.connections"].value == "100"
        # Data APIs are not served on the control plane: the connection is closed.
        with KafkaSocket(control) as socket_:
            socket_.send(produce_request("t2", make_batch()))
            assert peer_closed(socket_.sock, 5)
        assert broker.metric("broker_invalid_requests_total", reason="unknown_api") == 1


@pytest.mark.system
def test_a_key_of_ours_serves_changes_on_data_listeners_too():
    overrides = dict(CONTROL, **{"pybroker.control.plane.alter.on.data.listeners": "true"})
    with BrokerProcess(workers=1, overrides=overrides) as broker:
        client = broker.listeners["CLIENT"]
        assert alter_raw(client, "0", "max.connections", "100") == ErrorCode.none
        created = request(client, 19, 5, create_topics_frame("t1"))
        assert [t.error_code for t in created.topics] == [ErrorCode.none]


@pytest.mark.system
def test_without_a_control_plane_every_listener_serves_changes():
    overrides = {key: value for key, value in CONTROL.items()
                 if key != "control.plane.listener.name"}
    with BrokerProcess(workers=1, overrides=overrides) as broker:
        for name in ("CLIENT", "CONTROLLER"):
            assert alter_raw(broker.listeners[name], "0", "max.connections", "100") == ErrorCode.none
        assert "control-plane" not in broker.worker_pids
        assert broker.metric("broker_worker_up", worker="control-plane") == 0


# --- isolation -------------------------------------------------------------------------------

@pytest.mark.system
def test_control_plane_connections_escape_data_limits_but_keep_their_own():
    overrides = dict(CONTROL, **{"max.connections": "2", "max.connections.per.ip": "2",
                                 "listener.name.controller.max.connections": "3"})
    with BrokerProcess(workers=2, overrides=overrides) as broker:
        client, control = broker.listeners["CLIENT"], broker.listeners["CONTROLLER"]
        held = served_probes(client, 2)
        assert Probe(client).outcome(0.5) == "pending"  # max.connections and per IP reached
        admins = served_probes(control, 3)  # not counted against either
        extra = Probe(control)
        assert extra.outcome(0.5) == "pending"  # its own listener limit
        assert broker.metric("broker_connections", listener="CONTROLLER") == 3
        assert broker.metric("broker_connections", listener="CLIENT") == 2
        admins.pop().close()
        assert extra.outcome(5) == "served"
        extra.close()
        wait_until(lambda: broker.metric("broker_connections", listener="CONTROLLER") == 2)
        # Lowering max.connections evicts data connections only.
        assert alter_raw(control, "0", "max.connections", "1") == ErrorCode.none
        wait_until(lambda: broker.metric("broker_connections", listener="CLIENT") == 1)
        assert sum(probe.is_closed(0.2) for probe in held) == 1
        assert not any(probe.is_closed(0.1) for probe in admins)
        for probe in held + admins:
            probe.close()


@pytest.mark.system
def test_the_control_plane_is_exempt_from_client_quotas():
    overrides = dict(CONTROL, **{"quota.window.num": "2", "pybroker.quota.burst.windows": "1"})
    with BrokerProcess(workers=1, overrides=overrides) as broker:
        # 0.01 % of a worker: a tenth of a millisecond of handling per second.
        assert alter_client_quota(broker.listeners["CONTROLLER"], {"client-id": "test"},
                                  "request_percentage", 0.01) == 0

        def hammer(address, count=400):
            with KafkaSocket(address) as client:
                for correlation in range(count):
                    client.send(metadata_request(version=9, correlation_id=correlation))
                    client.receive()

        hammer(broker.listeners["CONTROLLER"])
        assert broker.metric("broker_throttle_time_seconds_total",
                             quota="request_percentage") == 0
        # The same client on the data listener is throttled within a few requests.
        with KafkaSocket(broker.listeners["CLIENT"], timeout=30) as client:
            for correlation in range(200):
                client.send(metadata_request(version=9, correlation_id=correlation))
                client.receive()
                if broker.metric("broker_throttle_time_seconds_total",
                                 quota="request_percentage") > 0:
                    break
        assert broker.metric("broker_throttle_time_seconds_total",
                             quota="request_percentage") > 0


# --- the control-plane worker process --------------------------------------------------------

@pytest.mark.system
def test_killed_control_plane_worker_is_restarted_and_data_workers_never_notice():
    with BrokerProcess(workers=2, overrides=CONTROL) as broker:
        control, client = broker.listeners["CONTROLLER"], broker.listeners["CLIENT"]
        data_pids = {name: pid for name, pid in broker.worker_pids.items() if name != "control-plane"}
        old = worker_pid(broker, "control-plane")
        with KafkaSocket(client) as data_connection:
            data_connection.send(api_versions_request(3, correlation_id=1))
            data_connection.receive()
            os.kill(old, signal.SIGKILL)
            wait_until(lambda: broker.worker_pids["control-plane"] != old, timeout=10)
            wait_until(lambda: broker.metric("broker_worker_up", worker="control-plane") == 1)
            assert request(control, 3, 9, metadata_request(version=9)).brokers[0].port == control[1]
            data_connection.send(api_versions_request(3, correlation_id=2))
            assert decode_response(18, 3, data_connection.receive())[0] == 2
        assert {name: pid for name, pid in broker.worker_pids.items()
                if name != "control-plane"} == data_pids
        assert broker.metric("broker_worker_restarts_total") == 1
        assert all(broker.metric("broker_worker_up", worker=name) == 1 for name in data_pids)


@pytest.mark.system
def test_control_plane_worker_is_pinned_to_its_cpu_and_reports_its_metrics():
    cpu = max(os.sched_getaffinity(0))
    overrides = dict(CONTROL, **{"pybroker.control.plane.cpu": str(cpu)})
    with BrokerProcess(workers=1, overrides=overrides) as broker:
        assert os.sched_getaffinity(worker_pid(broker, "control-plane")) == {cpu}
        assert os.sched_getaffinity(worker_pid(broker, "data-0")) == os.sched_getaffinity(0)
        control = broker.listeners["CONTROLLER"]
        with KafkaSocket(control):
            request(control, 3, 9, metadata_request(version=9))
            wait_until(lambda: broker.metric("broker_network_worker_idle_ratio",
                                             worker="control-plane", plane="control") > 0.5)
            assert broker.metric("broker_connections", listener="CONTROLLER") >= 1
        assert broker.metric("broker_request_duration_seconds_count", api="Metadata",
                             listener="CONTROLLER") == 1
        assert broker.metric("broker_request_queue_capacity", plane="control") == 20
        assert broker.metric("broker_request_queue_capacity", plane="data") == 500
        assert "broker_request_queue_size{plane=\"control\"} 0.0" in broker.scrape()


# --- usable while the data plane drowns -----------------------------------------------------

SATURATED = dict(CONTROL, **{
    "queued.max.request.bytes": str(8 * MIB), "socket.request.max.bytes": str(2 * MIB),
    "message.max.bytes": str(2 * MIB), "max.connections": "12",
    "log.segment.bytes": str(16 * MIB), "log.retention.bytes": str(32 * MIB),
    "log.retention.check.interval.ms": "1000",
})


class LatencyProbe(threading.Thread):
    """Metadata (answered by the control-plane worker) and DescribeConfigs (answered by the
    parent) in turn on one control-plane connection every 20 ms; keeps every round trip."""

    def __init__(self, address):
        super().__init__(daemon=True)
        self.address = address
        self.times: list[float] = []
        self.failure: BaseException | None = None
        self._stop_event = threading.Event()
        self.started_at = time.monotonic()

    def run(self):
        self.started_at = time.monotonic()
        try:
            with KafkaSocket(self.address) as client:
                correlation = 0
                while not self._stop_event.wait(0.02):
                    correlation += 1
                    started = time.perf_counter()
                    client.send(metadata_request(version=9, correlation_id=correlation)
                                if correlation % 2 else
                                describe_configs_request(correlation_id=correlation))
                    client.receive()
                    self.times.append(time.perf_counter() - started)
        except BaseException as error:  # reported by the test thread
            self.failure = error

    def stop(self):
        self._stop_event.set()
        self.join(10)


def alter_quota_with_kafka_python(bootstrap: str, client_id: str, rate: float) -> int:
    from kafka import KafkaAdminClient
    from kafka.protocol.admin.client_quotas import AlterClientQuotasRequest

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    entry = AlterClientQuotasRequest.EntryData
    alter = AlterClientQuotasRequest(validate_only=False, entries=[entry(
        entity=[entry.EntityData(entity_type="client-id", entity_name=client_id)],
        ops=[entry.OpData(key="producer_byte_rate", value=rate, remove=False)])])

    async def send():
        return await admin._manager.send(alter)

    try:
        return admin._manager.run(send).entries[0].error_code
    finally:
        admin.close()


@pytest.mark.system
def test_admin_clients_on_the_control_plane_end_a_storm_the_data_plane_cannot_serve():
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    with BrokerProcess(workers=2, overrides=SATURATED) as broker:
        control, client = broker.listeners["CONTROLLER"], broker.listeners["CLIENT"]
        create_topic(f"127.0.0.1:{control[1]}", "flood")
        flood = subprocess.Popen(
            [sys.executable, "-m", "loadtest.flood", "--address", f"127.0.0.1:{client[1]}",
             "--topic", "flood", "--connections", "12", "--seconds", "12"],
            stdout=subprocess.PIPE, text=True)
        probe = LatencyProbe(control)
        try:
            # Saturated: every slot taken, the pool exhausted with requests queued for it.
            wait_until(lambda: broker.metric("broker_connections", listener="CLIENT") == 12)
            wait_until(lambda: broker.metric("broker_muted_channels", reason="memory") > 0)
            depleted = broker.metric("broker_request_memory_depleted_seconds_total")
            probe.start()
            waiting = Probe(client)
            assert waiting.outcome(0.5) == "pending"
            # confluent-kafka raises max.connections on the control plane ...
            admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{control[1]}"})
            resource = ConfigResource("broker", "0", incremental_configs=[
                ConfigEntry("max.connections", "13", incremental_operation=AlterConfigOpType.SET)])
            admin.incremental_alter_configs([resource])[resource].result(10)
            assert waiting.outcome(5) == "served"  # ... and the waiting client gets in.
            # kafka-python puts the flood's client id under a producer quota: it is throttled.
            assert alter_quota_with_kafka_python(f"127.0.0.1:{control[1]}", "flood", 1e6) == 0
            wait_until(lambda: broker.metric("broker_throttle_time_seconds_total",
                                             quota="producer_byte_rate") > 0)
            assert broker.metric("broker_muted_channels", reason="throttle") > 0
            # ... and it stayed saturated: requests waited for memory most of the time.
            assert broker.metric("broker_request_memory_depleted_seconds_total") - depleted > \
                0.5 * (time.monotonic() - probe.started_at)
            waiting.close()
        finally:
            probe.stop()
            flood.kill()
            flood.wait()
        assert probe.failure is None
        assert len(probe.times) >= 20
        assert max(probe.times) < 0.1, sorted(probe.times)[-5:]
