"""DeleteRecords, DescribeLogDirs and DescribeProducers: what operators do to and see of the
log itself.

DeleteRecords moves a partition's log start offset (broker.shared.log.partition
`delete_records`): Fetch below it answers OFFSET_OUT_OF_RANGE and ListOffsets earliest
answers it, in every worker at once (it is a word of the partition's shared state).  It needs
DELETE on the topic, and a cleanup.policy with delete (else POLICY_VIOLATION, as Kafka).  DescribeLogDirs answers each log dir's partitions with their sizes, as
`kafka-log-dirs` shows them; it needs DESCRIBE on the cluster.

A partition named twice in one request is served once, as Kafka's handlers do (a map of
partitions for DeleteRecords, the last offset given winning; a set for DescribeLogDirs; see
DescribeProducers for its own): a repeated entry must not repeat the work.  The work on
distinct partitions (an fsync for each moved log start, a directory listing for each size, a
producer table walk) is done a slice per loop turn (workers.apis.slices).
"""

from __future__ import annotations

import logging
import os
import shutil

from broker.shared.acl import CLUSTER_NAME, Operation, ResourceType
from broker.shared.log import topic_config
from broker.shared.protocol.errors import ErrorCode
from workers import producers_response
from workers.apis.slices import in_slices
from workers.router import NO_THROTTLE, Api, RequestContext, error_code

log = logging.getLogger("workers.apis.log_admin")
SLICE_DELETIONS = 16  # partitions whose log start moves per loop turn (an fsync each)
SLICE_SIZES = 256  # partition directories listed per loop turn (DescribeLogDirs)
SLICE_ENTRIES = 2048  # producers (and partitions, by their cost) described per loop turn
_PARTITION_COST = 16  # a partition's lock and table mapping, in producers' worth of work
_REFUSED_CODE = ErrorCode.topic_authorization_failed.value
_UNKNOWN_CODE = ErrorCode.unknown_topic_or_partition.value
_STORAGE_ERROR_CODE = ErrorCode.kafka_storage_error.value


class DeleteRecords(Api, api="DeleteRecords"):
    def handle(self, ctx: RequestContext, body):
        wanted: dict[str, dict[int, int]] = {}  # topic -> partition -> offset, the last given
        for topic in body.topics:
            wanted.setdefault(topic.name, {}).update(
                (part.partition_index, part.offset) for part in topic.partitions)
        access = self.services.access
        topics = [(name, access.check(ctx, Operation.DELETE, ResourceType.TOPIC, name), offsets)
                  for name, offsets in wanted.items()]
        answers: dict[str, list] = {name: [] for name in wanted}
        return in_slices(self._delete_all(topics, answers), SLICE_DELETIONS,
                         lambda: ctx.respond({"throttle_time": NO_THROTTLE, "topics": [
                             {"name": name, "partitions": parts}
                             for name, parts in answers.items()]}))

    def _delete_all(self, topics: list, answers: dict):
        """Steps for in_slices: one partition each."""
        registry = self.services.registry
        for name, allowed, offsets in topics:
            for index, offset in offsets.items():
                low, problem = -1, "topic_authorization_failed"
                if allowed:
                    low, problem = self._delete(registry, name, index, offset)
                answers[name].append({"partition_index": index, "low_watermark": low,
                                      "error_code": error_code(problem)})
                yield 1

    @staticmethod
    def _delete(registry, name: str, index: int, offset: int) -> tuple[int, str | None]:
        try:
            partition = registry.partition(name, index)
            if partition is None:
                return -1, "unknown_topic_or_partition"
            if partition.offline:
                return -1, "kafka_storage_error"
            if not topic_config.deletes(registry.props, registry.configs(name)):
                return -1, "policy_violation"  # a compacted topic keeps its records (Kafka)
            return partition.delete_records(offset)
        except OSError as error:  # e.g. out of descriptors, a failed fsync: this partition pays
            log.error("deleting records of %s-%d failed: %s", name, index, error)
            return -1, "kafka_storage_error"


