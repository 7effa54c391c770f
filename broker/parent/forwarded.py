"""A request a worker forwarded to the parent, decoded for the service that answers it (the
admin service, the group coordinator, the transaction coordinator), and the bound on the answer
it gets.

`ResponseBudget` is what one answer may take: at most pybroker.forwarded.response.max.bytes
and pybroker.request.max.entries entries.  Services charge each entry before they build it,
so a small request that asks for a huge answer (a group named 10,000 times, every key of every
config resource) is refused before the parent spends time or memory on it:
`ResponseTooLarge`, and the connection that asked is closed.  `AdminRouter` checks every
answer's size once more when it is done, which covers the answers nothing estimates (a
JoinGroup's member list, the transaction APIs).
"""

from __future__ import annotations

from broker.shared.acl import canonical_host
from broker.shared.config import ServerProperties
from broker.shared.protocol.codec import REQUEST_PREFIX, request_readers
from broker.shared.protocol.context import RequestContext

ENTRY_BYTES = 16  # what an answer's entry takes at least besides its strings and blobs


def decode_forwarded(request: bytes, listener: int, peer: str, user: str):
    """(RequestContext, body) of a forwarded frame; `peer` is the client's "ip:port", `user`
    its principal's name.  The worker decoded it once already, so it decodes."""
    api_key, version, _ = REQUEST_PREFIX.unpack_from(request, 0)
    header_reader, body_reader = request_readers(api_key, version)
    header, offset = header_reader(request, 0)
    body, _ = body_reader(request, offset)
    host = canonical_host(peer.rpartition(":")[0] or peer)
    return RequestContext(request[4:8], api_key, version, listener, header, user, host), body


class ResponseTooLarge(Exception):
    """An answer past its budget: it is not built, and the connection that asked is closed."""

    def __init__(self, what: str):
        super().__init__(what)


class ResponseBudget:
    """The bytes and entries one answer may still take; `charge` before building an entry."""

    __slots__ = ("max_bytes", "max_entries", "bytes", "entries")

    def __init__(self, max_bytes: int, max_entries: int):
        if max_bytes <= 0 or max_entries <= 0:
            raise ValueError(f"a response budget needs room: {max_bytes} bytes, "
                             f"{max_entries} entries")
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self.bytes = self.entries = 0

    def charge(self, nbytes: int, entries: int = 1) -> None:
        """Count an entry of about `nbytes` (ENTRY_BYTES are added for each entry); raise
        ResponseTooLarge past either bound."""
        self.bytes += nbytes + ENTRY_BYTES * entries
        self.entries += entries
        if self.bytes > self.max_bytes:
            raise ResponseTooLarge(f"the answer would take more than {self.max_bytes} bytes "
                                   f"(pybroker.forwarded.response.max.bytes)")
        if self.entries > self.max_entries:
            raise ResponseTooLarge(f"the answer would hold more than {self.max_entries} "
                                   f"entries (pybroker.request.max.entries)")


def budget_of(props: ServerProperties | None = None) -> ResponseBudget:
    """A fresh budget for one answer, from the broker's settings (None: the defaults)."""
    props = props or _DEFAULTS
    return ResponseBudget(props.pybroker_forwarded_response_max_bytes,
                          props.pybroker_request_max_entries)


_DEFAULTS = ServerProperties()
