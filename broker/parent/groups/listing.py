"""The groups as a whole: ListGroups, DescribeGroups and DeleteGroups over the coordinator's
table, classic groups and consumer groups of KIP-848 alike.

ListGroups gives each group's type ("classic" or "consumer", filtered by v5's TypesFilter) and
state; DescribeGroups describes classic groups only, as Kafka: a consumer group is "Dead"
(GROUP_ID_NOT_FOUND from v6), and ConsumerGroupDescribe describes it
(broker.parent.groups.consumer); DeleteGroups deletes an empty group of either kind.

Authorization (with an authorizer, broker.shared.access), as Kafka's KafkaApis: describing
needs DESCRIBE on the group, deleting DELETE; ListGroups lists every group to a principal with
DESCRIBE on the cluster, else the groups it may DESCRIBE.

Answers stay proportional to what is held, never to how often a request names it: each group
a DescribeGroups or DeleteGroups names is answered once, and what grows with the groups held
(a group's members and their metadata, the list of groups) is charged to the answer's
ResponseBudget (broker.parent.forwarded) before it is built.
"""

from __future__ import annotations

import logging
from typing import Callable

from broker.parent.forwarded import ResponseBudget, budget_of
from broker.parent.groups.offset_store import OffsetStore
from broker.parent.groups.state import Group, GroupState
from broker.shared.access import Access
from broker.shared.acl import CLUSTER_NAME, Operation, ResourceType
from broker.shared.protocol.context import NO_THROTTLE, RequestContext
from broker.shared.protocol.errors import ErrorCode

log = logging.getLogger("broker.parent.groups.listing")

NO_OPERATIONS = -2147483648  # authorized operations not asked for (Kafka's INT32_MIN)


