"""Messages between the parent and a worker over their SOCK_SEQPACKET socket pair.

Each message is msgpack-encoded; `Channel` carries it in one datagram, or in back-to-back
chunks when it is larger than one (a DescribeConfigs of thousands of keys, a large group's
SyncGroup, eviction orders for thousands of connections), and queues what the socket cannot
take yet, so no message is ever truncated or dropped.  A `Handoff` carries the accepted
sockets themselves as SCM_RIGHTS ancillary data, one fd per entry, in the same order.
A queue past MAX_QUEUED_BYTES means a peer that stopped reading: the channel breaks, and the
worker with it.  A client's payloads (forwarded requests, their answers) never take it there:
their senders ask `has_room` first and refuse the one request that does not fit.

    parent -> worker   Boot (first, once), Handoff, Shutdown, Close, EvictQuery, ForwardedResponse,
                       Quotas (after Boot and after every client-quota change), Tls (after a
                       SIGHUP changed the SSL listeners' certificates), Credentials
                       (after Boot and after every SCRAM credential change), UserVerdict,
                       Acls (after Boot and after every ACL change, with an authorizer),
                       ConnectionsQuery (an operator asked GET /connections)
    worker -> parent   Ready (once booted), Progress (hand-off credits and closed connection
                       ids), EvictCandidates, ForwardedRequest, UserClaim (a connection
                       authenticated: may it stay, under the per-user limits?),
                       ConnectionsList
"""

from __future__ import annotations

import array
import collections
import logging
import os
import socket
import time

import msgspec

from broker.shared.acl import Acl
from broker.shared.config import BrokerConfig
from broker.shared.sasl import ScramCredential
from broker.shared.tls import TlsSettings

log = logging.getLogger("broker.shared.ipc")

MAX_FDS_PER_MESSAGE = 250  # Linux accepts at most 253 fds per SCM_RIGHTS message
MAX_MESSAGE_BYTES = 1 << 16


class Boot(msgspec.Struct, tag=True, frozen=True):
    config: BrokerConfig
    slot: int
    shm_path: str
    cluster_id: str
    name: str
    control_plane: bool = False  # serve the control-plane listener only (KIP-291)


class HandedOff(msgspec.Struct, array_like=True, frozen=True):
    """One socket of a Handoff: who it is (its fd travels beside the message)."""

    conn_id: int
    listener: int  # index into the config's listeners
    host: str  # the peer's address
    port: int


class Handoff(msgspec.Struct, tag=True, frozen=True):
    conns: list[HandedOff]  # one per fd, in the fds' order


class Shutdown(msgspec.Struct, tag=True, frozen=True):
    deadline_ms: int


class Ready(msgspec.Struct, tag=True, frozen=True):
    pid: int


class Progress(msgspec.Struct, tag=True, frozen=True):
    registered: int  # hand-off credits returned (sockets registered or dropped)
    closed: list[int]  # ids of connections that ended, so the parent frees their slots


class Close(msgspec.Struct, tag=True, frozen=True):
    conn_ids: list[int]
    reason: str


class EvictQuery(msgspec.Struct, tag=True, frozen=True):
    round: int
    count: int
    listeners: list[int]  # listener indexes whose connections may be evicted


class EvictCandidates(msgspec.Struct, tag=True, frozen=True):
    round: int
    candidates: list[tuple[int, int]]  # (conn id, last activity CLOCK_MONOTONIC ns), oldest first


class Quotas(msgspec.Struct, tag=True, frozen=True):
    """The client quotas in force (entity key -> {quota key: value}), after every change."""

    entries: dict[str, dict[str, float]]
    shadow: bool = False  # pybroker.shadow.client.quotas: throttles counted, not applied


class Tls(msgspec.Struct, tag=True, frozen=True):
    """The SSL listeners' settings after a SIGHUP changed them: new handshakes use them, open
    connections keep theirs (Kafka's dynamic key store update)."""

    listener_tls: dict[str, TlsSettings]


