"""Messages between the parent and a worker over their SOCK_SEQPACKET socket pair.

One datagram is one msgpack-encoded message.  A `Handoff` carries the accepted sockets
themselves as SCM_RIGHTS ancillary data, one fd per entry, in the same order.

    parent -> worker   Boot (first, once), Handoff, Shutdown, Close, EvictQuery, AdminResponse,
                       Quotas (after Boot and after every client-quota change)
    worker -> parent   Ready (once booted), Progress (hand-off credits and closed connection
                       ids), EvictCandidates, AdminRequest
"""

from __future__ import annotations

import array
import socket

import msgspec

from broker.config import BrokerConfig

MAX_FDS_PER_MESSAGE = 250  # Linux accepts at most 253 fds per SCM_RIGHTS message
MAX_MESSAGE_BYTES = 1 << 16


class Boot(msgspec.Struct, tag=True, frozen=True):
    config: BrokerConfig
    slot: int
    shm_path: str
    cluster_id: str
    name: str
    control_plane: bool = False  # serve the control-plane listener only (KIP-291)


class Handoff(msgspec.Struct, tag=True, frozen=True):
    # (connection id, listener index, peer host, peer port) per fd
    conns: list[tuple[int, int, str, int]]


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


class AdminRequest(msgspec.Struct, tag=True, frozen=True):
    request_id: int
    listener: int
    peer: str
    frame: bytes  # the request frame, served by the parent (config and quota changes)


class AdminResponse(msgspec.Struct, tag=True, frozen=True):
    request_id: int
    frame: bytes | None  # the response frame; None closes the connection
    busy_ns: int = 0  # the parent's handling time, charged to the client's request quota


Message = (Boot | Handoff | Shutdown | Ready | Progress | Close | EvictQuery | EvictCandidates
           | AdminRequest | AdminResponse | Quotas)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)
encode = _encoder.encode


def decode(data: bytes) -> Message:
    return _decoder.decode(data)


def send_handoff(sock: socket.socket, conns: list, fds: list[int]) -> None:
    """Send one Handoff with its fds; raises BlockingIOError if the worker's queue is full."""
    sock.sendmsg([encode(Handoff(conns))],
                 [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])


def receive(sock: socket.socket) -> tuple[Message, list[int]]:
    """One message and the fds that came with it; raises BlockingIOError when none is ready,
    EOFError when the peer closed."""
    data, ancillary, flags, _ = sock.recvmsg(MAX_MESSAGE_BYTES,
                                             socket.CMSG_SPACE(MAX_FDS_PER_MESSAGE * 4))
    fds = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    if not data and not fds:
        raise EOFError("peer closed the socket")
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            socket.close(fd)
        raise OSError(f"truncated IPC message (flags {flags:#x})")
    return decode(data), list(fds)
