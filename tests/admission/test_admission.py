"""Connection admission, black-box: KIP-402 limits, KIP-612 rates, eviction, live changes."""

import os
import signal
import threading
import time

import pytest
from kio.schema.errors import ErrorCode

from tests.admission.helpers import Probe, served_probes
from tests.harness import BrokerProcess, wait_until
from tests.wire import KafkaSocket, alter_raw, decode_response, describe_configs_request, frame

pytestmark = pytest.mark.system  # every test here starts a broker

TWO_LISTENERS = {
    "listeners": "CLIENT://127.0.0.1:0,INTERNAL://127.0.0.1:0",
    "listener.security.protocol.map": "CLIENT:PLAINTEXT,INTERNAL:PLAINTEXT",
    "inter.broker.listener.name": "INTERNAL",
}


def active(broker, listener="PLAINTEXT"):
    return broker.metric("broker_connections", listener=listener)


def test_max_connections_stops_accepting_and_resumes_after_a_close():
    with BrokerProcess(workers=2, overrides={"max.connections": "3"}) as broker:
        address = broker.listeners["PLAINTEXT"]
        probes = served_probes(address, 3)
        waiting = Probe(address)
        assert waiting.outcome(0.5) == "pending"  # in the kernel backlog, not accepted
        assert active(broker) == 3
        probes[0].close()
        assert waiting.outcome(5) == "served"
        assert active(broker) == 3
        assert broker.metric("broker_acceptor_blocked_seconds_total", listener="PLAINTEXT") >= 0.4
        assert broker.metric("broker_connections_limit", scope="broker", listener="") == 3


def test_a_listener_at_its_limit_does_not_stall_the_others():
    overrides = dict(TWO_LISTENERS, **{"listener.name.client.max.connections": "2"})
    with BrokerProcess(workers=2, overrides=overrides) as broker:
        client, internal = broker.listeners["CLIENT"], broker.listeners["INTERNAL"]
        held = served_probes(client, 2)
        waiting = Probe(client)
        assert waiting.outcome(0.3) == "pending"
        others = served_probes(internal, 6)  # the other listener goes on
        assert active(broker, "INTERNAL") == 6 and active(broker, "CLIENT") == 2
        held[1].close()
        assert waiting.outcome(5) == "served"
        for probe in held + others:
            probe.close()


def test_per_ip_limits_with_exact_and_cidr_overrides():
    overrides = {"max.connections.per.ip": "2",
                 "max.connections.per.ip.overrides": "127.0.0.0/30:3,127.0.0.3:4"}
    with BrokerProcess(workers=2, overrides=overrides) as broker:
        address = broker.listeners["PLAINTEXT"]
        for source, limit in (("127.0.0.3", 4), ("127.0.0.2", 3), ("127.0.0.9", 2)):
            kept = served_probes(address, limit, source)
            refused = Probe(address, source)
            assert refused.outcome(5) == "refused", source  # answered, then closed
            kept[0].close()
            wait_until(lambda source=source: Probe(address, source).outcome(5) == "served")
        assert broker.metric("broker_connections_rejected_total", listener="PLAINTEXT",
                             reason="per_ip_limit") >= 3


def test_inter_broker_listener_evicts_the_least_recently_used_client():
    overrides = dict(TWO_LISTENERS, **{"max.connections": "3"})
    with BrokerProcess(workers=2, overrides=overrides) as broker:
        clients = served_probes(broker.listeners["CLIENT"], 3)
        time.sleep(0.05)  # distinct activity times: clients[1] becomes the least recent
        assert clients[0].request() and clients[2].request()
        internal = Probe(broker.listeners["INTERNAL"])
        assert internal.outcome(5) == "served"  # the protected listener is let in
        assert clients[1].is_closed(3)
        assert clients[0].request(3) and clients[2].request(3)
        wait_until(lambda: active(broker, "CLIENT") == 2)
        assert broker.metric("broker_connections_rejected_total", listener="CLIENT",
                             reason="evicted") == 1


def alter_broker_config(bootstrap, resource_name, **configs):
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return admin.alter_configs([ConfigResource(ConfigResourceType.BROKER, resource_name,
                                                   configs=configs)])
    finally:
        admin.close()


def describe_broker_config(bootstrap, keys):
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource("broker", "0")
    entries = admin.describe_configs([resource])[resource].result(10)
    return {key: (entries[key].value, entries[key].source) for key in keys}


