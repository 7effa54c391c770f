"""accepts: two connclient processes (disjoint source addresses), each connection doing
connect, ApiVersions, answer, close against the broker, versus connect and wait for the
server's close against loadtest/accept_close_server.py, and the broker's work less the
broker: connect, one frame echoed, close against loadtest/echo_server.py (one process, no
hand-off, no admission, no answer to build)."""

from __future__ import annotations

import json
import os
import subprocess

from loadtest.bench.common import BIN, Server, cpu_seconds


def run_accept(port: int, pids, mode: str, frame_path: str, seconds: float):
    before = cpu_seconds(pids)
    procs = [subprocess.Popen([os.path.join(BIN, "connclient"), "127.0.0.1", str(port), "32",
                               str(seconds), mode, frame_path, str(base)],
                              stdout=subprocess.PIPE, text=True) for base in (2, 122)]
    results = [json.loads(proc.communicate(timeout=seconds + 30)[0]) for proc in procs]
    return {"rate": sum(r["rate"] for r in results), "errors": sum(r["errors"] for r in results),
            "server_cpu": cpu_seconds(pids) - before,
            "connections": sum(r["connections"] for r in results)}


def raw_accept_close(frame_path: str, seconds: float) -> dict[str, dict]:
    """The baselines: connect and wait for the close against loadtest/accept_close_server.py;
    connect, send `frame_path`'s frame, read it back and close against the echo server."""
    figures = {}
    raw = Server("accept_close_server.py")
    try:
        figures["raw accept+close"] = run_accept(raw.port, raw.pids, "fin", "-", seconds)
    finally:
        raw.close()
    echo = Server("echo_server.py")
    try:
        figures["echo accept+request+close"] = run_accept(echo.port, echo.pids, "req",
                                                          frame_path, seconds)
    finally:
        echo.close()
    return figures