class Acls(msgspec.Struct, tag=True, frozen=True):
    """The ACLs in force, after Boot and after every change (with an authorizer only)."""

    acls: list[Acl]


class Credentials(msgspec.Struct, tag=True, frozen=True):
    """The SCRAM credentials (mechanism -> user -> credential), after Boot and every change."""

    scram: dict[str, dict[str, ScramCredential]]


class UserClaim(msgspec.Struct, tag=True, frozen=True):
    """A connection authenticated as `user`; its answer waits for the parent's UserVerdict."""

    conn_id: int
    user: str


class UserVerdict(msgspec.Struct, tag=True, frozen=True):
    conn_id: int
    refused: str = ""  # "" (admitted, counted for the user), per_user_limit or per_user_rate
    limit: int = 0  # the limit it is over, for the client's error message


class ForwardedRequest(msgspec.Struct, tag=True, frozen=True):
    request_id: int
    listener: int
    peer: str
    frame: bytes  # the request frame, served by the parent (config and quota changes)
    user: str = "ANONYMOUS"  # the connection's principal name, for the parent's authorization


class ForwardedResponse(msgspec.Struct, tag=True, frozen=True):
    request_id: int
    frame: bytes | None  # the response frame; None closes the connection
    busy_ns: int = 0  # the parent's handling time, charged to the client's request quota
    refused: str = ""  # with no frame: why (an invalid-request reason the worker counts)
    detail: str = ""  # and what, for the worker's log line


class ConnectionsQuery(msgspec.Struct, tag=True, frozen=True):
    query: int
    top: int  # at most this many rows back (the parent bounds it)
    by: str  # the sort key, one of CONNECTION_SORT_KEYS, largest first


CONNECTION_SORT_KEYS = ("bytes", "requests", "throttle", "age")


class ConnectionRow(msgspec.Struct, frozen=True):
    """One connection as the operator's live view shows it."""

    conn_id: int
    listener: int  # index into the config's listeners
    ip: str
    port: int
    client_id: str | None  # from its first request
    principal: str
    age_s: float
    bytes_in: int
    bytes_out: int
    requests: int
    in_flight: int  # requests read and not yet answered
    throttle_ms: int  # throttle time earned over the connection's life
    state: str  # the mute state: not_muted, muted, response_pending, throttled, ...
    waiting_for: list[str]  # why it is not being read now, if it is not (empty when read)


class ConnectionsList(msgspec.Struct, tag=True, frozen=True):
    query: int
    total: int  # connections this worker holds
    rows: list[ConnectionRow]  # its top `top` by the key, largest first


class UpstreamNode(msgspec.Struct, array_like=True, frozen=True):
    node_id: int
    host: str
    port: int
    rack: str | None = None


class UpstreamView(msgspec.Struct, tag=True, frozen=True):
    """Front-end mode: the upstream cluster as the parent last saw it, sent to every worker
    after Boot and whenever it changes.  `versions`: (api key, lowest, highest) that every
    upstream node asked so far serves; the features are copied into ApiVersions answers."""

    cluster_id: str | None
    nodes: list[UpstreamNode]
    versions: list[tuple[int, int, int]]
    supported_features: list[tuple[str, int, int]] = []
    finalized_features: list[tuple[str, int, int]] = []
    finalized_epoch: int = -1
    bound: list[int] = []  # the node ids whose front-end ports are bound: the others are never named


Message = (Boot | Handoff | Shutdown | Ready | Progress | Close | EvictQuery | EvictCandidates
           | ForwardedRequest | ForwardedResponse | Quotas | Tls | Credentials | UserClaim | UserVerdict
           | Acls | ConnectionsQuery | ConnectionsList | UpstreamView)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)
encode = _encoder.encode