def test_lowering_max_connections_evicts_at_once_and_persists(tmp_path):
    with BrokerProcess(workers=2, data_dir=str(tmp_path)) as broker:
        address = broker.listeners["PLAINTEXT"]
        probes = served_probes(address, 10)
        result = alter_broker_config(broker.bootstrap, "0", **{
            "max.connections": "4", "sasl.kerberos.min.time.before.relogin": "61000"})
        assert result == {"broker": {"0": "OK"}}
        # The admin client's own connection counted too (the most recent: it survived, then
        # the client closed it), so 3 of the 10 idle probes are left.
        wait_until(lambda: active(broker) == 3, timeout=3)
        survivors = [p for p in probes if not p.is_closed(0.2)]
        assert len(survivors) == 3
        assert broker.metric("broker_connections_rejected_total", listener="PLAINTEXT",
                             reason="evicted") == 7
        assert describe_broker_config(broker.bootstrap, ["max.connections"]) == \
            {"max.connections": ("4", 2)}  # DYNAMIC_BROKER_CONFIG
    with BrokerProcess(workers=2, data_dir=str(tmp_path)) as restarted:
        assert describe_broker_config(restarted.bootstrap, [
            "max.connections", "sasl.kerberos.min.time.before.relogin"]) == \
            {"max.connections": ("4", 2), "sasl.kerberos.min.time.before.relogin": ("61000", 2)}
        address = restarted.listeners["PLAINTEXT"]
        wait_until(lambda: active(restarted) == 0)
        kept = served_probes(address, 4)
        assert Probe(address).outcome(0.5) == "pending"
        for probe in kept:
            probe.close()


def test_incremental_alter_configs_validation_and_listener_keys():
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    with BrokerProcess(workers=1, overrides=TWO_LISTENERS) as broker:
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{broker.listeners['CLIENT'][1]}"})

        def alter(name, key, value, op=AlterConfigOpType.SET):
            resource = ConfigResource("broker", name, incremental_configs=[
                ConfigEntry(key, value, incremental_operation=op)])
            try:
                admin.incremental_alter_configs([resource])[resource].result(10)
                return "ok"
            except Exception as error:  # the client raises KafkaException carrying the code
                return error.args[0].name()

        # Kafka's answers: INVALID_REQUEST for a value its broker config validation refuses.
        assert alter("0", "listener.name.client.max.connections", "0") == "INVALID_REQUEST"
        assert alter("0", "max.connections", "-1") == "INVALID_REQUEST"
        assert alter("0", "log.dirs", "/elsewhere") == "INVALID_REQUEST"  # not dynamic
        internal = broker.listeners["INTERNAL"]
        assert alter_raw(internal, "", "max.connections", "50") == ErrorCode.none  # the cluster default
        assert alter_raw(internal, "7", "max.connections", "5") == 42  # not this broker
        assert alter("0", "max.connections.per.ip.overrides", "127.0.0.5:1",
                     AlterConfigOpType.APPEND) == "ok"
        assert alter("0", "max.connections.per.ip.overrides", "10.0.0.0/8:x") == "INVALID_REQUEST"
        assert alter("0", "listener.name.client.max.connections", "2") == "ok"
        held = served_probes(broker.listeners["CLIENT"], 1)  # + the admin's own connection
        assert Probe(broker.listeners["CLIENT"]).outcome(0.5) == "pending"
        described = describe_broker_config(f"127.0.0.1:{broker.listeners['INTERNAL'][1]}",
                                           ["max.connections", "listener.name.client.max.connections",
                                            "max.connections.per.ip.overrides"])
        assert described == {"max.connections": ("50", 3),  # DYNAMIC_DEFAULT_BROKER_CONFIG
                             "listener.name.client.max.connections": ("2", 2),
                             "max.connections.per.ip.overrides": ("127.0.0.5:1", 2)}
        held[0].close()
        # Kafka's other dynamic keys, and keys Kafka does not know (custom ones), are stored
        # without effect here: the log and DescribeConfigs' documentation say so and why.
        assert alter("0", "sasl.kerberos.min.time.before.relogin", "61000") == "ok"
        broker.wait_for_line(r"dynamic config broker: sasl.kerberos.min.time.before.relogin "
                             r"stored as Kafka stores it, but without effect here "
                             r"\(sasl.kerberos.min.time.before.relogin: Kerberos")
        assert alter("0", "num.io.threads", "9") == "ok"
        assert alter("0", "log.cleanup.policy", "compact", AlterConfigOpType.APPEND) == "ok"
        assert alter("0", "plugin.custom.setting", "x") == "ok"
        assert alter("0", "num.io.threads", "0") == "INVALID_REQUEST"  # Kafka's bound: >= 1
        assert alter("0", "message.max.bytes", "abc") == "INVALID_REQUEST"
        assert alter("0", "ssl.keystore.type", "PEM") == "INVALID_REQUEST"  # per listener only
        assert alter_raw(internal, "", "sasl.kerberos.min.time.before.relogin", "1") == 42
        with KafkaSocket(internal) as client:  # per broker only: not the cluster default
            client.send(describe_configs_request(
                ["sasl.kerberos.min.time.before.relogin", "num.io.threads", "log.cleanup.policy",
                 "plugin.custom.setting", "max.connections"], documentation=True))
            _, response = decode_response(32, 4, client.receive())
        shown = {c.name: (c.value, c.config_source, c.read_only, c.documentation)
                 for c in response.results[0].configs}
        assert shown["sasl.kerberos.min.time.before.relogin"][:3] == ("61000", 2, False)
        assert shown["num.io.threads"][:3] == ("9", 2, False)
        assert shown["log.cleanup.policy"][:2] == ("delete,compact", 2)
        assert shown["plugin.custom.setting"][:3] == (None, 2, True)  # never shown, as Kafka
        assert "without effect here: Kerberos" in shown["sasl.kerberos.min.time.before.relogin"][3]
        assert "without effect here" not in shown["max.connections"][3]  # applied at once


