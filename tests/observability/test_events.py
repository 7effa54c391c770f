"""The event log: the writer's rotation and cap, and what a real broker records, end to end
through the PySpark pipeline."""

import datetime
import glob
import os
import socket
import time

import pytest
from kio.schema.errors import ErrorCode

from broker.shared import events as ev
from broker.shared.apis import BY_NAME
from broker.shared.config import ConfigError, load_config
from broker.shared.events import EventLog, decode_line
from tests.batches import make_batch
from tests.harness import BrokerProcess, wait_until
from tests.wire import (KafkaSocket, alter_client_quota, create_topic, decode_response, frame,
                        produce_request, request)

CONSUMER_GROUP_HEARTBEAT = BY_NAME["ConsumerGroupHeartbeat"].key


def read_events(directory) -> list:
    found = []
    for path in sorted(glob.glob(os.path.join(directory, "*.jsonl"))):
        with open(path, "rb") as handle:
            found += [decode_line(line) for line in handle if line.strip()]
    return found


# --- the writer ------------------------------------------------------------------------------

def test_files_rotate_and_the_directory_stays_under_its_cap(tmp_path):
    writer = EventLog(str(tmp_path), "data-0", 3, file_bytes=4096, total_bytes=16384)
    other = EventLog(str(tmp_path), "data-1", 3, file_bytes=1 << 20, total_bytes=1 << 30)
    other.emit(ev.Throttle(client_id="early", quota="producer_byte_rate", throttle_ms=1))
    other.flush()  # its file is the oldest, and still open: it must survive the cap
    for number in range(2000):
        writer.emit(ev.ConnectionAccepted(listener="CLIENT", ip="10.0.0.1", port=number,
                                          conn_id=number))
        if number % 50 == 0:
            writer.flush()
    writer.close()
    files = glob.glob(str(tmp_path / "*.jsonl"))
    sizes = [os.path.getsize(path) for path in files]
    assert sum(sizes) <= 16384 + 4096 + 8192  # the cap, plus the file being written
    assert len(files) >= 3
    kept = read_events(tmp_path)
    assert any(event.proc == "data-1" for event in kept)
    ports = sorted(event.port for event in kept if isinstance(event, ev.ConnectionAccepted))
    assert ports[-1] == 1999 and ports == list(range(ports[0], 2000))  # oldest went first
    assert all(event.node == 3 and event.v == ev.SCHEMA_VERSION and event.ts > 0
               for event in kept)
    other.close()


def test_event_log_settings():
    raw = {"log.dirs": "/data/kafka/logs"}
    assert load_config(raw).event_log_dir == "/data/kafka/pybroker-events"
    assert load_config(dict(raw, **{"pybroker.event.log.dir": "/x"})).event_log_dir == "/x"
    assert load_config(dict(raw, **{"pybroker.event.log.enable": "false"})).event_log_dir is None
    with pytest.raises(ConfigError, match="^pybroker.event.log.total.bytes: 8192 is less than"):
        load_config(dict(raw, **{"pybroker.event.log.total.bytes": "8192",
                                 "pybroker.event.log.file.bytes": "16384"}))


# --- a real broker ---------------------------------------------------------------------------

