"""One client connection inside a worker: frames served in order, muting, idle tracking.

Reads land in the worker's shared scratch buffer (a BufferedProtocol), except the rest of a
frame over LARGE_FRAME_BYTES that did not arrive whole, which is read into a buffer of its own
(workers.framing).  Each read is cut into frames: the 4-byte size is checked against
`socket.request.max.bytes` before anything is allocated, then each frame goes to the router
(workers.router), in order, and what the router settles is sent: bytes, file regions (by a
FileSender), a throttled answer (KIP-219: sent, then the channel stays muted), or a Future
whose wait the connection keeps as a ParkedRequest (workers.parked).  A request is "in
flight" from the moment its frame is complete until its response is handed to the transport;
the mute state machine (workers.mute) records that, and every response of one read leaves in
one write.

The usual read - requests whose answers the router memoized, nothing pending, nothing muted -
is answered where it lies in the scratch buffer, by the C walk of workers.frames, and never
copied; a read is copied only where it must outlive the next one (a request for the router,
which may keep it while its answer waits, and the frames left pending).

While a response is pending (or the transport's write buffer is over its high-water mark) the
connection stops reading; frames already read wait in `_pending` and are served afterwards.

A connection sees the worker that owns it only through ConnectionHost, and the two waits of
workers.backpressure (the request queue, the memory pool's waiters) through the host's
`queue` and `memory`.  With the memory pool on, connections are PooledConnection
(workers.pooled_connection).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import mmap
import struct
import time
from time import monotonic as _monotonic
from typing import TYPE_CHECKING, Protocol

from broker.shared.acl import canonical_host
from broker.shared.apis import api_key_of
from broker.shared.tls import ANONYMOUS, CertificateRefused
from workers.answer import Throttled
from workers.fetch_response import FileResponse
from workers.file_sender import FileSender
from workers.frame_maps import FrameMaps
from workers.frames import answer_memoized
from workers.framing import LargeFrames
from workers.router import InvalidRequest, Router
from workers.mute import (RECEIVED, SENT, IllegalMuteTransition, MuteEvent, MuteState,
                          response_sent, transition, unmute)
from workers.parked import ParkedRequest
from workers.upstream import UpstreamUnavailable

if TYPE_CHECKING:
    from workers.authenticator import Authenticator
    from workers.backpressure import MemoryWaiters, RequestQueue
    from workers.worker_events import WorkerEvents
    from workers.stats import WorkerStats

log = logging.getLogger("workers.connection")

_SIZE = struct.Struct(">i")
_CLIENT_ID_LENGTH = struct.Struct(">h")  # request header v1+: after key, version, correlation
# A client reconnects from the same few addresses: each one's canonical form is parsed once.
_canonical_ip = functools.lru_cache(maxsize=4096)(canonical_host)
_RESPONSE_PENDING = MuteState.RESPONSE_PENDING
_NOT_MUTED = MuteState.NOT_MUTED


def client_id_of(request) -> str | None:
    """The client id of a request frame (header v1 and v2 put it at byte 8)."""
    if len(request) < 10:
        return None
    length = _CLIENT_ID_LENGTH.unpack_from(request, 8)[0]
    if length < 0:
        return None
    return bytes(request[10:10 + length]).decode("utf-8", "replace")


def _fulfil(future, value) -> None:
    if not future.done():
        future.set_result(value)


class ConnectionHost(Protocol):
    """What a connection uses of the worker that owns it (workers.worker.Worker)."""

    # Looked up once per connection.
    scratch: memoryview  # where reads land: one buffer for all the worker's connections
    router: Router  # its `handle(request, listener index, user, ip, connection)` answers
    max_request_bytes: int  # socket.request.max.bytes
    large_frame_bytes: int  # an incomplete frame above this gets a buffer of its own
    frame_maps: FrameMaps | None  # mappings for the largest frames, reused
    events: WorkerEvents | None  # only whether there is an event log (client ids are kept)
    queue: RequestQueue  # queued.max.requests, and parked requests
    # API keys whose wait for an answer counts against queued.max.requests (the parent's
    # queue); none in front-end mode, where the wait is the upstream's
    queued_keys: frozenset[int]
    memory: MemoryWaiters | None  # the memory pool's waiters; None when the pool is off
    # Used per request that is not answered at once, or once a second.
    loop: asyncio.AbstractEventLoop  # for throttles held back by the broker
    stats: WorkerStats  # its `muted("throttle", change)`
    receive_timeout: float  # pybroker.request.receive.timeout.ms, in seconds
    max_unsent_bytes: int  # pybroker.connection.max.unsent.bytes
    send_stall_seconds: float  # pybroker.connection.send.stall.ms, in seconds
    sasl_max_receive_bytes: int  # sasl.server.max.receive.size: requests before authentication

    def connection_registered(self, conn: Connection) -> None: ...

    def connection_closed(self, conn: Connection, reason: str) -> None: ...

    def requests_served(self, conn: Connection, api_keys: list[int], received_at: float,
                        parked: bool = False) -> None: ...

    def invalid_request(self, reason: str) -> None: ...

    def principal_of(self, listener: int, transport) -> str: ...

    def authenticator(self, conn: Connection) -> Authenticator | None: ...

    def claim_user(self, conn: Connection, user: str) -> asyncio.Future: ...

    def user_refused(self, conn: Connection, user: str, reason: str) -> None: ...


class Connection(LargeFrames, asyncio.BufferedProtocol):
    """A Kafka channel: size-prefixed request frames in, responses out in the same order."""

    # Slots: an idle connection costs a few hundred bytes, not a dict of some fifty entries.
    __slots__ = (
        "host", "_scratch", "ip", "_handle", "_memo", "_max_bytes", "_large_bytes", "_queue",
        "conn_id", "listener_index", "peer", "transport", "state", "last_active", "closing",
        "_close_reason", "_reading", "_write_paused", "_pending", "_partial_since", "fd",
        "_parked", "files", "_queue_wait", "opened_at", "bytes_in", "bytes_out", "_sent_mark",
        "_stalled_since", "bytes_in_logged", "bytes_out_logged", "aggregate", "client_id",
        "principal", "user", "session_expires", "_claiming", "_need_client_id", "requests",
        "throttle_ms", "upstream_node")

    def __init__(self, host: ConnectionHost, conn_id: int, listener_index: int, peer: str,
                 fd: int = -1, tls: bool = False):
        """`fd`: the socket's descriptor (file regions are sent to it, and the worker asks the
        kernel about it while reading is paused); `tls`: the listener encrypts, so file
        regions are read into memory instead."""
        # Per-connection state
        self.host = host
        # Looked up once: these are used for every read and every request.
        self._scratch = host.scratch
        self.ip = _canonical_ip(peer.rpartition(":")[0] or peer)  # peer is "ip:port"
        # (request, listener, user, ip, connection) -> the answer: the router, or the SASL
        # exchange until the client authenticated
        self._handle = host.router.handle
        # The router's memo of pure answers, read by the frame walk (None: every request goes
        # to `_handle`, as on a SASL listener, whose authenticator sees each request).
        self._memo: dict | None = host.router.memo.table
        self._max_bytes = host.max_request_bytes
        self._large_bytes = host.large_frame_bytes
        self._queue = host.queue
        self.conn_id = conn_id
        self.listener_index = listener_index
        self.peer = peer
        self.transport: asyncio.Transport | None = None
        self.state = MuteState.NOT_MUTED
        self.last_active = time.monotonic()
        self.closing = False
        self._close_reason = "client"
        self._reading = True
        self._write_paused = False
        # Framing state: bytes read but not yet served, and the large-frame receive buffer,
        # which grows as bytes arrive (never to a size a client only claims).
        self._pending = b""
        self._large: bytearray | mmap.mmap | None = None
        self._large_view: memoryview | None = None
        self._large_got = 0
        self._large_size = 0
        self._partial_since = 0.0  # when the frame still incomplete began to arrive
        self.fd = fd
        self._parked: ParkedRequest | None = None  # the request whose answer waits
        # File regions may go to the socket as they are (plaintext): TLS must encrypt every
        # byte in Python, so there they are read into memory.
        self.files = fd >= 0 and not tls
        self._queue_wait = False  # waiting in the host's queue for room
        # For the event log: bytes both ways, and the client id of the first request.
        self.opened_at = self.last_active
        self.bytes_in = self.bytes_out = 0
        self._sent_mark = 0  # bytes the client had taken at the last look (send stall)
        self._stalled_since = 0.0
        self.bytes_in_logged = self.bytes_out_logged = 0
        self.aggregate = None  # (table, api key, entry) of workers.worker_events, the current one
        self.client_id: str | None = None
        self.principal = ANONYMOUS  # set once connected (TLS: from the client certificate)
        self.user = "ANONYMOUS"  # the principal's name: the quota `user` entity
        self.session_expires = 0.0  # KIP-368: when the SASL session ends (monotonic); 0: never
        self._claiming = False  # a certificate's user waits for the per-user limits' verdict
        self._need_client_id = True  # the first request's, for the event log and the live view
        self.requests = 0  # answered (or acks=0) requests
        self.throttle_ms = 0  # throttle time earned over the connection's life
        self.upstream_node: int | None = None  # front-end mode: the node its requests go to

    # --- Protocol interface ---------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        host = self.host
        try:
            self.principal = host.principal_of(self.listener_index, transport)
        except CertificateRefused as refusal:  # as Kafka: a certificate naming no one is closed
            log.info("closing connection %s from %s: %s", self.conn_id, self.peer, refusal)
            host.connection_registered(self)
            self.close("authentication_failed")
            self._update_reading()  # closing: what the client sent already is never served
            return
        if self.principal != ANONYMOUS:  # a client certificate: quotas know the user
            self.user = self.principal.partition(":")[2]
        authenticator = host.authenticator(self)
        if authenticator is not None:  # a SASL listener: requests go there until authenticated
            self.authenticating(authenticator.handle, host.sasl_max_receive_bytes)
        elif self.principal != ANONYMOUS:  # nothing is read until the user's limits admit it
            self._claiming = True
            host.claim_user(self, self.user).add_done_callback(self._claim_decided)
            self._update_reading()
        host.connection_registered(self)

    def _claim_decided(self, verdict: asyncio.Future) -> None:
        """The parent's verdict on a client certificate's user: read requests, or close."""
        if self.closing:
            return
        if verdict.exception() is not None:
            self._fail(verdict.exception())
        elif verdict.result().refused:
            self.host.user_refused(self, self.user, verdict.result().refused)
        else:
            self._claiming = False
            self._update_reading()

    def connection_lost(self, exc) -> None:
        if exc is not None and self._close_reason == "client" and not isinstance(
                exc, (ConnectionResetError, BrokenPipeError)):
            self._close_reason = "error"  # a reset is the client going away, anything else is not
        self.closing = True
        self._large = self._large_view = None
        if self._parked is not None:
            self._parked.future.cancel()
        self.host.connection_closed(self, self._close_reason)

    def eof_received(self) -> bool:
        return False  # close our side too: Kafka connections are not half-open

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if not self.closing:
            self._serve(b"")

    @property
    def reading(self) -> bool:
        return self._reading

    def get_buffer(self, sizehint: int):
        if self._large_view is not None:
            if self._large_got == len(self._large):
                self._grow_frame_buffer()
            return self._large_view[self._large_got:]
        return self._scratch

    def buffer_updated(self, nbytes: int) -> None:
        received = self.last_active = _monotonic()
        self.bytes_in += nbytes
        if self._large_view is not None:
            self._into_frame_buffer(nbytes)
            return
        memo = self._memo
        if (memo is None or self._pending or self.state is not _NOT_MUTED or self._write_paused
                or self._need_client_id or self._queue.full):
            self._serve(self._scratch[:nbytes])  # a view: what outlives it is copied out
            return
        # The usual read: requests all answered from the memo, in C, where they were read,
        # and nothing else changes (the mute state nets out, nothing is left for later).
        out: list[bytes] = []
        handled: list[int] = []
        try:
            offset = answer_memoized(self._scratch, 0, self._max_bytes, memo, out, handled,
                                     nbytes)
        except Exception as error:  # noqa: BLE001 - sorted by _fail: one connection pays
            self._flush(out, handled)
            self._fail(error)
            return
        if offset < nbytes or not out:
            self._serve(self._scratch[:nbytes], None, offset, out, handled)
            return
        # _flush, inline (a call costs ~700 instructions, 4 % of such a read): the answers
        # are one bytes object.
        if not self.closing:
            answer = out[0]
            self.bytes_out += len(answer)
            transport = self.transport
            transport.write(answer)
            if transport.get_write_buffer_size() > self.host.max_unsent_bytes:
                self._unsent_bytes()
        self.requests += len(handled)
        self.host.requests_served(self, handled, received)
        if self._write_paused or self.closing:  # the write found the client slow to read
            self._update_reading()

    # --- Framing and serving --------------------------------------------------------------

    def _serve(self, data, request=None, offset: int = 0, out: list[bytes] | None = None,
               handled: list[int] | None = None) -> None:
        """Serve `request` (a frame read into a buffer of its own), if given, then every
        complete frame in `_pending + data` from `offset`, in order, with one write.

        `offset`, `out` and `handled` carry what buffer_updated's walk of memoized answers did
        (nothing is pending then): it answered the frames before `offset` in `out`, their api
        keys in `handled`, and left the frame at `offset`.  `data` may be a view of the
        worker's scratch buffer, which the next read overwrites: what outlives the call (a
        request, the pending tail) is copied out of it.  Both kinds of frame share the
        per-request step, inline: it runs for every request, and as a method it cost ~150 ns
        more each.  `request` is served as it is: its size was checked when it began to
        arrive."""
        if self._pending:
            data = self._pending + data
        if out is None:
            out, handled, walked = [], [], -1
        else:
            walked = offset  # the walk left that frame: not walked again
        end = len(data)
        max_bytes, handle, listener, queue, user, ip, memo = (
            self._max_bytes, self._handle, self.listener_index, self._queue, self.user, self.ip,
            self._memo)
        received, sent, key_of = RECEIVED, SENT, api_key_of
        try:
            while True:
                if request is None:  # cut the next frame from `data`, if it may be served now
                    if end - offset < 4 or self.state is not _NOT_MUTED or self._write_paused:
                        break
                    if (memo is not None and offset != walked and not self._need_client_id
                            and not queue.full):  # memoized answers first, in C
                        # The mute state nets out unchanged.
                        offset = answer_memoized(data, offset, max_bytes, memo, out, handled)
                        if end - offset < 4:
                            break
                    size = _SIZE.unpack_from(data, offset)[0]
                    if size < 0 or size > max_bytes:
                        self._check_size(size)
                    if end - offset - 4 < size:
                        if size > self._large_bytes:
                            self._start_large_frame(data, offset + 4, size)
                            offset = end
                        break
                    if queue.full:  # queued.max.requests: read no more for now
                        self._queue_wait = True
                        queue.wait(self)
                        break
                    request = data[offset + 4:offset + 4 + size]
                    if type(request) is not bytes:  # a view of the scratch: the router keeps it
                        request = request.tobytes()
                    offset += 4 + size
                # The step: serve one whole request.
                if self._need_client_id:
                    self._need_client_id = False
                    self.client_id = client_id_of(request)
                # The mute tables are looked up directly.  A state missing from a table is an
                # illegal transition.
                state = received.get(self.state)
                if state is None:
                    raise IllegalMuteTransition(f"request received in state {self.state.name}")
                self.state = state
                response = handle(request, listener, user, ip, self)
                api_key = key_of(request)
                if type(response) is bytes:
                    out.append(response)
                elif response is not None and self._park_or_throttle(response, api_key, out):
                    self._pending = bytes(data[offset:])  # parked: the answer must wait
                    if offset < end:  # a frame began behind it: its receive time runs now
                        self._partial_since = self.last_active
                    self._flush(out, handled)
                    return
                self.state = sent[self.state]  # None (acks=0) counts as sent, as in Kafka
                handled.append(api_key)
                request = None
        except Exception as error:  # noqa: BLE001 - sorted by _fail: one connection pays
            self._flush(out, handled)
            self._fail(error)
            return
        if offset < end:
            if offset or not self._pending:  # a new frame began
                self._partial_since = self.last_active
            self._pending = bytes(data[offset:])  # a copy: the scratch is the next read's
        else:
            self._pending = b""
        self._flush(out, handled)
        self._update_reading()

    def _park_or_throttle(self, response, api_key: int, out: list[bytes]) -> bool:
        """An answer that is not plain bytes: file regions, a Future (a long poll, a request
        the parent serves) or a Throttled answer.  Either the connection parks until the
        answer is ready (True), or the answer joins `out` (a throttled one: the channel stays
        muted for the throttle)."""
        if type(response) is FileResponse:
            return self._send_file(response, api_key, out)
        if type(response) is not Throttled:
            if not isinstance(response, asyncio.Future):
                raise TypeError(f"the router answered {type(response).__name__}")
            # A request waiting for the parent is queued there, unless it waits by design (a
            # rebalance); a long poll waits in purgatory.
            self._park(response, api_key, queued=api_key in self.host.queued_keys)
            return True
        self.throttle_ms += response.ms
        if response.delay:  # an old version: the broker holds the response back itself
            loop = self.host.loop
            future = loop.create_future()
            loop.call_later(response.ms / 1000, _fulfil, future, response.frame)
            self._park(future, api_key, queued=False)
            return True
        # KIP-219: the response leaves now, carrying the throttle; then the channel stays muted.
        self.state = transition(self.state, MuteEvent.THROTTLE_STARTED)
        if response.frame is not None:
            out.append(response.frame)
        self.host.stats.muted("throttle", +1)
        self.host.loop.call_later(response.ms / 1000, self._throttle_over)
        return False

    def _send_file(self, response: FileResponse, api_key: int, out: list[bytes]) -> bool:
        """A zero-copy answer: the answers before it are written, then it is sent by a
        FileSender while the connection stays muted (True)."""
        if self.closing:
            response.close()
            return False
        self._flush(out, [])
        out.clear()
        if self.closing:  # the flush found the client not taking answers
            response.close()
            return False
        try:
            sender = FileSender(self.host.loop, self.transport, self.fd, response)
        except BaseException:
            response.close()  # out of descriptors: the answer's own are released at once
            raise
        self.bytes_out += response.size
        self._park(sender.future, api_key, queued=False, sender=sender)
        sender.start()
        return True

    def _throttle_over(self) -> None:
        self.host.stats.muted("throttle", -1)
        if self.closing:
            return
        try:
            self.state = unmute(transition(self.state, MuteEvent.THROTTLE_ENDED))
        except IllegalMuteTransition as error:
            self._fail(error)
            return
        self._serve(b"")  # requests that arrived meanwhile, then reading again

    def _fail(self, error: Exception) -> None:
        """Close this connection for `error`; a handler bug never costs the worker."""
        if isinstance(error, InvalidRequest):
            self._reject(error)
        elif isinstance(error, (ConnectionResetError, BrokenPipeError)):  # while we sent
            self.close("client")
        elif isinstance(error, UpstreamUnavailable):
            log.info("closing connection %s from %s: %s", self.conn_id, self.peer, error)
            self.close(error.reason)
        elif isinstance(error, IllegalMuteTransition):
            log.error("connection %s from %s: %s; closing", self.conn_id, self.peer, error)
            self.close("error")
        else:
            log.error("connection %s from %s: request failed; closing", self.conn_id, self.peer,
                      exc_info=error)
            self.close("error")

    def _park(self, future, api_key: int, queued: bool, sender: FileSender | None = None) -> None:
        """A request whose answer waits: stay muted until the future is done.  Only `queued`
        ones (waiting for the parent to serve them) count against queued.max.requests."""
        parked = self._parked = ParkedRequest(future, api_key, self.last_active, queued, sender)
        self._queue.parked(queued)
        self._update_reading()
        future.add_done_callback(lambda _: self._parked_done(parked))

    def _parked_done(self, parked: ParkedRequest) -> None:
        self._parked = None
        self._queue.done(parked.queued)
        future = parked.future
        if future.cancelled():
            return
        if self.closing:
            if future.exception() is None and type(future.result()) is FileResponse:
                future.result().close()  # its descriptors: the answer will never be sent
            return
        error = future.exception()
        if error is not None:
            self._fail(error)
            return
        try:  # a done-callback's exception would be swallowed and leave the channel muted
            self._answer_parked(future.result(), parked)
        except Exception as error:  # noqa: BLE001 - sorted by _fail: one connection pays
            self._fail(error)

    def _answer_parked(self, response, parked: ParkedRequest) -> None:
        # An upstream answer read into a buffer of its own is a bytearray (front-end mode).
        out = [response] if type(response) is bytes or type(response) is bytearray else []
        if type(response) in (Throttled, FileResponse) and \
                self._park_or_throttle(response, parked.api_key, out):
            return  # held back once more (a delayed throttle, an answer being sent)
        self.state = response_sent(self.state)
        self._flush(out, [parked.api_key], parked.received_at, parked=True)
        if self._pending:  # a frame that began behind the answer: its time runs from now
            self._partial_since = time.monotonic()
        self._serve(b"")  # frames that queued up behind it

    def _flush(self, out: list[bytes], handled: list[int], received_at: float | None = None,
               parked: bool = False) -> None:
        if out and not self.closing:
            data = out[0] if len(out) == 1 else b"".join(out)
            self.bytes_out += len(data)
            transport = self.transport
            transport.write(data)
            if transport.get_write_buffer_size() > self.host.max_unsent_bytes:
                self._unsent_bytes()
        if handled:
            self.requests += len(handled)
            self.host.requests_served(self, handled,
                                      self.last_active if received_at is None else received_at,
                                      parked)

    def _unsent_bytes(self) -> None:
        log.info("connection %s from %s: %d bytes of answers not taken by the client; closing",
                 self.conn_id, self.peer, self.transport.get_write_buffer_size())
        self.close("unsent_bytes")

    def _reject(self, invalid: InvalidRequest) -> None:
        log.warning("closing connection %s from %s: %s", self.conn_id, self.peer, invalid)
        self.host.invalid_request(invalid.reason)
        self.close("invalid")

    def queue_resumed(self) -> None:
        """The host's queue has room for our request again (queued.max.requests)."""
        self._queue_wait = False
        if not self.closing:
            self._serve(b"")

    def _update_reading(self) -> None:
        """Read only while not muted and the peer keeps up with our responses."""
        want = (self.state is _NOT_MUTED and not self._write_paused and not self.closing
                and not self._queue_wait and not self._claiming)
        if want != self._reading and self.transport is not None:
            self._reading = want
            if want:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    # --- Authentication and closing -------------------------------------------------------

    def authenticating(self, handle, max_bytes: int) -> None:
        """A SASL listener: requests go to `handle` and may be at most `max_bytes` long until
        the client authenticated (sasl.server.max.receive.size)."""
        self._handle = handle
        self._memo = None
        self._max_bytes = min(self._max_bytes, max_bytes)

    def authenticated(self, principal: str, handle) -> None:
        """SASL authentication succeeded: the principal, and what answers from now on (the
        router, or the authenticator watching for a re-authentication)."""
        self.principal = principal
        self.user = principal.partition(":")[2]
        self._handle = handle
        router = self.host.router
        # Memoized answers again, unless the authenticator must see each request (KIP-368).
        self._memo = router.memo.table if handle == router.handle else None
        self._max_bytes = self.host.max_request_bytes

    def close_later(self, delay: float, reason: str) -> None:
        """Close `delay` seconds from now (a failed authentication), on a timer."""
        self.host.loop.call_later(delay, self.close, reason)

    def close(self, reason: str) -> None:
        """Close after the responses already written; `reason` labels the metric.  A client
        that does not take them gets pybroker.connection.send.stall.ms, then the socket is
        aborted: a closing connection never holds its slot for ever."""
        if self.closing:
            return
        self.closing = True
        self._close_reason = reason
        transport = self.transport
        if transport is None:
            return
        if reason in ("send_stalled", "unsent_bytes"):
            transport.abort()
            return
        transport.close()
        if transport.get_write_buffer_size():
            self.host.loop.call_later(self.host.send_stall_seconds, self._abort, transport)

    @staticmethod
    def _abort(transport) -> None:
        if not transport.is_closing() or transport.get_write_buffer_size():
            transport.abort()

    def send_stalled(self, now: float) -> bool:
        """Answers wait to be sent and the client took none of them for longer than
        pybroker.connection.send.stall.ms (called once a tick)."""
        transport = self.transport
        if transport is None or self.closing:
            return False
        unsent = transport.get_write_buffer_size()
        if self._parked is not None:
            unsent += self._parked.unsent
        taken = self.bytes_out - unsent
        if unsent == 0 or taken != self._sent_mark:
            self._sent_mark, self._stalled_since = taken, now
            return False
        return now - self._stalled_since > self.host.send_stall_seconds

    def owes_answer(self) -> bool:
        """A request is being served and its answer is not written yet (shutdown waits)."""
        return self.state in (MuteState.RESPONSE_PENDING, MuteState.THROTTLED_RESPONSE_PENDING)

    def waiting_for(self) -> list[str]:
        """Why the connection is not being read now (empty while it is): the live view's."""
        why = []
        if self.state in (MuteState.THROTTLED, MuteState.THROTTLED_RESPONSE_PENDING):
            why.append("throttle")
        if self.owes_answer():
            why.append("answer")  # a request in flight: answers leave in request order
        if self._write_paused:
            why.append("client_reading")  # the client does not take our answers fast enough
        if self._queue_wait:
            why.append("request_queue")  # queued.max.requests
        if self._claiming:
            why.append("user_limit")  # the per-user limits' verdict
        return why

    def is_idle(self) -> bool:
        """Nothing in flight and nothing half-read: safe to close for idleness."""
        return (self.state is _NOT_MUTED and not self._pending and self._large is None
                and self._parked is None)

    def receive_overdue(self, now: float) -> bool:
        """A frame began to arrive more than pybroker.request.receive.timeout.ms ago and is
        still incomplete (whole frames waiting behind a muted one do not count: the wait is
        ours, not the client's)."""
        return (self._partial_since > 0 and now - self._partial_since > self.host.receive_timeout
                and self._partial())

    def _partial(self) -> bool:
        if self._large is not None:
            return True
        pending = self._pending
        return bool(pending) and (len(pending) < 4 or
                                  len(pending) - 4 < _SIZE.unpack_from(pending)[0])
