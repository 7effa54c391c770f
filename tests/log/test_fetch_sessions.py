"""Incremental fetch sessions (KIP-227): the session protocol through a worker's real router,
and the session cache's slots, fair share and eviction on a fake clock."""

import contextlib
import datetime
import socket
import struct
import tempfile
import threading
import time
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kio.schema.errors import ErrorCode

from broker.shared.config import load_config
from broker.shared.log.settings import LogSettings
from broker.shared.log.topics import Epoch, TopicRegistry
from tests.batches import make_batch
from tests.harness import BrokerProcess
from tests.wire import request
from tests.wire import create_topic, decode_response
from workers.apis import Services, build_apis
from workers.fetch_response import FileResponse
from workers.fetch_sessions import CachedPartition, FetchSessionCache
from workers.router import BrokerView, Router


class Broker:
    """A worker's real router with a session cache of its own."""

    def __init__(self, tmp_path, slots: int = 10):
        props = load_config({}).props
        self.registry = TopicRegistry((str(tmp_path),), LogSettings(), Epoch())
        self.sessions = FetchSessionCache(slots, slots, 0, 1, props.pybroker_request_max_entries,
                                          100_000)
        services = Services(view=BrokerView(node_id=0, cluster_id="c", advertised=(("h", 1),)),
                            props=props, registry=self.registry, sessions=self.sessions)
        self.router = Router(build_apis(services))

    def produce(self, topic: str, partition: int, count: int = 1) -> None:
        frame = request(0, 9, {"transactional_id": None, "acks": 1,
                               "timeout": datetime.timedelta(seconds=5),
                               "topic_data": [{"name": topic, "partition_data": [
                                   {"index": partition, "records": make_batch(count)}]}]})
        self.router.handle(frame, 0)

    def fetch(self, session_id: int, epoch: int, topics: dict, forget: dict | None = None,
              version: int = 12):
        """topics: {topic: {partition: fetch offset}}; answers (error, session id,
        {(topic, partition): (high watermark, record bytes, error)})."""
        def key(name):
            return {"topic_id": self.registry.get(name).topic_id} if version >= 13 \
                else {"topic": name}
        frame = request(1, version, {
            "replica_id": -1, "max_wait": datetime.timedelta(0), "min_bytes": 0,
            "max_bytes": 1 << 20, "isolation_level": 0, "session_id": session_id,
            "session_epoch": epoch, "rack_id": "", "cluster_id": None,
            "topics": [dict(key(name), partitions=[
                {"partition": index, "current_leader_epoch": -1, "fetch_offset": offset,
                 "last_fetched_epoch": -1, "log_start_offset": -1,
                 "partition_max_bytes": 1 << 20} for index, offset in parts.items()])
                for name, parts in topics.items()],
            "forgotten_topics_data": [dict(key(name), partitions=list(parts))
                                      for name, parts in (forget or {}).items()]})
        answer = self.router.handle(frame, 0)
        if isinstance(answer, FileResponse):  # zero-copy: the bytes a socket would get
            answer = answer.materialize()
        body = decode_response(1, version, answer[4:])[1]
        names = {info.topic_id: name for name in ("a", "b")
                 if (info := self.registry.get(name)) is not None}
        parts = {(topic.topic if version < 13 else names[topic.topic_id], part.partition_index):
                 (part.high_watermark, len(part.records or b""), part.error_code)
                 for topic in body.responses for part in topic.partitions}
        return body.error_code, body.session_id, parts


@pytest.fixture
def broker(tmp_path):
    broker = Broker(tmp_path)
    broker.registry.create("a", 3)
    broker.registry.create("b", 2)
    return broker


