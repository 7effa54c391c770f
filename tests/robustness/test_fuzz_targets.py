"""Fuzzing inside `make test`: a short atheris run of every target, hypothesis mutations of the
requests real clients sent (tests/fuzz/corpus), and the same mutations against a real broker.

Invariants: no process dies, no exception escapes a connection, no connection slot or pool
byte leaks, and every refused request is counted in a metric.
"""

import random
import socket
import struct
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz import targets
from tests.fuzz.__main__ import ROOT, captured
from tests.harness import BrokerProcess, wait_until

FRAMES = captured()
INTERESTING = [b"\x00", b"\xff", b"\x7f\xff\xff\xff", b"\xff\xff\xff\xff\x0f", b"\x80\x00\x00\x00",
               b"\x00\x00\x00\x00", b"\x01"]


def test_the_corpus_holds_every_client_and_the_apis_they_use():
    kinds = {struct.unpack_from(">h", frame)[0] for frame in FRAMES}
    assert {0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 18, 19}.issubset(kinds)
    assert len(FRAMES) >= 60


@pytest.mark.system  # the fuzzers run as processes of their own, 2 s per target, two at once
def test_every_fuzz_target_runs_without_a_finding():
    done = subprocess.run([sys.executable, "-m", "tests.fuzz", "--seconds", "2", "--jobs", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.count(": ok;") == len(targets.TARGETS)


def mutate(frame: bytes, choices: list[int]) -> bytes:
    """Apply a few edits picked by `choices`: overwrite with a boundary value, flip a byte,
    cut, duplicate a slice, insert bytes."""
    data = bytearray(frame)
    picks = iter(choices)
    for _ in range(1 + next(picks, 0) % 3):
        if not data:
            break
        kind, where = next(picks, 0) % 5, next(picks, 0) % len(data)
        if kind == 0:
            value = INTERESTING[next(picks, 0) % len(INTERESTING)]
            data[where:where + len(value)] = value
        elif kind == 1:
            data[where] ^= 1 + next(picks, 0) % 255
        elif kind == 2:
            del data[where:]
        elif kind == 3:
            length = 1 + next(picks, 0) % 16
            data[where:where] = data[where:where + length]
        else:
            data[where:where] = bytes([next(picks, 0) % 256]) * (1 + next(picks, 0) % 8)
    return bytes(data)


mutations = st.tuples(st.sampled_from(FRAMES), st.lists(st.integers(0, 2**16), min_size=12,
                                                        max_size=12))


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(mutations)
def test_mutated_client_requests_get_an_answer_or_a_refusal(case):
    frame, choices = case
    targets.router(mutate(frame, choices))  # raises on anything but an answer or a refusal


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(mutations)
def test_mutated_client_requests_through_a_connection(case):
    frame, choices = case
    data = mutate(frame, choices)
    targets.framing(bytes([choices[0] % 256]) + struct.pack(">i", len(data)) + data)


@pytest.mark.system
def test_mutated_requests_against_a_real_broker_leave_nothing_behind():
    """2,000 mutated client requests over 40 connections to a broker with the memory pool on:
    it stays up, restarts no worker, and ends with no connection slot or pool byte held."""
    overrides = {"queued.max.request.bytes": str(8 << 20), "socket.request.max.bytes": str(1 << 20),
                 "pybroker.request.receive.timeout.ms": "1000"}
    rng = random.Random(13)
    with BrokerProcess(workers=2, overrides=overrides) as broker:
        address = broker.listeners["PLAINTEXT"]
        for round_ in range(40):
            with socket.create_connection(address, timeout=5) as sock:
                for _ in range(50):
                    data = mutate(rng.choice(FRAMES), [rng.randrange(2**16) for _ in range(12)])
                    try:
                        sock.sendall(struct.pack(">i", len(data)) + data)
                    except OSError:
                        break  # the broker closed this one: a refusal
        wait_until(lambda: broker.metric("broker_connections", listener="PLAINTEXT") == 0,
                   timeout=15, message="connection slots still held")
        wait_until(lambda: broker.metric("broker_request_memory_used_bytes") == 0, timeout=10,
                   message="pool bytes still held")
        assert broker.proc.poll() is None
        assert broker.metric("broker_worker_restarts_total") == 0
        closed = sum(broker.metric("broker_connections_closed_total", listener="PLAINTEXT",
                                   reason=reason) for reason in
                     ("client", "invalid", "error", "receive_timeout"))
        assert closed == 40
