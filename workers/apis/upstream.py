"""Front-end mode: the APIs of a worker that stands before an upstream Kafka cluster.

Every request but ApiVersions and the SASL exchange goes to one upstream node: the node whose
front-end port the client connected to, or, on a listener's own (bootstrap) port, the node
that connection is pinned to when its first request arrives (workers.upstream.Upstream).  A
client picks the node itself, from the Metadata and FindCoordinator answers the front-end
rewrote (workers.upstream_rewrite): the partition leader for Produce and Fetch, the
coordinator for group and transaction requests, any node for metadata and admin.  So no
request is ever split or re-routed, and NOT_LEADER_OR_FOLLOWER or NOT_COORDINATOR reach the
client as Kafka sent them, for it to refresh and move.

Only the request header is decoded; the body goes upstream as it arrived (a Produce's acks=0
is set to 1 in place).  The answer comes back as upstream framed it: rewritten where it names
nodes, and settled by the router like any answer (quotas charged to the client here, the
longer of the two throttles written).  Upstream versions bound what is offered: ApiVersions
advertises, per API, what the front-end routes, what kio reads and what every upstream node
asked serves, with the upstream's features (transaction.version and the group protocols are
the cluster's, not this broker's).
"""

from __future__ import annotations

import functools
import struct

from broker.shared import ipc
from broker.shared.client_quotas import FETCH, PRODUCE
from broker.shared.protocol.codec import build, encode_entity, frame, request_readers, response_class
from broker.shared.protocol.errors import ErrorCode
from workers import upstream_rewrite as rewrite
from workers.apis import edge_acls
from workers.answer import Answer
from workers.router import NO_THROTTLE, Api, InvalidRequest, RequestContext
from workers.upstream import Upstream, UpstreamUnavailable

# The APIs a client may send through the front-end, with the highest version it offers (None:
# the highest kio reads) and how their answers are rewritten.  Left out: broker-to-broker and
# controller-only APIs, and DescribeQuorum (it names the controllers' own listeners).
# Fetch stops at v14: from v16 an answer may end with leaders' addresses after its records
# (below, the records pass through without a walk over them), and up to v14 the body starts
# with replica_id and max_wait_ms, read in place (v15 moves the replica to a tagged field).
ROUTED: dict[int, tuple[int | None, object]] = {
    0: (None, rewrite.node_endpoints(0)), 1: (14, None), 2: (None, None),
    3: (None, rewrite.metadata), 8: (None, None), 9: (None, None),
    10: (None, rewrite.find_coordinator), 11: (None, None), 12: (None, None),
    13: (None, None), 14: (None, None), 15: (None, None), 16: (None, None),
    19: (None, None), 20: (None, None), 21: (None, None), 22: (None, None), 23: (None, None),
    24: (None, None), 25: (None, None), 26: (None, None), 27: (None, None), 28: (None, None),
    29: (None, None), 30: (None, None), 31: (None, None), 32: (None, None), 33: (None, None),
    34: (None, None), 35: (None, None), 37: (None, None), 42: (None, None), 43: (None, None),
    44: (None, None), 45: (None, None), 46: (None, None), 47: (None, None), 48: (None, None),
    49: (None, None), 50: (None, None), 51: (None, None), 60: (None, rewrite.describe_cluster),
    61: (None, None), 65: (None, None), 66: (None, None), 68: (None, None), 69: (None, None),
    71: (None, None), 72: (None, None), 74: (None, None), 75: (None, None), 76: (None, None),
    77: (None, None), 78: (None, rewrite.node_endpoints(78)),
    79: (None, rewrite.node_endpoints(79)), 90: (None, None), 91: (None, None),
    92: (None, None),
}
_PRODUCE, _FETCH = 0, 1
_REBALANCES = frozenset({11, 14, 78})  # JoinGroup, SyncGroup, ShareFetch: they wait long
REBALANCE_SECONDS = 900.0  # how long those may wait upstream before the link is closed
_REPLICA_AND_WAIT = struct.Struct(">ii")
_PRODUCE_NODE_ENDPOINTS = 10  # the first Produce version whose answer may name leaders


def kio_versions(key: int, cap: int | None = None) -> tuple[int, int] | None:
    """The range of versions kio reads requests of (up to `cap`), None if none."""
    known = []
    for version in range(0, 64 if cap is None else cap + 1):
        try:
            request_readers(key, version)
        except KeyError:
            if known:
                break
            continue
        known.append(version)
    return (known[0], known[-1]) if known else None


