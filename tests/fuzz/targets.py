"""Fuzz targets: one per decoder a hostile client can reach, each `target(data: bytes)`.

Each target raises only on a broken invariant; the decoders' own refusals are the expected
outcome.  An abort (kio's native reader), a hang or an unexpected exception is a finding.

    framing   bytes fed to a worker's Connection in arbitrary reads: whatever it writes is
              whole response frames, nothing escapes, a refusal closes with a metric, and a
              closed connection holds no buffer.  The pooled variant also returns every byte
              it took from the pool.  The same bytes through the C walk that answers memoized
              requests (workers/_frames.c) and its Python oracle: the same answers, the same stop;
              each read's answered requests through the C counts (workers/_counts.c) and their
              Python oracles: the same counters and event aggregate.
    requests  a request frame for any (API key, version) kio knows, through the guarded
              decoder the worker and the parent use: only ordinary exceptions, never an abort.
    router    a request frame through the worker's real router (workers/router.py) and the
              parent's services for what it forwards: an answer or InvalidRequest, never
              another exception.
    records   bytes as a produced record batch (every codec, the CRC fixed up in half of the
              runs so mutations reach the records) and as a stored log chunk: validation
              refuses with a Kafka error name, decompression stays within its bound, and the
              readers of stored batches (headers, timestamps) stay bounded by the bytes.
    ipc       bytes as datagrams between parent and worker: the decoder and the chunk
              reassembly refuse cleanly.
    tags      a flexible request frame through the unknown-tagged-field stripper
              (workers.unknown_tags): a shorter-or-equal frame or ValueError, nothing
              else, however the counts and lengths lie.
    http      what a peer sends the metrics endpoint (broker.parent.http_head): a head found
              within the bytes, then an environ or BadRequest with a status, nothing else.
    names     bytes as a DER X.500 name and as a DER client certificate (broker.shared.x500):
              a printed subject no longer than four characters a byte, or ValueError.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import tempfile

from kio.schema.index import api_key_map, schema_name_map

SCHEMAS = sorted((key, version) for key, name in api_key_map.items()
                 for version in schema_name_map[name])


class Finding(AssertionError):
    """A broken invariant."""


# --- framing -----------------------------------------------------------------------------------


class _Memory:
    """The pool's waiters: every other request is granted at once, the rest wait; counts bytes."""

    def __init__(self):
        self.held = 0
        self.calls = 0
        self.waiters = []

    def try_allocate(self, size: int, listener: int) -> bool:
        self.calls += 1
        if self.calls % 2:
            self.held += size
            return True
        return False

    def wait(self, conn) -> None:
        self.waiters.append(conn)

    def release(self, size: int, listener: int) -> None:
        self.held -= size


class _Queue:
    """A request queue never full, counting parked requests."""

    full = False

    def __init__(self):
        self.waiting = 0

    def parked(self, queued: bool) -> None:
        self.waiting += 1

    def done(self, queued: bool) -> None:
        self.waiting -= 1


def _fuzz_worker():
    """The test suite's FakeWorker, completed with what a connection may ask of its host:
    a memory pool, forwarding to a parent that answers at once, the request queue."""
    from tests.helpers import FakeWorker

    class Worker(FakeWorker):
        def __init__(self):
            super().__init__(max_request_bytes=1 << 16, large_frame_bytes=256)
            self.loop = asyncio.new_event_loop()
            self.memory = _Memory()
            self.queue = _Queue()
            self.router.forward = self.forward_admin  # as the worker's Forwarder
            self.reset()

        def reset(self):
            self.served, self.invalid, self.closed = [], [], []
            self.memory.waiters, self.forwarded, self.queue.waiting = [], [], 0

        def requests_served(self, conn, api_keys, received_at, parked=False):
            super().requests_served(conn, api_keys, received_at, parked)
            _counts_agree(api_keys, len(self.served) * 7919 + 1000 * len(api_keys))

        def forward_admin(self, request, listener, peer, user="ANONYMOUS"):
            future = self.loop.create_future()
            self.forwarded.append((future, bytes(request[4:8])))
            return future

    return Worker()