class Listing:
    """ListGroups, DescribeGroups and DeleteGroups for the groups of the coordinator's table."""

    def __init__(self, props, access: Access, groups: dict[str, Group], offsets: OffsetStore):
        self.props = props
        self.access = access
        self.groups = groups  # the coordinator's table, shared
        self.offsets = offsets  # a group with committed offsets exists (and is deleted) too
        # An empty consumer group deleted (its record too): set by the coordinator.
        self.drop_consumer_group: Callable[[str], None] = lambda group_id: None

    def _may(self, ctx: RequestContext, operation: Operation, group_id: str) -> bool:
        return self.access.check(ctx, operation, ResourceType.GROUP, group_id)

    def describe_groups(self, ctx: RequestContext, body, _host: str) -> bytes:
        """Each group named once, however often the request names it: Kafka would describe
        a group named 10,000 times 10,000 times (1.1 GB for one 110 KB member); clients
        name each once and read the answer by group id."""
        budget = budget_of(self.props)
        wanted = getattr(body, "include_authorized_operations", False)
        found = []
        for group_id in dict.fromkeys(body.groups):
            budget.charge(len(group_id))
            if not self._may(ctx, Operation.DESCRIBE, group_id):
                found.append(_described(group_id, ErrorCode.group_authorization_failed))
                continue
            operations = self.access.operations(ctx, ResourceType.GROUP, group_id) \
                if wanted else NO_OPERATIONS
            group = self.groups.get(group_id)
            if group is not None and not isinstance(group, Group) and ctx.version >= 6:
                found.append(dict(_described(group_id, ErrorCode.group_id_not_found, "Dead",
                                             operations),
                                  error_message=f"Group {group_id} is not a classic group."))
            elif group is not None and not isinstance(group, Group):  # before v6: Dead
                found.append(_described(group_id, ErrorCode.none, "Dead", operations))
            elif group is None and ctx.version >= 6:  # KIP-1043; before v6, a Dead group
                found.append(dict(_described(group_id, ErrorCode.group_id_not_found, "Dead", operations),
                                  error_message=f"Group {group_id} not found."))
            elif group is None:
                found.append(_described(group_id, ErrorCode.none, "Dead", operations))
            else:
                found.append(_description(group, operations, budget))
        return ctx.respond({"throttle_time": NO_THROTTLE, "groups": found})

    def list_groups(self, ctx: RequestContext, body, _host: str) -> bytes:
        # Kafka compares both filters case-insensitively (STABLE, Classic, ...).
        states = {state.lower() for state in getattr(body, "states_filter", ()) or ()}
        types = {kind.lower() for kind in getattr(body, "types_filter", ()) or ()}
        listed = []
        budget = budget_of(self.props)
        everything = self.access.allowed(ctx, Operation.DESCRIBE, ResourceType.CLUSTER,
                                         CLUSTER_NAME)
        for group in self.groups.values():
            if states and group.state.value.lower() not in states:
                continue
            if not everything and not self.access.allowed(ctx, Operation.DESCRIBE,
                                                          ResourceType.GROUP, group.group_id):
                continue
            kind = group.kind  # classic, consumer or share
            if types and kind not in types:
                continue
            budget.charge(len(group.group_id) + len(group.protocol_type or "")
                          + len(group.state.value) + len(kind))
            listed.append({"group_id": group.group_id, "protocol_type": group.protocol_type or "",
                           "group_state": group.state.value, "group_type": kind})
        return ctx.respond({"throttle_time": NO_THROTTLE, "error_code": ErrorCode.none,
                            "groups": listed})

    def delete_groups(self, ctx: RequestContext, body, _host: str) -> bytes:
        """Each group once (as Kafka's `distinct`); the tombstones of all the groups deleted
        are written together, not one write (and fsync) per group."""
        results: dict[str, ErrorCode] = {}
        for group_id in dict.fromkeys(body.groups_names):
            group = self.groups.get(group_id)
            if not self._may(ctx, Operation.DELETE, group_id):
                results[group_id] = ErrorCode.group_authorization_failed
            elif group is None and not self.offsets.get(group_id):
                results[group_id] = ErrorCode.group_id_not_found
            elif group is not None and group.members:
                results[group_id] = ErrorCode.non_empty_group
            else:
                results[group_id] = ErrorCode.none
        deleted = [group_id for group_id, code in results.items() if code == ErrorCode.none]
        try:
            self.offsets.delete_groups(deleted)
        except OSError as error:
            log.error("deleting groups failed: %s", error)
            results.update(dict.fromkeys(deleted, ErrorCode.coordinator_not_available))
        else:
            for group_id in deleted:
                if not isinstance(self.groups.get(group_id, Group("")), Group):
                    self.drop_consumer_group(group_id)  # its own records go too
                self.groups.pop(group_id, None)
        return ctx.respond({"throttle_time": NO_THROTTLE, "results": [
            {"group_id": group_id, "error_code": code} for group_id, code in results.items()]})


def _described(group_id: str, code, state: str = "", operations: int = NO_OPERATIONS) -> dict:
    """A DescribeGroups entry without members: refused, or a group that does not exist."""
    return {"error_code": code, "group_id": group_id, "group_state": state, "protocol_type": "",
            "protocol_data": "", "members": [], "authorized_operations": operations}


def _description(group: Group, operations: int, budget: ResponseBudget) -> dict:
    """A group as Kafka describes it: members' metadata and assignments (and the protocol)
    only when it is Stable; charged to `budget` before any of it is built."""
    stable = group.state is GroupState.STABLE
    protocol = group.protocol if stable else None
    members = list(group.members.values())
    budget.charge(len(group.protocol_type or "") + len(protocol or ""))
    budget.charge(sum(len(m.member_id) + len(m.instance_id or "") + len(m.client_id)
                      + len(m.client_host) for m in members), len(members))
    if protocol is not None:
        budget.charge(sum(len(m.metadata(protocol)) + len(m.assignment) for m in members
                          if m.supports(protocol)), 0)
    return {"error_code": ErrorCode.none, "group_id": group.group_id, "group_state": group.state.value,
            "protocol_type": group.protocol_type or "", "protocol_data": protocol or "",
            "authorized_operations": operations,
            "members": [{"member_id": m.member_id, "group_instance_id": m.instance_id,
                         "client_id": m.client_id, "client_host": m.client_host,
                         "member_metadata": m.metadata(protocol)
                         if protocol is not None and m.supports(protocol) else b"",
                         "member_assignment": m.assignment if stable else b""}
                        for m in members]}