class FrontEnd:
    """What the upstream APIs of one worker share: the cluster (set once the loop runs) and
    where each node is reached on each listener."""

    def __init__(self, node_port, advertised, ports_per_listener: int,
                 request_timeout: float = 30.0, max_wait_ms: int = 30000):
        self.node_port = node_port  # (listener index, node id) -> port
        self.advertised = advertised  # by listener index: (host, port) or None
        self.width = ports_per_listener
        self.request_timeout = request_timeout  # seconds an upstream answer may take
        self.max_wait_ms = max_wait_ms  # a Fetch's long poll, at most
        self.bound: frozenset[int] | None = None  # node ids whose ports the parent bound
        self.upstream: Upstream | None = None
        self.access = None  # the edge's ACLs (broker.shared.access.Access), with an authorizer
        self._addresses: dict[int, object] = {}  # listener index -> Address

    def address(self, listener_index: int):
        """node id -> (host, port) of its front-end port on that listener."""
        found = self._addresses.get(listener_index)
        if found is None:
            host = (self.advertised[listener_index] or ("localhost", 0))[0]
            width, port_of = self.width, self.node_port

            def found(node_id: int):
                bound = self.bound
                if not 0 <= node_id < width or (bound is not None and node_id not in bound):
                    return None  # no port: left out of what clients are told
                return host, port_of(listener_index, node_id)

            self._addresses[listener_index] = found
        return found

    def node_of(self, client) -> int:
        """The upstream node a client connection's requests go to (fixed for its life)."""
        node = client.upstream_node
        if node is None:
            upstream = self.upstream
            port = client.transport.get_extra_info("sockname")[1]
            first = self.node_port(client.listener_index, 0)
            if first <= port < first + self.width:
                node = port - first
            else:
                node = upstream.bootstrap_node() if upstream is not None else None
                if node is None:
                    raise UpstreamUnavailable("the upstream cluster has not answered yet")
            client.upstream_node = node
        return node

    def pool(self, client):
        node = self.node_of(client)
        pool = self.upstream.pools.get(node) if self.upstream is not None else None
        if pool is None:
            raise UpstreamUnavailable(f"upstream node {node} is not in the cluster")
        return pool


class Routed(Api):
    """An API whose requests go to the connection's upstream node."""

    raw = True  # the router decodes the header only and hands over the frame

    def __init__(self, front: FrontEnd, key: int, versions: tuple[int, int], rewriter):
        super().__init__()
        self.front = front
        self.key, self.versions = key, versions
        self.name = f"api {key}"
        self.rewriter = rewriter
        self.upstream_versions = versions  # narrowed by the parent's view

    def handle_raw(self, ctx: RequestContext, request, body_at: int, client):
        low, high = self.upstream_versions
        if not low <= ctx.version <= high:
            raise InvalidRequest("unsupported_version",
                                 f"API {self.key} v{ctx.version}: the upstream cluster serves "
                                 f"v{low}-{high}")
        key, version = self.key, ctx.version
        after = None  # what the edge's ACLs make of the answer
        access = self.front.access
        if access is not None and access.enabled:
            verdict = edge_acls.check(access, ctx, _decoded(request, key, version, body_at))
            if verdict is not None:
                if type(verdict) is bytes:
                    return verdict  # nothing the principal may do: answered here
                if verdict.body is not None:
                    request = edge_acls.request_with(request, body_at, verdict.body)
                if type(verdict) is edge_acls.Split:
                    after = functools.partial(edge_acls.merged, api_key=key, version=version,
                                              verdict=verdict)
                elif verdict.answer is not None:
                    after = functools.partial(edge_acls.filtered, api_key=key,
                                              version=version, verdict=verdict)
        front = self.front
        pool = front.pool(client)
        deadline = front.request_timeout
        if key == _FETCH:
            request, wait = _fetch_checked(request, body_at, front.max_wait_ms)
            deadline += wait
        elif key in _REBALANCES:
            deadline = max(deadline, REBALANCE_SECONDS)
        elif key == _PRODUCE and after is None:
            at = rewrite.acks_at(request, body_at, version)
            if request[at:at + 2] == b"\0\0":  # acks=0: sent as acks=1, the answer swallowed
                request = bytearray(request)
                request[at + 1] = 1
                return pool.request(request, functools.partial(_unacknowledged, version,
                                                               ctx.size), deadline)
        address = front.address(ctx.listener_index)
        return pool.request(request, functools.partial(self._settle, version, ctx.size, address,
                                                       after), deadline)

    def _settle(self, version: int, size: int, address, after, answer):
        if after is not None:
            answer = after(answer)
        rewriter = self.rewriter
        if rewriter is not None and (self.key != _PRODUCE or version >= _PRODUCE_NODE_ENDPOINTS):
            answer = rewriter(answer, version, address)
        if self.key == _PRODUCE:
            return Answer(answer, PRODUCE, size,
                          encode=lambda ms: rewrite.produce_throttled(answer, version, ms))
        if self.key == _FETCH:
            return Answer(answer, FETCH, len(answer))
        return answer


