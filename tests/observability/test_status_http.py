"""The metrics endpoint's bounds (broker/parent/status_http.py): idle and slow-loris sockets
neither pile up parent threads nor keep a scrape out, and are closed after the read timeout;
an oversized request head is refused; the request-head parser (broker/parent/http_head.py)."""

from __future__ import annotations

import socket
import time
import urllib.request

import pytest

from broker.parent import status_http
from broker.parent.http_head import BadRequest, environ_of, head_end
from tests.harness import BrokerProcess, wait_until
from tests.wire import peer_closed

IDLE = 300
SLOW = 100


def threads(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("Threads:"))


def connect_all(address, count: int, first_bytes: bytes = b"") -> list[socket.socket]:
    opened = []
    for _ in range(count):
        sock = socket.create_connection(address, timeout=5)
        if first_bytes:
            sock.sendall(first_bytes)
        opened.append(sock)
    return opened


def timed_scrape(address) -> tuple[float, str]:
    started = time.monotonic()
    with urllib.request.urlopen(f"http://{address[0]}:{address[1]}/metrics",
                                timeout=10) as response:
        text = response.read().decode()
    return time.monotonic() - started, text


def all_closed(sockets: list[socket.socket]) -> bool:
    """Whether the endpoint closed every one (each closed one is taken out of the list)."""
    sockets[:] = [sock for sock in sockets if not peer_closed(sock, wait=0.001)]
    return not sockets


@pytest.mark.system
def test_idle_and_slow_sockets_keep_neither_threads_nor_a_scrape_and_time_out():
    with BrokerProcess(workers=1) as broker:
        address = broker.metrics_address
        broker.scrape()  # the endpoint's threads are all started
        before = threads(broker.pid)
        attack = connect_all(address, IDLE)
        attack += connect_all(address, SLOW, b"GET /metrics HTTP/1.1\r\nHost: ")
        try:
            took, text = timed_scrape(address)
            assert took < 1.0, f"a scrape took {took:.2f}s beside {IDLE + SLOW} idle sockets"
            assert "broker_connections_accepted_total" in text
            assert threads(broker.pid) <= before + 1, (before, threads(broker.pid))
            # Past the cap the oldest were dropped at once; the rest go at the read timeout.
            started, waiting = time.monotonic(), list(attack)
            wait_until(lambda: all_closed(waiting), timeout=status_http.READ_TIMEOUT + 5,
                       message="idle sockets still open after the read timeout")
            assert time.monotonic() - started >= status_http.READ_TIMEOUT - 1.5
        finally:
            for sock in attack:
                sock.close()
        capped = broker.metric("broker_status_http_dropped_total", reason="connection_cap")
        timed_out = broker.metric("broker_status_http_dropped_total", reason="read_timeout")
        assert capped >= IDLE + SLOW - status_http.MAX_CONNECTIONS
        assert capped + timed_out == IDLE + SLOW
        assert threads(broker.pid) <= before + 1


@pytest.mark.system
def test_an_oversized_request_head_is_refused_and_scrapes_still_answer():
    with BrokerProcess(workers=1) as broker:
        with socket.create_connection(broker.metrics_address, timeout=5) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Filler: " + b"a" * 20000)
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
        assert answer.startswith(b"HTTP/1.0 431 ")
        assert broker.metric("broker_status_http_dropped_total", reason="too_large") == 1
        took, text = timed_scrape(broker.metrics_address)
        assert "broker_status_http_connections" in text


def test_the_head_ends_at_its_blank_line_and_becomes_an_environ():
    head = b"GET /conn%65ctions?top=3&by=age HTTP/1.1\r\nHost: a\r\nAccept-Encoding: gzip\r\n" \
           b"Accept: text/plain\r\nAccept: */*\r\n\r\nbody"
    end = head_end(head)
    assert head[end:] == b"body" and head_end(b"GET / HTTP/1.1\r\nHost: a\r\n") == -1
    assert head_end(b"GET / HTTP/1.0\n\n") == 16
    environ = environ_of(head[:end], ("127.0.0.1", 9404), ("127.0.0.2", 5000))
    assert environ["REQUEST_METHOD"] == "GET" and environ["PATH_INFO"] == "/connections"
    assert environ["QUERY_STRING"] == "top=3&by=age"
    assert environ["HTTP_ACCEPT_ENCODING"] == "gzip"
    assert environ["HTTP_ACCEPT"] == "text/plain,*/*"
    assert environ["REMOTE_ADDR"] == "127.0.0.2"


@pytest.mark.parametrize("head, status", [
    (b"\r\n\r\n", "400"),
    (b"HELLO\r\n\r\n", "400"),
    (b"GET /metrics\r\n\r\n", "400"),
    (b"GET /metrics HTTP/2.0\r\n\r\n", "505"),
    (b"GET /metrics HTTP/x\r\n\r\n", "400"),
    (b"G(T /metrics HTTP/1.1\r\n\r\n", "400"),
    (b"GET /metrics HTTP/1.1\r\nno colon\r\n\r\n", "400"),
    (b"GET /metrics HTTP/1.1\r\nBad Name: x\r\n\r\n", "400"),
    (b"GET /metrics HTTP/1.1\r\n" + b"A: b\r\n" * 101 + b"\r\n", "431"),
])
def test_a_malformed_head_is_a_bad_request(head, status):
    with pytest.raises(BadRequest) as refused:
        environ_of(head, ("127.0.0.1", 9404), ("127.0.0.2", 5000))
    assert refused.value.status.startswith(status)
