"""What the scenarios share: request frames, the baseline servers and brokers they start,
server CPU accounting, and rrclient (`run_rr`, `SHAPES`: 100 connections x 1 in flight and
10 connections x 50 pipelined)."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys

from tests.harness import BrokerProcess

# loadtest/, which holds the baseline servers and (in bin/) the C load generators.
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(HERE, "bin")
SHAPES = {"100x1": (100, 1), "10x50": (10, 50)}


def api_versions_frame() -> bytes:
    from kafka.protocol.metadata import ApiVersionsRequest

    request = ApiVersionsRequest[3](client_software_name="bench", client_software_version="1.0")
    request.with_header(correlation_id=7, client_id="bench")
    body = bytes(request.encode(header=True))
    return struct.pack(">i", len(body)) + body


def metadata_frame() -> bytes:
    from kafka.protocol.metadata import MetadataRequest

    request = MetadataRequest[12](topics=None, allow_auto_topic_creation=False,
                                  include_topic_authorized_operations=False)
    request.with_header(correlation_id=7, client_id="bench")
    body = bytes(request.encode(header=True))
    return struct.pack(">i", len(body)) + body


def write_frames(directory: str) -> dict[str, str]:
    """The request frames rrclient and connclient send, each in a file of `directory`:
    {"apiversions": path, "metadata": path}."""
    paths = {}
    for name, data in (("apiversions", api_versions_frame()), ("metadata", metadata_frame())):
        paths[name] = os.path.join(directory, f"{name}.bin")
        with open(paths[name], "wb") as handle:
            handle.write(data)
    return paths


def cpu_seconds(pids: list[int], user: bool = True, system: bool = True) -> float:
    """CPU seconds the processes used so far: user and/or system time."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) * user + int(fields[12]) * system  # utime, stime
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


class Server:
    """A baseline server script from loadtest/, started and stopped by pid."""

    def __init__(self, script: str):
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, script)],
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        self.port = int(line.rsplit(":", 1)[1])
        self.pids = [self.proc.pid]

    def close(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(10)


class Broker:
    def __init__(self, workers: int, overrides: dict[str, str] | None = None,
                 data_dir: str | None = None):
        self.process = BrokerProcess(workers=workers, overrides=overrides,
                                     data_dir=data_dir).start()
        self.port = self.process.port
        self.pids = [self.process.pid] + list(self.process.worker_pids.values())

    def close(self):
        self.process.stop()


def run_rr(port: int, pids, frame_path: str, shape: str, seconds: float, mode: str):
    conns, depth = SHAPES[shape]
    before = cpu_seconds(pids)
    out = subprocess.run([os.path.join(BIN, "rrclient"), "127.0.0.1", str(port), str(conns),
                          str(depth), str(seconds), frame_path, "0.5", mode],
                         capture_output=True, text=True, timeout=seconds + 30)
    result = json.loads(out.stdout)
    result["server_cpu"] = cpu_seconds(pids) - before
    return result
