"""Apache Kafka 4.4.0 beside this broker: a single-node KRaft Kafka (`ApacheKafka`) or a
replicated cluster of several (`KafkaCluster`) started from the jars `compat/pom.xml` resolves
into `compat/lib`, and Kafka's command-line tools run by class name.

`python -m loadtest.apache_kafka` starts one and prints its bootstrap address until SIGTERM or
Ctrl-C; `python -m loadtest.apache_kafka tool <name|class> [args...]` runs a tool (the names
are those of Kafka's `bin/kafka-*.sh` scripts).  Everything listens on 127.0.0.1, on ports the
kernel picked free a moment before, and lives in a temporary directory removed on stop.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPAT = os.path.join(ROOT, "compat")
LIB = os.path.join(COMPAT, "lib")
CLASSES = os.path.join(COMPAT, "target", "classes")
LOG4J = os.path.join(COMPAT, "log4j2.properties")
VERSION = "4.4.0"

# Kafka's scripts, by the class each one runs (bin/kafka-*.sh in the distribution).
TOOLS = {
    "kafka-topics": "org.apache.kafka.tools.TopicCommand",
    "kafka-configs": "org.apache.kafka.tools.ConfigCommand",
    "kafka-acls": "org.apache.kafka.tools.AclCommand",
    "kafka-consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "kafka-groups": "org.apache.kafka.tools.GroupsCommand",
    "kafka-share-groups": "org.apache.kafka.tools.consumer.group.ShareGroupCommand",
    "kafka-transactions": "org.apache.kafka.tools.TransactionsCommand",
    "kafka-delete-records": "org.apache.kafka.tools.DeleteRecordsCommand",
    "kafka-log-dirs": "org.apache.kafka.tools.LogDirsCommand",
    "kafka-get-offsets": "org.apache.kafka.tools.GetOffsetShell",
    "kafka-console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "kafka-console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "kafka-verifiable-producer": "org.apache.kafka.tools.VerifiableProducer",
    "kafka-verifiable-consumer": "org.apache.kafka.tools.VerifiableConsumer",
    "kafka-producer-perf-test": "org.apache.kafka.tools.ProducerPerformance",
    "kafka-consumer-perf-test": "org.apache.kafka.tools.ConsumerPerformance",
    "kafka-broker-api-versions": "org.apache.kafka.tools.BrokerApiVersionsCommand",
    "kafka-storage": "kafka.tools.StorageTool",
}

# The JVM options kafka-run-class.sh and kafka-server-start.sh give, with a smaller heap for
# tools; a client JVM compiles little, so tiered compilation stops at C1 for a quick start.
# The JVM's own warnings go to stderr (its default is stdout, where the tools print what the
# tests parse), and class-data sharing's not at all: a tool maps an archive when it can
# (`class_sharing`) and runs without one, as fast as before, when it cannot.
SERVER_JVM = ["-Xms1G", "-Xmx1G", "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
              "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
              "-Djava.awt.headless=true"]
TOOL_JVM = ["-Xmx512M", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
            "-Djava.awt.headless=true", "-Xlog:disable", "-Xlog:all=warning,cds*=off:stderr"]
ARCHIVES = os.path.join(COMPAT, "target", "cds")

MISSING = ("Apache Kafka's jars are not in compat/lib: run `make kafka` (needs Java 17+ and "
           "Maven: 'apt-get install default-jdk-headless maven' on Debian/Ubuntu)")


def classpath() -> str:
    """Kafka's jars, then the classes compiled from compat/src (jars first: a class-data
    archive records jars only, and must be a prefix of the class path that maps it)."""
    if not os.path.isdir(LIB) or not any(n.startswith("kafka_2.13-") for n in os.listdir(LIB)):
        raise RuntimeError(MISSING)
    return os.pathsep.join([os.path.join(LIB, "*"), CLASSES])


@functools.lru_cache(maxsize=1)
def tool_archive() -> str:
    """The class-data archive of the tools' JVMs, named after the jars and the JDK it holds
    classes of (other jars or another JDK: another archive)."""
    files = [os.path.realpath(shutil.which("java") or "java"),
             *(os.path.join(LIB, name) for name in sorted(os.listdir(LIB)))]
    stamps = "\n".join(f"{path}:{os.stat(path).st_mtime_ns}" for path in files
                       if os.path.exists(path))
    digest = hashlib.sha256(stamps.encode()).hexdigest()[:16]
    return os.path.join(ARCHIVES, f"tools-{digest}.jsa")


_archiving = threading.Lock()  # held by the one run that writes the archive


def class_sharing(run):
    """Runs `run(jvm_options)` with the tools' class-data archive mapped (AppCDS: a tool's
    JVM then takes about half the CPU, 0.5 s instead of 1 s here, most of it class loading).
    Without the archive, the first run writes it at its exit, to a name of its own renamed
    into place after, while runs beside it go without."""
    archive = tool_archive()
    if os.path.exists(archive):
        return run([f"-XX:SharedArchiveFile={archive}"])
    if not _archiving.acquire(blocking=False):
        return run([])
    try:
        os.makedirs(ARCHIVES, exist_ok=True)
        written = f"{archive}.{os.getpid()}.tmp"
        result = run([f"-XX:ArchiveClassesAtExit={written}"])
        if os.path.exists(written):
            os.replace(written, archive)
        return result
    finally:
        _archiving.release()


def java_command(main_class: str, args: list[str], jvm: list[str] | None = None,
                 log_dir: str | None = None) -> list[str]:
    """The command line that runs `main_class` on Kafka's classpath, logging as `log4j2`
    says (warnings to stderr, or everything to `log_dir`/server.log when given)."""
    options = list(TOOL_JVM if jvm is None else jvm)
    options.append(f"-Dlog4j2.configurationFile={LOG4J}")
    if log_dir:
        options += [f"-Dkafka.logs.dir={log_dir}", "-Dkafka.log.appender=file",
                    "-Dkafka.log.level=info"]
    return ["java", *options, "-cp", classpath(), main_class, *args]


def tool(name: str, *args: str, timeout: float = 120.0, check: bool = True,
         stdin: str | None = None) -> subprocess.CompletedProcess:
    """Runs one of Kafka's tools (a script name from TOOLS, or a class) and returns its
    output; raises when it exits non-zero and `check` is set."""
    def run(sharing: list[str]) -> subprocess.CompletedProcess:
        command = java_command(TOOLS.get(name, name), list(args), TOOL_JVM + sharing)
        return subprocess.run(command, input=stdin, capture_output=True, text=True,
                              timeout=timeout)

    result = class_sharing(run)
    if check and result.returncode != 0:
        raise RuntimeError(f"{name} {' '.join(args)} exited {result.returncode}:\n"
                           f"{result.stdout[-2000:]}{result.stderr[-4000:]}")
    return result


def tool_process(name: str, *args: str, **popen) -> subprocess.Popen:
    """Starts one of Kafka's tools in the background (a verifiable consumer, a console
    consumer), mapping the class-data archive when there is one; `popen` goes to Popen."""
    archive = tool_archive()
    sharing = [f"-XX:SharedArchiveFile={archive}"] if os.path.exists(archive) else []
    return subprocess.Popen(java_command(TOOLS.get(name, name), list(args), TOOL_JVM + sharing),
                            **popen)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def server_properties(directory: str, port: int, controller_port: int,
                      extra: dict[str, str]) -> str:
    """A combined broker+controller node, one replica of everything, 127.0.0.1 only."""
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": os.path.join(directory, "logs"),
        "num.partitions": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
    }
    settings.update(extra)
    return "".join(f"{key}={value}\n" for key, value in settings.items())


class ApacheKafka:
    """One Apache Kafka node in its own temporary directory, started and stopped by pid."""

    def __init__(self, overrides: dict[str, str] | None = None, heap: str = "1G"):
        self.overrides = dict(overrides or {})
        self.heap = heap
        self.directory = tempfile.mkdtemp(prefix="apache-kafka-")
        self.port = free_port()
        self.controller_port = free_port()
        self.cluster_id = uuid.uuid4().hex[:22]  # one id, so a start after kill() finds its data
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        self._log_start = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def pids(self) -> list[int]:
        return [self.proc.pid]

    @property
    def log_path(self) -> str:
        return os.path.join(self.directory, "server.log")

    def start(self, timeout: float = 90.0) -> "ApacheKafka":
        config = os.path.join(self.directory, "server.properties")
        with open(config, "w") as out:
            out.write(server_properties(self.directory, self.port, self.controller_port,
                                        self.overrides))
        subprocess.run(java_command(TOOLS["kafka-storage"],
                                    ["format", "-t", self.cluster_id, "-c", config,
                                     "--ignore-formatted"]),
                       check=True, capture_output=True, timeout=120)
        jvm = [f"-Xms{self.heap}", f"-Xmx{self.heap}", *SERVER_JVM[2:]]
        self._log_start = self._log_size()  # a start after kill() appends to the same log
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(java_command("kafka.Kafka", [config], jvm, self.directory),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     start_new_session=True)
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Apache Kafka exited {self.proc.returncode}:\n"
                                   f"{self.proc.stderr.read().decode()[-4000:]}"
                                   f"{self._log_tail()}")
            if "Kafka Server started" in self._log_since(self._log_start):
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"Apache Kafka did not start in {timeout:.0f} s:\n{self._log_tail()}")

    def _log_size(self) -> int:
        try:
            return os.path.getsize(self.log_path)
        except FileNotFoundError:
            return 0

    def _log_since(self, position: int) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(position)
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def _log_tail(self, size: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(0, log.tell() - size))
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.directory, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL, the data directory kept (start() again reads it)."""
        self.proc.kill()
        self.proc.wait(10)

    def __enter__(self) -> "ApacheKafka":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class KafkaCluster:
    """A KRaft cluster of `size` combined broker+controller nodes on 127.0.0.1, each an
    ApacheKafka of its own (node ids 1..size, static voters, one cluster id), replicated as a
    production cluster is: replication factor `size`, min.insync.replicas size - 1.  Started
    together (a node waits for a quorum); one node killed and started again by its id."""

    def __init__(self, size: int = 3, overrides: dict[str, str] | None = None,
                 heap: str = "256m"):
        self.nodes = [ApacheKafka(heap=heap) for _ in range(size)]
        voters = ",".join(f"{number}@127.0.0.1:{node.controller_port}"
                          for number, node in enumerate(self.nodes, 1))
        replicas, in_sync = str(size), str(max(1, size - 1))
        replicated = {
            "controller.quorum.voters": voters, "default.replication.factor": replicas,
            "min.insync.replicas": in_sync, "num.partitions": "3",
            "offsets.topic.replication.factor": replicas, "offsets.topic.num.partitions": "3",
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": in_sync,
            "transaction.state.log.num.partitions": "3",
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": in_sync,
            "unclean.leader.election.enable": "false"}
        for number, node in enumerate(self.nodes, 1):
            node.cluster_id = self.nodes[0].cluster_id
            node.overrides.update(replicated, **{"node.id": str(number)}, **(overrides or {}))

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    def node(self, node_id: int) -> ApacheKafka:
        return self.nodes[node_id - 1]

    def start(self, timeout: float = 120.0) -> "KafkaCluster":
        """Every node at once (each waits for the quorum the others make)."""
        with concurrent.futures.ThreadPoolExecutor(len(self.nodes)) as pool:
            started = [pool.submit(node.start, timeout) for node in self.nodes]
            failures = [future.exception() for future in started if future.exception()]
        if failures:
            self.stop()
            raise failures[0]
        return self

    def kill(self, node_id: int) -> None:
        """SIGKILL one node, its data kept: `restart(node_id)` brings it back."""
        self.node(node_id).kill()

    def restart(self, node_id: int, timeout: float = 120.0) -> None:
        self.node(node_id).start(timeout)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> "KafkaCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str]) -> int:
    if argv and argv[0] == "tool":
        if len(argv) < 2:
            print("usage: python -m loadtest.apache_kafka tool <name|class> [args...]",
                  file=sys.stderr)
            return 2
        command = functools.partial(java_command, TOOLS.get(argv[1], argv[1]), argv[2:])
        return class_sharing(lambda sharing: subprocess.run(
            command(TOOL_JVM + sharing)).returncode)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    with ApacheKafka() as kafka:
        print(f"Apache Kafka {VERSION} ready: bootstrap {kafka.bootstrap} "
              f"(pid {kafka.pid}, log {kafka.log_path})", flush=True)
        try:
            while not stop and kafka.proc.poll() is None:
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
