"""Front-end mode: upstream answers made to name the front-end, never the upstream nodes.

Every field that carries a broker's address is rewritten to the front-end port of that node
on the client's listener (`Address`: node id -> (host, port), or None for a node without a
front-end port, which is then left out):

  Metadata             brokers                         decoded and encoded again (kio)
  FindCoordinator      v0-3 the coordinator, v4+ each  decoded and encoded again
  DescribeCluster      brokers                         decoded and encoded again
  Produce v10+         node_endpoints (KIP-951)        decoded; encoded again only when set
  ShareFetch/Acknowledge  node_endpoints               decoded; encoded again only when set

Fetch is offered up to v15, whose answers hold no address: its bytes pass through untouched.
Node ids, the cluster id and controller ids are kept as upstream gives them, so a client
that meets the same cluster directly and through the front-end sees one cluster.

Also here: a Produce's acks read and set in place (acks=0 goes upstream as acks=1, so the
upstream connection always gets an answer and no error of one client closes a connection
others share), and a Produce answer's throttle_time_ms written (it follows the topics).
"""

from __future__ import annotations

import dataclasses
import datetime
import struct
from typing import Callable

from broker.shared.protocol.client_codec import decode_response, reencode_response
from broker.shared.protocol.errors import ErrorCode
from broker.shared.protocol.guard import GuardError, read_uvarint
from workers.router import InvalidRequest

Address = Callable[[int], "tuple[str, int] | None"]

_INT16 = struct.Struct(">h")
_COORDINATOR_NOT_AVAILABLE = 15


def metadata(answer, version: int, address: Address) -> bytes:
    body_at, body = decode_response(3, version, answer)
    return reencode_response(answer, body_at, _brokers_moved(body, "node_id", address))


def describe_cluster(answer, version: int, address: Address) -> bytes:
    body_at, body = decode_response(60, version, answer)
    if getattr(body, "endpoint_type", 1) != 1:  # controllers: answered by brokers as an error
        return bytes(answer)
    return reencode_response(answer, body_at, _brokers_moved(body, "broker_id", address))


def _brokers_moved(body, id_field: str, address: Address):
    """The answer's brokers at their front-end ports; those without one left out."""
    moved = (_moved(broker, address(getattr(broker, id_field))) for broker in body.brokers)
    return dataclasses.replace(body, brokers=tuple(item for item in moved if item is not None))


def find_coordinator(answer, version: int, address: Address) -> bytes:
    body_at, body = decode_response(10, version, answer)
    if version < 4:
        body = _coordinator(body, address)
    else:
        body = dataclasses.replace(body, coordinators=tuple(
            _coordinator(item, address) for item in body.coordinators))
    return reencode_response(answer, body_at, body)


def _coordinator(entry, address: Address):
    """One coordinator: its front-end address, or COORDINATOR_NOT_AVAILABLE for a node
    without a front-end port (the client asks again)."""
    if entry.node_id < 0:
        return entry
    where = address(entry.node_id)
    if where is None:
        return dataclasses.replace(entry, node_id=-1, host="", port=-1,
                                   error_code=ErrorCode(_COORDINATOR_NOT_AVAILABLE))
    return dataclasses.replace(entry, host=where[0], port=where[1])


def _moved(entry, where: tuple[str, int] | None):
    return None if where is None else dataclasses.replace(entry, host=where[0], port=where[1])


def node_endpoints(api_key: int):
    """The rewriter of an answer whose node_endpoints field lists leaders (Produce v10+,
    ShareFetch, ShareAcknowledge): decoded to look, encoded again only when it is set."""

    def rewrite(answer, version: int, address: Address):
        body_at, body = decode_response(api_key, version, answer)
        if not getattr(body, "node_endpoints", ()):
            return answer
        endpoints = tuple(_moved(item, address(item.node_id))
                          for item in body.node_endpoints)
        body = dataclasses.replace(body, node_endpoints=tuple(
            item for item in endpoints if item is not None))
        return reencode_response(answer, body_at, body)

    return rewrite


def produce_throttled(answer, version: int, throttle_ms: int) -> bytes:
    """A Produce answer with throttle_time_ms at least `throttle_ms`."""
    body_at, body = decode_response(0, version, answer)
    written = max(throttle_ms, int(body.throttle_time.total_seconds() * 1000))
    body = dataclasses.replace(body, throttle_time=datetime.timedelta(milliseconds=written))
    return reencode_response(answer, body_at, body)


def produce_failed(answer, version: int) -> str | None:
    """The first partition error of a Produce answer, as Kafka names it; None if none."""
    _, body = decode_response(0, version, answer)
    for topic in body.responses:
        for partition in topic.partition_responses:
            if partition.error_code != ErrorCode.none:
                return f"{topic.name}-{partition.index}: {partition.error_code.name}"
    return None


def acks_at(request, body_at: int, version: int) -> int:
    """Where a Produce request's acks (int16) lies: after the transactional id, a nullable
    string (compact from v9), its length read as Kafka reads it (a varint wraps to 32 bits,
    a negative length is null).  InvalidRequest if the frame cannot hold it."""
    try:
        if version >= 9:
            value, at = read_uvarint(request, body_at)
            value &= 0xFFFFFFFF
            length = (value - (1 << 32) if value >= 1 << 31 else value) - 1
        else:
            length, at = _INT16.unpack_from(request, body_at)[0], body_at + 2
    except (IndexError, struct.error, GuardError):
        raise InvalidRequest("malformed_body", "Produce: no transactional id") from None
    at += max(0, length)
    if length > 32767 or at + 2 > len(request):
        raise InvalidRequest("malformed_body", f"Produce: a transactional id of {length} "
                                               f"bytes in a frame of {len(request)}")
    return at
