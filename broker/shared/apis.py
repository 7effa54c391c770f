"""The Kafka APIs this broker serves: one row each, and the only list of them.

Every other list derives from this table: the worker's router (which APIs and versions exist),
what a worker forwards to the parent and which parent service answers it (the admin service or
the group coordinator), what the control-plane worker serves (KIP-291), what ApiVersions
advertises, the API label of metrics and events, and the changes refused on data listeners
when a control plane exists.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Server(enum.Enum):
    """Who answers a request."""

    WORKER = "worker"  # the worker that read it
    ADMIN = "admin"  # the parent's admin service (broker.parent.admin): configs, quotas, ACLs
    GROUPS = "groups"  # the parent's group coordinator (broker.parent.groups)
    TRANSACTIONS = "transactions"  # the parent's transaction coordinator (parent.transactions)


@dataclass(frozen=True)
class ApiSpec:
    key: int
    name: str
    versions: tuple[int, int]  # lowest and highest served
    server: Server
    alters: bool = False  # changes configuration or topics: with a control plane, only there
    control_plane: bool = False  # also served by the control-plane worker
    # First version whose client backs off by itself when told throttle_time_ms (KIP-219);
    # the broker holds back the answers of older versions for the throttle instead.
    client_throttle: int = 0
    waits: bool = False  # its answer waits by design (a rebalance): not a queued request

    @property
    def forwarded(self) -> bool:
        return self.server is not Server.WORKER


_W, _A, _G, _T = Server.WORKER, Server.ADMIN, Server.GROUPS, Server.TRANSACTIONS

APIS: tuple[ApiSpec, ...] = (
    # Produce: kio has no v0-2 (magic v0/v1 batches)
    ApiSpec(0, "Produce", (3, 10), _W, client_throttle=6),
    ApiSpec(1, "Fetch", (4, 16), _W, client_throttle=8),
    ApiSpec(2, "ListOffsets", (1, 11), _W, client_throttle=3),
    ApiSpec(3, "Metadata", (0, 13), _W, control_plane=True, client_throttle=6),
    ApiSpec(8, "OffsetCommit", (2, 9), _G, client_throttle=4),
    ApiSpec(9, "OffsetFetch", (1, 9), _G, client_throttle=4),
    ApiSpec(10, "FindCoordinator", (0, 6), _W, client_throttle=2),
    ApiSpec(11, "JoinGroup", (0, 7), _G, client_throttle=3, waits=True),
    ApiSpec(12, "Heartbeat", (0, 4), _G, client_throttle=2),
    ApiSpec(13, "LeaveGroup", (0, 5), _G, client_throttle=2),
    ApiSpec(14, "SyncGroup", (0, 5), _G, client_throttle=2, waits=True),
    # DescribeGroups v6: an unknown group is GROUP_ID_NOT_FOUND, not "Dead"
    ApiSpec(15, "DescribeGroups", (0, 6), _G, client_throttle=2),
    ApiSpec(16, "ListGroups", (0, 5), _G, client_throttle=2),
    ApiSpec(17, "SaslHandshake", (0, 1), _W, control_plane=True),
    ApiSpec(18, "ApiVersions", (0, 4), _W, control_plane=True, client_throttle=2),
    ApiSpec(19, "CreateTopics", (2, 7), _W, alters=True, control_plane=True, client_throttle=3),
    ApiSpec(20, "DeleteTopics", (1, 6), _W, alters=True, control_plane=True),
    ApiSpec(21, "DeleteRecords", (0, 2), _W),
    ApiSpec(22, "InitProducerId", (0, 4), _T, client_throttle=1),
    ApiSpec(24, "AddPartitionsToTxn", (0, 5), _T),  # v4+: the brokers' batched form
    ApiSpec(25, "AddOffsetsToTxn", (0, 4), _T),
    ApiSpec(26, "EndTxn", (0, 4), _T),  # v5 is KIP-890's transaction.version 2: not offered
    ApiSpec(28, "TxnOffsetCommit", (0, 5), _G),
    ApiSpec(29, "DescribeAcls", (1, 3), _A, control_plane=True),
    ApiSpec(30, "CreateAcls", (1, 3), _A, alters=True, control_plane=True),
    ApiSpec(31, "DeleteAcls", (1, 3), _A, alters=True, control_plane=True),
    ApiSpec(32, "DescribeConfigs", (1, 4), _A, control_plane=True, client_throttle=2),
    ApiSpec(33, "AlterConfigs", (0, 2), _A, alters=True, control_plane=True),
    ApiSpec(35, "DescribeLogDirs", (1, 4), _W, control_plane=True),
    ApiSpec(36, "SaslAuthenticate", (0, 2), _W, control_plane=True),
    ApiSpec(37, "CreatePartitions", (0, 3), _W, alters=True, control_plane=True),
    ApiSpec(42, "DeleteGroups", (0, 2), _G, client_throttle=1),
    ApiSpec(44, "IncrementalAlterConfigs", (0, 1), _A, alters=True, control_plane=True),
    ApiSpec(47, "OffsetDelete", (0, 0), _G),
    ApiSpec(48, "DescribeClientQuotas", (0, 1), _A, control_plane=True),
    ApiSpec(49, "AlterClientQuotas", (0, 1), _A, alters=True, control_plane=True),
    ApiSpec(50, "DescribeUserScramCredentials", (0, 0), _A, control_plane=True),
    ApiSpec(51, "AlterUserScramCredentials", (0, 0), _A, alters=True, control_plane=True),
    ApiSpec(60, "DescribeCluster", (0, 2), _W, control_plane=True),
    ApiSpec(61, "DescribeProducers", (0, 0), _W),
    ApiSpec(65, "DescribeTransactions", (0, 0), _T, control_plane=True),
    ApiSpec(66, "ListTransactions", (0, 1), _T, control_plane=True),
    ApiSpec(68, "ConsumerGroupHeartbeat", (0, 1), _G),  # KIP-848
    ApiSpec(69, "ConsumerGroupDescribe", (0, 1), _G),
    ApiSpec(76, "ShareGroupHeartbeat", (1, 1), _G),  # KIP-932
    ApiSpec(77, "ShareGroupDescribe", (1, 1), _G),
    ApiSpec(78, "ShareFetch", (1, 1), _G, waits=True),  # a long poll
    ApiSpec(79, "ShareAcknowledge", (1, 1), _G),
    ApiSpec(90, "DescribeShareGroupOffsets", (0, 1), _G),
    ApiSpec(91, "AlterShareGroupOffsets", (0, 0), _G),
    ApiSpec(92, "DeleteShareGroupOffsets", (0, 0), _G),
)

BY_KEY: dict[int, ApiSpec] = {api.key: api for api in APIS}
BY_NAME: dict[str, ApiSpec] = {api.name: api for api in APIS}
API_NAMES: dict[int, str] = {api.key: api.name for api in APIS}
GROUP_KEYS = frozenset(api.key for api in APIS if api.server is Server.GROUPS)
TRANSACTION_KEYS = frozenset(api.key for api in APIS if api.server is Server.TRANSACTIONS)
# Forwarded APIs whose wait for the parent counts against queued.max.requests (a rebalance
# wait, like a long poll, does not).
QUEUED_WHILE_FORWARDED = frozenset(api.key for api in APIS if api.forwarded and not api.waits)
# Answered by a worker with CLUSTER_AUTHORIZATION_FAILED on a data listener, not forwarded.
REFUSED_ON_DATA_LISTENERS = frozenset(api.key for api in APIS
                                      if api.alters and api.forwarded)


def served(control_plane: bool) -> tuple[ApiSpec, ...]:
    """The APIs a worker of that plane serves: the data plane all, the control plane the admin
    and control ones."""
    return tuple(api for api in APIS if api.control_plane or not control_plane)


def api_key_of(request) -> int:
    """The API key of a request frame (the bytes after the size prefix)."""
    return request[0] << 8 | request[1]


def api_version_of(request) -> int:
    return request[2] << 8 | request[3]
