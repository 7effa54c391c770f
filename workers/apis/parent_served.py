"""APIs served by the parent, which workers forward: config and quotas (the parent owns
configuration, broker.parent.admin) and consumer groups (the parent is the group coordinator,
broker.parent.groups).  Which APIs these are, and who answers each, is the API table's say
(broker.shared.apis).

The router decodes the frame (so the parent only sees frames that decode), then its
Forwarder (workers.forwarding) sends it raw to the parent (IPC `ForwardedRequest`); the answer
comes back as bytes with the parent's handling time.  The connection stays muted meanwhile,
like any request whose answer waits (a JoinGroup waits for the rebalance).  Group APIs are
served on data listeners only, not on the control plane.
"""

from __future__ import annotations

from broker.shared.apis import ApiSpec
from workers.router import Api


class Forwarded(Api):
    forwarded = True  # the router forwards the frame; `handle` is never called

    def __init__(self, services, spec: ApiSpec):
        super().__init__(services)
        self.key, self.name, self.versions = spec.key, spec.name, spec.versions