def framing(data: bytes) -> None:
    from tests.helpers import FakeTransport
    from workers.connection import Connection
    from workers.pooled_connection import PooledConnection

    if not data:
        return
    pooled, chunk = data[0] & 1, 1 + data[0] // 2 % 64
    worker = _WORKERS.get("framing") or _WORKERS.setdefault("framing", _fuzz_worker())
    _memo_walks_agree(data[1:], worker.router.memo.table)  # the answers of earlier runs
    worker.reset()
    worker.memory.held = 0
    transport = FakeTransport()
    conn = (PooledConnection if pooled else Connection)(worker, 1, 0, "127.0.0.1:1")
    conn.connection_made(transport)
    view = memoryview(data[1:])
    while view and not conn.closing:
        buffer = conn.get_buffer(-1)
        n = min(len(buffer), len(view), chunk)
        buffer[:n] = view[:n]
        conn.buffer_updated(n)
        view = view[n:]
        _answer_waiters(worker)
    out = b"".join(transport.writes)
    while out:
        size = struct.unpack_from(">i", out)[0] if len(out) >= 4 else -1
        if not 4 <= size <= len(out) - 4:
            raise Finding(f"a partial or malformed response frame was written: {out[:16]!r}")
        out = out[4 + size:]
    conn.connection_lost(None)
    if transport.closed and worker.closed != ["invalid"]:
        raise Finding(f"closed as {worker.closed} (a handler or the mute state failed), "
                      f"not refused as invalid")
    if transport.closed and not worker.invalid:
        raise Finding("refused without a metric")
    if conn._large is not None:
        raise Finding("a closed connection still holds its frame buffer")
    if pooled and worker.memory.held != 0:
        raise Finding(f"{worker.memory.held} pool bytes not returned after the close")
    if worker.queue.waiting != 0:
        raise Finding(f"{worker.queue.waiting} parked requests never accounted as done")


def _memo_walks_agree(data: bytes, memo: dict) -> None:
    """The C walk of memoized answers stops where the Python walk stops, with the same
    answers, on any bytes (the memo: what the router memoized so far, real ApiVersions)."""
    from workers import frames

    if frames._frames is None:
        return
    # The whole bytes, and a read that ends before its buffer does (`end`).
    for end in ((), (max(0, len(data) - data[-1] % 16),) if data else ()):
        verdicts = []
        for walk in (frames.python_answer_memoized, frames._frames.answer_memoized):
            out, handled = [], []
            verdicts.append((walk(data, 0, 1 << 16, memo, out, handled, *end), out, handled))
        if verdicts[0] != verdicts[1]:
            raise Finding(f"the memo walks disagree (end {end}): python {verdicts[0]}, "
                          f"C {verdicts[1]}")


