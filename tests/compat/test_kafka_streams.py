"""Kafka Streams 4.4 against this broker: a word count with exactly_once_v2
(compat/src/main/java/pybroker/compat/WordCount.java: lines split into words, regrouped through
a repartition topic, counted in a state store with a compacted changelog) whose committed
output is exact across `kill -9` of the broker while the application processes and commits.

The short test kills the broker once; the long set (`make compat`) kills it three times and the
application once, with more input, and runs the same against Apache Kafka 4.4.0 to show the
assertions hold for the reference broker."""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import threading
import time

import pytest

from loadtest.apache_kafka import ApacheKafka, java_command
from tests.harness import BrokerProcess, wait_until
from tests.helpers import create_topics

pytestmark = pytest.mark.system

APP_ID = "wordcount"
INPUT, OUTPUT = "lines", "counts"
REPARTITION = f"{APP_ID}-words-repartition"  # Grouped.with("words") in WordCount.java
CHANGELOG = f"{APP_ID}-counts-changelog"  # Materialized.as("counts")
PARTITIONS = 2
OVERRIDES = {"group.initial.rebalance.delay.ms": "0",
             "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500"}
# Purges of the repartition topic (DeleteRecords) every commit or so, not every 30 s.
APP_SETTINGS = ["repartition.purge.interval.ms=200"]
VOCABULARY = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
              "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee "
              "zulu").split()


def text(count: int) -> list[str]:
    """`count` lines of one to six words each, the same every run."""
    return [" ".join(VOCABULARY[(number * 7 + place * 3) % len(VOCABULARY)]
                     for place in range(number % 6 + 1)) for number in range(count)]


class WordCountApp:
    """The WordCount JVM; its stdout (state changes, thread errors) read on a thread, its
    log (warnings) kept in a file beside the state directory."""

    def __init__(self, bootstrap: str, directory: str, settings: list[str]):
        self.state_dir = os.path.join(directory, "state")
        self.log_path = os.path.join(directory, "wordcount.log")
        self.command = java_command("pybroker.compat.WordCount",
                                    [bootstrap, APP_ID, INPUT, OUTPUT, self.state_dir, *settings])
        self.lines: list[str] = []
        self.proc: subprocess.Popen | None = None

    def start(self) -> "WordCountApp":
        self.lines.clear()
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=log,
                                         text=True, start_new_session=True)
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        return self

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_running(self, timeout: float = 60.0) -> None:
        wait_until(lambda: self._said("-> RUNNING") or self.proc.poll() is not None,
                   timeout=timeout, message=f"WordCount never RUNNING:\n{self.tail()}")
        assert self.proc.poll() is None, f"WordCount exited {self.proc.returncode}:\n{self.tail()}"

    def _said(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    @property
    def thread_errors(self) -> list[str]:
        return [line for line in self.lines if line.startswith("THREAD-ERROR")]

    def check_alive(self) -> None:
        """Fails at once when a stream thread died or the JVM exited."""
        assert not self.thread_errors and self.proc.poll() is None, \
            f"WordCount failed (exit {self.proc.poll()}):\n{self.tail()}"

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM: KafkaStreams.close(), then exit status 0."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def tail(self) -> str:
        with open(self.log_path, errors="replace") as log:
            return "\n".join(self.lines[-20:]) + "\n" + log.read()[-4000:]


class CommittedCounts:
    """The output topic read with read_committed from its beginning by an assigned consumer
    (no group, so no rebalance ever moves it back): every value each word was given, and
    `counted`, the sum of each word's last value (words counted and committed)."""

    def __init__(self, bootstrap: str):
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                                  "isolation.level": "read_committed",
                                  "enable.auto.commit": False, "enable.partition.eof": False})
        self.consumer.assign([TopicPartition(OUTPUT, p, OFFSET_BEGINNING)
                              for p in range(PARTITIONS)])
        self.values: dict[str, list[int]] = collections.defaultdict(list)
        self.counted = 0

    def read(self, until, timeout: float, app: WordCountApp) -> None:
        """Read until `until()` holds; fail with the application's log if it does not."""
        deadline = time.monotonic() + timeout
        while not until():
            app.check_alive()
            assert time.monotonic() < deadline, \
                f"output after {timeout} s: {self.latest()}\n{app.tail()}"
            message = self.consumer.poll(0.2)
            if message is not None and message.error() is None:
                values = self.values[message.key().decode()]
                value = int.from_bytes(message.value(), "big", signed=True)
                self.counted += value - (values[-1] if values else 0)
                values.append(value)

    def latest(self) -> dict[str, int]:
        return {word: values[-1] for word, values in self.values.items()}

    def close(self) -> None:
        self.consumer.close()