class DescribeLogDirs(Api, api="DescribeLogDirs"):
    def handle(self, ctx: RequestContext, body):
        if not self.services.access.check(ctx, Operation.DESCRIBE, ResourceType.CLUSTER,
                                          CLUSTER_NAME):
            return ctx.respond({"throttle_time": NO_THROTTLE, "results": [],
                                "error_code": ErrorCode.cluster_authorization_failed})
        registry = self.services.registry
        wanted = None
        if body.topics is not None:  # a set of partitions, as Kafka's: entries add up
            wanted = {}
            for topic in body.topics:
                wanted.setdefault(topic.topic, set()).update(topic.partitions)
        by_dir: dict[str, dict[str, list]] = {log_dir: {} for log_dir in registry.log_dirs}
        return in_slices(self._sizes(registry.topics(), wanted, by_dir), SLICE_SIZES,
                         lambda: self._answer(ctx, by_dir))

    @staticmethod
    def _sizes(topics: dict, wanted: dict | None, by_dir: dict):
        """Steps for in_slices: one partition's size each."""
        for name, info in sorted(topics.items()):
            for index, directory in enumerate(info.directories):
                if wanted is not None and index not in wanted.get(name, ()):
                    continue
                log_dir = os.path.dirname(directory)
                by_dir.setdefault(log_dir, {}).setdefault(name, []).append(
                    {"partition_index": index, "partition_size": _size(directory),
                     "offset_lag": 0, "is_future_key": False})
                yield 1

    @staticmethod
    def _answer(ctx: RequestContext, by_dir: dict) -> bytes:
        results = []
        for log_dir, topics in by_dir.items():
            usage = shutil.disk_usage(log_dir)
            results.append({"error_code": ErrorCode.none, "log_dir": log_dir,
                            "total_bytes": usage.total, "usable_bytes": usage.free,
                            "topics": [{"name": name, "partitions": partitions}
                                       for name, partitions in topics.items()]})
        return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": ErrorCode.none,
                            "results": results})


def _size(directory: str) -> int:
    """Bytes of a partition's segments (what Kafka counts as its size)."""
    try:
        return sum(entry.stat().st_size for entry in os.scandir(directory)
                   if entry.name.endswith(".log"))
    except FileNotFoundError:  # deleted meanwhile
        return 0


class DescribeProducers(Api, api="DescribeProducers"):
    """The idempotent producers active on each partition (READ on the topic).

    Each partition is answered once, however often the request names it: Kafka answers every
    entry, but its admin client asks for each partition once and keys the answers by
    partition, so a repeated entry only made work (99,000 of one partition held the worker
    for seconds and made a 37.5 MB answer).  Partitions are described SLICE_ENTRIES' worth per
    loop turn; one answer describes at most `pybroker.request.max.entries` partitions and
    producers in all, the first partition always whole: a partition past that gets
    THROTTLING_QUOTA_EXCEEDED (as CreateTopics answers what it leaves for a retry), and the
    rest are not walked."""

    def handle(self, ctx: RequestContext, body):
        wanted: dict[str, dict[int, bytes | None]] = {}  # each partition once, as first asked
        for topic in body.topics:
            wanted.setdefault(topic.name, {}).update(dict.fromkeys(topic.partition_indexes))
        access = self.services.access  # answers[index]: None until described
        topics = [(name, access.check(ctx, Operation.READ, ResourceType.TOPIC, name), answers)
                  for name, answers in wanted.items()]
        budget = _AnswerBudget(self.services.props.pybroker_request_max_entries)
        return in_slices(self._describe_all(topics, budget), SLICE_ENTRIES,
                         lambda: ctx.frame(producers_response.body(
                             [(name, list(answers.values())) for name, _, answers in topics])))

    def _describe_all(self, topics: list, budget: "_AnswerBudget"):
        """Steps for in_slices: one partition's encoded answer each, yielding its cost."""
        registry = self.services.registry
        for name, allowed, answers in topics:
            for index in answers:
                if not allowed:
                    answers[index] = producers_response.partition(index, _REFUSED_CODE, None)
                    yield 1
                elif budget.spent:  # an earlier partition did not fit: this one is not walked
                    answers[index] = _over_budget(index, budget.limit)
                    yield 1
                else:
                    answers[index], cost = self._describe(registry, name, index, budget)
                    yield cost

    @staticmethod
    def _describe(registry, name: str, index: int,
                  budget: "_AnswerBudget") -> tuple[bytes, int]:
        """(the partition's encoded answer, its cost)."""
        try:
            partition = registry.partition(name, index)
            if partition is None:
                return producers_response.partition(index, _UNKNOWN_CODE, None), 1
            states = partition.producer_states()
        except OSError as error:  # e.g. out of descriptors: this partition pays
            log.error("describing the producers of %s-%d failed: %s", name, index, error)
            return producers_response.partition(index, _STORAGE_ERROR_CODE, str(error)), 1
        cost = _PARTITION_COST + len(states)
        if not budget.take(1 + len(states)):
            return _over_budget(index, budget.limit), cost
        return producers_response.partition(index, ErrorCode.none.value, None, states), cost


def _over_budget(index: int, limit: int) -> bytes:
    return producers_response.partition(
        index, ErrorCode.throttling_quota_exceeded.value,
        f"this answer already describes {limit:,} partitions and producers at most "
        f"(pybroker.request.max.entries): ask again for this partition")


class _AnswerBudget:
    """Partitions and producers one answer may still describe; once a partition did not fit,
    the later ones are not even walked (`spent`)."""

    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError(f"an answer budget must be positive, not {limit}")
        self.limit = limit
        self.used = 0
        self.spent = False

    def take(self, entries: int) -> bool:
        """Count a described partition in; False (and spent) if it would not fit, unless it
        is the first: one partition is always answered whole."""
        if self.used and self.used + entries > self.limit:
            self.spent = True
            return False
        self.used += entries
        return True
