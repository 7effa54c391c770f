"""The Kafka APIs a worker serves, one module per family.

discovery  ApiVersions, Metadata, FindCoordinator
produce    Produce, InitProducerId
fetch      Fetch (long poll), ListOffsets
topics     CreateTopics, DeleteTopics
admin      DescribeConfigs, IncrementalAlterConfigs, Describe/AlterClientQuotas (forwarded
           to the parent)
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
    forward: object = None  # (frame, listener index) -> Future of the parent's answer
    quotas: object = None  # workers.quotas.ClientQuotas


def build_apis(services: Services) -> list[Api]:
    from workers.apis.discovery import ApiVersions, FindCoordinator, Metadata
    from workers.apis.fetch import Fetch, ListOffsets
    from workers.apis.produce import InitProducerId, Produce
    from workers.apis.topics import CreateTopics, DeleteTopics

    from workers.apis.admin import forwarded_apis

    apis: list[Api] = [Produce(services), Fetch(services), ListOffsets(services),
                       Metadata(services), FindCoordinator(services), CreateTopics(services),
                       DeleteTopics(services), InitProducerId(services), *forwarded_apis(services)]
    apis.append(ApiVersions(apis))
    return apis


def api_names() -> dict[int, str]:
    """API key -> name of every API served (for metrics labels)."""
    from workers.apis.discovery import ApiVersions, FindCoordinator, Metadata
    from workers.apis.fetch import Fetch, ListOffsets
    from workers.apis.produce import InitProducerId, Produce
    from workers.apis.topics import CreateTopics, DeleteTopics

    from workers.apis.admin import FORWARDED

    names = {cls.key: cls.name for cls in (ApiVersions, Metadata, FindCoordinator, Produce,
                                           InitProducerId, Fetch, ListOffsets, CreateTopics,
                                           DeleteTopics)}
    names.update({key: name for key, name, _ in FORWARDED})
    return names
