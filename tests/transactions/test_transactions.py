"""Transactions (KIP-98) with real clients on a real broker: confluent-kafka's transactional
producer and read_committed / read_uncommitted consumers, zombie fencing, kafka-python's
transactional producer, a transaction left open expiring, and a consume-transform-produce loop
that stays exactly-once across a kill -9 of the whole broker."""

import os
import signal
import time

import pytest
from kio.schema.errors import ErrorCode

from tests.harness import PROJECT, BrokerProcess, wait_until
from tests.helpers import consume_all
from tests.wire import request
from tests.wire import KafkaSocket, create_topic, decode_response, frame

pytestmark = pytest.mark.system

OVERRIDES = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": "200",
             "group.initial.rebalance.delay.ms": "0"}


@pytest.fixture(scope="module")
def broker():
    with BrokerProcess(workers=2, overrides=OVERRIDES) as running:
        yield running


def producer(broker, transactional_id: str, **extra):
    from confluent_kafka import Producer

    made = Producer(dict({"bootstrap.servers": broker.bootstrap,
                          "transactional.id": transactional_id, "linger.ms": 5}, **extra))
    made.init_transactions(10)
    return made


def describe_transaction(broker, transactional_id: str):
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        client.send(frame(request(65, 0, {"transactional_ids": [transactional_id]})))
        (state,) = decode_response(65, 0, client.receive())[1].transaction_states
    return state


def test_read_committed_sees_committed_records_only(broker):
    create_topic(broker.bootstrap, "orders", 3)
    made = producer(broker, "orders-app")
    for outcome in ("commit", "abort", "commit"):
        made.begin_transaction()
        for number in range(30):
            made.produce("orders", f"{outcome}-{number}".encode(), partition=number % 3)
        made.flush(10)
        made.commit_transaction(10) if outcome == "commit" else made.abort_transaction(10)
    committed = consume_all(broker.bootstrap, "orders", "read_committed", 60, "committed")
    everything = consume_all(broker.bootstrap, "orders", "read_uncommitted", 90, "uncommitted")
    assert len(committed) == 60 and all(v.startswith(b"commit-") for v in committed)
    assert sorted(everything) == sorted(committed + [f"abort-{n}".encode() for n in range(30)])
    assert describe_transaction(broker, "orders-app").transaction_state == "CompleteCommit"
    assert broker.metric("broker_transactions_ended_total", outcome="committed") >= 2
    assert broker.metric("broker_transactions_ended_total", outcome="aborted") >= 1


def test_offsets_sent_to_a_transaction_commit_with_it(broker):
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    create_topic(broker.bootstrap, "offsets-in", 1)
    made = producer(broker, "offsets-app")
    wanted = [TopicPartition("offsets-in", 0)]
    # read_committed (librdkafka's default) asks OffsetFetch with require_stable: while the
    # offset is pending it hears UNSTABLE_OFFSET_COMMIT and retries; read_uncommitted does not.
    stable, unstable = (Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "transformer",
                                  "enable.auto.commit": False, "isolation.level": isolation})
                        for isolation in ("read_committed", "read_uncommitted"))
    try:
        made.begin_transaction()
        made.produce("offsets-in", b"x")
        made.send_offsets_to_transaction([TopicPartition("offsets-in", 0, 17)],
                                         stable.consumer_group_metadata(), 10)
        assert unstable.committed(wanted, 10)[0].offset < 0  # pending: not visible yet
        with pytest.raises(KafkaException):  # retried until its timeout: never stable
            stable.committed(wanted, 2)
        made.commit_transaction(10)
        assert stable.committed(wanted, 10)[0].offset == 17
        assert unstable.committed(wanted, 10)[0].offset == 17
    finally:
        stable.close()
        unstable.close()


def test_a_zombie_is_fenced_by_a_new_producer_with_its_id(broker):
    from confluent_kafka import KafkaException

    create_topic(broker.bootstrap, "fencing", 1)
    zombie = producer(broker, "fenced-app")
    zombie.begin_transaction()
    zombie.produce("fencing", b"zombie")
    zombie.flush(10)
    successor = producer(broker, "fenced-app")  # aborts the zombie's transaction
    successor.begin_transaction()
    successor.produce("fencing", b"successor")
    successor.commit_transaction(10)
    with pytest.raises(KafkaException) as raised:
        zombie.commit_transaction(10)
    assert raised.value.args[0].fatal()
    assert consume_all(broker.bootstrap, "fencing", "read_committed", 1, "fencing") == \
        [b"successor"]


