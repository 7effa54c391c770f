"""ACLs as Kafka models them, and the decision Kafka's StandardAuthorizer makes with them.

Shared by both kinds of process: the parent validates, stores and serves the ACL APIs
(broker.parent.acl_store) and decides the requests it serves; every worker decides the requests it
serves with the ACLs the parent sent it (IPC `Acls`), without asking anyone.

An ACL is a resource pattern (type, name, LITERAL or PREFIXED) and an entry (principal, host,
operation, ALLOW or DENY).  `Authorizer.allows(user, host, operation, type, name)`:

  1. a super user (`super.users`) may do everything;
  2. the ACLs that apply are those on the resource type whose pattern matches the name (a
     LITERAL equal to it or `*`, a PREFIXED one the name starts with), for `User:<user>` or
     `User:*`, from the host or `*`;
  3. a DENY for the operation, or for ALL, denies (DENY wins);
  4. an ALLOW for the operation, for ALL, or for one that implies it (READ, WRITE, DELETE and
     ALTER imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS) allows;
  5. otherwise it is denied - unless no ACL at all is on the resource and
     `allow.everyone.if.no.acl.found` is true.

Decisions are cached per (user, host, operation, type, name) in a bounded dict, so a
producer's thousandth request to a topic costs one lookup; a change of ACLs makes a new
Authorizer and so a new cache.
"""

from __future__ import annotations

import ipaddress
from enum import IntEnum

import msgspec

CLUSTER_NAME = "kafka-cluster"  # the one name of the CLUSTER resource
WILDCARD = "*"
CACHE_ENTRIES = 1 << 16  # cached decisions; the cache starts afresh when full
CACHED_NAME_CHARS = 255  # longer names (a client's choice) are decided each time, not kept
MAX_ACLS = 100_000  # ACLs stored: every worker holds them all
MAX_ACL_BYTES = 16 << 20  # their names, principals and hosts together (sent whole to workers)
MAX_FIELD_CHARS = 1024  # one ACL's resource name or principal; a host is at most 255


class ResourceType(IntEnum):
    UNKNOWN, ANY, TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID, DELEGATION_TOKEN, USER = range(8)


class PatternType(IntEnum):
    UNKNOWN, ANY, MATCH, LITERAL, PREFIXED = range(5)


class Operation(IntEnum):
    (UNKNOWN, ANY, ALL, READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, CLUSTER_ACTION,
     DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, CREATE_TOKENS, DESCRIBE_TOKENS) = range(15)


class Permission(IntEnum):
    UNKNOWN, ANY, DENY, ALLOW = range(4)


# What an ALLOW for the key operation also grants.
_IMPLIED_BY = {Operation.DESCRIBE: (Operation.READ, Operation.WRITE, Operation.DELETE,
                                    Operation.ALTER),
               Operation.DESCRIBE_CONFIGS: (Operation.ALTER_CONFIGS,)}
# The operations each resource type knows, as authorized_operations bit fields list them.
SUPPORTED_OPERATIONS = {
    ResourceType.TOPIC: (Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DELETE,
                         Operation.ALTER, Operation.DESCRIBE, Operation.DESCRIBE_CONFIGS,
                         Operation.ALTER_CONFIGS),
    ResourceType.GROUP: (Operation.READ, Operation.DESCRIBE, Operation.DELETE),
    ResourceType.CLUSTER: (Operation.CREATE, Operation.CLUSTER_ACTION, Operation.DESCRIBE_CONFIGS,
                           Operation.ALTER_CONFIGS, Operation.IDEMPOTENT_WRITE, Operation.ALTER,
                           Operation.DESCRIBE),
    ResourceType.TRANSACTIONAL_ID: (Operation.DESCRIBE, Operation.WRITE),
}


class Acl(msgspec.Struct, frozen=True, array_like=True):
    """One ACL binding, as stored and as sent to workers (Kafka's codes for the enums)."""

    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission: int