@pytest.mark.system
def test_a_broker_run_becomes_a_report_naming_the_storm_and_the_throttled_client(
        spark, tmp_path):
    overrides = {"max.connections.per.ip": "5", "quota.window.num": "2",
                 "pybroker.quota.burst.windows": "1"}
    with BrokerProcess(workers=2, overrides=overrides, data_dir=str(tmp_path)) as broker:
        address = broker.listeners["PLAINTEXT"]
        create_topic(broker.bootstrap, "events")
        assert alter_client_quota(address, {"client-id": "greedy"}, "producer_byte_rate",
                                  20000) == 0
        _join_and_leave(address, "watchers", "events")
        with KafkaSocket(address) as producer:  # client id "test" is not limited
            producer.send(produce_request("events", make_batch(3)))
            producer.receive()
        # A storm from one address: 5 get in, 25 are refused for max.connections.per.ip.
        wait_until(lambda: broker.metric("broker_connections", listener="PLAINTEXT") == 0)
        storm_started = time.time()
        held = [socket.create_connection(address) for _ in range(30)]
        wait_until(lambda: broker.metric("broker_connections_rejected_total",
                                         listener="PLAINTEXT", reason="per_ip_limit") == 25)
        storm_ended = time.time()
        for sock in held:
            sock.close()
        wait_until(lambda: broker.metric("broker_connections", listener="PLAINTEXT") == 0)
        # A producer far over its byte rate: its answers carry throttle times.
        sent = received = 0
        with KafkaSocket(address, timeout=30) as greedy:
            for correlation in range(3):
                request = _produce_as("greedy", "events", correlation)
                greedy.send(request)
                sent += len(request)
                received += 4 + len(greedy.receive())
        wait_until(lambda: broker.metric("broker_throttle_time_seconds_total",
                                         quota="producer_byte_rate") > 0)
    events_dir = str(tmp_path / "pybroker-events")
    recorded = read_events(events_dir)
    kinds = {type(event).__name__ for event in recorded}
    assert {"WorkerStarted", "WorkerExited", "ConnectionAccepted", "ConnectionRejected",
            "ConnectionClosed", "Throttle", "ConfigChanged", "Requests",
            "BrokerStats"} <= kinds
    assert [(e.group, e.group_type, e.epoch, e.members, e.reason) for e in recorded
            if isinstance(e, ev.GroupRebalance)] == [
        ("watchers", "consumer", 1, 1, "member joined"),
        ("watchers", "consumer", 2, 0, "left the group")]
    closed = [e for e in recorded if isinstance(e, ev.ConnectionClosed) and e.client_id == "greedy"]
    assert [(e.bytes_in, e.bytes_out) for e in closed] == [(sent, received)]
    aggregated = [e for e in recorded if isinstance(e, ev.Requests) and e.client_id == "greedy"]
    assert sum(e.count for e in aggregated) == 3 and {e.api for e in aggregated} == {"Produce"}
    assert (sum(e.bytes_in for e in aggregated), sum(e.bytes_out for e in aggregated)) == \
        (sent, received)
    change = next(e for e in recorded if isinstance(e, ev.ConfigChanged))
    assert change.kind == "quota" and change.listener == "PLAINTEXT" and change.peer
    assert {e.proc for e in recorded} == {"parent", "data-0", "data-1"}

    from pipeline.job import run

    summary = run([events_dir], str(tmp_path / "report"), spark=spark)
    timeline = spark.read.parquet(str(tmp_path / "report" / "timeline")).collect()
    refused = {row["second"]: row["rejected_per_ip_limit"] for row in timeline
               if row["rejected_per_ip_limit"]}
    assert sum(refused.values()) == 25
    assert all(int(storm_started) <= second <= int(storm_ended) for second in refused)
    assert any(row["throttled_clients"] for row in timeline)
    top = spark.read.parquet(str(tmp_path / "report" / "top_n")).collect()
    assert [row["key"] for row in top if row["metric"] == "throttle_ms" and row["rank"] == 1] \
        == ["greedy"]
    groups = spark.read.parquet(str(tmp_path / "report" / "groups")).collect()
    assert [(row["group"], row["group_type"], row["rebalances"], row["reason_kinds"])
            for row in groups] == [("watchers", "consumer", 2, 2)]
    assert summary["bad_lines"] == 0 and summary["unknown_version"] == 0
    with open(summary["report"], encoding="utf-8") as handle:
        page = handle.read()
    assert page.count("src='data:image/png;base64,") == 4 and "greedy" in page


def _join_and_leave(address, group: str, topic: str) -> None:
    """A member of the consumer group protocol joins `group` and leaves it: two group epochs."""
    heartbeat = {"group_id": group, "member_id": "member-1", "member_epoch": 0,
                 "instance_id": None, "rack_id": None,
                 "rebalance_timeout": datetime.timedelta(seconds=30),
                 "subscribed_topic_names": (topic,), "server_assignor": None,
                 "topic_partitions": ()}
    with KafkaSocket(address) as member:
        for epoch in (0, -1):
            member.send(frame(request(CONSUMER_GROUP_HEARTBEAT, 1,
                                      dict(heartbeat, member_epoch=epoch))))
            _, answer = decode_response(CONSUMER_GROUP_HEARTBEAT, 1, member.receive())
            assert answer.error_code == ErrorCode.none, answer


def _produce_as(client_id: str, topic: str, correlation: int) -> bytes:
    """A 50 kB Produce request from `client_id`."""
    from kafka.protocol.producer.produce import ProduceRequest

    from tests.wire import frame

    data = ProduceRequest.TopicProduceData
    request = ProduceRequest[9](transactional_id=None, acks=1, timeout_ms=5000, topic_data=[
        data(name=topic, partition_data=[data.PartitionProduceData(
            index=0, records=make_batch(50, value_size=1000))])])
    request.with_header(correlation_id=correlation, client_id=client_id)
    return frame(bytes(request.encode(header=True)))