def alter_ip_quota(address, ip, rate, remove=False):
    from kafka.protocol.admin.client_quotas import AlterClientQuotasRequest

    entry = AlterClientQuotasRequest.EntryData
    request = AlterClientQuotasRequest[1](validate_only=False, entries=[entry(
        entity=[entry.EntityData(entity_type="ip", entity_name=ip)],
        ops=[entry.OpData(key="connection_creation_rate", value=float(rate), remove=remove)])])
    request.with_header(correlation_id=1, client_id="test")
    with KafkaSocket(address) as client:
        client.send(frame(bytes(request.encode(header=True))))
        _, response = decode_response(49, 1, client.receive())
    return [int(e.error_code) for e in response.entries]


def describe_ip_quotas(address):
    from kafka.protocol.admin.client_quotas import DescribeClientQuotasRequest

    component = DescribeClientQuotasRequest.ComponentData
    request = DescribeClientQuotasRequest[1](strict=False, components=[
        component(entity_type="ip", match_type=2, match=None)])
    request.with_header(correlation_id=1, client_id="test")
    with KafkaSocket(address) as client:
        client.send(frame(bytes(request.encode(header=True))))
        _, response = decode_response(48, 1, client.receive())
    return {e.entity[0].entity_name: e.values[0].value for e in response.entries}


def test_per_ip_rate_closes_late_and_does_not_charge_the_broker_rate(tmp_path):
    overrides = dict(TWO_LISTENERS, **{"quota.window.num": "2", "pybroker.quota.burst.windows": "1"})
    with BrokerProcess(workers=1, overrides=overrides, data_dir=str(tmp_path)) as broker:
        client, internal = broker.listeners["CLIENT"], broker.listeners["INTERNAL"]
        assert alter_ip_quota(internal, "127.0.0.7", 2) == [ErrorCode.none]
        assert alter_ip_quota(internal, "nonsense", 2) == [42]
        assert describe_ip_quotas(internal) == {"127.0.0.7": 2.0}
        rate_before = broker.metric("broker_connection_creation_rate", scope="broker", listener="")
        served = [Probe(client, "127.0.0.7") for _ in range(2)]
        assert [p.outcome(5) for p in served] == ["served", "served"]
        started = time.monotonic()
        throttled = Probe(client, "127.0.0.7")
        assert throttled.outcome(3) == "closed"  # never answered, closed after the delay
        assert 0.2 <= time.monotonic() - started < 1.5
        assert Probe(client, "127.0.0.8").outcome(5) == "served"  # other IPs are not throttled
        assert broker.metric("broker_connections_rejected_total", listener="CLIENT",
                             reason="per_ip_rate") == 1
        admitted = broker.metric("broker_connections_accepted_total", listener="CLIENT")
        assert admitted == 3  # the throttled socket was not counted as admitted
        assert broker.metric("broker_connection_creation_rate", scope="broker", listener="") \
            >= rate_before
    with BrokerProcess(workers=1, overrides=overrides, data_dir=str(tmp_path)) as restarted:
        assert describe_ip_quotas(restarted.listeners["INTERNAL"]) == {"127.0.0.7": 2.0}