class AclFilter(msgspec.Struct, frozen=True):
    """What DescribeAcls and DeleteAcls select: None and ANY match everything; the MATCH
    pattern type selects the ACLs that would apply to the named resource."""

    resource_type: int
    resource_name: str | None
    pattern_type: int
    principal: str | None
    host: str | None
    operation: int
    permission: int

    def problem(self) -> str | None:
        """Why Kafka would refuse this filter (INVALID_REQUEST), or None."""
        for value, kind in ((self.resource_type, ResourceType), (self.pattern_type, PatternType),
                            (self.operation, Operation), (self.permission, Permission)):
            if value not in kind._value2member_map_ or value == kind.UNKNOWN:
                return f"the filter's {kind.__name__} {value} is unknown"
        return None

    def matches(self, acl: Acl) -> bool:
        return (self.resource_type in (ResourceType.ANY, acl.resource_type)
                and self._name_matches(acl)
                and self.principal in (None, acl.principal)
                and self.host in (None, acl.host)
                and self.operation in (Operation.ANY, acl.operation)
                and self.permission in (Permission.ANY, acl.permission))

    def _name_matches(self, acl: Acl) -> bool:
        wanted = self.pattern_type
        if wanted not in (PatternType.ANY, PatternType.MATCH, acl.pattern_type):
            return False
        if self.resource_name is None:
            return True
        if wanted != PatternType.MATCH:
            return self.resource_name == acl.resource_name
        if acl.pattern_type == PatternType.LITERAL:
            return acl.resource_name in (self.resource_name, WILDCARD)
        return self.resource_name.startswith(acl.resource_name)


def creation_problem(acl: Acl) -> str | None:
    """Why Kafka would refuse to create this ACL (INVALID_REQUEST, Kafka's words), or None.
    As in Kafka the host is not checked: one that is not `*` or an IP never matches."""
    if acl.resource_type == ResourceType.CLUSTER and acl.resource_name != CLUSTER_NAME:
        return f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
    if not acl.resource_name:
        return "Invalid empty resource name"
    if acl.resource_type not in ResourceType._value2member_map_ or acl.resource_type in (
            ResourceType.UNKNOWN, ResourceType.ANY):
        return f"Invalid resourceType {_name(ResourceType, acl.resource_type)}"
    if acl.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        return f"Invalid patternType {_name(PatternType, acl.pattern_type)}"
    if acl.operation not in Operation._value2member_map_ or acl.operation in (
            Operation.UNKNOWN, Operation.ANY):
        return f"Invalid operation {_name(Operation, acl.operation)}"
    if acl.permission not in (Permission.ALLOW, Permission.DENY):
        return f"Invalid permissionType {_name(Permission, acl.permission)}"
    if len(acl.resource_name) > MAX_FIELD_CHARS or len(acl.principal) > MAX_FIELD_CHARS \
            or len(acl.host) > 255:
        return f"the resource name and principal may hold {MAX_FIELD_CHARS} characters, " \
               f"the host 255"
    return principal_problem(acl.principal)


def acl_bytes(acl: Acl) -> int:
    """What an ACL weighs against MAX_ACL_BYTES."""
    return len(acl.resource_name) + len(acl.principal) + len(acl.host) + 16


