"""Run the fuzz targets with atheris: `python -m tests.fuzz [--seconds N] [target ...]`.

Each target (tests/fuzz/targets.py) runs in a process of its own for N seconds (default 60),
coverage-guided over the broker's own modules, starting from seeds derived from the captured
requests of real clients (corpus/requests, see capture.py).  A crash, an abort or a broken
invariant stops that target, leaves the input that did it under `fuzz-findings/` and makes
the run exit 1.  The last line per target gives executions and coverage.

`make fuzz` runs every target for FUZZ_SECONDS; `make test` runs each for a few seconds.
"""

from __future__ import annotations

import argparse
import os
import re
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CAPTURED = os.path.join(HERE, "corpus", "requests")
_DONE = re.compile(r"#(\d+)\s+DONE\s+cov: (\d+) ft: (\d+)")
_STATUS = re.compile(r"#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+)")


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
    if target == "handlers":
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
        from tests.test_proxy_header import V2_LOCAL, V2_TCP4, V2_TCP6

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

        from tests.test_certificate_principals import JAVA_17, certificate

        ca = trustme.CA()
        seeds = [der for der, _printed in JAVA_17.values()]
        seeds += [certificate(ca, JAVA_17[case][0])[0] for case in ("spoof_comma", "multi")]
    elif target == "ipc":
        config = load_config({})
        seeds = [ipc.encode(message) for message in (
            ipc.Progress(registered=3, closed=[1, 2]), ipc.Handoff([(1, 0, "127.0.0.1", 5)]),
            ipc.AdminRequest(request_id=1, listener=0, peer="p", frame=frames[0]),
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


def run_one(target: str, args: list[str]) -> None:
    """In the fuzzing process: instrument the broker's modules, then hand over to atheris."""
    import atheris

    with atheris.instrument_imports(include=["broker", "workers", "shm", "proxyprotocol"]):
        # Everything a target can reach, imported under instrumentation (modules imported
        # later would run uninstrumented and give the fuzzer no coverage to follow).
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
        import broker.shared.protocol.tags  # noqa: F401
        import broker.shared.x500  # noqa: F401
        import workers.apis.forwarded  # noqa: F401
        import workers.apis.discovery  # noqa: F401
        import workers.apis.fetch  # noqa: F401
        import workers.apis.produce  # noqa: F401
        import workers.apis.topics  # noqa: F401
        import workers.connection  # noqa: F401
        import workers.authenticator  # noqa: F401
        import workers.handlers  # noqa: F401
    from tests.fuzz.targets import TARGETS

    atheris.Setup([sys.argv[0], *args], TARGETS[target])
    atheris.Fuzz()


def run_all(targets: list[str], seconds: int, jobs: int = 1) -> int:
    """Each target for `seconds` in a process of its own, `jobs` at a time; reports in order."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        outcomes = list(pool.map(lambda target: _run_target(target, seconds), targets))
    failed = 0
    for line, output in outcomes:
        print(line, flush=True)
        if output is not None:
            failed += 1
            print(output[-4000:], file=sys.stderr)
    return 1 if failed else 0


def _run_target(target: str, seconds: int) -> tuple[str, str | None]:
    """(its report line, its output if it failed)."""
    findings = os.path.join(ROOT, "fuzz-findings")
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{target}-") as work:
        seeds = os.path.join(work, "corpus")
        count = write_seeds(target, seeds)
        os.makedirs(findings, exist_ok=True)
        argv = [sys.executable, "-m", "tests.fuzz", "--one", target, "--",
                f"-max_total_time={seconds}", "-rss_limit_mb=4096", "-timeout=20",
                f"-artifact_prefix={findings}/{target}-", "-max_len=200000", seeds]
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True,
                              timeout=seconds + 120)
    output = done.stderr + done.stdout
    last = _DONE.search(output) or (_STATUS.findall(output) or [None])[-1]
    if isinstance(last, re.Match):
        execs, cov, features = last.groups()
    elif last:
        execs, cov, features = last
    else:
        execs = cov = features = "?"
    status = "ok" if done.returncode == 0 else f"FAILED (exit {done.returncode})"
    line = (f"fuzz {target}: {status}; {execs} executions in {seconds}s from {count} "
            f"seeds; coverage {cov} edges, {features} features")
    return line, None if done.returncode == 0 else output


def main() -> int:
    from tests.fuzz.targets import TARGETS

    parser = argparse.ArgumentParser(prog="python -m tests.fuzz")
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--jobs", type=int, default=1, help="targets run at once")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("targets", nargs="*", help=f"some of {', '.join(TARGETS)} (all)")
    args, rest = parser.parse_known_args()
    if args.one:  # libFuzzer's own options follow "--"
        run_one(args.one, sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else [])
        return 0
    unknown = set(args.targets) - set(TARGETS)
    if unknown or rest:
        parser.error(f"unknown targets or options: {sorted(unknown) + rest}")
    return run_all(args.targets or list(TARGETS), args.seconds, args.jobs)


if __name__ == "__main__":
    sys.exit(main())
