"""Front-end mode: the upstream Kafka cluster as the parent sees it, and the ports its nodes get.

`UpstreamDirectory` asks one upstream node at a time (the known nodes in turn, then the
bootstrap servers) for its ApiVersions and a Metadata without topics, every
`pybroker.upstream.metadata.refresh.ms` (every second while none answers), connected and
authenticated as the front-end (broker.shared.upstream_security).  From the answers
it keeps the cluster id, the nodes and their addresses, the API versions every node asked so
far serves (a rolling upgrade mixes versions: the lowest highest wins) and the features, and
hands the result, when it changed, to `publish` (the parent sends it to every worker as an
`UpstreamView`).  Each node id seen for the first time gets its front-end ports through `bind`
(the listeners' acceptors for that node); a bind that fails is tried again at the next look.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Callable

from broker.shared import ipc
from broker.shared.protocol.client_codec import decode_response, request_frame
from broker.shared.upstream_security import CLIENT_ID, UpstreamSecurity

log = logging.getLogger("broker.parent.upstream_directory")

_SIZE = struct.Struct(">i")
_API_VERSIONS, _METADATA = 18, 3
_API_VERSIONS_VERSION, _METADATA_VERSION = 3, 12
_MAX_ANSWER_BYTES = 64 << 20  # a Metadata without topics is a few hundred bytes per node
UNREACHABLE_RETRY_SECONDS = 1.0


class UpstreamDirectory:
    """Polls the upstream cluster; publishes what changed; binds ports for new nodes."""

    def __init__(self, loop: asyncio.AbstractEventLoop, bootstrap: tuple[tuple[str, int], ...],
                 refresh_seconds: float, timeout_seconds: float,
                 publish: Callable[[ipc.UpstreamView], None], bind: Callable[[int], bool],
                 security: UpstreamSecurity | None = None):
        self.loop = loop
        self.security = security or UpstreamSecurity("PLAINTEXT")
        self.bootstrap = bootstrap
        self.refresh_seconds = refresh_seconds
        self.timeout_seconds = timeout_seconds
        self.publish = publish
        self.bind = bind
        self.view: ipc.UpstreamView | None = None
        self.reachable = False
        self._versions: dict[tuple[str, int], dict[int, tuple[int, int]]] = {}  # by address
        self._bound: set[int] = set()
        self._turn = 0  # which known node is asked next
        self._task: asyncio.Task | None = None
        self._first = loop.create_future()

    def start(self) -> None:
        self._task = self.loop.create_task(self._run())

    async def first_view(self, timeout: float) -> bool:
        """Wait until the cluster answered once, at most `timeout` seconds."""
        try:
            await asyncio.wait_for(asyncio.shield(self._first), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:  # noqa: BLE001 - the directory keeps looking whatever happened
                log.exception("upstream directory: refresh failed")
            await asyncio.sleep(self.refresh_seconds if self.reachable
                                else min(self.refresh_seconds, UNREACHABLE_RETRY_SECONDS))

    async def refresh(self) -> None:
        """Ask the candidates in turn until one answers."""
        failures = []
        for address in self._candidates():
            try:
                versions, features, metadata = await asyncio.wait_for(
                    self._ask(address), self.timeout_seconds)
            except (OSError, asyncio.TimeoutError, ValueError, EOFError) as error:
                failures.append(f"{address[0]}:{address[1]} ({error!r})")
                continue
            if not self.reachable:
                log.info("upstream cluster reachable through %s:%d", *address)
            self.reachable = True
            self._versions[address] = versions
            self._learned(features, metadata)
            return
        if self.reachable or self.view is None:
            log.warning("upstream cluster unreachable: %s", "; ".join(failures))
        self.reachable = False

    def _candidates(self) -> list[tuple[str, int]]:
        known = [(node.host, node.port) for node in self.view.nodes] if self.view else []
        self._turn += 1
        if known:
            turn = self._turn % len(known)
            known = known[turn:] + known[:turn]
        return known + [address for address in self.bootstrap if address not in known]

    async def _ask(self, address: tuple[str, int]):
        host, port = address
        reader, writer = await asyncio.open_connection(
            host, port, **self.security.connection_options(host))

        async def ask(request: bytes) -> bytes:
            writer.write(request)
            return await _read_answer(reader)

        try:
            await self.security.authenticate(ask)
            api_versions = decode_response(_API_VERSIONS, _API_VERSIONS_VERSION, await ask(
                request_frame(_API_VERSIONS, _API_VERSIONS_VERSION, 1, CLIENT_ID,
                              {"client_software_name": CLIENT_ID,
                               "client_software_version": "1"})))[1]
            metadata = decode_response(_METADATA, _METADATA_VERSION, await ask(
                request_frame(_METADATA, _METADATA_VERSION, 2, CLIENT_ID,
                              {"topics": (), "allow_auto_topic_creation": False,
                               "include_topic_authorized_operations": False})))[1]
        finally:
            writer.close()
        if api_versions.error_code != 0:
            raise ValueError(f"ApiVersions answered error {api_versions.error_code}")
        versions = {item.api_key: (item.min_version, item.max_version)
                    for item in api_versions.api_keys}
        features = ([(item.name, item.min_version, item.max_version)
                     for item in api_versions.supported_features],
                    [(item.name, item.min_version_level, item.max_version_level)
                     for item in api_versions.finalized_features],
                    api_versions.finalized_features_epoch)
        return versions, features, metadata

    def _learned(self, features, metadata) -> None:
        nodes = sorted((ipc.UpstreamNode(node_id=broker.node_id, host=broker.host,
                                         port=broker.port, rack=broker.rack)
                        for broker in metadata.brokers), key=lambda node: node.node_id)
        addresses = {(node.host, node.port) for node in nodes}
        for address in list(self._versions):  # nodes gone and bootstrap aliases: forgotten
            if address not in addresses and len(self._versions) > 1:
                del self._versions[address]
        for node in nodes:
            if node.node_id not in self._bound and self.bind(node.node_id):
                self._bound.add(node.node_id)
        view = ipc.UpstreamView(cluster_id=metadata.cluster_id, nodes=nodes,
                                versions=_common_versions(self._versions.values()),
                                supported_features=features[0], finalized_features=features[1],
                                finalized_epoch=features[2], bound=sorted(self._bound))
        if view != self.view:
            if self.view is None or view.nodes != self.view.nodes:
                log.info("upstream cluster %s: nodes %s", view.cluster_id,
                         ", ".join(f"{node.node_id}@{node.host}:{node.port}" for node in nodes))
            self.view = view
            self.publish(view)
        if not self._first.done():
            self._first.set_result(None)


def _common_versions(by_node) -> list[tuple[int, int, int]]:
    """(key, lowest, highest) served by every node: the intersection of their ranges."""
    common: dict[int, tuple[int, int]] | None = None
    for versions in by_node:
        if common is None:
            common = dict(versions)
            continue
        for key in list(common):
            if key not in versions:
                del common[key]
                continue
            low = max(common[key][0], versions[key][0])
            high = min(common[key][1], versions[key][1])
            if low > high:
                del common[key]
            else:
                common[key] = (low, high)
    return sorted((key, low, high) for key, (low, high) in (common or {}).items())


async def _read_answer(reader: asyncio.StreamReader) -> bytes:
    """One size-prefixed answer."""
    size = _SIZE.unpack(await reader.readexactly(4))[0]
    if not 4 <= size <= _MAX_ANSWER_BYTES:
        raise ValueError(f"answer of {size} bytes")
    return _SIZE.pack(size) + await reader.readexactly(size)