def canonical_host(host: str) -> str:
    """An address as ACLs compare it: a zone suffix dropped, an IPv4-mapped IPv6 address as
    its IPv4 one, IPv6 in its short form (Java's getHostAddress gives Kafka the same for one
    client whatever the socket family).  `*` and what is not an address stay as they are."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


def principal_problem(principal: str) -> str | None:
    kind, sep, name = principal.partition(":")
    if not sep or not kind or not name:
        return f"Could not parse principal from `{principal}` (no colon is present " \
               f"separating the principal type from the principal name)"
    return None


def parse_super_users(text: str) -> frozenset[str]:
    """`super.users`: principals separated by ';'; raises ValueError naming a bad one."""
    users = [item.strip() for item in text.split(";") if item.strip()]
    for principal in users:
        problem = principal_problem(principal)
        if problem is not None:
            raise ValueError(f"super.users: {problem}")
    return frozenset(users)


def _name(kind, value: int) -> str:
    member = kind._value2member_map_.get(value)
    return member.name if member is not None else str(value)


class _TypeIndex:
    """The ACLs of one resource type, by pattern: literal names and prefixes."""

    __slots__ = ("literal", "prefixed", "prefix_lengths")

    def __init__(self):
        self.literal: dict[str, list[Acl]] = {}
        self.prefixed: dict[str, list[Acl]] = {}
        self.prefix_lengths: tuple[int, ...] = ()

    def on(self, name: str) -> list[Acl]:
        """Every ACL whose pattern matches `name`, for any principal."""
        found = list(self.literal.get(name, ()))
        if name != WILDCARD:
            found += self.literal.get(WILDCARD, ())
        for length in self.prefix_lengths:
            if length > len(name):
                break
            found += self.prefixed.get(name[:length], ())
        return found


class Authorizer:
    """The decisions of one set of ACLs.  Never blocks, never fails: an unknown operation or
    resource is simply not allowed."""

    def __init__(self, acls, super_users: frozenset[str] = frozenset(),
                 allow_if_no_acl: bool = False):
        self.acls: tuple[Acl, ...] = tuple(acls)
        self.super_users = super_users
        self.allow_if_no_acl = allow_if_no_acl
        self._index: dict[int, _TypeIndex] = {}
        for acl in self.acls:
            index = self._index.get(acl.resource_type)
            if index is None:
                index = self._index[acl.resource_type] = _TypeIndex()
            table = index.literal if acl.pattern_type == PatternType.LITERAL else index.prefixed
            table.setdefault(acl.resource_name, []).append(acl)
        for index in self._index.values():
            index.prefix_lengths = tuple(sorted({len(prefix) for prefix in index.prefixed}))
        self._cache: dict[tuple, bool] = {}

    def allows(self, user: str, host: str, operation: int, resource_type: int,
               name: str) -> bool:
        """May `User:<user>`, connected from `host`, do `operation` on the resource?"""
        key = (user, host, operation, resource_type, name)
        decided = self._cache.get(key)
        if decided is None:
            decided = self._decide(user, host, operation, resource_type, name)
            if len(name) <= CACHED_NAME_CHARS and len(user) <= CACHED_NAME_CHARS:
                if len(self._cache) >= CACHE_ENTRIES:
                    self._cache.clear()
                self._cache[key] = decided
        return decided

    def _decide(self, user: str, host: str, operation: int, resource_type: int,
                name: str) -> bool:
        principal = "User:" + user
        if principal in self.super_users:
            return True
        index = self._index.get(resource_type)
        on_resource = index.on(name) if index is not None else []
        applying = [acl for acl in on_resource
                    if acl.principal in (principal, "User:*") and acl.host in (host, WILDCARD)]
        if any(acl.permission == Permission.DENY and acl.operation in (operation, Operation.ALL)
               for acl in applying):
            return False
        granting = (operation, Operation.ALL, *_IMPLIED_BY.get(operation, ()))
        if any(acl.permission == Permission.ALLOW and acl.operation in granting
               for acl in applying):
            return True
        return self.allow_if_no_acl and not on_resource

    def allows_any(self, user: str, host: str, operation: int, resource_type: int) -> bool:
        """May the principal do `operation` on some resource of the type?  Kafka's default
        authorizeByResourceType (an InitProducerId without IDEMPOTENT_WRITE needs WRITE on
        any topic): some ALLOW pattern (the operation or ALL, nothing implied) that no DENY
        pattern covers.  Cached like `allows`."""
        key = (user, host, operation, resource_type, None)
        decided = self._cache.get(key)
        if decided is None:
            decided = self._cache[key] = self._decide_any(user, host, operation, resource_type)
        return decided

    def _decide_any(self, user: str, host: str, operation: int, resource_type: int) -> bool:
        if self.allows(user, host, operation, resource_type, "hardcode"):
            return True  # super users, wildcard ALLOWs, allow.everyone.if.no.acl.found
        principal = "User:" + user
        allow_literal, allow_prefix, deny_literal, deny_prefix = set(), set(), set(), set()
        for acl in self.acls:
            if acl.resource_type != resource_type or acl.principal not in (principal, "User:*") \
                    or acl.host not in (host, WILDCARD) \
                    or acl.operation not in (operation, Operation.ALL):
                continue
            literal = acl.pattern_type == PatternType.LITERAL
            if acl.permission == Permission.DENY:
                (deny_literal if literal else deny_prefix).add(acl.resource_name)
            elif acl.permission == Permission.ALLOW:
                (allow_literal if literal else allow_prefix).add(acl.resource_name)
        if WILDCARD in deny_literal:
            return False
        if WILDCARD in allow_literal:
            return True

        def prefix_denied(name: str) -> bool:
            return any(name[:length] in deny_prefix for length in range(1, len(name) + 1))

        return any(name not in deny_literal and not prefix_denied(name)
                   for name in allow_literal) or \
            any(not prefix_denied(name) for name in allow_prefix)

    def authorized_operations(self, user: str, host: str, resource_type: int,
                              name: str) -> int:
        """Kafka's bit field of the operations allowed on a resource (bit n: operation n)."""
        bits = 0
        for operation in SUPPORTED_OPERATIONS.get(resource_type, ()):
            if self.allows(user, host, operation, resource_type, name):
                bits |= 1 << operation
        return bits
