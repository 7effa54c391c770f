"""Request routing: decode each request with kio, hand it to the API that serves it, and settle
what the API answers.

`Router.handle(frame, listener_index, user, host, client)` takes one request frame (the bytes
after the size prefix), decodes it with kio behind the request guard
(broker.shared.protocol.guard: a count the frame cannot back never reaches kio's native reader,
which would abort the process) and dispatches it.  What the API answers (workers.answer) is
settled here and nowhere else: request time and byte-rate quotas charged, the throttle
(KIP-219) written into the answer, file regions read into bytes where they cannot be sent as
they are, requests the parent serves forwarded.  The connection gets bytes, None (acks=0), a
FileResponse, a Throttled answer, or a Future of one of these.  `InvalidRequest` is raised when
the connection must be closed: Kafka closes on unknown API keys, unsupported versions and
requests it cannot parse.

The APIs themselves live in workers.apis; only what they declare is advertised in
ApiVersions, so the broker never promises what it cannot answer.
"""

from __future__ import annotations

import asyncio
import struct
import time
from dataclasses import dataclass

from broker.shared.apis import BY_KEY, BY_NAME
from broker.shared.protocol.codec import (REQUEST_PREFIX, frame, request_readers,
                                          throttle_field_at)
from broker.shared.protocol.context import (NO_THROTTLE, RequestContext,  # noqa: F401 (re-export)
                                            error_code)
from broker.shared.protocol.errors import ErrorCode
from broker.shared.protocol.guard import TooManyEntries
from workers.answer import ForwardRequest  # noqa: F401 (tests and fuzz targets import it here)
from workers.answer import Answer, Throttled
from workers.answer_cache import BoundedCache
from workers.fetch_response import FileResponse
from workers.frames import MAX_KEY_BYTES
from workers.unknown_tags import is_unknown_tag, without_unknown_tags

# The route of a request: its API key and version read as one unsigned 32-bit number.
_ROUTE_KEY = struct.Struct(">I")
_THROTTLE = struct.Struct(">i")
# ApiVersions v0 body: error code, array of one (api key, min version, max version).
_API_VERSIONS_V0_ERROR = struct.Struct(">hihhh")
# Pure answers (ApiVersions) are memoized by the request's route and its bytes after the
# correlation id (workers.frames, whose walk answers from the same memo): small keys only (a
# real ApiVersions request is about 50 bytes), 256 KiB in all.
_MEMO_BYTES = 256 * 1024


class InvalidRequest(Exception):
    """The request cannot be answered; `reason` is one of shm.block.INVALID_REASONS."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


@dataclass(frozen=True)
class BrokerView:
    """What handlers need to know about this broker."""

    node_id: int
    cluster_id: str
    advertised: tuple[tuple[str, int] | None, ...]  # per listener index: (host, port) or None


class Api:
    """Base of the request handlers: subclasses set the class attributes and `handle`."""

    key: int = -1  # these three come from the API table (broker.shared.apis)
    name: str = ""
    versions: tuple[int, int] = (0, 0)
    pure = False  # True: the answer depends only on the request bytes after the correlation id
    forwarded = False  # True: the raw frame goes to the parent undecoded
    raw = False  # True: only the header is decoded; `handle_raw` gets the frame (front-end)

    def __init_subclass__(cls, api: str | None = None, **kwargs):
        """`class Produce(Api, api="Produce")`: key, name and versions from the table."""
        super().__init_subclass__(**kwargs)
        if api is not None:
            spec = BY_NAME[api]
            cls.key, cls.name, cls.versions = spec.key, spec.name, spec.versions

    def __init__(self, services=None):
        self.services = services  # workers.apis.Services

    def handle(self, ctx: RequestContext, body):
        raise NotImplementedError

    def handle_raw(self, ctx: RequestContext, request, body_at: int, client):
        """A raw API's request: the frame, where its body begins, and the connection."""
        raise NotImplementedError