def _decoded(request, key: int, version: int, body_at: int):
    """The request body, decoded behind the request guard (the edge's ACLs read it)."""
    try:
        return request_readers(key, version)[1](request, body_at)[0]
    except Exception as error:  # kio raises several types for malformed input
        raise InvalidRequest("malformed_body", f"API {key} v{version}: {error!r}") from None


def _fetch_checked(request, body_at: int, max_wait_ms: int):
    """A consumer's Fetch (v4-14: replica_id, then max_wait_ms, lead the body), its long poll
    capped at pybroker.fetch.max.wait.ms; (the frame, the seconds it may wait).  A replica's
    Fetch is refused: no client is a follower, and upstream it would act as the front-end."""
    try:
        replica, wait = _REPLICA_AND_WAIT.unpack_from(request, body_at)
    except struct.error:
        raise InvalidRequest("malformed_body", "Fetch: a body too short") from None
    if replica != -1:
        raise InvalidRequest("malformed_body", f"Fetch as replica {replica}: not a consumer's")
    if wait > max_wait_ms:
        request = bytearray(request)
        struct.pack_into(">i", request, body_at + 4, max_wait_ms)
        wait = max_wait_ms
    return request, max(0, wait) / 1000


def _unacknowledged(version: int, size: int, answer) -> Answer:
    """An acks=0 Produce's upstream answer: nothing for the client but the quota's charge; an
    error closes its connection, as Kafka closes it (the client's only sign of it)."""
    failed = rewrite.produce_failed(answer, version)
    if failed is not None:
        raise InvalidRequest("produce_failed", f"acks=0 produce failed upstream: {failed}")
    return Answer(None, PRODUCE, size)


class FrontEndApiVersions(Api, api="ApiVersions"):
    """ApiVersions answered here: the routed APIs' versions as far as upstream serves them,
    the local ones (SASL), and the upstream cluster's features."""

    pure = True

    def __init__(self, routed: list[Routed], local: list[Api]):
        super().__init__()
        self.routed = routed
        self.local = local
        self._bodies: dict[int, bytes] = {}
        self.update(None)

    def update(self, view: ipc.UpstreamView | None) -> None:
        """Advertise what the parent's view of the cluster allows."""
        upstream = {key: (low, high) for key, low, high in view.versions} if view else None
        keys = [(api.key, *api.versions) for api in self.local] + [(self.key, *self.versions)]
        for api in self.routed:
            theirs = upstream.get(api.key) if upstream is not None else api.versions
            low, high = (max(api.versions[0], theirs[0]), min(api.versions[1], theirs[1])) \
                if theirs else (1, 0)
            api.upstream_versions = (low, high)
            if low <= high:
                keys.append((api.key, low, high))
        keys.sort()
        self._bodies = {version: encode_entity(self._response(version, keys, view))
                        for version in range(self.versions[1] + 1)}

    def _response(self, version: int, keys, view):
        values = {"error_code": ErrorCode.none, "throttle_time": NO_THROTTLE,
                  "api_keys": [{"api_key": key, "min_version": low, "max_version": high}
                               for key, low, high in keys]}
        if view is not None:
            values["supported_features"] = [
                {"name": name, "min_version": low, "max_version": high}
                for name, low, high in view.supported_features]
            values["finalized_features"] = [
                {"name": name, "min_version_level": low, "max_version_level": high}
                for name, low, high in view.finalized_features]
            values["finalized_features_epoch"] = view.finalized_epoch
        return build(response_class(self.key, version), values)

    def handle(self, ctx: RequestContext, body) -> bytes:
        return frame(ctx.correlation, False, self._bodies[ctx.version])  # header v0 always


def build_front_end_apis(front: FrontEnd, local: list[Api], authorizing: bool = False
                         ) -> tuple[list[Api], FrontEndApiVersions]:
    """The routed APIs, the local ones, and the ApiVersions that advertises them.  With an
    authorizer, only the APIs the edge authorizes, in versions that name topics."""
    routed = []
    for key, (cap, rewriter) in ROUTED.items():
        if authorizing:
            if key not in edge_acls.CHECKS:
                continue
            cap = min(cap if cap is not None else 63, edge_acls.CAPS.get(key, 63))
        versions = kio_versions(key, cap)
        if authorizing and versions is not None and key in edge_acls.FLOORS:
            versions = (max(versions[0], edge_acls.FLOORS[key]), versions[1])
        if versions is not None:
            routed.append(Routed(front, key, versions, rewriter))
    versions_api = FrontEndApiVersions(routed, local)
    return [*routed, *local, versions_api], versions_api
