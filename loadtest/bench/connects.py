"""connects: many connections, one client.

  sequential connects  one client opens SEQUENTIAL connections one after another and holds
                       them (connect only: what a burst of clients does to the listen backlog),
                       against loadtest/echo_server.py (raw uvloop) and the broker (2 workers);
                       time with the broker / time with the raw server, target <= CONNECT_RATIO.
                       A connect that took over 0.5 s is a SYN the kernel dropped (counted).
  ... with a request   the same, each connection doing one ApiVersions round trip (no target:
                       two process hops per connection the raw server does not have)
  idle connections     IDLE connections held open (each answered once, so registered) by
                       HOLDERS client processes from 127.0.0.2-5 at once, on a broker of 3
                       workers: the broker's RSS (parent and workers) per connection, and the
                       time to open them.  The broker raises its soft open-files limit to the
                       hard one by itself (the line it logs is printed); each worker holds its
                       share of the connections in its own descriptor table.
Each run closes its sockets with an RST, so no TIME_WAIT slows the next one's port search.
"""

from __future__ import annotations

import resource
import socket
import struct
import subprocess
import sys
import time

from loadtest.bench.common import Server, api_versions_frame
from tests.harness import BrokerProcess, rss, wait_until

SEQUENTIAL = 10_000
IDLE = 50_000
HOLDERS = 4
CONNECT_RATIO = 3.0
STALL_SECONDS = 0.5
_LINGER_RST = struct.pack("ii", 1, 0)


def raise_open_files(wanted: int) -> int:
    """This process's open-files limits up to `wanted` (the hard one too, if allowed)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), max(hard, wanted)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _close_all(socks: list[socket.socket]) -> None:
    for sock in socks:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
        sock.close()


def _sequential(address, count: int, frame: bytes | None, sources=("127.0.0.1",)) -> dict:
    """Open `count` connections one after another (each doing `frame`'s round trip, if any)."""
    socks, stalls = [], 0
    started = time.perf_counter()
    try:
        for n in range(count):
            begun = time.perf_counter()
            sock = socket.create_connection(address, source_address=(sources[n % len(sources)],
                                                                     0))
            socks.append(sock)
            if frame is not None:
                sock.sendall(frame)
                sock.recv(65536)
            stalls += time.perf_counter() - begun > STALL_SECONDS
    except BaseException:
        _close_all(socks)
        raise
    return {"seconds": time.perf_counter() - started, "stalls": stalls, "errors": 0,
            "socks": socks}


def timed_connects(address, count: int, frame: bytes | None) -> dict:
    """`count` connections opened one after another and held, then closed: how long the
    opening took, and how many stalled."""
    run = _sequential(address, count, frame)
    _close_all(run.pop("socks"))
    return run


def sequential_connects() -> dict[str, dict]:
    raise_open_files(SEQUENTIAL + 1000)
    frame = api_versions_frame()
    figures = {}
    raw = Server("echo_server.py")
    try:
        figures["connects raw"] = timed_connects(("127.0.0.1", raw.port), SEQUENTIAL, None)
    finally:
        raw.close()
    for label, with_frame in (("connects broker", None), ("connects broker, request", frame)):
        with BrokerProcess(workers=2) as broker:
            figures[label] = timed_connects(broker.listeners["PLAINTEXT"], SEQUENTIAL, with_frame)
    return figures


class Holding:
    """`count` answered connections to `address` held open by `holders` client processes from
    127.0.0.2 on (one process may not hold them all: its own open-files limit) from entry to
    exit; `.connections` held and `.seconds` it took to open them."""

    def __init__(self, address: tuple[str, int], count: int, holders: int = HOLDERS):
        self.address, self.count, self.holders = address, count, holders

    def __enter__(self) -> "Holding":
        raise_open_files(self.count // self.holders + 1000)  # the holders inherit it
        host, port = self.address
        started = time.perf_counter()
        self.procs = [subprocess.Popen([sys.executable, "-m", "loadtest.bench.connects", "hold",
                                        host, str(port), str(self.count // self.holders),
                                        f"127.0.0.{2 + n}"],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                      for n in range(self.holders)]
        try:
            self.connections = sum(int(proc.stdout.readline() or 0) for proc in self.procs)
        except BaseException:
            self.__exit__()
            raise
        self.seconds = time.perf_counter() - started
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            proc.communicate("close\n", timeout=120)


def idle_connections() -> dict:
    """Hold IDLE answered connections (Holding), spread by the acceptor over 3 workers (each
    has its own descriptor table): RSS per connection, time to open them."""
    raise_open_files(IDLE // HOLDERS + 1000)  # the broker inherits it
    overrides = {"connections.max.idle.ms": "3600000", "num.network.threads": "3"}
    with BrokerProcess(workers=3, overrides=overrides) as broker:
        pids = [broker.pid, *broker.worker_pids.values()]
        before = sum(rss(pid) for pid in pids)
        limit = [line for line in broker.lines if "open files limit" in line]
        with Holding(broker.listeners["PLAINTEXT"], IDLE) as held:
            wait_until(lambda: broker.metric("broker_connections", listener="PLAINTEXT")
                       >= held.connections, timeout=60, message="not every connection registered")
            after = sum(rss(pid) for pid in pids)
    return {"seconds": held.seconds, "connections": held.connections,
            "errors": int(held.connections < IDLE),
            "rss_per_connection": (after - before) / max(1, held.connections),
            "limit_line": limit[0].split("] ", 1)[-1] if limit else "no limit line"}


def _hold(host: str, port: int, count: int, source: str) -> None:
    """A holder process: open `count` answered connections, say how many, wait, close."""
    raise_open_files(count + 100)
    run = _sequential((host, port), count, api_versions_frame(), sources=(source,))
    print(len(run["socks"]), flush=True)
    sys.stdin.readline()
    _close_all(run["socks"])


def print_connects(figures: dict[str, dict]) -> tuple[int, int]:
    """The table and its verdict: (targets missed, errors)."""
    raw = figures["connects raw"]["seconds"]
    print(f"\n{f'{SEQUENTIAL:,} sequential connects, held':32} {'seconds':>8} {'stalls':>7} "
          f"{'/ raw':>7}  target")
    missed = 0
    for name in ("connects raw", "connects broker", "connects broker, request"):
        figure = figures[name]
        ratio = figure["seconds"] / raw
        target = ""
        if name == "connects broker":
            met = ratio <= CONNECT_RATIO
            missed += not met
            target = f"<= {CONNECT_RATIO} {'met' if met else 'MISSED'}"
        print(f"{name:32} {figure['seconds']:>8.2f} {figure['stalls']:>7} {ratio:>7.2f}  "
              f"{target}")
    idle = figures["idle connections"]
    print(f"{'idle connections held':32} {idle['connections']:>8,} opened in "
          f"{idle['seconds']:.1f} s, {idle['rss_per_connection'] / 1024:.1f} KiB RSS each "
          f"({idle['limit_line']})")
    return missed, sum(figure.get("errors", 0) for figure in figures.values())


def connection_figures() -> dict[str, dict]:
    figures = sequential_connects()
    figures["idle connections"] = idle_connections()
    return figures


if __name__ == "__main__":
    if sys.argv[1:2] == ["hold"]:
        _hold(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        sys.exit(0)
    missed, errors = print_connects(connection_figures())
    sys.exit(1 if missed or errors else 0)