class InputFeed(threading.Thread):
    """The text produced in order by an idempotent confluent-kafka producer, never more than
    `ahead` words past what the application has counted: it is busy until the feed ends,
    whatever the machine's speed, so a kill while the feed runs hits it mid-work.  Every line
    must be acknowledged."""

    def __init__(self, bootstrap: str, lines: list[str], counts: CommittedCounts, ahead: int,
                 timeout: float = 120.0):
        super().__init__(daemon=True)
        self.bootstrap, self.lines, self.counts = bootstrap, lines, counts
        self.ahead, self.timeout = ahead, timeout
        self.produced = 0
        self.failures: list = []
        self.unflushed = -1

    def run(self) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True,
                             "linger.ms": 5, "message.timeout.ms": 120_000})
        fed = 0
        for number, line in enumerate(self.lines):
            fed += len(line.split())
            if not self._wait_for_room(fed, producer):
                self.failures.append(f"the output stayed {self.ahead} words behind "
                                     f"for {self.timeout} s")
                break
            producer.produce(INPUT, key=str(number), value=line, on_delivery=self._delivered)
            self.produced += 1
        self.unflushed = producer.flush(self.timeout)

    def _wait_for_room(self, fed: int, producer) -> bool:
        deadline = time.monotonic() + self.timeout
        while fed - self.counts.counted > self.ahead:
            if time.monotonic() > deadline:
                return False
            producer.poll(0.01)
        return True

    def _delivered(self, error, _message) -> None:
        if error is not None:
            self.failures.append(error)


class OurBroker:
    """This broker on a data directory and a port of its own: killed with SIGKILL (parent and
    workers) and restarted on both, so the application's bootstrap address stays valid."""

    PROBLEM = re.compile(r" (ERROR|CRITICAL) |Traceback")
    # Its groups' members stay across a restart, their sessions counted from when it serves.
    keeps_members = True

    def __init__(self, data_dir: str):
        self.data_dir = data_dir
        self.process = BrokerProcess(workers=2, data_dir=data_dir, overrides=OVERRIDES).start()
        self.port = self.process.port
        self.earlier_lines: list[str] = []

    @property
    def bootstrap(self) -> str:
        return self.process.bootstrap

    def problems(self) -> list[str]:
        """Lines of every run of the broker that say something went wrong inside it."""
        return [line for line in self.earlier_lines + self.process.lines
                if self.PROBLEM.search(line)]

    def kill(self) -> None:
        self.process.kill()
        self.earlier_lines += self.process.lines

    def restart(self) -> None:
        listener = {"listeners": f"PLAINTEXT://127.0.0.1:{self.port}"}
        self.process = BrokerProcess(workers=2, data_dir=self.data_dir,
                                     overrides=dict(OVERRIDES, **listener)).start()

    def stop(self) -> None:
        self.process.stop()


class TheirBroker:
    """Apache Kafka 4.4.0 with the same interface: kill -9 keeps its directory and ports."""

    # Kafka loads a group, and starts its members' sessions, seconds before it serves (while
    # it registers with its controller): a slow start on a loaded machine expires them.
    keeps_members = False

    def __init__(self):
        self.kafka = ApacheKafka().start()
        self.bootstrap = self.kafka.bootstrap

    def kill(self) -> None:
        self.kafka.kill()

    def restart(self) -> None:
        self.kafka.start()

    def problems(self) -> list[str]:
        return []  # its log is its own business

    def stop(self) -> None:
        self.kafka.stop()


def internal_topics(bootstrap: str) -> dict[str, dict[str, str]]:
    """The application's own topics as the broker lists them: name -> partitions and the
    configs that make them what they are."""
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient({"bootstrap.servers": bootstrap})
    listed = admin.list_topics(timeout=10).topics
    found = {}
    for name in (REPARTITION, CHANGELOG):
        if name not in listed:
            continue
        (future,) = admin.describe_configs([ConfigResource("topic", name)]).values()
        configs = future.result(10)
        found[name] = {"partitions": str(len(listed[name].partitions)),
                       **{key: configs[key].value for key in ("cleanup.policy", "retention.ms")}}
    return found


def group_members(bootstrap: str) -> set[str]:
    """The member ids of the application's consumer group."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    (future,) = admin.describe_consumer_groups([APP_ID]).values()
    return {member.member_id for member in future.result(10).members}


def committed_and_end_offsets(bootstrap: str, group: str, topic: str) -> tuple[list, list]:
    """The offsets `group` committed on each partition of `topic`, and its end offsets."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "isolation.level": "read_committed"})
    try:
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        committed = [tp.offset for tp in consumer.committed(partitions, timeout=10)]
        ends = [consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in partitions]
        return committed, ends
    finally:
        consumer.close()


