"""APIs served by the parent, which workers forward: config and quotas (the parent owns
configuration) and consumer groups (the parent is the group coordinator, broker.groups).

The raw frame goes to the parent (IPC `AdminRequest`) and its answer comes back as bytes; the
connection stays muted meanwhile, like any request whose answer waits (a JoinGroup waits for
the rebalance).  Group APIs are served on data listeners only, not on the control plane.
"""

from __future__ import annotations

from workers.handlers import Api

FORWARDED = (
    (32, "DescribeConfigs", (1, 4)),
    (44, "IncrementalAlterConfigs", (0, 1)),
    (48, "DescribeClientQuotas", (0, 1)),
    (49, "AlterClientQuotas", (0, 1)),
)


class Forwarded(Api):
    forwarded = True  # the router answers ForwardRequest; the connection sends it on

    def __init__(self, services, key: int, name: str, versions: tuple[int, int]):
        super().__init__(services)
        self.key, self.name, self.versions = key, name, versions


def group_apis(services) -> list[Api]:
    from broker.groups.coordinator import GROUP_APIS

    return [Forwarded(services, key, name, versions)
            for key, (name, versions) in GROUP_APIS.items()]


def forwarded_apis(services) -> list[Api]:
    return [Forwarded(services, key, name, versions) for key, name, versions in FORWARDED]
