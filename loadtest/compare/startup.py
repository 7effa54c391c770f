"""startup: the time from launching the broker's process to its first answered ApiVersions
(Kafka: launching kafka.Kafka, its storage formatted before; ours: `python -m broker`), and
the resident memory of the empty broker a second later, each the median of STARTS starts.

Memory is the proportional set size (PSS, /proc/<pid>/smaps_rollup) summed over the broker's
processes: ours are a parent and its workers, which share pages (the interpreter's files, the
shared-memory block) that a sum of RSS would count once per process; Kafka is one JVM, whose
PSS is its RSS but for the few library pages it shares.  The RSS sums are in the notes.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time

from loadtest.bench.common import api_versions_frame
from loadtest.compare.brokers import SIDES, create, failure
from loadtest.compare.rows import Reading, Row, join
from tests.harness import rss

PARTS = ("startup",)
STARTS = 3
SETTLE_SECONDS = 1.0
POLL_SECONDS = 0.005
START_TIMEOUT = 90.0
STARTUP = "start-up time to the first answered ApiVersions"
MEMORY = "empty broker's resident memory (PSS)"


def pss(pid: int) -> int:
    """Proportional set size of a process in bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


class FirstAnswer:
    """A thread that sends ApiVersions to 127.0.0.1:`port` every POLL_SECONDS until one is
    answered: `.at` is the monotonic time of that answer."""

    def __init__(self, port: int):
        self.port, self.at = port, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        frame = api_versions_frame()
        deadline = time.monotonic() + START_TIMEOUT
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock:
                    sock.sendall(frame)
                    if len(sock.recv(4)) == 4:
                        self.at = time.monotonic()
                        return
            except OSError:
                pass
            time.sleep(POLL_SECONDS)

    def wait(self, timeout: float) -> float:
        self._thread.join(timeout)
        self._stop.set()
        if self.at is None:
            raise RuntimeError(f"no ApiVersions answered on port {self.port}")
        return self.at


def _one_start(side: str) -> tuple[float, int, int]:
    """(seconds to the first answer, PSS, RSS) of one start of `side`'s broker."""
    broker = create(side)
    poller = FirstAnswer(broker.port)
    launched = time.monotonic()
    broker.start()
    try:
        # Kafka formats its storage (a JVM of its own) before launching the broker
        launched = getattr(getattr(broker, "node", None), "started_at", launched)
        answered = poller.wait(START_TIMEOUT)
        time.sleep(SETTLE_SECONDS)
        return (answered - launched, sum(pss(pid) for pid in broker.pids),
                sum(rss(pid) for pid in broker.pids))
    finally:
        broker.stop()


def _measure(side: str) -> dict[str, Reading]:
    starts = [_one_start(side) for _ in range(STARTS)]
    times = [start[0] for start in starts]
    memory = statistics.median(start[1] for start in starts)
    resident = statistics.median(start[2] for start in starts)
    return {STARTUP: Reading(statistics.median(times),
                             f"{', '.join(f'{t:.2f}' for t in times)} s"),
            MEMORY: Reading(memory / 2**20, f"RSS {resident / 2**20:.0f} MiB")}


def run(parts, seconds: float) -> list[dict]:
    rows = [Row(STARTUP, "s", "lower", f"median of {STARTS} starts"),
            Row(MEMORY, "MiB", "lower", "ours: parent + workers; Kafka: the JVM (1 GiB heap)")]
    results = {}
    for side in SIDES:
        try:
            results[side] = _measure(side)
        except Exception as error:  # noqa: BLE001 - reported in the table, never invented
            reason = f"not measured: {failure(error)}"
            results[side] = {row.name: Reading(None, reason) for row in rows}
    return join(rows, results)
