"""Where this broker loses to Kafka, and why, from a profile: `python -m loadtest.compare.profile
[connects|idle|metadata]` runs one losing scenario against this broker alone, samples its
parent and workers with py-spy meanwhile (`make compare` installs it), and prints each
process's CPU share and the functions that hold most of its samples (self and total).  For
`idle` it prints where the resident memory per held connection goes instead: the growth of
each process, and the kernel's socket memory beside it, which no process's RSS counts.

  connects  10,000 sequential connects, held (loadtest/bench/connects.py)
  idle      IDLE connections held, per-process RSS growth per connection
  metadata  Metadata v12 at 100 connections x 1 in flight (loadtest/bin/rrclient)
"""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time

from loadtest.bench.common import cpu_seconds, run_rr, write_frames
from loadtest.bench.connects import SEQUENTIAL, Holding, raise_open_files, timed_connects
from loadtest.bench.memory import resident_bytes
from loadtest.compare.brokers import Ours
from loadtest.compare.connections import IDLE_OVERRIDES, idle_count

TOP = 12


def _spy() -> str:
    found = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(found):
        raise SystemExit("py-spy is missing: `pip install py-spy` (make compare installs it)")
    return found


def sampled(pids: list[int], seconds: float, work) -> tuple[dict[int, list[str]], float]:
    """Runs `work()` while py-spy samples each pid for `seconds` (raw stacks); returns the
    stacks per pid and the CPU seconds the pids used meanwhile."""
    directory = tempfile.mkdtemp(prefix="pybroker-profile-")
    spies = {pid: subprocess.Popen([_spy(), "record", "--pid", str(pid), "--rate", "200",
                                    "--duration", str(int(seconds) + 1), "--format", "raw",
                                    "--nonblocking", "-o", os.path.join(directory, f"{pid}.txt")],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for pid in pids}
    time.sleep(0.5)  # py-spy attached
    cpu = cpu_seconds(pids)
    work()
    cpu = cpu_seconds(pids) - cpu
    stacks = {}
    for pid, spy in spies.items():
        spy.wait(seconds + 30)
        with open(os.path.join(directory, f"{pid}.txt")) as raw:
            stacks[pid] = raw.read().splitlines()
    shutil.rmtree(directory, ignore_errors=True)
    return stacks, cpu


def hottest(lines: list[str]) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """Samples, and the functions with most samples on top of the stack (self) and anywhere
    in it (total), from py-spy's raw format: `frame;frame;... count`, outermost first."""
    own, total, samples = collections.Counter(), collections.Counter(), 0
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [_short(frame) for frame in stack.split(";")]
        samples += int(count)
        own[frames[-1]] += int(count)
        for frame in set(frames):
            total[frame] += int(count)
    return samples, own.most_common(TOP), total.most_common(TOP)


def _short(frame: str) -> str:
    """`name (path/to/module.py:line)` -> `name (module.py)`: a function, not a line."""
    name, _, where = frame.partition(" (")
    return f"{name} ({os.path.basename(where.split(':')[0])})" if where else name


def report(broker: Ours, stacks: dict[int, list[str]], cpu: float, what: str) -> None:
    roles = {broker.process.pid: "parent",
             **{pid: f"worker {n}" for n, pid in broker.process.worker_pids.items()}}
    print(f"\n{what}: broker CPU {cpu:.2f} s")
    for pid, lines in stacks.items():
        samples, own, total = hottest(lines)
        print(f"\n  {roles.get(pid, pid)} (pid {pid}): {samples} samples")
        for title, rows in (("self", own), ("total", total)):
            print(f"    {title}:")
            for frame, count in rows:
                print(f"      {100 * count / max(samples, 1):5.1f}%  {frame}")


def connects() -> None:
    raise_open_files(SEQUENTIAL + 2000)
    broker = Ours(IDLE_OVERRIDES).start()
    try:
        timed_connects(broker.address, 1000, None)  # warm
        figures = {}
        stacks, cpu = sampled(broker.pids, 8, lambda: figures.update(
            timed_connects(broker.address, SEQUENTIAL, None)))
        report(broker, stacks, cpu, f"{SEQUENTIAL:,} sequential connects in "
                                    f"{figures['seconds']:.2f} s")
    finally:
        broker.stop()


def metadata() -> None:
    broker = Ours().start()
    try:
        with tempfile.TemporaryDirectory(prefix="pybroker-profile-") as tmp:
            frame = write_frames(tmp)["metadata"]
            result = {}
            stacks, cpu = sampled(broker.pids, 5, lambda: result.update(
                run_rr(broker.address[1], broker.pids, frame, "100x1", 5, "kafka")))
        result = {key: result[key] for key in ("rps", "p99_us", "errors") if key in result}
        report(broker, stacks, cpu, f"Metadata at 100 x 1: {result}")
    finally:
        broker.stop()


def idle() -> None:
    count = idle_count()
    raise_open_files(count + 2000)
    broker = Ours(IDLE_OVERRIDES).start()
    try:
        before = {pid: resident_bytes([pid]) for pid in broker.pids}
        sockets_before = _socket_memory()
        with Holding(broker.address, count) as held:
            after = {pid: resident_bytes([pid]) for pid in broker.pids}
            sockets = _socket_memory() - sockets_before
        roles = {broker.process.pid: "parent",
                 **{pid: f"worker {n}" for n, pid in broker.process.worker_pids.items()}}
        print(f"\n{held.connections:,} idle connections held")
        for pid in broker.pids:
            grown = after[pid] - before[pid]
            print(f"  {roles[pid]:>9}: RSS +{grown / 2**20:7.1f} MiB = "
                  f"{grown / 1024 / held.connections:.2f} KiB per connection")
        print(f"  kernel socket memory (both ends, /proc/net/sockstat): +{sockets / 2**20:.1f} MiB"
              f" (not in any RSS)")
    finally:
        broker.stop()


def _socket_memory() -> int:
    """TCP socket buffer pages the kernel holds, in bytes (/proc/net/sockstat `mem`)."""
    with open("/proc/net/sockstat") as stat:
        for line in stat:
            if line.startswith("TCP:"):
                fields = line.split()
                return int(fields[fields.index("mem") + 1]) * os.sysconf("SC_PAGE_SIZE")
    return 0


SCENARIOS = {"connects": connects, "idle": idle, "metadata": metadata}


def main(argv: list[str]) -> int:
    wanted = argv or list(SCENARIOS)
    unknown = [name for name in wanted if name not in SCENARIOS]
    if unknown:
        print(f"unknown: {', '.join(unknown)}; one of {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    for name in wanted:
        SCENARIOS[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
