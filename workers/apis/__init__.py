"""The Kafka APIs a worker serves, one module per family.

discovery  ApiVersions, Metadata, DescribeCluster, FindCoordinator
produce    Produce, InitProducerId
fetch      Fetch (long poll), ListOffsets
topics     CreateTopics, DeleteTopics
admin      DescribeConfigs, IncrementalAlterConfigs, Describe/AlterClientQuotas and the
           group APIs (JoinGroup, SyncGroup, ..., OffsetCommit/Fetch): forwarded to the parent
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.config import ServerProperties
from broker.log.topics import TopicRegistry
from workers.handlers import Api, BrokerView


@dataclass
class Services:
    """What the APIs share inside one worker."""

    view: BrokerView
    props: ServerProperties
    registry: TopicRegistry
    waits: object = None  # workers.apis.fetch.FetchWaits, set once the loop runs
    quotas: object = None  # workers.quotas.ClientQuotas; None on the control plane
    may_alter: object = None  # (listener index) -> whether changes are served there


def build_apis(services: Services, control_plane: bool = False) -> list[Api]:
    """The data plane serves everything; the control plane only admin and control APIs."""
    from workers.apis.discovery import ApiVersions, DescribeCluster, FindCoordinator, Metadata
    from workers.apis.fetch import Fetch, ListOffsets
    from workers.apis.produce import InitProducerId, Produce
    from workers.apis.topics import CreateTopics, DeleteTopics

    from workers.apis.admin import forwarded_apis, group_apis

    apis: list[Api] = [Metadata(services), DescribeCluster(services), CreateTopics(services),
                       DeleteTopics(services), *forwarded_apis(services)]
    if not control_plane:
        apis += [Produce(services), Fetch(services), ListOffsets(services),
                 FindCoordinator(services), InitProducerId(services), *group_apis(services)]
    apis.append(ApiVersions(apis))
    return apis


def api_names() -> dict[int, str]:
    """API key -> name of every API served (for metrics labels)."""
    from workers.apis.discovery import ApiVersions, DescribeCluster, FindCoordinator, Metadata
    from workers.apis.fetch import Fetch, ListOffsets
    from workers.apis.produce import InitProducerId, Produce
    from workers.apis.topics import CreateTopics, DeleteTopics

    from workers.apis.admin import FORWARDED

    names = {cls.key: cls.name for cls in (ApiVersions, Metadata, DescribeCluster,
                                           FindCoordinator, Produce,
                                           InitProducerId, Fetch, ListOffsets, CreateTopics,
                                           DeleteTopics)}
    names.update({key: name for key, name, _ in FORWARDED})
    from broker.groups.coordinator import GROUP_APIS

    names.update({key: name for key, (name, _) in GROUP_APIS.items()})
    return names
