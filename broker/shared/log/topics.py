"""The topic registry: which topics exist, their ids and partitions, on disk as Kafka lays it out.

A topic is the set of directories `<log dir>/<topic>-<n>` (n = 0..count-1) whose
`partition.metadata` names the same topic id.  Creating and deleting topics takes an exclusive
flock on `<first log dir>/.topics.lock` and then bumps the metadata epoch, a counter every
process can read (a cell of the shared block, written only under that lock); each process
re-reads the directories when the epoch moves.  Deleted partitions are renamed to
`<topic>-<n>.<id>-delete` first, so a half-deleted topic is never seen as a topic.
Partitions that went offline (broker.shared.log.partition) are listed in OFFLINE_FILE, so Metadata
can say so without opening every partition.  Topic-level configs (broker.shared.log.topic_config)
are kept in CONFIGS_FILE by topic id, written under the same lock with the epoch bumped: every
process gives its partition handles the new settings at its next look.
"""

from __future__ import annotations

import base64
import fcntl
import os
import re
import shutil
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import msgspec

from broker.shared.constants import INT_MAX
from broker.shared.log import topic_config
from broker.shared.log.files import OpenFiles, default_capacity
from broker.shared.log.partition import Partition
from broker.shared.log.settings import LogSettings

# Matched whole (fullmatch): with re.match, "$" would also match before a trailing newline.
LEGAL_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")
_PARTITION_DIR = re.compile(r"(.+)-(\d+)")
METADATA_FILE = "partition.metadata"
OFFLINE_FILE = ".pybroker-offline-partitions"  # "topic<TAB>index" lines, under the topics lock
CONFIGS_FILE = ".pybroker-topic-configs.json"  # {topic id: {key: value}}, under the topics lock


def is_legal_name(name: str) -> bool:
    """Kafka's rule: 1 to 249 of [a-zA-Z0-9._-], and neither "." nor ".."."""
    return bool(LEGAL_NAME.fullmatch(name)) and name not in (".", "..")


def encode_topic_id(topic_id: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(topic_id.bytes).decode().rstrip("=")


def decode_topic_id(text: str) -> uuid.UUID:
    return uuid.UUID(bytes=base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))


class Deletion(NamedTuple):
    """One name's outcome in TopicRegistry.delete_many: a Kafka error name, or None and the id
    of the topic deleted."""

    problem: str | None
    topic_id: uuid.UUID | None = None


