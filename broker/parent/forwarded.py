"""A request a worker forwarded to the parent, decoded for the service that answers it (the
admin service, the group coordinator, the transaction coordinator)."""

from __future__ import annotations

from broker.shared.acl import canonical_host
from broker.shared.protocol.codec import REQUEST_PREFIX, request_readers
from broker.shared.protocol.context import RequestContext


def decode_forwarded(request: bytes, listener: int, peer: str, user: str):
    """(RequestContext, body) of a forwarded frame; `peer` is the client's "ip:port", `user`
    its principal's name.  The worker decoded it once already, so it decodes."""
    api_key, version, _ = REQUEST_PREFIX.unpack_from(request, 0)
    header_reader, body_reader = request_readers(api_key, version)
    header, offset = header_reader(request, 0)
    body, _ = body_reader(request, offset)
    host = canonical_host(peer.rpartition(":")[0] or peer)
    return RequestContext(request[4:8], api_key, version, listener, header, user, host), body