class Router:
    """Decodes each request with kio, dispatches it by API key and settles the answer."""

    def __init__(self, apis: list[Api], quotas=None, forward=None):
        self.apis = {api.key: api for api in apis}
        self.quotas = quotas  # workers.throttling.ClientQuotas, or None (the control plane)
        # (frame, listener index, peer, user) -> a Future of the parent's Answer; None: the
        # router answers ForwardRequest (in-process use)
        self.forward = forward
        self._routes = {}
        # route -> (where throttle_time_ms lies in the answer or 0, whether the broker delays)
        self._throttles: dict[int, tuple[int, bool]] = {}
        # The pure answers: key (route + all after the correlation id) -> (head, tail, api key).
        self.memo = BoundedCache(_MEMO_BYTES, MAX_KEY_BYTES)
        for api in apis:
            low, high = api.versions
            client_throttle = BY_KEY[api.key].client_throttle if api.key in BY_KEY else 0
            for version in range(low, high + 1):
                header_reader, body_reader = request_readers(api.key, version)
                route = api.key << 16 | version
                memo_prefix = _ROUTE_KEY.pack(route) if api.pure else None  # the key's start
                self._routes[route] = (header_reader, body_reader, api, memo_prefix, version)
                self._throttles[route] = (throttle_field_at(api.key, version),
                                          version < client_throttle)
        self._api_versions_range = self.apis[18].versions if 18 in self.apis else (0, 0)

    def served(self) -> dict[int, tuple[int, int]]:
        return {key: api.versions for key, api in self.apis.items()}

    def handle(self, request, listener_index: int, user: str = "ANONYMOUS", host: str = "",
               client=None):
        """Answer one request frame; raise InvalidRequest to close the connection.  `user`:
        the connection's principal name (SASL or a client certificate); `host`: its IP;
        `client`: the connection (its `peer` "ip:port", and `files`: whether file regions
        may be sent as they are), None in-process."""
        if len(request) < 8:
            raise InvalidRequest("frame_too_small", f"request of {len(request)} bytes has no header")
        route = self._routes.get(_ROUTE_KEY.unpack_from(request, 0)[0])
        if route is None:
            api_key, api_version, _ = REQUEST_PREFIX.unpack_from(request, 0)
            return self._unroutable(request, api_key, api_version)
        header_reader, body_reader, api, memo_prefix, api_version = route
        if api.raw:
            return self._raw(request, header_reader, api, api_version, listener_index, user,
                             host, client)
        key = None  # the memo's key: the request as it came, before any tag was skipped
        if memo_prefix is not None and len(request) - 4 <= MAX_KEY_BYTES:
            key = memo_prefix + request[8:]  # all but the correlation id (bytes, whatever it is)
            answer = self.memo.table.get(key)
            if answer is not None:
                return b"".join((answer[0], request[4:8], answer[1]))
        try:
            header, body = _decode(request, header_reader, body_reader)
        except Exception as error:  # kio raises several types for malformed input
            if not is_unknown_tag(error):
                raise _invalid(error, api.name, api_version) from None
            try:  # a newer client's tagged fields: skipped, as Kafka skips them (KIP-482)
                request = without_unknown_tags(request, api.key, api_version)
                header, body = _decode(request, header_reader, body_reader)
            except Exception as again:  # noqa: BLE001 - sorted by _invalid
                raise _invalid(again, api.name, api_version) from None
        ctx = RequestContext(request[4:8], api.key, api_version, listener_index, header, user,
                             host, len(request))
        if api.forwarded:  # decoded here first, so the parent only sees frames that decode
            if self.forward is None:
                return ForwardRequest(request)
            peer = client.peer if client is not None else host
            return self._later(ctx, self.forward(request, listener_index, peer, user), 0.0,
                               client)
        quotas = self.quotas
        if quotas is None or not quotas.active():
            response = api.handle(ctx, body)
            if type(response) is bytes:
                if key is not None:  # not len(request): skipping unknown tags may shorten it
                    self.memo.put(key, (response[:4], response[8:], api.key), len(key),
                                  len(response))
                return response
            return self.settle(ctx, response, 0.0, client)
        started = time.perf_counter()
        response = api.handle(ctx, body)
        return self.settle(ctx, response, time.perf_counter() - started, client)

    def _raw(self, request, header_reader, api: Api, api_version: int, listener_index: int,
             user: str, host: str, client):
        """A request whose body is not decoded here (front-end mode: it goes upstream)."""
        try:
            header, body_at = header_reader(request, 0)
        except Exception as error:  # kio raises several types for malformed input
            raise _invalid(_HeaderError(repr(error)), api.name, api_version) from None
        ctx = RequestContext(request[4:8], api.key, api_version, listener_index, header, user,
                             host, len(request))
        quotas = self.quotas
        if quotas is None or not quotas.active():
            return self.settle(ctx, api.handle_raw(ctx, request, body_at, client), 0.0, client)
        started = time.perf_counter()
        response = api.handle_raw(ctx, request, body_at, client)
        return self.settle(ctx, response, time.perf_counter() - started, client)

    def settle(self, ctx: RequestContext, response, busy: float, client=None):
        """What the connection sends for a handler's answer (workers.answer) that took `busy`
        seconds: quotas charged, the throttle written in, file regions read where the
        connection cannot send them."""
        if isinstance(response, asyncio.Future):
            return self._later(ctx, response, busy, client)
        seconds = 0.0
        quotas = self.quotas
        if type(response) is Answer:
            if quotas is not None and quotas.active():
                seconds = max(quotas.earned(ctx.user, ctx.header.client_id, busy + response.busy,
                                            response.quota, response.amount), response.owed)
            if seconds > 0:
                return self._throttled(ctx, response, seconds)
            response = response.payload
        elif busy and quotas is not None and quotas.active():
            seconds = quotas.earned(ctx.user, ctx.header.client_id, busy)
            if seconds > 0:
                return self._throttled(ctx, Answer(response), seconds)
        if type(response) is FileResponse and client is not None and not client.files:
            return response.materialize()  # TLS: every byte goes through the connection
        return response

    def _throttled(self, ctx: RequestContext, answer: Answer, seconds: float) -> Throttled:
        """The answer with its throttle written in (a throttled answer is rare: it goes as
        bytes), and whether the broker itself must hold it back (an old version)."""
        ms = max(1, int(seconds * 1000))
        at, delay = self._throttles[ctx.api_key << 16 | ctx.version]
        payload = answer.payload if answer.encode is None else answer.encode(ms)
        if type(payload) is FileResponse:
            payload = payload.materialize()
        if payload is None:
            return Throttled(None, ms, delay=False)  # acks=0: muted, with no answer
        if at and answer.encode is None:  # a longer throttle the handler wrote stays
            written = max(ms, _THROTTLE.unpack_from(payload, at)[0])
            payload = b"".join((payload[:at], _THROTTLE.pack(written), payload[at + 4:]))
        return Throttled(payload, ms, delay=delay)

    def _later(self, ctx: RequestContext, waiting: asyncio.Future, busy: float, client):
        """A Future of the settled answer of `waiting`; cancelling it cancels `waiting` (the
        connection went away: a long poll stops waiting)."""
        settled = waiting.get_loop().create_future()

        def done(future: asyncio.Future) -> None:
            if settled.done() or future.cancelled() or future.exception() is not None:
                self._charge(ctx, busy)  # the handling time was spent all the same
            if settled.done():  # cancelled meanwhile: nobody sends a file answer
                if not future.cancelled() and future.exception() is None:
                    _close_files(future.result())
            elif future.cancelled():
                settled.cancel()
            elif future.exception() is not None:
                settled.set_exception(future.exception())
            else:
                try:
                    settled.set_result(self.settle(ctx, future.result(), busy, client))
                except Exception as error:  # noqa: BLE001 - the connection hears of it
                    settled.set_exception(error)

        waiting.add_done_callback(done)
        settled.add_done_callback(lambda _: settled.cancelled() and waiting.cancel())
        return settled

    def _charge(self, ctx: RequestContext, busy: float) -> None:
        """Charge handling time of a request that is never answered (its wait was cancelled
        or failed): the client spent it."""
        quotas = self.quotas
        if busy and quotas is not None and quotas.active():
            quotas.earned(ctx.user, ctx.header.client_id, busy)

    def _unroutable(self, request, api_key: int, api_version: int) -> bytes:
        low, high = self._api_versions_range
        if api_key == 18 and api_version > high:
            # KIP-511: a newer client gets a v0 body naming the ApiVersions range we serve.
            body = _API_VERSIONS_V0_ERROR.pack(ErrorCode.unsupported_version, 1, 18, low, high)
            return frame(request[4:8], False, body)
        if api_key in self.apis:
            raise InvalidRequest("unsupported_version",
                                 f"{self.apis[api_key].name} v{api_version} is not supported")
        raise InvalidRequest("unknown_api", f"API key {api_key} (v{api_version}) is not served")


def _close_files(answer) -> None:
    """Release the descriptors of a file answer nobody will send."""
    payload = answer.payload if type(answer) is Answer else answer
    if type(payload) is FileResponse:
        payload.close()


class _HeaderError(Exception):
    """The request header, not the body, failed to decode."""


def _decode(request, header_reader, body_reader):
    try:
        header, offset = header_reader(request, 0)
    except Exception as error:  # kio raises several types for malformed input
        if is_unknown_tag(error):
            raise
        raise _HeaderError(repr(error)) from None
    body, _ = body_reader(request, offset)  # guarded: see broker.shared.protocol.guard
    return header, body


def _invalid(error: Exception, api_name: str, version: int) -> InvalidRequest:
    """Why a request that does not decode closes its connection."""
    if isinstance(error, _HeaderError):
        return InvalidRequest("malformed_header", f"bad request header: {error}")
    if isinstance(error, TooManyEntries):
        return InvalidRequest("too_many_entries", f"{api_name} v{version}: {error}")
    return InvalidRequest("malformed_body", f"bad {api_name} v{version} body: {error!r}")
