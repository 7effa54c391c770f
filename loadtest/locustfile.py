"""Connection-storm load test for the broker, with locust (raw Kafka protocol over TCP, no HTTP).

    locust -f loadtest/locustfile.py --config loadtest/locust.conf --host tcp://127.0.0.1:PORT

Two kinds of simulated user:

* ``StormUser`` (all users but two): each task opens a new TCP connection, sends one
  ApiVersions v3 request, reads the whole response, and closes.  Reported as
  ``kafka / connect+ApiVersions+close``.
* ``SteadyUser`` (exactly two, ``fixed_count``): keeps one long-lived connection and sends an
  ApiVersions request on it every ~50 ms.  Reported as ``kafka / steady ApiVersions``; this is
  what shows whether connections that already exist suffer while the storm goes on.  Each
  (re)connection is reported as ``kafka / steady connect``, so more than two of those means the
  steady connections were dropped and re-opened.

Refused, reset or timed-out connections, short reads, a wrong correlation id or a non-zero
error code are reported as failures; they never crash a user.

The host must be ``tcp://127.0.0.1:PORT`` (any 127.0.0.0/8 address) or ``tcp://localhost:PORT``:
this test is only ever meant to hit a broker on the local machine, and refuses anything else.

locust runs on gevent and monkey-patches the standard library before this file is imported,
so the plain blocking ``socket`` calls below are cooperative.
"""

from __future__ import annotations

import ipaddress
import itertools
import logging
import socket
import struct
import time
from urllib.parse import urlsplit

from locust import User, constant, constant_pacing, events, task
from locust.exception import StopTest

logger = logging.getLogger(__name__)

STORM_NAME = "connect+ApiVersions+close"
STEADY_NAME = "steady ApiVersions"
STEADY_CONNECT_NAME = "steady connect"
REQUEST_TYPE = "kafka"
MAX_RESPONSE_BYTES = 1 << 20  # an ApiVersions response is a few hundred bytes


# --- the request frame, built once ---------------------------------------------------------

def _compact_string(text: str) -> bytes:
    data = text.encode()
    assert len(data) < 127  # one-byte unsigned varint length
    return bytes([len(data) + 1]) + data


def _api_versions_body(correlation_id: int = 0) -> bytes:
    """ApiVersions v3 request (header v2) with client id and software name 'locust'."""
    try:
        from kafka.protocol.metadata import ApiVersionsRequest
    except ImportError:  # kafka-python not installed: the same bytes, by hand
        return (struct.pack(">hhih", 18, 3, correlation_id, len(b"locust")) + b"locust" + b"\x00"
                + _compact_string("locust") + _compact_string("1.0") + b"\x00")
    request = ApiVersionsRequest[3](client_software_name="locust", client_software_version="1.0")
    request.with_header(correlation_id=correlation_id, client_id="locust")
    return bytes(request.encode(header=True))


_BODY = _api_versions_body(0)
# size prefix + body; bytes 8..12 of the frame (4..8 of the body) hold the correlation id
FRAME_TEMPLATE = struct.pack(">i", len(_BODY)) + _BODY
_CORRELATION = slice(8, 12)


def frame_with(correlation_id: int) -> bytes:
    frame = bytearray(FRAME_TEMPLATE)
    frame[_CORRELATION] = struct.pack(">i", correlation_id)
    return bytes(frame)


# --- options and the target ---------------------------------------------------------------

@events.init_command_line_parser.add_listener
def _add_arguments(parser):
    parser.add_argument("--kafka-timeout", type=float, default=5.0, env_var="LOCUST_KAFKA_TIMEOUT",
                        help="Timeout in seconds for every socket operation (connect, send, "
                             "each receive). Default 5.")
    parser.add_argument("--steady-interval", type=float, default=0.05,
                        env_var="LOCUST_STEADY_INTERVAL",
                        help="Seconds between two requests of a SteadyUser. Default 0.05.")


class TargetError(ValueError):
    pass


def parse_target(host: str | None) -> tuple[str, int]:
    """'tcp://127.x.y.z:PORT' or 'tcp://localhost:PORT' -> (ip, port); anything else raises."""
    if not host:
        raise TargetError("no host given: pass --host tcp://127.0.0.1:PORT")
    parts = urlsplit(host)
    if parts.scheme != "tcp" or not parts.hostname or parts.path not in ("", "/") \
            or parts.query or parts.fragment or parts.username or parts.password:
        raise TargetError(f"host {host!r} is not of the form tcp://127.0.0.1:PORT")
    try:
        port = parts.port
    except ValueError as exc:
        raise TargetError(f"host {host!r} has an invalid port") from exc
    if not port:
        raise TargetError(f"host {host!r} has no port: pass --host tcp://127.0.0.1:PORT")
    name = parts.hostname
    if name == "localhost":
        return "127.0.0.1", port  # never resolve: 'localhost' could map anywhere
    try:
        address = ipaddress.ip_address(name)
    except ValueError as exc:
        raise TargetError(f"host {host!r}: only 127.0.0.0/8 addresses or 'localhost' are "
                          "allowed; this load test only targets the local machine") from exc
    if address.version != 4 or address not in ipaddress.ip_network("127.0.0.0/8"):
        raise TargetError(f"host {host!r}: {name} is not in 127.0.0.0/8; this load test only "
                          "targets the local machine")
    return str(address), port