def test_a_full_fetch_with_epoch_0_opens_a_session_and_increments_answer_only_news(broker):
    broker.produce("a", 0, 3)
    error, session, parts = broker.fetch(0, 0, {"a": {0: 0, 1: 0, 2: 0}, "b": {0: 0, 1: 0}})
    assert error == ErrorCode.none and session != 0 and len(broker.sessions) == 1
    assert set(parts) == {("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)}
    assert parts["a", 0][:2] == (3, parts["a", 0][1]) and parts["a", 0][1] > 0
    # The session fetches a-0 from 0 until told otherwise: its records again.
    assert list(broker.fetch(session, 1, {})[2]) == [("a", 0)]
    # a-0 moved on (named with its new offset), nothing else new: an empty answer.
    assert broker.fetch(session, 2, {"a": {0: 3}}) == (ErrorCode.none, session, {})
    broker.produce("b", 1, 2)
    error, same, parts = broker.fetch(session, 3, {})
    assert (error, same) == (ErrorCode.none, session) and list(parts) == [("b", 1)]
    assert parts["b", 1][0] == 2 and parts["b", 1][1] > 0
    # b-1 was not named again: the session still fetches it from offset 0.
    assert list(broker.fetch(session, 4, {})[2]) == [("b", 1)]
    assert broker.fetch(session, 5, {"b": {1: 2}}) == (ErrorCode.none, session, {})


def test_session_errors_as_kafka_answers_them(broker):
    _, session, _ = broker.fetch(0, 0, {"a": {0: 0}})
    assert broker.fetch(session + 1000, 1, {})[:2] == (ErrorCode.fetch_session_id_not_found, 0)
    assert broker.fetch(session, 5, {})[:2] == (ErrorCode.invalid_fetch_session_epoch, 0)
    assert broker.fetch(session, 1, {}, version=13)[:2] == \
        (ErrorCode.fetch_session_topic_id_error, 0)
    assert broker.fetch(session, 1, {})[:2] == (ErrorCode.none, session)  # the errors changed nothing
    # A full fetch naming the session closes it; with epoch -1 no new one is opened.
    assert broker.fetch(session, -1, {"a": {0: 0}})[1] == 0
    assert len(broker.sessions) == 0
    assert broker.fetch(session, 2, {})[:2] == (ErrorCode.fetch_session_id_not_found, 0)


def test_forgotten_partitions_leave_and_an_emptied_session_closes(broker):
    broker.produce("a", 2, 1)
    _, session, _ = broker.fetch(0, 0, {"a": {0: 0, 2: 0}})
    broker.produce("a", 2, 1)
    assert broker.fetch(session, 1, {}, forget={"a": [2]}) == (ErrorCode.none, session, {})
    assert broker.sessions.partitions == 1
    error, closed, parts = broker.fetch(session, 2, {}, forget={"a": [0]})
    assert (error, closed, parts) == (ErrorCode.none, 0, {}) and len(broker.sessions) == 0


def test_topic_id_sessions_of_fetch_v13(broker):
    broker.produce("b", 0, 2)
    error, session, parts = broker.fetch(0, 0, {"a": {0: 0}, "b": {0: 0}}, version=13)
    assert error == ErrorCode.none and session and parts["b", 0][0] == 2
    broker.produce("a", 0, 1)
    assert list(broker.fetch(session, 1, {"b": {0: 2}}, version=13)[2]) == [("a", 0)]
    assert broker.fetch(session, 2, {}, version=12)[:2] == \
        (ErrorCode.fetch_session_topic_id_error, 0)


def test_a_partition_in_error_is_answered_until_the_error_is_gone(broker):
    _, session, parts = broker.fetch(0, 0, {"a": {0: 5}})  # beyond the end
    assert parts["a", 0][2] == 1  # OFFSET_OUT_OF_RANGE
    assert broker.fetch(session, 1, {})[2]["a", 0][2] == 1  # still wrong: said again
    broker.produce("a", 0, 5)
    assert broker.fetch(session, 2, {})[2]["a", 0][:2] == (5, 0)  # fine now, high watermark 5
    assert broker.fetch(session, 3, {}) == (ErrorCode.none, session, {})


def test_partitions_that_returned_records_go_to_the_back(broker):
    _, session, _ = broker.fetch(0, 0, {"a": {0: 0, 1: 0, 2: 0}})
    broker.produce("a", 0, 1)
    broker.fetch(session, 1, {})
    order = [(cached.topic, cached.partition)
             for cached in broker.sessions.get(session).partitions.values()]
    assert order == [("a", 1), ("a", 2), ("a", 0)]


def test_with_no_slots_a_full_fetch_gets_no_session(tmp_path):
    broker = Broker(tmp_path, slots=0)
    broker.registry.create("a", 1)
    assert broker.fetch(0, 0, {"a": {0: 0}})[:2] == (ErrorCode.none, 0)


PARTITIONS = [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)]
OPERATIONS = st.one_of(
    st.tuples(st.just("produce"), st.sampled_from(PARTITIONS), st.integers(1, 3)),
    st.tuples(st.just("fetch")),
    st.tuples(st.sampled_from(["forget", "add"]), st.sampled_from(PARTITIONS)))


@settings(max_examples=40, deadline=None)
@given(st.lists(OPERATIONS, max_size=25))
def test_what_a_session_tells_adds_up_to_what_full_fetches_tell(operations):
    """A client that follows the protocol (names the partitions whose offset moved, forgets
    and adds some) always knows every partition's high watermark and gets every record."""
    with tempfile.TemporaryDirectory() as directory:
        broker = Broker(directory)
        broker.registry.create("a", 3)
        broker.registry.create("b", 2)
        offsets = {PARTITIONS[0]: 0, PARTITIONS[3]: 0}  # the session's partitions
        _, session, told = broker.fetch(0, 0, as_topics(offsets))
        known = {part: answer[0] for part, answer in told.items()}
        epoch, moved, forgotten = 1, {}, {}
        for operation in operations:
            if operation[0] == "produce":
                broker.produce(operation[1][0], operation[1][1], operation[2])
            elif operation[0] == "forget" and operation[1] in offsets and len(offsets) > 1:
                del offsets[operation[1]]  # what it knew stays: a forget and an add in
                moved.pop(operation[1], None)  # one request cancel out (Kafka adds first)
                forgotten[operation[1]] = True
            elif operation[0] == "add" and operation[1] not in offsets:
                offsets[operation[1]] = moved[operation[1]] = 0
                forgotten.pop(operation[1], None)
            elif operation[0] == "fetch":
                error, same, told = broker.fetch(session, epoch, as_topics(moved),
                                                 forget=as_topics(forgotten))
                assert (error, same) == (ErrorCode.none, session)
                epoch, moved, forgotten = epoch + 1, {}, {}
                truth = broker.fetch(0, -1, as_topics(offsets))[2]
                assert set(told) <= set(offsets)
                for part, (high, size, _error) in told.items():
                    known[part] = high
                    if size:
                        offsets[part] = moved[part] = high
                for part, (high, size, _error) in truth.items():
                    assert known.get(part) == high, part  # told, or unchanged since
                    assert bool(size) == (part in told and told[part][1] > 0), part


def as_topics(partitions) -> dict:
    topics: dict = {}
    for (topic, index), offset in dict(partitions).items():
        topics.setdefault(topic, {})[index] = offset if isinstance(offset, int) else 0
    return topics


# --- the cache: slots, fair share, eviction -------------------------------------------------

class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def parts(count: int) -> dict:
    return {("t", index): CachedPartition("t", index, 0, 1024) for index in range(count)}


def cache(slots=2, share=None, clock=None, budget=10_000, **more):
    return FetchSessionCache(slots, slots if share is None else share, 0, 1, 1000, budget,
                             eviction_ms=120_000, clock=clock or Clock(), **more)


def test_a_full_cache_evicts_a_stale_session_first():
    clock = Clock()
    sessions = cache(clock=clock)
    first, second = sessions.create(False, parts(5)), sessions.create(False, parts(5))
    assert sessions.create(False, parts(1)) == 0  # full, nothing stale, nothing old
    clock.now += 100
    sessions.touch(sessions.get(first))
    clock.now += 30  # `second` unused for 130 s: stale
    third = sessions.create(False, parts(1))
    assert third and sessions.get(second) is None and sessions.get(first) is not None
    assert sessions.evictions == 1


def test_a_bigger_session_evicts_the_smallest_one_past_the_eviction_age():
    clock = Clock()
    sessions = cache(clock=clock)
    small, big = sessions.create(False, parts(2)), sessions.create(False, parts(9))
    clock.now += 60
    assert sessions.create(False, parts(50)) == 0  # both too young to be evicted
    clock.now += 70
    for session_id in (small, big):
        sessions.touch(sessions.get(session_id))  # in use: not stale, but old enough
    assert sessions.create(False, parts(2)) == 0  # not bigger than the smallest
    assert sessions.create(False, parts(3)) and sessions.get(small) is None
    assert sessions.get(big) is not None


def test_slots_are_shared_fairly_between_workers():
    counts = {0: 0, 1: 0}

    def worker(index):
        def publish(sessions, _partitions, _evictions):
            counts[index] = sessions
        return FetchSessionCache(4, 2, index, 2, 1000, 10_000, clock=Clock(),
                                 total=lambda: sum(counts.values()), publish=publish)

    first, second = worker(0), worker(1)
    borrowed = [first.create(False, parts(1)) for _ in range(4)]
    assert all(borrowed) and counts == {0: 4, 1: 0}  # free slots are lent
    assert all(session_id % 2 == 0 for session_id in borrowed)  # ids carry the worker's slot
    assert first.create(False, parts(1)) == 0
    second.create(False, parts(1))  # below its share: takes a slot even though none is free
    assert counts == {0: 4, 1: 1}
    first.tick()  # ... and the lender gives one back, its least recently used
    assert counts == {0: 3, 1: 1} and first.get(borrowed[0]) is None
    second.create(False, parts(1))
    first.tick()
    assert counts == {0: 2, 1: 2}
    first.tick()  # at its share: keeps what it has
    assert counts == {0: 2, 1: 2} and first.evictions == 2


def test_the_partition_budget_bounds_sessions_and_their_growth():
    clock = Clock()
    sessions = cache(slots=10, clock=clock, budget=100)
    assert sessions.create(False, parts(101)) == 0
    first = sessions.create(False, parts(60))
    assert sessions.create(False, parts(50)) == 0  # over the budget, nothing evictable
    session = sessions.get(first)
    session.partitions.update({("u", index): CachedPartition("u", index, 0, 1)
                               for index in range(40)})
    assert sessions.fits(session)
    session.partitions[("u", 41)] = CachedPartition("u", 41, 0, 1)
    assert not sessions.fits(session)
    clock.now += 200  # stale now: a newcomer may take its partitions
    assert sessions.create(False, parts(50)) and sessions.get(first) is None
    assert sessions.partitions == 50


def test_bad_shares_are_refused():
    with pytest.raises(ValueError):
        FetchSessionCache(2, 3, 0, 1, 10, 10)
    with pytest.raises(ValueError):
        FetchSessionCache(2, 1, 2, 2, 10, 10)


# --- a real consumer of 500 partitions, with sessions and without ----------------------------

class CountingRelay:
    """A TCP relay on 127.0.0.1 that reads the Kafka frames passing through: requests and
    bytes per API key, both ways, and each Fetch's session id and epoch."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.requests, self.bytes, self.fetch_sessions = Counter(), Counter(), []

    def start(self, target: tuple[str, int]) -> None:
        threading.Thread(target=self._accept, args=(target,), daemon=True).start()

    def close(self) -> None:
        for sock in [self.server, *self.sockets]:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self, target) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(target)
            self.sockets += [client, upstream]
            asked: dict[int, int] = {}  # correlation id -> API key
            threading.Thread(target=self._pump, args=(client, upstream, asked, True),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, asked, False),
                             daemon=True).start()

    def _pump(self, source, sink, asked: dict, requests: bool) -> None:
        pending = b""
        while True:
            try:
                data = source.recv(1 << 16)
                if not data:
                    break
                sink.sendall(data)
            except OSError:
                break
            pending += data
            while len(pending) >= 4 and len(pending) >= 4 + int.from_bytes(pending[:4], "big"):
                size = int.from_bytes(pending[:4], "big")
                frame, pending = pending[4:4 + size], pending[4 + size:]
                self._count(frame, asked, requests, size + 4)
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _count(self, frame: bytes, asked: dict, request: bool, size: int) -> None:
        if request:
            api_key, version, correlation = struct.unpack_from(">hhi", frame)
            asked[correlation] = api_key
            if api_key == 1 and version >= 12:  # flexible header: client id, no tags
                client_id = struct.unpack_from(">h", frame, 8)[0]
                body = 10 + max(client_id, 0) + 1
                with self.lock:
                    self.fetch_sessions.append(struct.unpack_from(">ii", frame, body + 17))
        else:
            api_key = asked.pop(struct.unpack_from(">i", frame)[0], -1)
        with self.lock:
            self.requests[api_key] += request
            self.bytes[api_key] += size


def consume_through(bootstrap: str, relay: CountingRelay, expected: int, sessions: bool,
                    idle_fetches: int = 30) -> tuple[set, int, int]:
    """Every record of topic `wide` from the start, then `idle_fetches` fetches that find
    nothing new: (records, Fetch round trips, Fetch bytes both ways)."""
    relay.reset()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=20,
                             enable_incremental_fetch_sessions=sessions, request_timeout_ms=10000)
    try:
        consumer.assign([TopicPartition("wide", index) for index in range(500)])
        consumer.seek_to_beginning()
        records: set = set()
        deadline = time.monotonic() + 60
        while len(records) < expected and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=200).values():
                records.update((r.partition, r.offset, r.value) for r in batch)
        with relay.lock:
            done_at = relay.requests[1]
        while time.monotonic() < deadline:
            consumer.poll(timeout_ms=50)
            with relay.lock:
                if relay.requests[1] >= done_at + idle_fetches:
                    break
    finally:
        consumer.close()
    with relay.lock:
        return records, relay.requests[1], relay.bytes[1]


@pytest.mark.system
def test_a_consumer_of_500_partitions_gets_the_same_records_for_fewer_bytes_in_a_session():
    relay = CountingRelay()
    overrides = {"advertised.listeners": f"PLAINTEXT://127.0.0.1:{relay.port}"}
    try:
        with BrokerProcess(overrides) as broker:
            relay.start(broker.listeners["PLAINTEXT"])
            create_topic(broker.bootstrap, "wide", 500)
            producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5)
            for index in range(3000):
                producer.send("wide", b"record-%d" % index, partition=index % 500)
            producer.flush()
            producer.close()
            bootstrap = f"127.0.0.1:{relay.port}"
            with_session = consume_through(bootstrap, relay, 3000, sessions=True)
            epochs = list(relay.fetch_sessions)
            assert broker.metric("broker_incremental_fetch_sessions") >= 1
            without = consume_through(bootstrap, relay, 3000, sessions=False)
            assert {epoch for _session, epoch in relay.fetch_sessions} == {-1}
    finally:
        relay.close()
    assert len(with_session[0]) == 3000 and with_session[0] == without[0]
    assert any(session and epoch > 0 for session, epoch in epochs)  # incremental fetches
    per_fetch = [total / fetches for _records, fetches, total in (with_session, without)]
    print(f"\n500 partitions, 3000 records: with a session {with_session[2]} bytes in "
          f"{with_session[1]} fetches ({per_fetch[0]:.0f} per fetch), without "
          f"{without[2]} bytes in {without[1]} fetches ({per_fetch[1]:.0f} per fetch)")
    assert with_session[2] < without[2] / 2 and per_fetch[0] < per_fetch[1] / 5