def test_listener_creation_rate_holds_within_ten_percent_over_ten_seconds():
    overrides = {"listener.name.plaintext.max.connection.creation.rate": "20",
                 "pybroker.quota.burst.windows": "1"}
    with BrokerProcess(workers=2, overrides=overrides) as broker:
        address = broker.listeners["PLAINTEXT"]
        served_at, stop = [], threading.Event()

        def connect_loop():
            while not stop.is_set():
                try:
                    probe = Probe(address, timeout=5)
                    if probe.outcome(5) == "served":
                        served_at.append(time.monotonic())
                    probe.close()
                except OSError:
                    pass

        started = time.monotonic()
        threads = [threading.Thread(target=connect_loop) for _ in range(4)]
        for thread in threads:
            thread.start()
        time.sleep(10.0)  # the measured window itself
        stop.set()
        for thread in threads:
            thread.join(10)
        in_window = sum(1 for stamp in served_at if stamp - started <= 10.0)
        assert 180 <= in_window <= 220, in_window  # 20/s over 10 s, +-10 %
        assert broker.metric("broker_connection_accept_throttle_seconds_total",
                             listener="PLAINTEXT") > 1


def test_killed_worker_releases_every_slot_within_a_second():
    overrides = {"max.connections.per.ip": "6"}
    with BrokerProcess(workers=2, overrides=overrides) as broker:
        address = broker.listeners["PLAINTEXT"]
        probes = served_probes(address, 6)
        assert Probe(address).outcome(5) == "refused"  # the IP is full
        victim = broker.worker_pids["data-0"]
        os.kill(victim, signal.SIGKILL)
        broker.wait_for_line(rf"pid {victim}\) was killed by SIGKILL")
        alive = [p for p in probes if p.request()]
        assert len(alive) == 3  # round-robin put half of them on the dead worker
        wait_until(lambda: active(broker) == 3, timeout=1.5)
        wait_until(lambda: broker.metric("broker_worker_up", worker="data-0") == 1)
        refill = served_probes(address, 3)  # exactly the freed slots, no more
        assert Probe(address).outcome(5) == "refused"
        for probe in alive + refill:
            probe.close()


def test_a_storm_of_2000_connections_never_exceeds_max_connections():
    overrides = {"max.connections": "100", "socket.listen.backlog.size": "4096"}
    with BrokerProcess(workers=2, overrides=overrides) as broker:
        address = broker.listeners["PLAINTEXT"]
        peak, stop, served = [0], threading.Event(), [0]

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], active(broker))

        def storm(count):
            for _ in range(count):
                try:
                    probe = Probe(address, timeout=10)
                    if probe.outcome(10) == "served":
                        served[0] += 1
                    probe.close()
                except OSError:
                    pass

        sampler = threading.Thread(target=sample)
        sampler.start()
        workers = [threading.Thread(target=storm, args=(100,)) for _ in range(20)]
        held = served_probes(address, 100)  # the broker is full before the storm starts
        for worker in workers:
            worker.start()
        time.sleep(0.5)
        for probe in held:
            probe.close()
        for worker in workers:
            worker.join(120)
        stop.set()
        sampler.join(10)
        assert served[0] == 2000
        assert 0 < peak[0] <= 100
        wait_until(lambda: active(broker) == 0)


def test_sighup_rereads_the_connection_limits(tmp_path):
    config = tmp_path / "server.properties"
    config.write_text("max.connections=5\n")
    with BrokerProcess(workers=1, config_file=str(config)) as broker:
        address = broker.listeners["PLAINTEXT"]
        held = served_probes(address, 2)
        config.write_text("max.connections=2\n")
        mark = len(broker.lines)
        broker.proc.send_signal(signal.SIGHUP)
        broker.wait_for_line("SIGHUP: config re-read; changed: max_connections", start=mark)
        assert Probe(address).outcome(0.5) == "pending"
        config.write_text("max.connections=oops\n")
        broker.proc.send_signal(signal.SIGHUP)
        broker.wait_for_line("SIGHUP: config not reloaded: max.connections", start=mark)
        for probe in held:
            probe.close()
