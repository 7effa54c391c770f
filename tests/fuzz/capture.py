"""Capture the requests real clients send, as seeds for the fuzzers: `python -m tests.fuzz.capture`.

A broker runs on 127.0.0.1 with its advertised listener pointing at a recording proxy, so every
connection of every client (bootstrap and after) passes through it.  kafka-python, aiokafka and
confluent-kafka (librdkafka) then produce (uncompressed and with each codec, and in
transactions), consume in a group, commit, and use the admin APIs.  Each request frame (without its size prefix) is saved
as `corpus/requests/<client>-<api key>-v<version>-<n>.bin`, at most PER_KIND per client, API
and version, none larger than MAX_SEED_BYTES.  The corpus is committed; run this again after
adding an API.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import socket
import struct
import sys
import threading

from tests.harness import BrokerProcess

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "requests")
PER_KIND = 3
MAX_SEED_BYTES = 64 * 1024


class Recorder:
    """A TCP proxy to the broker that keeps the request frames clients send through it."""

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self.client = "unknown"  # which client library is talking now
        self.frames: dict[tuple[str, int, int], list[bytes]] = {}
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "Recorder":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(asyncio.start_server(self._serve, sock=self.listener))
        self._loop.run_forever()

    async def _serve(self, reader, writer) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._requests(reader, up_writer),
                             self._pump(up_reader, writer), return_exceptions=True)
        writer.close()
        up_writer.close()

    async def _requests(self, reader, writer) -> None:
        while True:
            try:
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                body = await reader.readexactly(size)
            except asyncio.IncompleteReadError:
                return  # the client closed its connection
            self._keep(body)
            writer.write(struct.pack(">i", size) + body)
            await writer.drain()

    @staticmethod
    async def _pump(reader, writer) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()

    def _keep(self, body: bytes) -> None:
        if len(body) < 8 or len(body) > MAX_SEED_BYTES:
            return
        api_key, version = struct.unpack_from(">hh", body)
        kept = self.frames.setdefault((self.client, api_key, version), [])
        if len(kept) < PER_KIND and body not in kept:
            kept.append(body)

    def save(self, directory: str) -> int:
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(directory)
        count = 0
        for (client, api_key, version), bodies in sorted(self.frames.items()):
            for body in bodies:
                digest = hashlib.sha1(body).hexdigest()[:10]
                name = f"{client}-{api_key}-v{version}-{digest}.bin"
                with open(os.path.join(directory, name), "wb") as out:
                    out.write(body)
                count += 1
        return count


# --- what each client does ------------------------------------------------------------------


def kafka_python(bootstrap: str) -> None:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import ConfigResource, ConfigResourceType, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic("kp", num_partitions=2, replication_factor=1)])
    admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, "0")])
    for codec in (None, "gzip"):
        producer = KafkaProducer(bootstrap_servers=bootstrap, compression_type=codec)
        for n in range(5):
            producer.send("kp", key=b"k%d" % n, value=b"v" * 50, headers=[("h", b"1")])
        producer.flush()
        producer.close()
    consumer = KafkaConsumer("kp", bootstrap_servers=bootstrap, group_id="kp-group",
                             auto_offset_reset="earliest", consumer_timeout_ms=4000)
    for _ in consumer:
        pass
    consumer.commit()
    consumer.close()
    admin.list_groups()
    admin.describe_groups(["kp-group"])
    admin.list_group_offsets({"kp-group": None})
    admin.list_partition_offsets({TopicPartition("kp", 0): -2, TopicPartition("kp", 1): 1000})
    admin.describe_cluster()
    admin.delete_groups(["kp-group"])
    admin.delete_topics(["kp"])
    admin.close()


def aiokafka(bootstrap: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
        await producer.start()
        for n in range(5):
            await producer.send_and_wait("ak", b"v%d" % n, key=b"k")
        await producer.stop()
        consumer = AIOKafkaConsumer("ak", bootstrap_servers=bootstrap, group_id="ak-group",
                                    auto_offset_reset="earliest")
        await consumer.start()
        await consumer.getmany(timeout_ms=3000)
        await consumer.commit()
        await consumer.stop()

    asyncio.run(run())


def confluent(bootstrap: str) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("ck", 3, 1)])["ck"].result(10)
    admin.describe_configs([ConfigResource("broker", "0")])
    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
        producer = Producer({"bootstrap.servers": bootstrap, "compression.type": codec,
                             "enable.idempotence": codec == "lz4", "linger.ms": 5})
        for n in range(20):
            producer.produce("ck", key=b"k%d" % n, value=b"value" * 20,
                             headers=[("h", b"x")], partition=n % 3)
        producer.flush(10)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ck-group",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe(["ck"])
    got = 0
    for _ in range(60):
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            got += 1
            if got >= 20:
                break
    consumer.commit(asynchronous=False)
    consumer.offsets_for_times([TopicPartition("ck", 0, 1000), TopicPartition("ck", 1, -1)])
    transactional = Producer({"bootstrap.servers": bootstrap, "transactional.id": "ck-txn"})
    transactional.init_transactions(10)
    for commit in (True, False):  # AddPartitions, AddOffsets, TxnOffsetCommit, EndTxn
        transactional.begin_transaction()
        transactional.produce("ck", b"in a transaction", partition=0)
        transactional.send_offsets_to_transaction([TopicPartition("ck", 0, got)],
                                                  consumer.consumer_group_metadata(), 10)
        if commit:
            transactional.commit_transaction(10)
        else:
            transactional.abort_transaction(10)
    consumer.close()
    admin.list_topics(timeout=5)
    admin.delete_topics(["ck"])["ck"].result(10)


def confluent_consumer_protocol(bootstrap: str) -> None:
    """A member of the consumer group protocol (KIP-848), subscribed by name and by regular
    expression: ConsumerGroupHeartbeat, OffsetCommit and OffsetFetch v9 with its epoch, and
    ConsumerGroupDescribe from the admin client."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: its handle serves the calls
    admin.create_topics([NewTopic("ck-848", 2, 1)])["ck-848"].result(10)
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce("ck-848", b"for a member of the new protocol", partition=0)
    producer.flush(10)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ck-848",
                         "group.protocol": "consumer", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe(["ck-none", "^ck-.*"])
    for _ in range(50):
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            consumer.commit(message=message, asynchronous=False)
            break
    admin.describe_consumer_groups(["ck-848"])["ck-848"].result(10)
    consumer.close()
    admin.delete_topics(["ck-848"])["ck-848"].result(10)


