"""`make report`: a short incident on a real broker, then the PySpark report about it.

Starts a broker on 127.0.0.1 (memory pool 8 MiB, max.connections.per.ip 50, a control
plane), then, each bounded in time and count and aimed at 127.0.0.1 only:
  1. a connection storm: 400 connections from one address in a few waves (most are refused);
  2. a quota-violating producer: client id "greedy" under a 200 kB/s producer_byte_rate
     quota, producing 50 kB requests as fast as its throttles let it for 4 s;
  3. a large-request burst: loadtest.flood, 12 connections x 2 x 1 MiB Produce for 3 s,
     which exhausts the pool;
then stops the broker, runs `python -m pipeline` on its event log and prints the report path.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time

from tests.harness import BrokerProcess

MIB = 1 << 20


def storm(address, waves: int = 4, per_wave: int = 100) -> int:
    refused = 0
    for _ in range(waves):
        held = []
        for _ in range(per_wave):
            try:
                held.append(socket.create_connection(address, timeout=2))
            except OSError:
                refused += 1
        time.sleep(0.5)
        for sock in held:
            sock.close()
        time.sleep(0.5)
    return refused


def greedy_producer(address, seconds: float) -> int:
    from kafka.protocol.producer.produce import ProduceRequest

    from tests.batches import make_batch
    from tests.wire import KafkaSocket, frame

    data = ProduceRequest.TopicProduceData
    sent = 0
    deadline = time.monotonic() + seconds
    with KafkaSocket(address, timeout=30) as client:
        while time.monotonic() < deadline:
            request = ProduceRequest[9](transactional_id=None, acks=1, timeout_ms=5000,
                                        topic_data=[data(name="demo", partition_data=[
                                            data.PartitionProduceData(
                                                index=0, records=make_batch(50, value_size=1000))])])
            request.with_header(correlation_id=sent, client_id="greedy")
            client.send(frame(bytes(request.encode(header=True))))
            client.receive()
            sent += 1
    return sent


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.demo")
    parser.add_argument("--out", default="reports/demo")
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    for ours in ("broker", "report"):  # a fresh run: no events of an earlier one
        shutil.rmtree(os.path.join(out, ours), ignore_errors=True)
    os.makedirs(out, exist_ok=True)
    overrides = {
        "listeners": "PLAINTEXT://127.0.0.1:0,CONTROLLER://127.0.0.1:0",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "control.plane.listener.name": "CONTROLLER",
        "queued.max.request.bytes": str(8 * MIB), "socket.request.max.bytes": str(2 * MIB),
        "message.max.bytes": str(2 * MIB), "max.connections.per.ip": "50",
        "log.segment.bytes": str(16 * MIB), "log.retention.bytes": str(32 * MIB),
        "log.retention.check.interval.ms": "1000",
        # Throttle after one window's worth, not Kafka's ten: the demo is short.
        "quota.window.num": "2", "pybroker.quota.burst.windows": "1",
    }
    from tests.wire import alter_client_quota, create_topic

    with BrokerProcess(workers=2, overrides=overrides, data_dir=os.path.join(out, "broker")) as broker:
        address, control = broker.listeners["PLAINTEXT"], broker.listeners["CONTROLLER"]
        create_topic(f"127.0.0.1:{control[1]}", "demo")
        create_topic(f"127.0.0.1:{control[1]}", "flood")
        alter_client_quota(control, {"client-id": "greedy"}, "producer_byte_rate", 200_000)
        print(f"storm: {storm(address)} connections could not even connect; the broker "
              "refuses most of the others (see the report)", flush=True)
        print(f"greedy producer: {greedy_producer(address, 4.0)} requests", flush=True)
        subprocess.run([sys.executable, "-m", "loadtest.flood", "--address",
                        f"127.0.0.1:{address[1]}", "--topic", "flood", "--seconds", "3"],
                       check=True, timeout=60)
        events_dir = os.path.join(out, "broker", "pybroker-events")
    return subprocess.run([sys.executable, "-m", "pipeline", "--events", events_dir,
                           "--out", os.path.join(out, "report")]).returncode


if __name__ == "__main__":
    sys.exit(main())