@dataclass(frozen=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    directories: tuple[str, ...]  # one per partition, in partition order

    @property
    def partitions(self) -> int:
        return len(self.directories)


class Epoch:
    """The metadata epoch; a word of shared memory, or a plain cell for tests."""

    def __init__(self, words=None, index: int = 0):
        self.words = words if words is not None else [0]
        self.index = index if words is not None else 0

    def get(self) -> int:
        return self.words[self.index]

    def bump(self) -> None:
        self.words[self.index] += 1


class TopicRegistry:
    """One thread's view of the topics, and its handles on their partitions.

    `files` bounds the descriptors those handles hold (files.py): by default a quarter of the
    process's open-files limit; a process with several registries (the parent's threads)
    gives each a share."""

    def __init__(self, log_dirs: tuple[str, ...], settings: LogSettings, epoch: Epoch,
                 props=None, files: OpenFiles | None = None):
        self.log_dirs = log_dirs
        self.files = files if files is not None else OpenFiles(default_capacity())
        self.settings = settings  # the broker's; a topic's own configs override them
        self.props = props if props is not None else topic_config.DEFAULT_PROPS
        self.epoch = epoch
        self._configs: dict[str, dict[str, str]] = {}  # topic name -> its own configs
        self._seen_epoch = None
        self._topics: dict[str, TopicInfo] = {}
        self._by_id: dict[uuid.UUID, TopicInfo] = {}
        self._partitions: dict[tuple[str, int], Partition] = {}
        self._offline: set[tuple[str, int]] = set()

    # --- reading --------------------------------------------------------------------------

    def topics(self) -> dict[str, TopicInfo]:
        if self.epoch.get() != self._seen_epoch:
            self._reload()
        return self._topics

    def get(self, name: str) -> TopicInfo | None:
        return self.topics().get(name)

    def by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        self.topics()
        return self._by_id.get(topic_id)

    def partition(self, name: str, index: int) -> Partition | None:
        """A handle on an existing partition, or None."""
        topic = self.get(name)
        if topic is None or not 0 <= index < topic.partitions:
            return None
        key = (name, index)
        handle = self._partitions.get(key)
        if handle is None:
            handle = Partition(topic.directories[index], name, index, self._settings_of(name),
                               self.files)
            handle.on_offline = lambda: self.record_offline(name, index)
            self._partitions[key] = handle
        return handle

    def forget(self, name: str, index: int) -> None:
        """Close the handle on a partition (a duty over every partition keeps none)."""
        handle = self._partitions.pop((name, index), None)
        if handle is not None:
            handle.close()

    def configs(self, name: str) -> dict[str, str]:
        """The topic's own configs (not the broker's defaults)."""
        self.topics()
        return self._configs.get(name, {})

    def settings_for(self, name: str) -> LogSettings:
        self.topics()
        return self._settings_of(name)

    def _settings_of(self, name: str) -> LogSettings:
        return topic_config.topic_settings(self.settings, self.props,
                                           self._configs.get(name, {}))

    def set_configs(self, name: str, configs: dict[str, str]) -> str | None:
        """Replace a topic's own configs (validated by the caller); None or
        "unknown_topic_or_partition"."""
        with self._locked():
            topic = self.topics().get(name)
            if topic is None:
                return "unknown_topic_or_partition"
            stored = _read_configs(self.log_dirs[0])
            key = encode_topic_id(topic.topic_id)
            if configs:
                stored[key] = dict(configs)
            else:
                stored.pop(key, None)
            _write_configs(self.log_dirs[0], stored)
            self.epoch.bump()
        return None

    def record_offline(self, name: str, index: int) -> None:
        """A partition went offline: every process's Metadata answers must say so."""
        with self._locked():
            with open(os.path.join(self.log_dirs[0], OFFLINE_FILE), "a", encoding="utf-8") as out:
                out.write(f"{name}\t{index}\n")
            self.epoch.bump()

    def is_offline(self, name: str, index: int) -> bool:
        """Whether the partition was marked offline (Metadata shows it without a leader)."""
        self.topics()
        return (name, index) in self._offline

    def _reload(self) -> None:
        epoch = self.epoch.get()
        found: dict[str, dict[int, tuple[uuid.UUID, str]]] = {}
        for log_dir in self.log_dirs:
            try:
                names = os.listdir(log_dir)
            except FileNotFoundError:
                continue
            for name in names:
                match = _PARTITION_DIR.fullmatch(name)
                if match is None:
                    continue
                directory = os.path.join(log_dir, name)
                topic_id = _read_topic_id(directory)
                if topic_id is not None:
                    found.setdefault(match.group(1), {})[int(match.group(2))] = (topic_id, directory)
        topics = {}
        for name, partitions in found.items():
            ids = {topic_id for topic_id, _ in partitions.values()}
            count = 0
            while count in partitions:
                count += 1
            if len(ids) == 1 and count:
                topics[name] = TopicInfo(name, ids.pop(),
                                         tuple(partitions[i][1] for i in range(count)))
        for key, handle in list(self._partitions.items()):
            topic = topics.get(key[0])
            if topic is None or topic.topic_id != self._topics.get(key[0], topic).topic_id \
                    or key[1] >= topic.partitions:
                handle.close()
                del self._partitions[key]
        self._topics = topics
        self._by_id = {topic.topic_id: topic for topic in topics.values()}
        self._offline = _read_offline(self.log_dirs[0])
        stored = _read_configs(self.log_dirs[0])
        self._configs = {name: stored[encode_topic_id(topic.topic_id)]
                         for name, topic in topics.items()
                         if encode_topic_id(topic.topic_id) in stored}
        for (name, _index), handle in self._partitions.items():
            handle.settings = self._settings_of(name)  # a config change applies at once
        self._seen_epoch = epoch

    # --- changing -------------------------------------------------------------------------

    @contextmanager
    def _locked(self):
        os.makedirs(self.log_dirs[0], exist_ok=True)
        fd = os.open(os.path.join(self.log_dirs[0], ".topics.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._seen_epoch = None  # re-read under the lock
            yield
        finally:
            os.close(fd)

    def create(self, name: str, partitions: int, validate_only: bool = False,
               max_partitions: int = INT_MAX) -> str | None:
        """Create a topic at once; return None or a Kafka error name (CreateTopics builds
        large ones a slice at a time through `staging`)."""
        problem = self.check_new(name, partitions, max_partitions)
        if problem is not None or validate_only:
            return problem
        staging = self.staging(name, partitions)
        staging.build(partitions)
        return self.commit([staging])[0]

    def check_new(self, name: str, partitions: int, max_partitions: int) -> str | None:
        """Why a topic could not be created (a Kafka error name), or None."""
        if not is_legal_name(name):
            return "invalid_topic_exception"
        if not 1 <= partitions <= max_partitions:
            return "invalid_partitions"
        if name in self.topics():
            return "topic_already_exists"
        return None

    def staging(self, name: str, partitions: int, counts: dict | None = None,
                configs: dict[str, str] | None = None) -> "Staging":
        """A topic to build; `counts` (partitions per log dir) may be shared by the topics of
        one request, so the log dirs are listed once; `configs`: its own, validated."""
        staging = Staging(self, name, partitions, counts)
        staging.configs = dict(configs or {})
        return staging

    def log_dir_counts(self) -> dict[str, int]:
        return {log_dir: _partition_count(log_dir) for log_dir in self.log_dirs}

    def commit(self, stagings: list["Staging"]) -> list[str | None]:
        """Under the topics lock, once for all: each staged topic becomes a topic, or (if the
        name was taken meanwhile) is removed; per topic, None or "topic_already_exists"."""
        problems = []
        with self._locked():
            existing = self.topics()
            stored = None
            for staging in stagings:
                if staging.name in existing:
                    staging.abort()
                    problems.append("topic_already_exists")
                    continue
                if staging.configs:  # written before the topic appears: never seen without
                    stored = _read_configs(self.log_dirs[0]) if stored is None else stored
                    stored[encode_topic_id(staging.topic_id)] = dict(staging.configs)
                    _write_configs(self.log_dirs[0], stored)
                for staged, final in staging.built:
                    os.rename(staged, final)
                problems.append(None)
            if None in problems:
                self.epoch.bump()
        return problems

    def add_partitions(self, name: str, count: int, validate_only: bool = False,
                       max_partitions: int = INT_MAX) -> tuple[str, str] | None:
        """CreatePartitions at once: None, or (Kafka error name, message)."""
        staging = self.partition_staging(name, count, max_partitions)
        if not isinstance(staging, Staging) or validate_only:
            return None if isinstance(staging, Staging) else staging
        staging.build(count)
        return self.commit_partitions(staging)

    def partition_staging(self, name: str, count: int, max_partitions: int = INT_MAX):
        """The partitions CreatePartitions adds, to build (a slice at a time if the caller
        wishes) and then commit; or (Kafka error name, message) if they cannot be added."""
        topic = self.get(name)
        if topic is None:
            return "unknown_topic_or_partition", f"The topic '{name}' does not exist."
        if count < topic.partitions:  # Kafka's words (kafka-topics prints them)
            return "invalid_partitions", (f"The topic {name} currently has {topic.partitions} "
                                          f"partition(s); {count} would not be an increase.")
        if count == topic.partitions:
            return "invalid_partitions", f"Topic already has {count} partition(s)."
        if count > max_partitions:
            return "invalid_partitions", (f"{count} partitions is more than "
                                          f"pybroker.max.partitions.per.topic {max_partitions}.")
        return Staging(self, name, count, topic_id=topic.topic_id, first=topic.partitions)

    def commit_partitions(self, staging: "Staging") -> tuple[str, str] | None:
        """Rename the built partitions into place under the topics lock, unless the topic
        changed meanwhile (then they are dropped and the caller may ask again)."""
        name = staging.name
        with self._locked():
            current = self.topics().get(name)
            if current is None or current.topic_id != staging.topic_id or \
                    current.partitions != staging.first:
                staging.abort()  # deleted or grown meanwhile: the caller may ask again
                return "reassignment_in_progress", "The topic changed meanwhile; ask again."
            for staged, final in staging.built:
                os.rename(staged, final)
            self.epoch.bump()
        return None

    def delete(self, name: str) -> str | None:
        return self.delete_many([name])[0].problem

    def delete_many(self, names: list[str]) -> list[Deletion]:
        """Delete topics under one hold of the topics lock; per name, a Kafka error name or the
        id of the topic deleted.  Each partition directory is renamed `...-delete` (no longer a
        topic to anyone); its files are removed later by the parent (`remove_deleted`), off
        every request path, as Kafka deletes them after log.segment.delete.delay.ms."""
        outcomes, doomed = [], []
        with self._locked():
            existing = self.topics()
            for name in names:
                topic = existing.get(name)
                if topic is None:
                    outcomes.append(Deletion("unknown_topic_or_partition"))
                    continue
                for directory in topic.directories:
                    target = f"{directory}.{encode_topic_id(topic.topic_id)}-delete"
                    os.rename(directory, target)
                    doomed.append(target)
                outcomes.append(Deletion(None, topic.topic_id))
            if doomed:
                stored = _read_configs(self.log_dirs[0])
                gone = {encode_topic_id(outcome.topic_id) for outcome in outcomes
                        if outcome.problem is None}
                if gone & stored.keys():
                    _write_configs(self.log_dirs[0], {key: value for key, value in stored.items()
                                                      if key not in gone})
                self.epoch.bump()
        return outcomes

    def close(self) -> None:
        for handle in self._partitions.values():
            handle.close()
        self._partitions.clear()


class Staging:
    """A topic being created: its partitions are built in `-staging` directories (outside the
    topics lock, a slice at a time if the caller wishes), then renamed into place at once
    under the lock.  Leftovers of a creation that never committed are removed at start-up."""

    def __init__(self, registry: TopicRegistry, name: str, partitions: int,
                 counts: dict | None = None, topic_id: uuid.UUID | None = None, first: int = 0):
        """`first` and `topic_id`: partitions added to an existing topic (CreatePartitions)."""
        self.registry = registry
        self.name = name
        self.partitions = partitions
        self.first = first
        self.topic_id = topic_id or uuid.uuid4()
        self.configs: dict[str, str] = {}  # its own topic configs, written at the commit
        self.built: list[tuple[str, str]] = []  # (staging directory, final directory)
        self._counts = counts if counts is not None else registry.log_dir_counts()

    @property
    def done(self) -> bool:
        return self.first + len(self.built) == self.partitions

    def build(self, count: int) -> None:
        """Build the next `count` partitions (fewer if fewer remain)."""
        start = self.first + len(self.built)
        for index in range(start, min(self.partitions, start + count)):
            log_dir = min(self._counts, key=self._counts.get)  # the emptiest log dir
            self._counts[log_dir] += 1
            final = os.path.join(log_dir, f"{self.name}-{index}")
            self.built.append((self._build_one(final, index), final))

    def _build_one(self, final: str, index: int) -> str:
        staging = f"{final}.{uuid.uuid4().hex}-staging"
        os.makedirs(staging)
        try:
            with open(os.path.join(staging, METADATA_FILE), "w", encoding="utf-8") as handle:
                handle.write(f"version: 0\ntopic_id: {encode_topic_id(self.topic_id)}\n")
            partition = Partition(staging, self.name, index, self.registry.settings,
                                  self.registry.files)
            try:
                partition.recover()  # writes a fresh state and an empty first segment
            finally:
                partition.close()
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)  # never leave a half-made partition
            raise
        return staging

    def abort(self) -> None:
        for staged, _final in self.built:
            shutil.rmtree(staged, ignore_errors=True)
        self.built = []


def _read_topic_id(directory: str) -> uuid.UUID | None:
    try:
        with open(os.path.join(directory, METADATA_FILE), encoding="utf-8") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "topic_id":
                    return decode_topic_id(value.strip())
    except (OSError, ValueError):
        return None
    return None


def _read_offline(log_dir: str) -> set[tuple[str, int]]:
    try:
        with open(os.path.join(log_dir, OFFLINE_FILE), encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return set()
    found = set()
    for line in lines:
        name, _, index = line.partition("\t")
        if index.isdigit():
            found.add((name, int(index)))
    return found


def forget_offline(log_dirs: tuple[str, ...]) -> None:
    """Start-up, before recovery: every partition gets its chance again."""
    try:
        os.unlink(os.path.join(log_dirs[0], OFFLINE_FILE))
    except FileNotFoundError:
        pass


def _partition_count(log_dir: str) -> int:
    try:
        return sum(1 for name in os.listdir(log_dir) if _PARTITION_DIR.fullmatch(name))
    except FileNotFoundError:
        return 0


def remove_deleted(log_dirs: tuple[str, ...]) -> int:
    """Remove the directories of deleted partitions (the parent's maintenance thread);
    returns how many."""
    removed = 0
    for log_dir in log_dirs:
        try:
            names = os.listdir(log_dir)
        except FileNotFoundError:
            continue
        for name in names:
            if name.endswith("-delete"):
                shutil.rmtree(os.path.join(log_dir, name), ignore_errors=True)
                removed += 1
    return removed


def remove_leftovers(log_dirs: tuple[str, ...]) -> list[str]:
    """Delete directories of unfinished creations and deletions (start-up, parent only)."""
    removed = []
    for log_dir in log_dirs:
        for name in os.listdir(log_dir) if os.path.isdir(log_dir) else ():
            if name.endswith("-delete") or name.endswith("-staging"):
                shutil.rmtree(os.path.join(log_dir, name), ignore_errors=True)
                removed.append(name)
    return removed


def _read_configs(log_dir: str) -> dict[str, dict[str, str]]:
    try:
        with open(os.path.join(log_dir, CONFIGS_FILE), "rb") as handle:
            return msgspec.json.decode(handle.read(), type=dict[str, dict[str, str]])
    except (FileNotFoundError, msgspec.DecodeError):
        return {}


def _write_configs(log_dir: str, stored: dict[str, dict[str, str]]) -> None:
    """Atomically (a temporary file, fsync, rename), under the topics lock."""
    path = os.path.join(log_dir, CONFIGS_FILE)
    with open(path + ".tmp", "wb") as handle:
        handle.write(msgspec.json.encode(stored))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(path + ".tmp", path)
