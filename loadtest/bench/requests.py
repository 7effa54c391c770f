"""requests: rrclient, ApiVersions v3 (memoized answer) and Metadata v12 (decoded every time),
100 connections x 1 in flight and 10 connections x 50 pipelined, against the broker with 1 and
2 workers, and the same frames against loadtest/echo_server.py.  The accept rate of the
2-worker broker (accepts) is measured on the same broker."""

from __future__ import annotations

from loadtest.bench.accepts import run_accept
from loadtest.bench.common import SHAPES, Broker, Server, run_rr


def echo_rates(frames: dict[str, str], seconds: float) -> dict[str, dict]:
    """The baseline: the ApiVersions frames against loadtest/echo_server.py."""
    figures = {}
    echo = Server("echo_server.py")
    try:
        for shape in SHAPES:
            figures[f"echo {shape}"] = run_rr(echo.port, echo.pids, frames["apiversions"], shape,
                                              seconds, "echo")
    finally:
        echo.close()
    return figures


def broker_rates(frames: dict[str, str], seconds: float) -> dict[str, dict]:
    """ApiVersions against the broker with 1 and 2 workers; with 2 also Metadata and the
    accept rate (connect, ApiVersions, answer, close)."""
    figures = {}
    for workers in (1, 2):
        broker = Broker(workers)
        try:
            for shape in SHAPES:
                figures[f"apiversions {workers}w {shape}"] = run_rr(
                    broker.port, broker.pids, frames["apiversions"], shape, seconds, "kafka")
            if workers == 2:
                figures["metadata 2w 100x1"] = run_rr(broker.port, broker.pids,
                                                      frames["metadata"], "100x1", seconds, "kafka")
                figures["accept+handoff+register 2w"] = run_accept(
                    broker.port, broker.pids, "req", frames["apiversions"], seconds)
        finally:
            broker.close()
    return figures