def test_kafka_python_transactions_interoperate(broker):
    from kafka import KafkaProducer

    create_topic(broker.bootstrap, "python-txn", 2)
    made = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="python-app")
    try:
        made.init_transactions()
        made.begin_transaction()
        for number in range(10):
            made.send("python-txn", f"kept-{number}".encode(), partition=number % 2)
        made.commit_transaction()
        made.begin_transaction()
        made.send("python-txn", b"dropped", partition=0)
        made.abort_transaction()
    finally:
        made.close()
    values = consume_all(broker.bootstrap, "python-txn", "read_committed", 10, "python-reader")
    assert sorted(values) == sorted(f"kept-{n}".encode() for n in range(10))


def test_a_transaction_left_open_is_aborted_after_its_timeout(broker):
    create_topic(broker.bootstrap, "abandoned", 1)
    made = producer(broker, "abandoned-app", **{"transaction.timeout.ms": 1000})
    made.begin_transaction()
    made.produce("abandoned", b"never")
    made.flush(10)
    wait_until(lambda: describe_transaction(broker, "abandoned-app").transaction_state
               == "CompleteAbort", timeout=10)
    after = producer(broker, "abandoned-later")
    after.begin_transaction()
    after.produce("abandoned", b"later")
    after.commit_transaction(10)
    assert broker.metric("broker_transactions_ended_total", outcome="timed_out") >= 1
    # The read_committed consumer is not stuck behind the abandoned transaction.
    assert consume_all(broker.bootstrap, "abandoned", "read_committed", 1, "abandoned") == \
        [b"later"]