# Each datagram starts with one byte: a whole message, or a chunk of one with more to come, or
# its last chunk.  Chunks of one message are sent back to back (one sender, one queue).
WHOLE, MORE, LAST = b"\x00", b"\x01", b"\x02"
CHUNK_BYTES = MAX_MESSAGE_BYTES - 1
MAX_REASSEMBLED_BYTES = 1 << 32  # a sanity bound: the largest frame is socket.request.max.bytes
MAX_QUEUED_BYTES = 1 << 30  # a peer that stopped reading this long is treated as gone
# What a client's payloads (forwarded requests, their answers) may fill of a channel's queue:
# past it the sender refuses the one request, whose connection closes; the channel, which
# carries every client of a worker, never breaks for one of them.
CLIENT_QUEUED_BYTES = MAX_QUEUED_BYTES // 4


def decode(data) -> Message:
    return _decoder.decode(data)


class ChannelError(OSError):
    """The channel is closed or its peer stopped reading."""


class Channel:
    """One end of a parent-worker socket pair: whole messages in, whole messages out.

    A message of any size goes out as one datagram or as back-to-back chunks, and is read back
    whole.  `send` never blocks the event loop and never drops a message: what the socket
    cannot take now waits, in order, for the socket to become writable.  File descriptors
    given to `send` belong to the channel from then on: it closes them once sent (the peer
    holds its own copies) or when the channel closes.  Without a loop (a worker booting) the
    socket is blocking and so is `send`.
    """

    def __init__(self, sock: socket.socket, loop=None, on_broken=None):
        self.sock = sock
        self.on_broken = on_broken  # called once if the peer is gone or stopped reading
        self.closed = False
        self._loop = None
        self._queue: collections.deque = collections.deque()  # ([flag, payload], fds)
        self._queued_bytes = 0
        self._writing = False
        self._chunks: list[bytes] = []  # a message being reassembled
        self._chunk_bytes = 0
        self._chunk_fds: list[int] = []
        if loop is not None:
            self.attach(loop)

    def fileno(self) -> int:
        return self.sock.fileno()

    def attach(self, loop) -> None:
        """From now on the socket is non-blocking and waits for writability on `loop`."""
        self._loop = loop
        self.sock.setblocking(False)

    # --- sending --------------------------------------------------------------------------

    def send(self, message: Message, fds: list[int] | tuple = ()) -> None:
        """Queue `message` (and `fds`) and send what the socket takes; raises ChannelError if
        the channel is closed (the fds are closed then too)."""
        if self.closed:
            _close_all(fds)
            raise ChannelError("the channel is closed")
        data = encode(message)
        if len(data) <= CHUNK_BYTES:
            self._queue.append(([WHOLE, data], list(fds)))
        else:
            view = memoryview(data)
            for start in range(0, len(data), CHUNK_BYTES):
                flag = MORE if start + CHUNK_BYTES < len(data) else LAST
                self._queue.append(([flag, view[start:start + CHUNK_BYTES]],
                                    list(fds) if start == 0 else []))
        self._queued_bytes += len(data)
        self.flush()
        if self._queued_bytes > MAX_QUEUED_BYTES:
            self._broken(ChannelError(f"{self._queued_bytes} bytes wait for a peer that does "
                                      f"not read"))
        if self.closed:
            raise ChannelError("the channel is closed")

    def flush(self) -> None:
        while self._queue and not self.closed:
            parts, fds = self._queue[0]
            try:
                if fds:
                    self.sock.sendmsg(parts, [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                               array.array("i", fds))])
                else:
                    self.sock.sendmsg(parts)
            except BlockingIOError:
                if not self._writing and self._loop is not None:
                    self._loop.add_writer(self.sock.fileno(), self.flush)
                    self._writing = True
                return
            except OSError as error:
                self._broken(error)
                return
            self._queue.popleft()
            self._queued_bytes -= len(parts[1])
            _close_all(fds)
        if self._writing:
            self._loop.remove_writer(self.sock.fileno())
            self._writing = False

    def pending(self) -> int:
        """Bytes queued and not yet taken by the socket."""
        return self._queued_bytes

    def has_room(self, nbytes: int) -> bool:
        """Whether a client's payload of `nbytes` may be queued (CLIENT_QUEUED_BYTES)."""
        return self._queued_bytes + nbytes <= CLIENT_QUEUED_BYTES

    # --- receiving ------------------------------------------------------------------------

    def receive(self) -> tuple[Message, list[int]]:
        """The next whole message and the fds that came with it; raises BlockingIOError when
        none is complete yet, EOFError when the peer closed."""
        while True:
            data, fds = _receive_datagram(self.sock)
            flag, payload = data[:1], memoryview(data)[1:]
            if flag == WHOLE and not self._chunks:
                return decode(payload), fds
            if flag not in (MORE, LAST) or (flag == WHOLE and self._chunks):
                _close_all(fds + self._chunk_fds)
                raise ChannelError(f"unexpected datagram flag {flag!r}")
            self._chunks.append(bytes(payload))
            self._chunk_bytes += len(payload)
            self._chunk_fds += fds
            if self._chunk_bytes > MAX_REASSEMBLED_BYTES:
                raise ChannelError("a reassembled message exceeds its bound")
            if flag == LAST:
                whole, fds = b"".join(self._chunks), self._chunk_fds
                self._chunks, self._chunk_fds, self._chunk_bytes = [], [], 0
                return decode(whole), fds

    # --- closing --------------------------------------------------------------------------

    def _broken(self, error: BaseException) -> None:
        """The peer is gone or stopped reading: nothing more is sent.  The owner, told through
        `on_broken`, stops watching the socket and closes the channel."""
        if self.closed:
            return
        self._stop_sending()
        if self.on_broken is not None:
            self.on_broken(error)
        else:
            self.close()

    def _stop_sending(self) -> None:
        self.closed = True
        if self._writing:
            self._loop.remove_writer(self.sock.fileno())
            self._writing = False
        for _parts, fds in self._queue:
            _close_all(fds)
        self._queue.clear()
        self._queued_bytes = 0

    def close(self) -> None:
        """Close the socket (an owner watching it removes its reader first)."""
        if self.sock.fileno() < 0:
            return
        self._stop_sending()
        _close_all(self._chunk_fds)
        self._chunk_fds, self._chunks, self._chunk_bytes = [], [], 0
        self.sock.close()


