"""Run the fuzz targets with atheris: `python -m tests.fuzz [--seconds N] [target ...]`.

Each target (tests/fuzz/targets.py) runs in a process of its own for N seconds (default 60),
coverage-guided over the broker's own modules, starting from seeds derived from the captured
requests of real clients (corpus/requests, see capture.py).  The processes are forked from one
that instrumented the modules once (seconds of CPU each time otherwise).  A crash, an abort or a broken
invariant stops that target, leaves the input that did it under `fuzz-findings/` and makes
the run exit 1.  The last line per target gives executions and coverage.

`make fuzz` runs every target for FUZZ_SECONDS; `make test` runs each for a few seconds.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CAPTURED = os.path.join(HERE, "corpus", "requests")
_DONE = re.compile(r"#(\d+)\s+DONE\s+cov: (\d+) ft: (\d+)")
_STATUS = re.compile(r"#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+)")
DEADLINE_SLACK = 120  # seconds a run may take beyond its fuzzing time before it is killed


def captured() -> list[bytes]:
    found = []
    for name in sorted(os.listdir(CAPTURED)):
        with open(os.path.join(CAPTURED, name), "rb") as handle:
            found.append(handle.read())
    return found


def _sasl_seeds() -> list[bytes]:
    """A PLAIN exchange (v1 and raw v0) and a SCRAM client-first, as clients send them."""
    def request(api_key: int, version: int, body: bytes) -> bytes:
        return struct.pack(">hhih", api_key, version, 1, 4) + b"fuzz" + body

    def string(text: bytes) -> bytes:
        return struct.pack(">h", len(text)) + text

    def sized(frames: list[bytes]) -> bytes:
        return b"".join(struct.pack(">I", len(f)) + f for f in frames)

    plain = b"\x00alice\x00pw"
    first = b"n,,n=alice,r=fyko+d2lbbFgONRv9qkxdawL"
    return [
        b"\x00" + sized([request(17, 1, string(b"PLAIN")),
                         request(36, 1, struct.pack(">i", len(plain)) + plain)]),
        b"\x01" + sized([request(17, 0, string(b"PLAIN")), plain]),
        b"\x02" + sized([request(17, 1, string(b"SCRAM-SHA-256")),
                         request(36, 1, struct.pack(">i", len(first)) + first)]),
        b"\x03" + sized([request(3, 12, b""), request(18, 3, b"")]),
    ]


def _timestamp_seeds() -> list[bytes]:
    """Batches with a client's LogAppendTime attribute and timestamps at the ends of 64 bits."""
    from tests.raw_batches import LOG_APPEND_TIME, batch_of, record

    edges = record(0, -(2**63)) + record(1, 2**63 - 1)
    return [batch_of(record(0, 5) + record(1, -5), 2, 10**12, attributes=LOG_APPEND_TIME),
            batch_of(edges, 2, 0), batch_of(edges, 2, 1), batch_of(edges, 2, -1)]


def write_seeds(target: str, directory: str) -> int:
    """The seeds of one target, derived from the captured request frames."""
    from broker.shared import ipc
    from broker.shared.config import load_config
    from tests.fuzz.targets import SCHEMAS

    frames = captured()
    seeds: list[bytes] = []
    if target in ("router", "upstream"):
        seeds = frames
    elif target == "framing":
        seeds = [bytes([flags]) + b"".join(struct.pack(">i", len(f)) + f for f in frames[i::7])
                 for i, flags in enumerate((0, 1, 2, 3, 14, 15, 127))]
    elif target == "requests":
        index = {schema: n for n, schema in enumerate(SCHEMAS)}
        for frame in frames:
            key = index.get(struct.unpack_from(">hh", frame))
            if key is not None:
                seeds.append(struct.pack(">H", key) + _body(frame))
    elif target == "records":
        from tests.batches import compressed, make_batch

        seeds = [batch for frame in frames for batch in _batches(frame)]
        seeds += [compressed(make_batch(5), codec, xerial) for codec, xerial in
                  ((1, False), (2, False), (2, True), (3, False), (4, False))]
        seeds += _timestamp_seeds()
        seeds += _topic_seeds()
    elif target == "sasl":
        seeds = _sasl_seeds()
    elif target == "tags":  # flexible frames, each with an unknown tagged field appended
        index = {schema: n for n, schema in enumerate(SCHEMAS)}
        for frame in frames:
            key = index.get(struct.unpack_from(">hh", frame))
            if key is not None and frame[-1:] == b"\x00":
                seeds.append(struct.pack(">H", key) + frame[:-1] + b"\x01\x2a\x02ok")
    elif target == "proxy":  # HAProxy's headers, v1 and v2 (with TLVs), then a Kafka frame
        from tests.admission.helpers import V2_LOCAL, V2_TCP4, V2_TCP6

        seeds = [header + frames[0] for header in (
            b"PROXY TCP4 192.0.2.7 10.0.0.1 40000 9092\r\n", b"PROXY UNKNOWN\r\n",
            b"PROXY TCP6 2001:db8::7 2001:db8::1 40000 9092\r\n", V2_TCP4, V2_TCP6, V2_LOCAL)]
    elif target == "http":  # what Prometheus, curl and a browser send
        seeds = [b"GET /metrics HTTP/1.1\r\nHost: b:9404\r\nUser-Agent: Prometheus/2.45.0\r\n"
                 b"Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;"
                 b"q=0.5,*/*;q=0.1\r\nAccept-Encoding: gzip\r\n"
                 b"X-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\n",
                 b"GET /connections?top=5&by=age HTTP/1.1\r\nHost: b\r\nAccept: */*\r\n\r\n",
                 b"GET /metrics?name[]=broker_connections HTTP/1.0\n\n",
                 b"OPTIONS / HTTP/1.1\r\nHost: b\r\n\r\n"]
    elif target == "names":  # hostile subjects, alone and in a signed certificate
        import trustme

        from tests.security.subjects import JAVA_17, certificate

        ca = trustme.CA()
        seeds = [der for der, _printed in JAVA_17.values()]
        seeds += [certificate(ca, JAVA_17[case][0])[0] for case in ("spoof_comma", "multi")]
    elif target == "ipc":
        config = load_config({})
        seeds = [ipc.encode(message) for message in (
            ipc.Progress(registered=3, closed=[1, 2]), ipc.Handoff([(1, 0, "127.0.0.1", 5)]),
            ipc.ForwardedRequest(request_id=1, listener=0, peer="p", frame=frames[0]),
            ipc.Quotas(entries={"client-id=a": {"producer_byte_rate": 1.0}}),
            ipc.Boot(config=config, slot=0, shm_path="/x", cluster_id="c", name="w"))]
    os.makedirs(directory, exist_ok=True)
    for n, seed in enumerate(seeds):
        with open(os.path.join(directory, f"seed-{n:04d}"), "wb") as out:
            out.write(seed)
    return len(seeds)


