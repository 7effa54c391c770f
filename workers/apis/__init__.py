"""The Kafka APIs a worker serves, one module per family.

discovery  ApiVersions, Metadata, DescribeCluster, FindCoordinator
sasl       SaslHandshake, SaslAuthenticate where no authentication is going on
produce    Produce
fetch      Fetch (long poll), ListOffsets
topics     CreateTopics, DeleteTopics, CreatePartitions
log_admin  DeleteRecords, DescribeLogDirs, DescribeProducers
forwarded  DescribeConfigs, IncrementalAlterConfigs, Describe/AlterClientQuotas, the group
           APIs (JoinGroup, SyncGroup, ..., OffsetCommit/Fetch) and the transaction APIs
           (InitProducerId, AddPartitionsToTxn, EndTxn, ...): sent to the parent

Which APIs a plane serves, and their versions, come from the API table (broker.shared.apis).
Each handler checks the ACLs where Kafka's KafkaApis does, through `Services.access`
(broker.shared.access): with no authorizer configured that check allows everything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from broker.shared.access import Access
from broker.shared.apis import served
from broker.shared.config import ServerProperties
from broker.shared.log.topics import TopicRegistry
from workers.router import Api, BrokerView

if TYPE_CHECKING:  # for annotations only: build_apis imports the API modules when called
    from workers.apis.fetch import FetchWaits
    from workers.fetch_sessions import FetchSessionCache
    from workers.throttling import ClientQuotas


@dataclass
class Services:
    """What the APIs share inside one worker."""

    view: BrokerView
    props: ServerProperties
    registry: TopicRegistry
    waits: FetchWaits | None = None  # set once the loop runs
    quotas: ClientQuotas | None = None  # None on the control plane
    may_alter: Callable[[int], bool] | None = None  # (listener index) -> changes served there?
    access: Access = field(default_factory=lambda: Access(False))  # ACLs: who may do what
    sessions: FetchSessionCache | None = None  # incremental fetch sessions (KIP-227)
    # Told of every local append (Produce): the worker wakes the fetches waiting for it.
    appended: Callable[[object], None] = lambda partition: None


# Front-end mode: the control plane is the front-end's own (its configs, quotas, SCRAM users,
# ACLs); the topics and transactions it would name are the upstream cluster's, not served here.
NOT_ON_A_FRONT_END = frozenset({19, 20, 35, 37, 65, 66})


def build_apis(services: Services, control_plane: bool = False,
               front_end: bool = False) -> list[Api]:
    """One handler per API the plane serves (broker.shared.apis); ApiVersions advertises them."""
    from workers.apis.authentication import SaslAuthenticate, SaslHandshake
    from workers.apis.discovery import ApiVersions, DescribeCluster, FindCoordinator, Metadata
    from workers.apis.fetch import Fetch, ListOffsets
    from workers.apis.parent_served import Forwarded
    from workers.apis.produce import Produce
    from workers.apis.log_admin import DeleteRecords, DescribeLogDirs, DescribeProducers
    from workers.apis.topics import CreatePartitions, CreateTopics, DeleteTopics

    local = {cls.key: cls for cls in (Metadata, DescribeCluster, FindCoordinator, Produce,
                                      Fetch, ListOffsets, CreateTopics,
                                      DeleteTopics, CreatePartitions, SaslHandshake,
                                      SaslAuthenticate, DeleteRecords, DescribeLogDirs,
                                      DescribeProducers)}
    apis: list[Api] = []
    specs = [spec for spec in served(control_plane) if spec.key != ApiVersions.key
             and not (front_end and spec.key in NOT_ON_A_FRONT_END)]
    for spec in specs:
        apis.append(Forwarded(services, spec) if spec.forwarded else local[spec.key](services))
    apis.append(ApiVersions(specs))
    return apis