def _close_all(fds) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


# Plain ints: `flags & socket.MSG_TRUNC` would go through the IntFlag's Python `__rand__`
# (a microsecond per message, by py-spy).
_MSG_TRUNC, _MSG_CTRUNC = int(socket.MSG_TRUNC), int(socket.MSG_CTRUNC)
_ANCILLARY_BYTES = socket.CMSG_SPACE(MAX_FDS_PER_MESSAGE * 4)


def _receive_datagram(sock: socket.socket) -> tuple[bytes, list[int]]:
    data, ancillary, flags, _ = sock.recvmsg(MAX_MESSAGE_BYTES, _ANCILLARY_BYTES)
    fds = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    if not data and not fds:
        raise EOFError("peer closed the socket")
    if flags & _MSG_TRUNC or not data:
        _close_all(fds)
        raise ChannelError(f"truncated IPC datagram (flags {flags:#x})")
    if flags & _MSG_CTRUNC:  # this process is out of descriptors: the kernel kept the
        _lost_descriptors()  # ones it could not install; the message holds, those sockets
    return data, list(fds)  # are missing (a hand-off counts them closed), the channel lives


_lost_logged = [0.0]


def _lost_descriptors() -> None:
    now = time.monotonic()
    if now - _lost_logged[0] >= 10.0:
        _lost_logged[0] = now
        log.error("descriptors passed over the IPC channel were lost: this process is at its "
                  "open-files limit (their connections are closed)")
