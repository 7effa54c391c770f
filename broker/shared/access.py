"""Authorization as a process sees it: the ACLs in force, the check handlers call, the audit.

Each process that serves requests (every worker for the data plane, the parent for the APIs
forwarded to it) has one `Access`.  Handlers call `check(ctx, operation, type, name)` where
Kafka's KafkaApis authorizes, with the request's principal and address from the context; with
`authorizer.class.name` unset it allows everything at the cost of one attribute test.  A
denial is counted at once (`broker_authorization_denied_total{api}`, through `count`) and
added to a per-second table that `flush` writes to the event log as `authorization_denied`
records (who, from where, which API, resource and operation, how many times): a client
retrying a denied request thousands of times a second costs one record a second, not
thousands.  `allowed` is the silent form for filtering lists (Metadata of all topics,
ListGroups), which Kafka does not audit either.

Until the parent's first `Acls` message a worker's authorizer holds no ACL: it denies all
but super users (fail closed), though the parent sends the ACLs before any connection.
"""

from __future__ import annotations

import time
from typing import Callable

from broker.shared.acl import SUPPORTED_OPERATIONS, Acl, Authorizer, Operation, ResourceType
from broker.shared.events import AuthorizationDenied, EventLog

MAX_KEYS = 2000  # distinct denials kept per second; the rest count under OTHER
MAX_NAME_CHARS = 256  # of a resource or user name written to the event log
OTHER = "<other>"


class Access:
    def __init__(self, enabled: bool, super_users: frozenset[str] = frozenset(),
                 allow_if_no_acl: bool = False, count: Callable[[int], None] = lambda key: None,
                 log: EventLog | None = None, listeners: tuple[str, ...] = (),
                 api_names: dict[int, str] | None = None):
        self.enabled = enabled
        self._super_users = super_users
        self._allow_if_no_acl = allow_if_no_acl
        self.authorizer = Authorizer((), super_users, allow_if_no_acl)
        self._count = count  # (api key) -> None: the denial metric
        self._log = log
        self._listeners = listeners
        self._api_names = api_names or {}
        self._table: dict[tuple, int] = {}

    def update(self, acls: list[Acl] | tuple[Acl, ...]) -> None:
        """The ACLs changed: decisions from now on use these (and a fresh cache)."""
        self.authorizer = Authorizer(acls, self._super_users, self._allow_if_no_acl)

    # --- the checks -----------------------------------------------------------------------

    def check(self, ctx, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        """Is the request's principal allowed?  A denial is counted and audited."""
        if not self.enabled or self.authorizer.allows(ctx.user, ctx.host, operation,
                                                      resource_type, name):
            return True
        self._denied(ctx, operation, resource_type, name)
        return False

    def allowed(self, ctx, operation: Operation, resource_type: ResourceType,
                name: str) -> bool:
        """As `check`, without auditing: for filtering what a list shows."""
        return not self.enabled or self.authorizer.allows(ctx.user, ctx.host, operation,
                                                          resource_type, name)

    def check_any(self, ctx, operation: Operation, resource_type: ResourceType) -> bool:
        """May the principal do `operation` on some resource of the type?"""
        if not self.enabled or self.authorizer.allows_any(ctx.user, ctx.host, operation,
                                                          resource_type):
            return True
        self._denied(ctx, operation, resource_type, "*")
        return False

    def operations(self, ctx, resource_type: ResourceType, name: str) -> int:
        """authorized_operations of a Metadata or Describe* answer (all bits when off)."""
        if not self.enabled:  # Kafka without an authorizer: every operation the type knows
            return sum(1 << operation for operation in SUPPORTED_OPERATIONS[resource_type])
        return self.authorizer.authorized_operations(ctx.user, ctx.host, resource_type, name)

    # --- the audit ------------------------------------------------------------------------

    def _denied(self, ctx, operation, resource_type, name: str) -> None:
        self._count(ctx.api_key)
        if self._log is None:
            return
        if len(name) > MAX_NAME_CHARS:  # a client's choice: what the log keeps is bounded
            name = name[:MAX_NAME_CHARS] + "..."
        key = (ctx.listener_index, ctx.host, ctx.user[:MAX_NAME_CHARS], ctx.api_key,
               resource_type, name, operation)
        if key not in self._table and len(self._table) >= MAX_KEYS:
            key = (ctx.listener_index, OTHER, OTHER, ctx.api_key, resource_type, OTHER,
                   operation)
        self._table[key] = self._table.get(key, 0) + 1

    def flush(self, second: int | None = None) -> None:
        """Write this second's denials to the event log (called once a second)."""
        if not self._table or self._log is None:
            return
        second = int(time.time()) if second is None else second
        table, self._table = self._table, {}
        for (listener, host, user, api_key, resource_type, name, operation), count in \
                table.items():
            self._log.emit(AuthorizationDenied(
                ts=second * 1000, second=second, listener=self._listener_name(listener), ip=host,
                principal=f"User:{user}", api=self._api_names.get(api_key, str(api_key)),
                resource_type=ResourceType(resource_type).name, resource=name,
                operation=Operation(operation).name, count=count))

    def _listener_name(self, index: int) -> str:
        return self._listeners[index] if index < len(self._listeners) else str(index)
