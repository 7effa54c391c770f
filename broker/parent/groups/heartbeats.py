"""What the heartbeat protocols of KIP-848 (consumer groups) and KIP-932 (share groups) answer
alike: a refusal with Kafka's message, the heartbeat answer, the assignment on the wire, a
group not described, the topics a member names checked for DESCRIBE, and the group's own
heartbeat interval and session timeout (group configs, else the broker's keys).
"""

from __future__ import annotations

import datetime

from broker.shared.access import Access
from broker.shared.acl import Operation, ResourceType
from broker.shared.protocol.context import NO_THROTTLE, RequestContext
from broker.shared.protocol.errors import ErrorCode

NO_OPERATIONS = -2147483648  # authorized operations not asked for (Kafka's INT32_MIN)


class Refused(Exception):
    """A request answered with an error, and Kafka's message for it."""

    def __init__(self, code: ErrorCode, message: str | None = None):
        super().__init__(message)
        self.code = code
        self.message = message


def heartbeat_answer(ctx: RequestContext, interval: datetime.timedelta,
                     code: ErrorCode = ErrorCode.none, message: str | None = None,
                     member_id: str | None = None, epoch: int = 0,
                     assignment: dict | None = None) -> bytes:
    return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": code,
                        "error_message": message, "member_id": member_id,
                        "member_epoch": epoch, "heartbeat_interval": interval,
                        "assignment": assignment})


def encoded(assignment) -> dict:
    """An assignment (topic id -> partitions) as a heartbeat answer carries it."""
    return {"topic_partitions": [{"topic_id": topic, "partitions": sorted(partitions)}
                                 for topic, partitions in assignment.items()]}


def not_described(group_id: str, code: ErrorCode, message: str | None = None) -> dict:
    """A ConsumerGroupDescribe or ShareGroupDescribe entry of a group refused or not found."""
    return {"error_code": code, "error_message": message, "group_id": group_id,
            "group_state": "", "group_epoch": -1, "assignment_epoch": -1, "assignor_name": "",
            "members": [], "authorized_operations": NO_OPERATIONS}


def check_topics(access: Access, ctx: RequestContext, names) -> None:
    """DESCRIBE on every topic a member names (as Kafka since 4.0)."""
    refused = sorted({name for name in names if not access.check(
        ctx, Operation.DESCRIBE, ResourceType.TOPIC, name)})
    if refused:
        raise Refused(ErrorCode.topic_authorization_failed,
                      f"Unauthorized topics: {', '.join(refused)}.")


def hidden_topics(access: Access, ctx: RequestContext, names) -> bool:
    """Whether a described group names a topic the principal may not DESCRIBE: Kafka (4.0+)
    answers that group TOPIC_AUTHORIZATION_FAILED rather than show it."""
    return any(not access.check(ctx, Operation.DESCRIBE, ResourceType.TOPIC, name)
               for name in set(names))


def interval(configs, kind: str, group_id: str) -> datetime.timedelta:
    """The group's `<kind>.heartbeat.interval.ms` (kind: consumer or share)."""
    return datetime.timedelta(milliseconds=int(configs.value(
        group_id, f"{kind}.heartbeat.interval.ms")))


def session_seconds(configs, kind: str, group_id: str) -> float:
    """The group's `<kind>.session.timeout.ms`, in seconds."""
    return int(configs.value(group_id, f"{kind}.session.timeout.ms")) / 1000