def _body(frame: bytes) -> bytes:
    from broker.shared.protocol.codec import request_readers

    api_key, version = struct.unpack_from(">hh", frame)
    header_reader, _ = request_readers(api_key, version)
    return frame[header_reader(frame, 0)[1]:]


def _topic_seeds() -> list[bytes]:
    """Batches whose base offset's second byte (outside the CRC) asks the target for a
    compacted topic, a topic codec and timestamp bounds (targets._slices_agree): some records
    without a key, some far from the bounds' clock."""
    from tests.batches import compressed, make_batch
    from tests.raw_batches import batch_of, record

    keyless = batch_of(b"".join(record(index, index << 30, key=None if index % 2 else b"k")
                                for index in range(6)), 6, 1 << 40)
    return [batch[:1] + bytes([flags]) + batch[2:]
            for flags in (0x06, 0x0A, 0x0E, 0x12, 0x16, 0x36)
            for batch in (make_batch(5), compressed(make_batch(5), 3), keyless)]


def _batches(frame: bytes) -> list[bytes]:
    from broker.shared.protocol.codec import request_readers

    if struct.unpack_from(">h", frame)[0] != 0:
        return []
    _, body_reader = request_readers(0, struct.unpack_from(">h", frame, 2)[0])
    body, _ = body_reader(frame, len(frame) - len(_body(frame)))
    return [bytes(part.records) for topic in body.topic_data for part in topic.partition_data
            if part.records]


def instrument() -> None:
    """Import, under atheris' instrumentation, every broker module a target can reach (modules
    imported later would run uninstrumented and give the fuzzer no coverage to follow)."""
    import atheris

    with atheris.instrument_imports(include=["broker", "workers", "shm", "proxyprotocol"]):
        import broker.parent.admin  # noqa: F401
        import broker.parent.groups.coordinator  # noqa: F401
        import broker.parent.http_head  # noqa: F401
        import broker.parent.proxy_header  # noqa: F401
        import proxyprotocol.v1  # noqa: F401
        import proxyprotocol.v2  # noqa: F401
        import broker.shared.ipc  # noqa: F401
        import broker.shared.log.records  # noqa: F401
        import broker.shared.protocol.codec  # noqa: F401
        import broker.shared.protocol.guard  # noqa: F401
        import workers.unknown_tags  # noqa: F401
        import broker.shared.x500  # noqa: F401
        import workers.apis.parent_served  # noqa: F401
        import workers.apis.discovery  # noqa: F401
        import workers.apis.fetch  # noqa: F401
        import workers.apis.produce  # noqa: F401
        import workers.apis.topics  # noqa: F401
        import workers.connection  # noqa: F401
        import workers.authenticator  # noqa: F401
        import workers.router  # noqa: F401
        import workers.upstream  # noqa: F401
        import workers.upstream_rewrite  # noqa: F401
        import workers.apis.upstream  # noqa: F401
        import workers.apis.edge_acls  # noqa: F401


@dataclass
class Run:
    """One target's fuzzing run: its libFuzzer options, where its output goes, its exit."""

    target: str
    seeds: int
    options: list[str]
    output: str
    seconds: int
    returncode: int | None = None


