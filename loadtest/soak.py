"""A soak: does any broker process grow when who talks to it keeps changing?

    python -m loadtest.soak [--seconds 600] [--threads 4]      (make soak)

A broker (2 data workers, 127.0.0.1 only) serves SECONDS of traffic from rotating populations:
10,000 client ids, 2,000 consumer group ids and 1,000 idempotent producer ids, each population
sliding to fresh ids as time goes (so over a 10-minute run several times as many distinct ids
are seen).  Every client id has a producer quota (a sensor each: the table is sized for 16,384
at once), producers write with their own sequences, groups commit offsets and ask for member ids.  Expiry is set short enough to
happen within the run (offsets.retention.minutes=1, producer.id.expiration.ms=60000): the
bounds and expiries of the bound table are what keep memory flat.

It prints every process's resident memory after the first minute and at the end, and exits 1
if any grew by more than 10 %, or if requests failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import struct
import sys
import threading
import time

from tests.batches import make_batch
from tests.harness import BrokerProcess, memory
from tests.wire import request as group_request
from tests.wire import KafkaSocket, create_topic, decode_response, frame, produce_request

CLIENTS, GROUPS, PRODUCERS = 10_000, 2_000, 1_000
PARTITIONS = 4
OVERRIDES = {"quota.producer.default": "100000000", "pybroker.quota.max.sensors": "16384",
             "offsets.retention.minutes": "1",
             "offsets.retention.check.interval.ms": "10000",
             "producer.id.expiration.ms": "60000", "group.min.session.timeout.ms": "1000",
             "group.initial.rebalance.delay.ms": "0", "pybroker.event.log.enable": "false"}


class Population:
    """`size` ids at a time, sliding by `per_second` new ids each second."""

    def __init__(self, size: int, per_second: float, started: float):
        self.size, self.per_second, self.started = size, per_second, started

    def pick(self, rng: random.Random) -> int:
        first = int((time.monotonic() - self.started) * self.per_second)
        return first + rng.randrange(self.size)


class Load(threading.Thread):
    def __init__(self, address, stop: threading.Event, seed: int, populations: dict,
                 threads: int):
        super().__init__(daemon=True)
        self.address, self.stop, self.rng = address, stop, random.Random(seed)
        self.seed, self.threads = seed, threads  # producer ids are split between threads
        self.populations = populations
        self.sequences: dict[tuple[int, int], int] = {}
        self.requests = self.failures = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                with KafkaSocket(self.address, timeout=10) as client:
                    for _ in range(200):
                        if self.stop.is_set():
                            return
                        self._one(client)
                        self.requests += 1
            except (OSError, AssertionError, struct.error) as error:
                self.failures += 1
                if self.failures <= 3:
                    print(f"load {self.seed}: {error!r}", file=sys.stderr)

    def _one(self, client: KafkaSocket) -> None:
        choice = self.rng.random()
        client_id = f"client-{self.populations['clients'].pick(self.rng)}"
        if choice < 0.6:
            self._produce(client, client_id)
        elif choice < 0.85:
            self._commit(client, client_id)
        else:
            self._join(client, client_id)

    def _produce(self, client: KafkaSocket, client_id: str) -> None:
        producer = self.populations["producers"].pick(self.rng) * self.threads + self.seed
        partition = self.rng.randrange(PARTITIONS)
        sequence = self.sequences.get((producer, partition), 0)
        batch = make_batch(3, producer_id=producer, epoch=0, sequence=sequence)
        data = produce_request("soak", batch, partition=partition)
        client.send(_with_client_id(data, client_id))
        _, response = decode_response(0, 9, client.receive())
        code = int(response.responses[0].partition_responses[0].error_code)
        if code == 59:  # UNKNOWN_PRODUCER_ID after expiry: start the sequence again
            self.sequences[(producer, partition)] = 0
        elif code != 0:
            raise AssertionError(f"produce failed with {code}")
        else:
            self.sequences[(producer, partition)] = sequence + 3
        if len(self.sequences) > 4 * PRODUCERS * PARTITIONS:
            self.sequences.clear()  # the generator's own memory, bounded too

    def _commit(self, client: KafkaSocket, client_id: str) -> None:
        group = f"group-{self.populations['groups'].pick(self.rng)}"
        client.send(frame(group_request(8, 2, {
            "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
            "retention_time_ms": -1, "topics": [{"name": "soak", "partitions": [
                {"partition_index": p, "committed_offset": self.rng.randrange(1000),
                 "committed_metadata": ""} for p in range(PARTITIONS)]}]},
            client_id=client_id)))
        client.receive()

    def _join(self, client: KafkaSocket, client_id: str) -> None:
        group = f"group-{self.populations['groups'].pick(self.rng)}"
        client.send(frame(group_request(11, 5, {
            "group_id": group, "session_timeout": datetime.timedelta(seconds=1),
            "rebalance_timeout": datetime.timedelta(seconds=1), "member_id": "",
            "group_instance_id": None, "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b"\0"}]}, client_id=client_id)))
        client.receive()  # MEMBER_ID_REQUIRED: a pending member, never used


def _with_client_id(request_frame: bytes, client_id: str) -> bytes:
    """The same request with another client id in its header (v1: after 8 bytes)."""
    body = request_frame[4:]
    length = struct.unpack_from(">h", body, 8)[0]
    encoded = client_id.encode()
    body = body[:8] + struct.pack(">h", len(encoded)) + encoded + body[10 + length:]
    return struct.pack(">i", len(body)) + body


def _megabytes(figures: dict) -> dict:
    return {name: {key: round(value / 2**20, 1) for key, value in found.items()}
            for name, found in figures.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.soak")
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args(argv)
    with BrokerProcess(workers=2, overrides=OVERRIDES) as broker:
        create_topic(broker.bootstrap, "soak", PARTITIONS)
        pids = {"parent": broker.pid, **broker.worker_pids}
        started = time.monotonic()
        populations = {"clients": Population(CLIENTS, 20, started),
                       "groups": Population(GROUPS, 5, started),
                       # each thread has its share of the producer ids (sequences are its own)
                       "producers": Population(PRODUCERS // args.threads, 2 / args.threads,
                                               started)}
        stop = threading.Event()
        loads = [Load(broker.listeners["PLAINTEXT"], stop, seed, populations, args.threads)
                 for seed in range(args.threads)]
        for load in loads:
            load.start()
        first_minute = min(60.0, args.seconds / 2)
        time.sleep(first_minute)
        after_first = {name: memory(pid) for name, pid in pids.items()}
        time.sleep(max(0.0, args.seconds - first_minute))
        at_end = {name: memory(pid) for name, pid in pids.items()}
        stop.set()
        for load in loads:
            load.join(30)
        untracked = broker.metric("broker_quota_untracked_requests_total")
    requests = sum(load.requests for load in loads)
    failures = sum(load.failures for load in loads)
    growth = {name: at_end[name]["VmRSS"] / after_first[name]["VmRSS"] - 1 for name in pids}
    print(json.dumps({"seconds": args.seconds, "requests": requests, "failures": failures,
                      "quota_untracked_requests": untracked,
                      "distinct_ids_seen": {
                          name: int(p.per_second * args.seconds + p.size) *
                          (args.threads if name == "producers" else 1)
                          for name, p in populations.items()},
                      "after_first_minute_mb": _megabytes(after_first),
                      "at_end_mb": _megabytes(at_end),
                      "growth": {k: round(v, 3) for k, v in growth.items()}}, indent=2))
    return 0 if failures == 0 and max(growth.values()) <= 0.10 else 1


if __name__ == "__main__":
    sys.exit(main())