def _counts_agree(api_keys: list[int], elapsed_ns: int) -> None:
    """The C counts of a read's requests (workers/_counts.c) leave what the Python ones leave,
    in the request counters and in an event aggregate."""
    from array import array

    from shm.block import DURATION_BOUNDS_NS
    from workers import counts

    if counts._counts is None:
        return
    buckets = len(DURATION_BOUNDS_NS) + 1
    cells = ((0, 128, 128 + 128 * buckets),)  # the shared block's layout: per API
    verdicts = []
    for count, add in ((counts.python_count_requests, counts.python_aggregate),
                       (counts._counts.count_requests, counts._counts.aggregate)):
        words, entry = array("q", bytes(8 * 128 * (2 + buckets))), counts.new_aggregate()
        for _ in range(2):
            count(memoryview(words), cells, DURATION_BOUNDS_NS, 0, api_keys, elapsed_ns)
            add(entry, len(api_keys), 100, 1000, elapsed_ns // 1000)
        verdicts.append((words, entry))
    if verdicts[0] != verdicts[1]:
        raise Finding(f"the counts of {api_keys} ({elapsed_ns} ns) disagree")


def _answer_waiters(worker) -> None:
    """Grant memory to waiting connections and answer forwarded requests, in order."""
    while worker.memory.waiters or worker.forwarded:
        if worker.memory.waiters:
            waiter = worker.memory.waiters.pop(0)
            if not waiter.closing:
                worker.memory.held += waiter.memory_wait
                waiter.memory_granted()
        if worker.forwarded:
            future, correlation = worker.forwarded.pop(0)
            if not future.done():
                future.set_result(struct.pack(">i", 4) + correlation)
        worker.loop.run_until_complete(asyncio.sleep(0))  # run the futures' callbacks


_WORKERS = {}


# --- requests ----------------------------------------------------------------------------------


def requests(data: bytes) -> None:
    from broker.shared.protocol.codec import request_readers

    if len(data) < 2:
        return
    api_key, version = SCHEMAS[int.from_bytes(data[:2], "big") % len(SCHEMAS)]
    try:
        _header_reader, body_reader = request_readers(api_key, version)
    except KeyError:
        return
    try:
        body_reader(data[2:], 0)
    except Exception:  # a refusal: what the router turns into a closed connection
        pass


# --- router ------------------------------------------------------------------------------------


def router(data: bytes) -> None:
    """`data` is a whole request frame (a captured one, mutated)."""
    from workers.router import ForwardRequest, InvalidRequest

    from tests.requests.helpers import ask_in_loop

    worker_router, parent, loop = _services()
    try:
        answer = ask_in_loop(loop, worker_router, data)  # in a running loop, as a worker asks
    except InvalidRequest:
        return
    if isinstance(answer, ForwardRequest):
        answer = parent.handle(answer.frame)
    if isinstance(answer, asyncio.Future):
        answer.cancel()  # a rebalance wait: not what this target looks at


def _services():
    if "services" not in _WORKERS:
        from tests.helpers import make_router
        from tests.requests.helpers import Parent

        _WORKERS["services"] = (make_router(tempfile.mkdtemp(prefix="fuzz-worker-")),
                                Parent(tempfile.mkdtemp(prefix="fuzz-parent-")),
                                asyncio.new_event_loop())
    return _WORKERS["services"]


# --- records -----------------------------------------------------------------------------------


def records(data: bytes) -> None:
    from crc32c import crc32c

    from broker.shared.log import records as batches

    if len(data) >= batches.HEADER_BYTES and data[0] & 1:  # half the runs get past the CRC
        data = data[:17] + struct.pack(">I", crc32c(data[21:])) + data[21:]
    try:
        batch = batches.validate(data, 1 << 20, max_decompressed=1 << 20)
    except batches.BatchError as error:
        if error.code not in ("corrupt_message", "invalid_record", "message_too_large",
                              "invalid_timestamp"):
            raise Finding(f"unexpected refusal {error.code}") from None
    else:
        if batch.last_offset_delta != batch.record_count - 1:
            raise Finding("an inconsistent batch was accepted")
    # The same bytes as stored log data: the readers stay within them.
    for header in batches.headers_in(data, partial=True):
        if header.position >= len(data):
            raise Finding("a header past the chunk")
    if len(data) >= batches.HEADER_BYTES:
        stamps = batches.record_timestamps(data)
        if stamps is not None and len(stamps) > len(data) // 7:
            raise Finding("more records than the bytes can hold")
        _lookups_agree(batches, data, stamps)
        _walks_agree(batches, data)
        _control_type_is_bounded(data)
        _slices_agree(batches, data)


def _verdict(check, room: int | None, most: int):
    """(header stored, bytes stored) of a check, or (its refusal's code, the records it lists),
    walked as Produce walks it: a first start within `room` (which may decline), then `most`
    records (or one slice of recompression) a step."""
    from broker.shared.log import records as batches

    try:
        check.start(room)
        while not check.step(most):
            pass
        return check.batch, check.stored
    except batches.BatchError as error:
        return error.code, getattr(error, "errors", None)


def _slices_agree(batches, data: bytes) -> None:
    """A batch checked in slices after a start with little room (Produce's queue) meets the
    verdict of one whole walk, faulty records listed alike; what it stores is a sound batch
    carrying that header, and a batch recompressed in the topic's codec holds the same
    records."""
    from broker.shared.log.compression import CODEC_IDS, TopicCodec
    from broker.shared.log.record_errors import FaultRoom

    appended = bool(data[1] & 1)  # the topic's message.timestamp.type
    keyed = bool(data[1] & 2)  # cleanup.policy=compact
    names = [None, *CODEC_IDS]
    codec = names[data[1] >> 2 & 7] if data[1] >> 2 & 7 < len(names) else None
    bounds = batches.TimestampBounds(data[4] << 20, data[5] << 20) if data[1] & 32 \
        else batches.TimestampBounds()
    verdicts = []
    for room, most in ((None, 1 << 62), (data[2] * 16, 1 + data[3] % 5)):
        try:
            check = batches.BatchCheck(data, 1 << 20, bounds, now_ms=1 << 40,
                                       max_decompressed=1 << 12, keyed=keyed,
                                       log_append_time=appended,
                                       codec=codec and TopicCodec(codec), where="t-0",
                                       fault_room=FaultRoom(3))
        except batches.BatchError:
            return
        verdicts.append(_verdict(check, room, most))
    if verdicts[0] != verdicts[1]:
        raise Finding(f"sliced and whole checks disagree: {verdicts}")
    header, stored = verdicts[0]
    if isinstance(header, batches.Batch):
        stored = stored or batches.restamped(data, header)
        if batches.is_sound(stored, 0, len(stored)) != header._replace(position=0):
            raise Finding("the stored batch does not carry the checked header")
        if codec is not None and _records_of(batches, stored) != _records_of(batches, data):
            raise Finding("the recompressed batch holds other records")


def _records_of(batches, batch: bytes) -> bytes:
    """The records of a batch, decompressed."""
    header = batches.read_header(batch, 0)
    body, codec = batch[batches.HEADER_BYTES:header.size], header.attributes & batches.CODEC_MASK
    return bytes(batches.decompress(codec, body, 1 << 20)) if codec else body


def _lookups_agree(batches, data: bytes, stamps) -> None:
    """A timestamp lookup finds the record a full listing finds."""
    if stamps is None:
        return
    for wanted in {stamps[len(stamps) // 2][1] if stamps else 0, -1, 2**62}:
        expected = next((item for item in stamps if item[1] >= wanted), None)
        found = batches.first_record_from(data, wanted)
        if found != expected:
            raise Finding(f"lookup of {wanted}: {found}, the listing says {expected}")


def _control_type_is_bounded(data: bytes) -> None:
    """A stored batch read as a transaction marker (the repair's replay): ABORT, COMMIT or
    None, whatever the bytes."""
    from broker.shared.log import control_batches

    if control_batches.control_type(data) not in (None, control_batches.ABORT,
                                                  control_batches.COMMIT):
        raise Finding("a control type outside ABORT and COMMIT")


def _walks_agree(batches, data: bytes) -> None:
    """The C record walk reaches the Python walk's verdict on the same bytes, faulty records
    (without a key, out of a timestamp window) counted and listed alike."""
    from broker.shared.log.record_errors import FaultRoom, Faults

    if batches._recordwalk is None:
        return
    count = max(1, min(data[-1] if data else 1, (len(data) - batches.HEADER_BYTES) // 7))
    keyed = bool(data[0] & 2)
    window = (-(data[1] << 8), data[2] << 8, data[3] - 128) if data[0] & 4 else None
    verdicts = []

    def python():
        faults = Faults(keyed, window, FaultRoom(3))
        walked = batches._walk(data, batches.HEADER_BYTES, len(data), 0, count, 2**63,
                               -(2**63), None, faults)
        return (*walked, faults.keyless, faults.stamped, faults.listed)

    def c():
        listed: list = []
        low, high, none = window or (0, 0, 0)
        walked = batches._recordwalk.walk(data, batches.HEADER_BYTES, len(data), 0, count,
                                          keyed, listed, 3, window is not None, low, high, none)
        return (*walked, listed)

    for walk in (python, c):
        try:
            verdicts.append(tuple(walk()))
        except batches.BatchError as error:
            verdicts.append(error.code)
    if verdicts[0] != verdicts[1]:
        raise Finding(f"the record walks disagree: python {verdicts[0]}, C {verdicts[1]}")


# --- ipc ---------------------------------------------------------------------------------------


def ipc(data: bytes) -> None:
    import msgspec

    from broker.shared import ipc as messages

    try:
        messages.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError):
        pass  # ValueError: invalid UTF-8 in a string
    # The same bytes as a stream of datagrams: a length byte, then that many bytes each.
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        channel = messages.Channel(right)
        right.setblocking(False)
        position = 0
        while position < len(data):
            size = data[position] + 1
            left.send(data[position + 1:position + 1 + size] or b"\0")
            position += 1 + size
            try:
                while True:
                    channel.receive()
            except (BlockingIOError, OSError, msgspec.DecodeError, ValueError):
                pass
    finally:
        left.close()
        right.close()


def sasl(data: bytes) -> None:
    """`data`: a mechanism choice byte, then size-prefixed frames sent to one connection's
    Authenticator (handshakes, tokens, raw v0 tokens, anything).  Every frame is answered,
    refused with InvalidRequest, or ignored once the authentication failed; nothing raises."""
    import hashlib

    from broker.shared.sasl import SaslSettings, scram_credential
    from workers.authenticator import Authenticator
    from workers.router import InvalidRequest

    if not data:
        return
    salt = b"fuzz-salt"
    credential = scram_credential("SCRAM-SHA-256", salt,
                                  hashlib.pbkdf2_hmac("sha256", b"pw", salt, 4096), 4096)

    class Conn:
        closed = None
        ip = "127.0.0.1"

        def close_later(self, delay, reason):
            self.closed = reason

    conn = Conn()
    settings = SaslSettings("SASL", ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"), {"alice": "pw"})
    results = []
    auth = Authenticator(conn, settings, lambda mechanism, user: credential if user == "alice"
                         else None, lambda request, listener, *user: b"routed",
                         lambda *args: results.append(args[-1]), 0.1)
    view = memoryview(data)[1:]
    while len(view) >= 4:
        size = min(struct.unpack_from(">I", view)[0] % 4096, len(view) - 4)
        frame, view = view[4:4 + size].toreadonly(), view[4 + size:]
        try:
            answer = auth.handle(frame, 0)
        except InvalidRequest:
            return  # the connection would close: a refusal
        if answer is not None and not isinstance(answer, bytes):
            raise Finding(f"an answer of type {type(answer).__name__}")
    if results.count("success") > 1 or ("failure" in results
                                        and conn.closed != "authentication_failed"):
        raise Finding(f"results {results}, closed {conn.closed}")


def tags(data: bytes) -> None:
    """`data`: two bytes choosing a request schema, then a request frame of it."""
    from workers.unknown_tags import without_unknown_tags

    if len(data) < 2:
        return
    api_key, version = SCHEMAS[int.from_bytes(data[:2], "big") % len(SCHEMAS)]
    frame = data[2:]
    try:
        stripped = without_unknown_tags(frame, api_key, version)
    except ValueError:
        return  # a frame the walk cannot follow: the connection is closed as malformed
    if len(stripped) > len(frame):
        raise Finding(f"the stripped frame grew: {len(frame)} -> {len(stripped)} bytes")


def proxy(data: bytes) -> None:
    """`data`: what a connection sends first on a PROXY protocol listener."""
    from broker.parent.proxy_header import ProxyHeaderError, parse

    try:
        header = parse(data, max_v2_bytes=1024)
    except ProxyHeaderError:
        return  # refused: the connection is closed
    if header is not None and not 0 < header.length <= min(len(data), 1024):
        raise Finding(f"a header of {header.length} bytes in {len(data)}")


def http(data: bytes) -> None:
    """`data`: what a peer sends the metrics endpoint first."""
    from broker.parent.http_head import BadRequest, environ_of, head_end

    end = head_end(data)
    if end < 0:
        return  # not whole: the endpoint waits for more, within its size and time bounds
    if not 0 < end <= len(data):
        raise Finding(f"a head of {end} bytes in {len(data)}")
    try:
        environ = environ_of(data[:end], ("127.0.0.1", 9404), ("127.0.0.2", 5000))
    except BadRequest as error:
        if error.status[:3] not in ("400", "431", "505"):
            raise Finding(f"refused with {error.status!r}") from None
        return
    if not all(isinstance(value, str) for value in environ.values()):
        raise Finding(f"an environ value that is not a string: {environ!r}")


def names(data: bytes) -> None:
    """`data`: a certificate subject (or a whole certificate) as a client may present it."""
    from broker.shared.x500 import rfc2253, subject_name

    for read in (rfc2253, subject_name):
        try:
            printed = read(data)
        except ValueError:
            continue  # names no one: the connection is closed
        # An OID octet prints as at most four characters, a value octet as at most three.
        if not isinstance(printed, str) or len(printed) > 4 * len(data):
            raise Finding(f"{read.__name__} printed {printed!r} from {len(data)} bytes")


def upstream(data: bytes) -> None:
    """`data`: a request frame a front-end routes upstream (a captured one, mutated): what the
    edge reads of it in place (a Produce's acks, a Fetch's replica and long poll), the edge's
    ACLs on it, and the same bytes read back as an upstream answer by a link."""
    from broker.shared.protocol.codec import REQUEST_PREFIX, request_readers
    from broker.shared.protocol.context import RequestContext
    from workers.apis import edge_acls
    from workers.apis.upstream import _decoded, _fetch_checked
    from workers.router import InvalidRequest
    from workers.upstream_rewrite import acks_at

    if len(data) < 8:
        return
    api_key, version, _ = REQUEST_PREFIX.unpack_from(data, 0)
    try:
        header_reader, _ = request_readers(api_key, version)
        _, body_at = header_reader(data, 0)
    except Exception:  # noqa: BLE001 - not a request the front-end routes: closed
        return
    try:
        if api_key == 0:
            at = acks_at(data, body_at, version)
            if not body_at <= at <= len(data) - 2:
                raise Finding(f"acks at {at} of a {len(data)}-byte frame")
        elif api_key == 1 and version <= 14:
            _fetch_checked(data, body_at, 30000)
        if (api_key in edge_acls.CHECKS  # what an authorizing front-end offers
                and edge_acls.FLOORS.get(api_key, 0) <= version <= edge_acls.CAPS.get(api_key, 99)):
            ctx = RequestContext(data[4:8], api_key, version, 0, None, "mallory", "10.0.0.9",
                                 len(data))
            verdict = edge_acls.check(_ACCESS, ctx, _decoded(data, api_key, version, body_at))
            if verdict is not None and type(verdict) is not bytes and verdict.body is not None:
                edge_acls.request_with(data, body_at, verdict.body)
    except InvalidRequest:
        pass  # the connection is closed as malformed
    _link_reads(data)


def _link_reads(data: bytes) -> None:
    """`data` as an upstream answer, in chunks: delivered whole, or the link broken."""
    from broker.shared import ipc as messages
    from broker.shared.upstream_security import UpstreamSecurity
    from workers.upstream import NodePool, UpstreamLink, UpstreamUnavailable

    class Transport:
        closing = False

        def writelines(self, parts):
            pass

        def abort(self):
            self.closing = True

        close = abort

        def is_closing(self):
            return self.closing

    loop = asyncio.new_event_loop()
    try:
        pool = NodePool(loop, messages.UpstreamNode(node_id=1, host="127.0.0.1", port=9), 1, 1.0,
                        UpstreamSecurity("PLAINTEXT"))
        link = UpstreamLink(pool)
        link.connection_made(Transport())
        link.ready = True
        pool.links.add(link)
        future = loop.create_future()
        link.send(b"\0\3\0\x0c" + data[4:8] + b"\0\0", future, bytes, 5.0)
        answer = struct.pack(">i", max(0, len(data) - 4)) + data[4:]
        for start in range(0, len(answer), 4099):
            if link.transport.closing:
                break
            chunk = answer[start:start + 4099]
            buffer = link.get_buffer(-1)
            buffer[:len(chunk)] = chunk[:len(buffer)]
            link.buffer_updated(min(len(chunk), len(buffer)))
        if future.done() and future.exception() is None and bytes(future.result()) != answer:
            raise Finding("a link delivered other bytes than it read")
        if future.done() and future.exception() is not None and \
                not isinstance(future.exception(), UpstreamUnavailable):
            raise Finding(f"a link failed with {future.exception()!r}")
    finally:
        loop.close()


def _edge_access():
    from broker.shared.access import Access
    from broker.shared.acl import Acl, Operation, PatternType, Permission, ResourceType

    access = Access(True)
    access.update([Acl(int(ResourceType.TOPIC), "t", int(PatternType.PREFIXED), "User:mallory",
                       "*", int(Operation.ALL), int(Permission.ALLOW))])
    return access


_ACCESS = _edge_access()


TARGETS = {"framing": framing, "requests": requests, "router": router, "records": records,
           "ipc": ipc, "sasl": sasl, "tags": tags, "proxy": proxy, "http": http, "names": names,
           "upstream": upstream}
# Which committed seed directory each target starts from (corpus/<name>/).
SEEDS = {"framing": "frames", "requests": "bodies", "router": "requests",
         "records": "batches", "ipc": "ipc", "sasl": "sasl", "tags": "tagged",
         "proxy": "proxy", "http": "http", "names": "names", "upstream": "upstream"}
