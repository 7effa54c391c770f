"""Compressed batches of many small records, sent by many connections at once: a worker holds
the decompressed records of a bounded number of batches (not one per connection), and
another client's produce is answered while they are walked; the same when each is
recompressed in its topic's codec."""

import threading
import time

import cramjam
import pytest
from kio.schema.errors import ErrorCode

from broker.shared.log.records import read_header

from tests.batches import make_batch
from tests.harness import BrokerProcess, memory, wait_until
from tests.raw_batches import batch_of, tiny_records
from tests.wire import KafkaSocket, decode_response, fetch_request, produce_errors, produce_request

pytestmark = pytest.mark.system  # every test here starts a broker

CONNECTIONS = 32
RECORDS = 1_000_000  # about 29 MB once decompressed, 0.8 MB as zstd
MIB = 1 << 20
BASELINE: dict = {}  # the worker's resident memory before the first dense batches


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess(workers=1) as running:
        from kafka import KafkaAdminClient
        from kafka.admin import NewTopic

        admin = KafkaAdminClient(bootstrap_servers=running.bootstrap)
        admin.create_topics([NewTopic("dense", num_partitions=1, replication_factor=1),
                             NewTopic("probe", num_partitions=1, replication_factor=1),
                             NewTopic("dense-lz4", num_partitions=1, replication_factor=1,
                                      topic_configs={"compression.type": "lz4",
                                                     "max.message.bytes": str(64 * MIB)})])
        admin.close()
        yield running


class PeakRss(threading.Thread):
    """The greatest VmRSS a process reaches while this runs (sampled every 5 ms)."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.running = pid, 0, True

    def run(self) -> None:
        while self.running:
            self.peak = max(self.peak, memory(self.pid).get("VmRSS", 0))
            time.sleep(0.005)

    def stop(self) -> int:
        self.running = False
        self.join(timeout=5)
        return self.peak


class Probe(threading.Thread):
    """Another client producing one small batch after another: the slowest answer's time."""

    def __init__(self, address):
        super().__init__(daemon=True)
        self.address, self.slowest, self.answers, self.running = address, 0.0, 0, True
        self.errors: list = []

    def run(self) -> None:
        with KafkaSocket(self.address, timeout=60) as client:
            while self.running:
                started = time.monotonic()
                client.send(produce_request("probe", make_batch(1), correlation_id=self.answers))
                self.errors += [code for code, _ in produce_errors(client.receive()) if code]
                self.slowest = max(self.slowest, time.monotonic() - started)
                self.answers += 1
                time.sleep(0.01)

    def stop(self) -> None:
        self.running = False
        self.join(timeout=60)


@pytest.mark.parametrize("topic, connections", [("dense", CONNECTIONS), ("dense-lz4", 4)])
def test_many_connections_sending_dense_batches_hold_a_bounded_decompressed_total(
        broker, topic, connections):
    """Recompressed (dense-lz4), a batch's records are held until its last slice is
    compressed, and its new batch appended at once: still one batch at a time."""
    records = tiny_records(RECORDS)
    packed = bytes(cramjam.zstd.compress(records, level=3))
    batch = batch_of(packed, RECORDS, int(time.time() * 1000), attributes=4)  # zstd
    assert len(batch) < MIB and len(records) > 25 * MIB
    address = broker.listeners["PLAINTEXT"]
    (pid,) = broker.worker_pids.values()
    clients = [KafkaSocket(address, timeout=120) for _ in range(connections)]
    probe = Probe(address)
    try:
        for client in clients:  # connected, and the worker warmed up, before the baseline
            client.send(produce_request("probe", make_batch(1)))
            assert produce_errors(client.receive())[0][0] == ErrorCode.none
        # The first test's: memory a previous one freed may be the worker's to reuse.
        baseline = BASELINE.setdefault("rss", memory(pid)["VmRSS"])
        probe.start()
        wait_until(lambda: probe.answers >= 3, timeout=30)
        peak = PeakRss(pid)
        peak.start()
        request = produce_request(topic, batch, correlation_id=7)
        for client in clients:
            client.send(request)
        answers = [produce_errors(client.receive()) for client in clients]
        grown = peak.stop() - baseline
        probe.stop()
        clients[0].send(fetch_request(topic, offset=0, correlation_id=8))
        _, fetched = decode_response(1, 12, clients[0].receive())
    finally:
        probe.running = False
        for client in clients:
            client.close()
    assert [codes for codes in answers if codes[0][0] != ErrorCode.none] == []
    assert sorted(offset for (_, offset), in answers) == [n * RECORDS for n in range(connections)]
    stored = read_header(fetched.responses[0].partitions[0].records, 0)
    assert stored.attributes & 7 == (4 if topic == "dense" else 3)  # zstd as sent, or lz4
    # Without a bound each connection's batch was held decompressed while it waited:
    # 32 x 29 MB.  Now one batch walked in slices and one small walk at a time.
    assert grown < 4 * len(records), f"the worker grew by {grown / MIB:.0f} MiB"
    assert probe.errors == []
    assert probe.slowest < 1.0, f"another client's produce waited {probe.slowest:.2f} s"


def lookup_frame(timestamp: int, correlation: int) -> bytes:
    from kafka.protocol.consumer.offsets import ListOffsetsRequest

    from tests.wire import frame

    topic = ListOffsetsRequest[4].ListOffsetsTopic
    request = ListOffsetsRequest[4](replica_id=-1, isolation_level=0, topics=[topic(
        name="dense", partitions=[topic.ListOffsetsPartition(
            partition_index=0, current_leader_epoch=-1, timestamp=timestamp)])])
    request.with_header(correlation_id=correlation, client_id="lookups")
    return frame(bytes(request.encode(header=True)))


def test_lookups_by_time_in_dense_batches_take_turns_with_other_clients(broker):
    """Each lookup decompresses a batch of a million records (tens of ms): 16 connections
    asking at once are served one lookup per loop turn, so another client's produce waits
    for about one of them, not for all (3 s before they took turns)."""
    from tests.wire import decode_response

    stamp = int(time.time() * 1000) + 1000  # later than every batch of the other tests
    batch = batch_of(bytes(cramjam.zstd.compress(tiny_records(RECORDS))), RECORDS, stamp,
                     attributes=4)
    address = broker.listeners["PLAINTEXT"]
    with KafkaSocket(address, timeout=60) as client:
        client.send(produce_request("dense", batch))
        ((code, base),) = produce_errors(client.receive())
        assert code == ErrorCode.none
    found, running = [], True

    def ask() -> None:
        with KafkaSocket(address, timeout=60) as client:
            for correlation in range(1000):  # bounded; stopped by `running` long before
                if not running:
                    return
                client.send(lookup_frame(stamp, correlation))
                (answer,) = decode_response(2, 4, client.receive())[1].topics[0].partitions
                found.append((answer.error_code, answer.offset))

    probe = Probe(address)
    probe.start()
    askers = [threading.Thread(target=ask, daemon=True) for _ in range(16)]
    for asker in askers:
        asker.start()
    wait_until(lambda: len(found) >= 64, timeout=60, message="lookups answered")
    running = False
    for asker in askers:
        asker.join(timeout=60)
    probe.stop()
    assert set(found) == {(ErrorCode.none, base)} and not probe.errors
    assert probe.slowest < 0.6, f"a produce waited {probe.slowest:.2f} s behind the lookups"