def purged_up_to(bootstrap: str, topic: str) -> list[int]:
    """Each partition's log start offset (DeleteRecords moved it past what was consumed)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused"})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[0]
                for p in range(PARTITIONS)]
    finally:
        consumer.close()


def run_word_count(broker, directory: str, lines: list[str], kills: list[tuple[float, str]],
                   ahead: int) -> None:
    """The word count over `lines` fed while it runs; at each (fraction of the lines fed,
    what) the broker, the application or both are killed with SIGKILL and started again on
    their data.  Then every assertion of exactly-once."""
    expected = collections.Counter(word for line in lines for word in line.split())
    create_topics(broker.bootstrap, INPUT, OUTPUT, partitions=PARTITIONS, timeout=30)
    app = WordCountApp(broker.bootstrap, directory, APP_SETTINGS).start()
    counts = None
    try:
        app.wait_running()
        counts = CommittedCounts(broker.bootstrap)
        feed = InputFeed(broker.bootstrap, lines, counts, ahead)
        feed.start()
        members = None
        for fraction, victim in kills:
            members = kill_mid_run(broker, app, feed, counts, fraction, victim)
        members = members if broker.keeps_members else None
        counts.read(lambda: counts.latest() == expected, timeout=90, app=app)
        feed.join(30)
        assert feed.failures == [] and feed.unflushed == 0
        assert app.thread_errors == [], app.tail()
        # A restart of the broker alone keeps the group's members (their tasks and state).
        assert members is None or group_members(broker.bootstrap) == members
        check_exactly_once(broker, counts, expected)
        assert app.stop() == 0 and "CLOSED" in app.lines, app.tail()
        committed, ends = committed_and_end_offsets(broker.bootstrap, APP_ID, INPUT)
        assert committed == ends  # every line consumed, its offset committed in a transaction
        assert broker.problems() == []
    finally:
        if counts is not None:
            counts.close()
        app.kill()


def kill_mid_run(broker, app: WordCountApp, feed: InputFeed, counts: CommittedCounts,
                 fraction: float, victim: str) -> set[str] | None:
    """Once `fraction` of the lines are fed and the application counted more since the last
    kill, SIGKILL to `victim` ("broker", "app" or "both"), started again on its data.  The
    group's members before a kill of the broker alone (None otherwise)."""
    counted = counts.counted
    counts.read(lambda: feed.produced >= fraction * len(feed.lines) and
                counts.counted > counted, timeout=90, app=app)
    assert feed.is_alive(), "the input ended before the kill: it would kill an idle app"
    print(f"kill -9 {victim}: {feed.produced} lines fed, "  # shown if the test fails
          f"{counts.counted} words counted")
    members = group_members(broker.bootstrap) if victim == "broker" else None
    if victim in ("app", "both"):
        app.kill()
    if victim in ("broker", "both"):
        broker.kill()
        broker.restart()
    if victim in ("app", "both"):
        app.start().wait_running()
    return members


def check_exactly_once(broker, counts: CommittedCounts, expected: collections.Counter) -> None:
    """Each word's committed values rise to its exact count (no increment committed twice,
    none lost); the internal topics are there with their configs; the repartition topic was
    purged (DeleteRecords) behind the application."""
    for word, values in counts.values.items():
        assert all(a < b for a, b in zip(values, values[1:])), (word, values)
        assert values[-1] == expected[word]
    assert internal_topics(broker.bootstrap) == {
        REPARTITION: {"partitions": str(PARTITIONS), "cleanup.policy": "delete",
                      "retention.ms": "-1"},
        CHANGELOG: {"partitions": str(PARTITIONS), "cleanup.policy": "compact",
                    "retention.ms": "604800000"}}
    wait_until(lambda: all(purged_up_to(broker.bootstrap, REPARTITION)), timeout=20,
               message="the repartition topic was never purged (DeleteRecords)")


def test_word_count_is_exact_across_a_killed_broker(tmp_path):
    broker = OurBroker(str(tmp_path / "broker"))
    try:
        run_word_count(broker, str(tmp_path), text(3000), [(0.3, "broker")], ahead=2000)
    finally:
        broker.stop()


@pytest.mark.long
@pytest.mark.parametrize("which", ["this broker", "Apache Kafka"])
def test_word_count_is_exact_across_kills_of_broker_and_application(tmp_path, which):
    """On Apache Kafka too: the assertions hold for the reference broker."""
    broker = OurBroker(str(tmp_path / "broker")) if which == "this broker" else TheirBroker()
    try:
        run_word_count(broker, str(tmp_path), text(30_000),
                       [(0.15, "broker"), (0.35, "app"), (0.55, "both"), (0.75, "broker")],
                       ahead=4000)
    finally:
        broker.stop()
