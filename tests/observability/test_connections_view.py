"""Who is connected, live: GET /connections and `python -m broker connections` against a real
broker of two workers, during a storm and with a throttled client."""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from kio.schema.errors import ErrorCode

from tests.batches import make_batch
from tests.harness import PROJECT, wait_until
from tests.wire import (KafkaSocket, alter_client_quota, api_versions_request, create_topic,
                        produce_request)

pytestmark = pytest.mark.system  # every test here starts a broker

RRCLIENT = os.path.join(PROJECT, "loadtest", "bin",
                        "rrclient")


# Its tests set a quota on the client id other tests use, and expect the oldest connections
# to be their own: a broker of its own (tests/conftest.py `broker`).
FRESH_BROKER = True


def listing(broker, **query) -> tuple[dict, float]:
    """The endpoint's answer and how long it took, in seconds."""
    host, port = broker.metrics_address
    url = f"http://{host}:{port}/connections?" + "&".join(f"{k}={v}" for k, v in query.items())
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=5) as response:
        answer = json.load(response)
    return answer, time.perf_counter() - started


def test_the_storming_client_is_on_top_and_each_listing_comes_within_100_ms(broker, tmp_path):
    address = broker.listeners["PLAINTEXT"]
    quiet = [KafkaSocket(address, source="127.0.0.5") for _ in range(3)]
    for sock in quiet:  # answered, so registered before the storm: the oldest by age
        sock.send(api_versions_request(client_id="quiet"))
        sock.receive()
    frame = tmp_path / "apiversions.bin"
    frame.write_bytes(api_versions_request(client_id="stormer"))
    # 40 connections from 127.0.0.1, 16 requests in flight on each: both workers saturated.
    storm = subprocess.Popen([RRCLIENT, address[0], str(address[1]), "40", "16", "4",
                              str(frame)], stdout=subprocess.PIPE)
    try:
        wait_until(lambda: listing(broker, top=1, by="requests")[0]["rows"][0]["requests"]
                   > 10_000, timeout=4, message="the storm never got going")
        took = []
        for _ in range(5):
            answer, seconds = listing(broker, top=10, by="requests")
            took.append(seconds)
        assert max(took) < 0.1, took
        assert answer["connections"] >= 43 and answer["unanswered"] == []
        assert set(answer["workers"]) == {"data-0", "data-1"}
        rows = answer["rows"]
        assert len(rows) == 10
        assert {(row["ip"], row["client_id"], row["listener"]) for row in rows} == \
            {("127.0.0.1", "stormer", "PLAINTEXT")}
        assert [row["requests"] for row in rows] == sorted((r["requests"] for r in rows),
                                                           reverse=True)
        oldest, _ = listing(broker, top=3, by="age")  # the quiet ones came first
        assert {row["ip"] for row in oldest["rows"]} == {"127.0.0.5"}
        host, port = broker.metrics_address
        printed = subprocess.run(
            [sys.executable, "-m", "broker", "connections", "--url",
             f"http://{host}:{port}/connections", "--top", "2", "--by", "requests"],
            capture_output=True, text=True, timeout=30)
        assert printed.returncode == 0, printed.stderr
        lines = printed.stdout.splitlines()
        assert lines[0].split()[:3] == ["WORKER", "LISTENER", "CLIENT"]
        assert all("127.0.0.1:" in line and "stormer" in line for line in lines[1:3])
        assert "top 2 by requests" in lines[3]
    finally:
        storm.wait(30)
        for sock in quiet:
            sock.close()
    assert json.loads(storm.stdout.read())["errors"] == 0


def test_a_throttled_client_shows_why_it_is_not_read(broker):
    address = broker.listeners["PLAINTEXT"]
    # The wire helpers' client id is "test".
    assert alter_client_quota(address, {"client-id": "test"}, "producer_byte_rate", 500) == ErrorCode.none
    create_topic(broker.bootstrap, "slow")
    batch = make_batch(10, value_size=1000)
    with KafkaSocket(address, source="127.0.0.6", timeout=30) as client:
        client.send(produce_request("slow", batch))  # 10 KB: twice the burst, 10 s owed
        client.receive()
        answer, _ = listing(broker, top=1, by="throttle")
        [row] = answer["rows"]
        assert (row["ip"], row["client_id"]) == ("127.0.0.6", "test")
        assert row["throttle_ms"] > 5000 and row["requests"] == 1
        assert row["state"] == "throttled" and row["waiting_for"] == ["throttle"]


@pytest.mark.parametrize("query, error", [
    ("top=0", "top must be 1..1000"), ("top=1001", "top must be 1..1000"),
    ("top=x", "invalid literal"), ("by=size", "by must be one of bytes, requests")])
def test_a_bad_question_is_answered_400_with_the_reason(broker, query, error):
    host, port = broker.metrics_address
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(f"http://{host}:{port}/connections?{query}", timeout=5)
    assert raised.value.code == 400
    assert error in json.load(raised.value)["error"]
