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


def answer_heartbeat(ctx: RequestContext, body, host: str, every: datetime.timedelta,
                     access: Access, validate, beat) -> bytes:
    """A heartbeat of either protocol: `validate(ctx, body)`, READ on the group, DESCRIBE on
    the topics it names, then `beat(ctx, body, host)` -> (member id, epoch, assignment or
    None); a Refused on the way is the answer."""
    try:
        validate(ctx, body)
        if not access.check(ctx, Operation.READ, ResourceType.GROUP, body.group_id):
            raise Refused(ErrorCode.group_authorization_failed)
        check_topics(access, ctx, body.subscribed_topic_names or ())
        member_id, epoch, assignment = beat(ctx, body, host)
    except Refused as refused:
        return heartbeat_answer(ctx, every, refused.code, refused.message,
                                body.member_id or None)
    return heartbeat_answer(ctx, every, member_id=member_id, epoch=epoch,
                            assignment=assignment)


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


def to_describe(access: Access, ctx: RequestContext, groups: dict, group_id: str, kind: type,
                name: str):
    """(the group of that id and kind to describe, None), or (None, the entry that refuses
    it): no DESCRIBE on the group, or no group of that kind (GROUP_ID_NOT_FOUND)."""
    if not access.check(ctx, Operation.DESCRIBE, ResourceType.GROUP, group_id):
        return None, not_described(group_id, ErrorCode.group_authorization_failed)
    group = groups.get(group_id)
    if not isinstance(group, kind):
        why = "not found" if group is None else f"is not a {name} group"
        return None, not_described(group_id, ErrorCode.group_id_not_found,
                                   f"Group {group_id} {why}.")
    return group, None


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