def test_consume_transform_produce_is_exactly_once_across_a_killed_broker(tmp_path):
    """10,000 records through a transactional loop; mid-stream the whole broker (and the loop)
    is killed with SIGKILL; after a restart on the same log the loop starts again.  Every
    source record is in the sink exactly once for a read_committed consumer."""
    from tests.wire import produce_errors, produce_request

    total = 10_000
    first = BrokerProcess(workers=2, data_dir=str(tmp_path), overrides=OVERRIDES).start()
    try:
        create_topic(first.bootstrap, "source", 3)
        create_topic(first.bootstrap, "sink", 3)
        with KafkaSocket(first.listeners["PLAINTEXT"]) as client:
            for number in range(total // 100):  # 100 batches of 100 distinct records
                client.send(produce_request("source", _source_batch(number), partition=number % 3))
                assert produce_errors(client.receive())[0][0] == ErrorCode.none
        app = _start_app(first.bootstrap, total)
        _wait_for_progress(app, 3000)
        for pid in [first.pid, *first.worker_pids.values()]:
            os.kill(pid, signal.SIGKILL)
        app.kill()
        app.wait()
        first.proc.wait()
    finally:
        first.stop()
    with BrokerProcess(workers=2, data_dir=str(tmp_path), overrides=OVERRIDES) as second:
        app = _start_app(second.bootstrap, total)
        try:
            assert app.wait(120) == 0, app.stdout.read()
        finally:
            app.kill()
        values = consume_all(second.bootstrap, "sink", "read_committed", total, "checker",
                             timeout=60)
    assert len(values) == total
    assert sorted(values) == sorted(b"T" + value for value in _source_values(total))


def _source_batch(number: int) -> bytes:
    """100 records with distinct values b"<batch>-<record>"."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 20)
    stamp = int(time.time() * 1000)
    for index in range(100):
        builder.append(index, timestamp=stamp, key=None, value=b"%d-%d" % (number, index),
                       headers=[])
    return bytes(builder.build())


def _source_values(total: int) -> list[bytes]:
    return [b"%d-%d" % (number, index) for number in range(total // 100) for index in range(100)]


def _start_app(bootstrap: str, total: int):
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-m", "tests.transform_app", bootstrap, "source",
                             "sink", str(total), "90"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            cwd=PROJECT)


def _wait_for_progress(app, records: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = app.stdout.readline()
        if not line:
            break
        if line.startswith("committed ") and int(line.split()[1]) >= records:
            return
    raise AssertionError(f"the transform app did not reach {records} records")


def test_aiokafka_transactions_interoperate(broker):
    import asyncio

    from aiokafka import AIOKafkaProducer

    create_topic(broker.bootstrap, "aio-txn", 2)

    async def run():
        made = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="aio-app")
        await made.start()
        try:
            async with made.transaction():
                for number in range(10):
                    await made.send("aio-txn", f"kept-{number}".encode(), partition=number % 2)
            await made.begin_transaction()
            await made.send("aio-txn", b"dropped", partition=0)
            await made.abort_transaction()
        finally:
            await made.stop()

    asyncio.run(run())
    values = consume_all(broker.bootstrap, "aio-txn", "read_committed", 10, "aio-reader")
    assert sorted(values) == sorted(f"kept-{n}".encode() for n in range(10))


def test_an_open_transaction_holds_back_the_lso_in_list_offsets_and_describe_producers(broker):
    create_topic(broker.bootstrap, "held", 1)
    plain = producer(broker, "held-before")
    plain.begin_transaction()
    plain.produce("held", b"committed")
    plain.commit_transaction(10)  # offsets 0 (record) and 1 (marker)
    made = producer(broker, "held-app")
    made.begin_transaction()
    made.produce("held", b"open")
    made.flush(10)  # offset 2, its transaction open

    def latest(isolation: int) -> int:
        with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
            client.send(frame(request(2, 4, {
                "replica_id": -1, "isolation_level": isolation, "topics": [
                    {"name": "held", "partitions": [{"partition_index": 0,
                                                     "current_leader_epoch": -1,
                                                     "timestamp": -1}]}]})))
            answer = decode_response(2, 4, client.receive())[1]
        return answer.topics[0].partitions[0].offset

    assert (latest(isolation=0), latest(isolation=1)) == (3, 2)
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        client.send(frame(request(61, 0, {"topics": [{"name": "held",
                                                      "partition_indexes": [0]}]})))
        answer = decode_response(61, 0, client.receive())[1]
    starts = {p.producer_id: p.current_txn_start_offset
              for p in answer.topics[0].partitions[0].active_producers}
    assert sorted(starts.values()) == [-1, 2]
    made.abort_transaction(10)
    assert latest(isolation=1) == 4  # past the abort marker


def test_a_transactional_batch_outside_any_transaction_cannot_stall_read_committed(broker):
    """A client that writes a transactional batch without InitProducerId or AddPartitions
    (a bug, or on purpose) would hold the partition's last stable offset for ever: the
    coordinator's sweep aborts it."""
    from kafka.protocol.producer.produce import ProduceRequest
    from kafka.record.default_records import DefaultRecordBatchBuilder

    create_topic(broker.bootstrap, "hanging", 1)
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=True,
                                        producer_id=777, producer_epoch=0, base_sequence=0,
                                        batch_size=1 << 20)
    builder.append(0, timestamp=int(time.time() * 1000), key=None, value=b"rogue", headers=[])
    data = ProduceRequest.TopicProduceData
    rogue = ProduceRequest[9](transactional_id="rogue", acks=1, timeout_ms=5000, topic_data=[
        data(name="hanging", partition_data=[data.PartitionProduceData(
            index=0, records=bytes(builder.build()))])])
    rogue.with_header(correlation_id=1, client_id="rogue")
    with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
        client.send(frame(bytes(rogue.encode(header=True))))
        assert decode_response(0, 9, client.receive())[1].responses[0].partition_responses[
            0].error_code == ErrorCode.none
    made = producer(broker, "after-rogue")
    made.begin_transaction()
    made.produce("hanging", b"after")
    made.commit_transaction(10)
    assert consume_all(broker.bootstrap, "hanging", "read_committed", 1, "hanging") == [b"after"]
    assert broker.metric("broker_transactions_ended_total", outcome="hanging") == 1