def confluent_share_consumer(bootstrap: str) -> None:
    """Members of a share group (KIP-932) in explicit acknowledgement mode: ShareGroupHeartbeat,
    ShareFetch with acknowledgements of each kind, ShareAcknowledge, and AlterShareGroupOffsets
    and DescribeShareGroupOffsets on the wire."""
    from confluent_kafka import AcknowledgeType, Producer, ShareConsumer
    from confluent_kafka.admin import AdminClient, NewTopic

    from tests.wire import KafkaSocket, frame, request

    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: its handle serves the calls
    admin.create_topics([NewTopic("ck-932", 1, 1)])["ck-932"].result(10)
    host, port = bootstrap.split(":")
    with KafkaSocket((host, int(port))) as sock:
        for api_key, version, values in (
                (91, 0, {"group_id": "ck-932", "topics": [{"topic_name": "ck-932", "partitions": [
                    {"partition_index": 0, "start_offset": 0}]}]}),
                (90, 1, {"groups": [{"group_id": "ck-932", "topics": None}]})):
            sock.send(frame(request(api_key, version, values)))
            sock.receive()
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in (b"accept", b"release", b"reject"):
        producer.produce("ck-932", value, partition=0)
    producer.flush(10)
    consumer = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": "ck-932",
                              "share.acknowledgement.mode": "explicit"})
    consumer.subscribe(["ck-932"])
    verdicts = {b"accept": AcknowledgeType.ACCEPT, b"release": AcknowledgeType.RELEASE,
                b"reject": AcknowledgeType.REJECT}
    for _ in range(50):
        messages = [m for m in consumer.poll(0.2) or [] if m.error() is None]
        for message in messages:
            consumer.acknowledge(message, verdicts[message.value()])
        if messages:
            consumer.commit_sync()
            break
    consumer.poll(0.5)
    consumer.close()
    admin.delete_topics(["ck-932"])["ck-932"].result(10)


def main() -> int:
    probe = socket.create_server(("127.0.0.1", 0))  # a port for the proxy, known in advance
    port = probe.getsockname()[1]
    probe.close()
    with BrokerProcess(workers=2, overrides={
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
            "group.initial.rebalance.delay.ms": "0"}) as broker:
        recorder = Recorder(broker.listeners["PLAINTEXT"])
        recorder.listener.close()
        recorder.listener = socket.create_server(("127.0.0.1", port))
        recorder.start()
        bootstrap = f"127.0.0.1:{port}"
        for name, flow in (("kafka-python", kafka_python), ("aiokafka", aiokafka),
                           ("confluent", confluent),
                           ("confluent-848", confluent_consumer_protocol),
                           ("confluent-932", confluent_share_consumer)):
            recorder.client = name
            flow(bootstrap)
        recorder.stop()
    count = recorder.save(CORPUS)
    kinds = sorted({(api, version) for _, api, version in recorder.frames})
    print(f"{count} request frames of {len(kinds)} API versions saved in {CORPUS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
