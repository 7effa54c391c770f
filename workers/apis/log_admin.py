"""DeleteRecords and DescribeLogDirs: what operators do to and see of the log itself.

DeleteRecords moves a partition's log start offset (broker.shared.log.partition
`delete_records`): Fetch below it answers OFFSET_OUT_OF_RANGE and ListOffsets earliest
answers it, in every worker at once (it is a word of the partition's shared state).  It needs
DELETE on the topic.  DescribeLogDirs answers each log dir's partitions with their sizes, as
`kafka-log-dirs` shows them; it needs DESCRIBE on the cluster.
"""

from __future__ import annotations

import os
import shutil

from broker.shared.acl import CLUSTER_NAME, Operation, ResourceType
from broker.shared.protocol import errors
from workers.handlers import NO_THROTTLE, Api, RequestContext, error_code


class DeleteRecords(Api, api="DeleteRecords"):
    def handle(self, ctx: RequestContext, body) -> bytes:
        registry, access = self.services.registry, self.services.access
        topics = []
        for topic in body.topics:
            allowed = access.check(ctx, Operation.DELETE, ResourceType.TOPIC, topic.name)
            answers = []
            for part in topic.partitions:
                low, problem = -1, "topic_authorization_failed"
                if allowed:
                    low, problem = self._delete(registry.partition(topic.name,
                                                                   part.partition_index),
                                                part.offset)
                answers.append({"partition_index": part.partition_index, "low_watermark": low,
                                "error_code": error_code(problem)})
            topics.append({"name": topic.name, "partitions": answers})
        return ctx.respond({"throttle_time": NO_THROTTLE, "topics": topics})

    @staticmethod
    def _delete(partition, offset: int) -> tuple[int, str | None]:
        if partition is None:
            return -1, "unknown_topic_or_partition"
        if partition.offline:
            return -1, "kafka_storage_error"
        return partition.delete_records(offset)


class DescribeLogDirs(Api, api="DescribeLogDirs"):
    def handle(self, ctx: RequestContext, body) -> bytes:
        if not self.services.access.check(ctx, Operation.DESCRIBE, ResourceType.CLUSTER,
                                          CLUSTER_NAME):
            return ctx.respond({"throttle_time": NO_THROTTLE, "results": [],
                                "error_code": errors.ErrorCode.cluster_authorization_failed})
        registry = self.services.registry
        wanted = None if body.topics is None else {
            topic.topic: set(topic.partitions) for topic in body.topics}
        by_dir: dict[str, dict[str, list]] = {log_dir: {} for log_dir in registry.log_dirs}
        for name, info in sorted(registry.topics().items()):
            for index, directory in enumerate(info.directories):
                if wanted is not None and index not in wanted.get(name, ()):
                    continue
                log_dir = os.path.dirname(directory)
                by_dir.setdefault(log_dir, {}).setdefault(name, []).append(
                    {"partition_index": index, "partition_size": _size(directory),
                     "offset_lag": 0, "is_future_key": False})
        results = []
        for log_dir, topics in by_dir.items():
            usage = shutil.disk_usage(log_dir)
            results.append({"error_code": errors.NONE, "log_dir": log_dir,
                            "total_bytes": usage.total, "usable_bytes": usage.free,
                            "topics": [{"name": name, "partitions": partitions}
                                       for name, partitions in topics.items()]})
        return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": errors.NONE,
                            "results": results})


def _size(directory: str) -> int:
    """Bytes of a partition's segments (what Kafka counts as its size)."""
    try:
        return sum(entry.stat().st_size for entry in os.scandir(directory)
                   if entry.name.endswith(".log"))
    except FileNotFoundError:  # deleted meanwhile
        return 0


class DescribeProducers(Api, api="DescribeProducers"):
    """The idempotent producers active on each partition (READ on the topic)."""

    def handle(self, ctx: RequestContext, body) -> bytes:
        registry, access = self.services.registry, self.services.access
        topics = []
        for topic in body.topics:
            allowed = access.check(ctx, Operation.READ, ResourceType.TOPIC, topic.name)
            answers = []
            for index in topic.partition_indexes:
                answer = {"partition_index": index, "error_code": errors.NONE,
                          "error_message": None, "active_producers": []}
                partition = registry.partition(topic.name, index) if allowed else None
                if not allowed:
                    answer["error_code"] = errors.ErrorCode.topic_authorization_failed
                elif partition is None:
                    answer["error_code"] = errors.UNKNOWN_TOPIC_OR_PARTITION
                else:
                    answer["active_producers"] = [
                        {"producer_id": state.producer_id, "producer_epoch": state.epoch,
                         "last_sequence": state.last_sequence,
                         "last_timestamp": state.last_timestamp, "coordinator_epoch": -1,
                         "current_txn_start_offset": state.current_txn_start_offset}
                        for state in partition.producer_states()]
                answers.append(answer)
            topics.append({"name": topic.name, "partitions": answers})
        return ctx.respond({"throttle_time": NO_THROTTLE, "topics": topics})