@events.init.add_listener
def _check_host(environment, **_kwargs):
    """Fail fast, before any user spawns, on a bad --host (workers get the host later)."""
    from locust.runners import WorkerRunner

    if isinstance(environment.runner, WorkerRunner):
        return
    options = environment.parsed_options
    if environment.host is None and not (options and options.headless):
        return  # the web UI may still supply it; on_start checks it then
    try:
        parse_target(environment.host)
    except TargetError as exc:
        raise SystemExit(f"locustfile: {exc}") from None


# --- the wire ------------------------------------------------------------------------------

class ProtocolError(Exception):
    pass


def _recv_exactly(sock: socket.socket, count: int) -> bytes:
    buffer = bytearray(count)
    view = memoryview(buffer)
    got = 0
    while got < count:
        n = sock.recv_into(view[got:], count - got)
        if n == 0:
            raise ConnectionResetError(f"connection closed by the broker after {got} of "
                                       f"{count} bytes")
        got += n
    return bytes(buffer)


def exchange(sock: socket.socket, frame: bytes, correlation_id: int) -> int:
    """Send one ApiVersions frame and read its whole response; returns the bytes received."""
    sock.sendall(frame)
    (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
    if not 6 <= size <= MAX_RESPONSE_BYTES:
        raise ProtocolError(f"implausible response size {size}")
    body = _recv_exactly(sock, size)
    got_id, error_code = struct.unpack_from(">ih", body)
    if got_id != correlation_id:
        raise ProtocolError(f"correlation id {got_id}, expected {correlation_id}")
    if error_code != 0:
        raise ProtocolError(f"ApiVersions error_code {error_code}")
    return 4 + size


def connect(address: tuple[str, int], timeout: float) -> socket.socket:
    sock = socket.create_connection(address, timeout=timeout)
    sock.settimeout(timeout)  # applies to every later send and recv
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


# --- users ---------------------------------------------------------------------------------

class _KafkaUser(User):
    abstract = True

    def on_start(self):
        try:
            self.address = parse_target(self.environment.host or self.host)
        except TargetError as exc:
            raise StopTest(f"locustfile: {exc}") from None
        options = self.environment.parsed_options
        self.timeout = getattr(options, "kafka_timeout", None) or 5.0

    def _report(self, name: str, started: float, length: int, exception: BaseException | None):
        self.environment.events.request.fire(
            request_type=REQUEST_TYPE, name=name,
            response_time=(time.perf_counter() - started) * 1000.0,
            response_length=length, exception=exception, context={})


class StormUser(_KafkaUser):
    """connect, one ApiVersions, close; as fast as it can."""

    weight = 1
    wait_time = constant(0)

    def on_start(self):
        super().on_start()
        self._ids = itertools.count(1)

    @task
    def connect_request_close(self):
        correlation_id = next(self._ids) & 0x7FFFFFFF
        frame = frame_with(correlation_id)
        started = time.perf_counter()
        length, failure, sock = 0, None, None
        try:
            sock = connect(self.address, self.timeout)
            length = exchange(sock, frame, correlation_id)
        except Exception as exc:  # refused, reset, timeout, protocol: a failure, never a crash
            failure = exc
        finally:
            if sock is not None:
                try:
                    sock.close()
                except OSError:
                    pass
        self._report(STORM_NAME, started, length, failure)


class SteadyUser(_KafkaUser):
    """One long-lived connection, an ApiVersions request on it every ~50 ms."""

    fixed_count = 2

    def wait_time(self):
        return self._pacing(self)

    def on_start(self):
        super().on_start()
        options = self.environment.parsed_options
        self._pacing = constant_pacing(getattr(options, "steady_interval", None) or 0.05)
        self._ids = itertools.count(1)
        self.sock: socket.socket | None = None

    def on_stop(self):
        self._drop()

    def _drop(self):
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None

    @task
    def steady_request(self):
        if self.sock is None:
            started = time.perf_counter()
            try:
                self.sock = connect(self.address, self.timeout)
            except Exception as exc:
                self._report(STEADY_CONNECT_NAME, started, 0, exc)
                return
            self._report(STEADY_CONNECT_NAME, started, 0, None)
        correlation_id = next(self._ids) & 0x7FFFFFFF
        started = time.perf_counter()
        try:
            length = exchange(self.sock, frame_with(correlation_id), correlation_id)
        except Exception as exc:  # the connection is now in an unknown state: reconnect next time
            self._drop()
            self._report(STEADY_NAME, started, 0, exc)
            return
        self._report(STEADY_NAME, started, length, None)