def serve_forks(plan: str, jobs: int) -> None:
    """In the fuzzing process: instrument once (seconds of CPU), then fork one child per run of
    the plan, `jobs` at a time, each a target of its own under libFuzzer; its exit status
    goes back into the plan.  A child past its deadline is killed (a hang is a finding)."""
    with open(plan, encoding="utf-8") as handle:
        runs = [Run(**fields) for fields in json.load(handle)]
    instrument()
    waiting, running = list(runs), {}
    while waiting or running:
        while waiting and len(running) < max(1, jobs):
            run = waiting.pop(0)
            running[_fork(run)] = (run, time.monotonic() + run.seconds + DEADLINE_SLACK)
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid:
            running.pop(pid)[0].returncode = os.waitstatus_to_exitcode(status)
            continue
        for child, (run, deadline) in running.items():
            if time.monotonic() > deadline:
                os.kill(child, signal.SIGKILL)
        time.sleep(0.05)
    with open(plan, "w", encoding="utf-8") as handle:
        json.dump([asdict(run) for run in runs], handle)


def _fork(run: Run) -> int:
    """Start one run in a forked child, its stdout and stderr into its output file."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 70
    try:
        import atheris

        from tests.fuzz.targets import TARGETS

        output = os.open(run.output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(output, 1)
        os.dup2(output, 2)
        atheris.Setup([sys.argv[0], *run.options], TARGETS[run.target])
        atheris.Fuzz()  # libFuzzer exits the process when the time is up
    except SystemExit as finding:  # atheris, after printing an exception a target raised
        code = finding.code if isinstance(finding.code, int) else 1
    except BaseException:  # noqa: BLE001 - told in the run's output, then a failed exit
        traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    # C's exit, never back into the parent's loop: libFuzzer's exit hook writes the input
    # that raised under fuzz-findings/, as when the target's process was started on its own.
    ctypes.CDLL(None).exit(code)
    os._exit(code)


def run_all(targets: list[str], seconds: int, jobs: int = 1) -> int:
    """Each target for `seconds` in a process of its own, `jobs` at a time (all forked from
    one that instrumented the broker's modules); reports in order."""
    findings = os.path.join(ROOT, "fuzz-findings")
    os.makedirs(findings, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fuzz-") as work:
        runs = []
        for target in targets:
            seeds = os.path.join(work, target)
            count = write_seeds(target, seeds)
            runs.append(Run(target, count, [
                f"-max_total_time={seconds}", "-rss_limit_mb=4096", "-timeout=20",
                f"-artifact_prefix={findings}/{target}-", "-max_len=200000", seeds],
                os.path.join(work, f"{target}.out"), seconds))
        plan = os.path.join(work, "plan.json")
        with open(plan, "w", encoding="utf-8") as handle:
            json.dump([asdict(run) for run in runs], handle)
        rounds = -(-len(runs) // max(1, jobs))
        served = subprocess.run([sys.executable, "-m", "tests.fuzz", "--forks", plan,
                                 "--jobs", str(jobs)], cwd=ROOT, capture_output=True,
                                text=True, timeout=120 + rounds * (seconds + DEADLINE_SLACK))
        with open(plan, encoding="utf-8") as handle:
            runs = [Run(**fields) for fields in json.load(handle)]
        failed = 0
        for run in runs:
            line, output = _report(run, served)
            print(line, flush=True)
            if output is not None:
                failed += 1
                print(output[-4000:], file=sys.stderr)
    return 1 if failed else 0


def _report(run: Run, served: subprocess.CompletedProcess) -> tuple[str, str | None]:
    """(its report line, its output if it failed)."""
    output = ""
    if os.path.exists(run.output):
        with open(run.output, encoding="utf-8", errors="replace") as handle:
            output = handle.read()
    last = _DONE.search(output) or (_STATUS.findall(output) or [None])[-1]
    if isinstance(last, re.Match):
        execs, cov, features = last.groups()
    elif last:
        execs, cov, features = last
    else:
        execs = cov = features = "?"
    if run.returncode is None:  # the forking process itself failed
        output += served.stderr[-3000:]
    status = "ok" if run.returncode == 0 else f"FAILED (exit {run.returncode})"
    line = (f"fuzz {run.target}: {status}; {execs} executions in {run.seconds}s from "
            f"{run.seeds} seeds; coverage {cov} edges, {features} features")
    return line, None if run.returncode == 0 else output


def main() -> int:
    from tests.fuzz.targets import TARGETS

    parser = argparse.ArgumentParser(prog="python -m tests.fuzz")
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--jobs", type=int, default=1, help="targets run at once")
    parser.add_argument("--forks", help=argparse.SUPPRESS)  # the plan of serve_forks
    parser.add_argument("targets", nargs="*", help=f"some of {', '.join(TARGETS)} (all)")
    args, rest = parser.parse_known_args()
    if args.forks:
        serve_forks(args.forks, args.jobs)
        return 0
    unknown = set(args.targets) - set(TARGETS)
    if unknown or rest:
        parser.error(f"unknown targets or options: {sorted(unknown) + rest}")
    return run_all(args.targets or list(TARGETS), args.seconds, args.jobs)


if __name__ == "__main__":
    sys.exit(main())
