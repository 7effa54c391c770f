"""The client quotas' token bucket over the shared block (broker.shared.client_quotas), on a
fake clock: Kafka's burst, exact held rates for many connections on several workers, and the
bounds on what a client may owe."""

import heapq

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.shared.client_quotas import FETCH, PRODUCE, QuotaSensors
from shm.block import SharedBlock

SECOND = 10**9
T0 = 1_000 * SECOND
BLOCK_LAYOUT = {"slots": 3, "listeners": 1, "quota_entities": 16, "quota_windows": 11}


def workers(block, count=3, samples=2, burst=None, max_throttle=10.0):
    return [QuotaSensors(block, slot, 1.0, samples, burst, slots=3,
                         max_throttle_seconds=max_throttle) for slot in range(count)]


def test_a_fresh_sensor_lets_kafkas_burst_pass_and_throttles_the_next_event(block):
    """With quota.window.num 2, exactly `limit` events pass at once; event limit+1 violates."""
    sensors = workers(block, samples=2)[0]
    entity = sensors.entity("client-id=a", now_ns=T0)
    throttles = [sensors.charge(PRODUCE, entity, 1, 100, now_ns=T0) for _ in range(101)]
    assert throttles[:100] == [0.0] * 100
    assert throttles[100] == pytest.approx(0.01)  # one event at 100/s is owed for 10 ms
    assert sensors.owed(PRODUCE, entity, now_ns=T0 + SECOND // 100) == 0.0


def test_the_burst_follows_the_burst_windows(block):
    sensors = workers(block, samples=11, burst=3)[0]
    entity = sensors.entity("client-id=a", now_ns=T0)
    assert sensors.charge(PRODUCE, entity, 3000, 1000, now_ns=T0) == 0.0
    assert sensors.charge(PRODUCE, entity, 500, 1000, now_ns=T0) == pytest.approx(0.5)


def test_an_idle_client_earns_no_more_than_the_burst(block):
    sensors = workers(block, samples=2)[0]
    entity = sensors.entity("client-id=a", now_ns=T0)
    sensors.charge(PRODUCE, entity, 100, 100, now_ns=T0)
    later = T0 + 3600 * SECOND  # an hour of silence is still one burst
    assert sensors.charge(PRODUCE, entity, 100, 100, now_ns=later) == 0.0
    assert sensors.charge(PRODUCE, entity, 50, 100, now_ns=later) == pytest.approx(0.5)


def test_every_worker_sees_what_the_others_charged(block):
    first, second, third = workers(block)
    entity = first.entity("client-id=a", now_ns=T0)
    assert second.entity("client-id=a", now_ns=T0) == entity
    first.charge(PRODUCE, entity, 100, 100, now_ns=T0)  # the burst, spent on worker 0
    assert second.charge(PRODUCE, entity, 100, 100, now_ns=T0) == pytest.approx(1.0)
    assert third.owed(PRODUCE, entity, now_ns=T0) == pytest.approx(1.0)
    assert first.owed(FETCH, entity, now_ns=T0) == 0.0  # each quota type its own bucket


def test_a_debt_beyond_the_longest_throttle_and_a_rate_span_is_forgiven(block):
    sensors = workers(block, samples=2, max_throttle=10.0)[0]
    entity = sensors.entity("client-id=a", now_ns=T0)
    sensors.charge(PRODUCE, entity, 100, 100, now_ns=T0)
    owed = sensors.charge(PRODUCE, entity, 1_000_000, 100, now_ns=T0)  # 10,000 s of quota
    assert owed == pytest.approx(12.0)  # 10 s of throttle + a 2 s span
    assert sensors.owed(PRODUCE, entity, now_ns=T0 + 12 * SECOND) == 0.0


def test_a_changed_limit_applies_to_what_comes_next(block):
    sensors = workers(block, samples=2)[0]
    entity = sensors.entity("client-id=a", now_ns=T0)
    sensors.charge(PRODUCE, entity, 100, 100, now_ns=T0)
    assert sensors.charge(PRODUCE, entity, 100, 100, now_ns=T0) == pytest.approx(1.0)
    # Raised a hundredfold: the next 100 cost 10 ms, the old second is still owed.
    assert sensors.charge(PRODUCE, entity, 100, 10_000, now_ns=T0) == pytest.approx(1.01)


def test_a_restarted_workers_charges_are_still_owed(block):
    first, second, _ = workers(block)
    entity = first.entity("client-id=a", now_ns=T0)
    first.charge(PRODUCE, entity, 500, 100, now_ns=T0)  # 4 s owed after the 1 s burst
    block.archive_slot_counters(0)  # the parent folds a dead worker's counters away
    assert second.owed(PRODUCE, entity, now_ns=T0) == pytest.approx(4.0)


def test_a_sensor_owed_time_is_not_taken_over(tmp_path):
    block = SharedBlock.create(str(tmp_path / "block"), slots=1, listeners=1, quota_entities=16,
                               quota_windows=2)
    try:
        sensors = QuotaSensors(block, 0, 1.0, 2, None, slots=1, max_throttle_seconds=10)
        held = [sensors.entity(f"client-id=c{n}", now_ns=T0) for n in range(16)]
        sensors.charge(PRODUCE, held[0], 1100, 100, now_ns=T0)  # owes 10 s
        later = T0 + 5 * SECOND  # every sensor idle for the span; c0 still owes 5 s
        taken = sensors.entity("client-id=stranger", now_ns=later)
        assert taken is not None and taken != held[0]
        assert sensors.owed(PRODUCE, held[0], now_ns=later) == pytest.approx(5.0)
    finally:
        block.close()


def held_rate(block, connections, workers_used, record_bytes, samples, limit, seconds=40):
    """Simulate `connections` of one client spread over workers, each sending a request as soon
    as its throttle ends (the broker mutes it until then); the rate held after the burst."""
    sensors = workers(block, count=3, samples=samples)[:workers_used]
    entity = sensors[0].entity("client-id=sim", now_ns=T0)
    ready = [(T0 + n * 1000, n) for n in range(connections)]  # (next send, connection)
    heapq.heapify(ready)
    sent, start, end = 0, T0 + 20 * SECOND, T0 + (20 + seconds) * SECOND
    while ready[0][0] < end:
        now, conn = heapq.heappop(ready)
        worker = sensors[conn % workers_used]
        owed = min(worker.charge(PRODUCE, entity, record_bytes, limit, now_ns=now), 10.0)
        if now >= start:
            sent += record_bytes
        heapq.heappush(ready, (now + 10_000 + int(owed * SECOND), conn))  # 10 us to serve
    return sent / seconds


@settings(max_examples=30, deadline=None)
@given(connections=st.sampled_from([1, 3, 10]), workers_used=st.integers(1, 3),
       record_bytes=st.sampled_from([100, 1000, 10_240, 102_400]), samples=st.integers(2, 11),
       per_second=st.sampled_from([10, 100, 1000]))
def test_the_held_rate_is_the_limit_for_any_connections_sizes_and_windows(
        tmp_path_factory, connections, workers_used, record_bytes, samples, per_second):
    """The bucket is scale-free: `per_second` requests of `record_bytes` fit the limit."""
    block = SharedBlock.create(str(tmp_path_factory.mktemp("q") / "block"), slots=3,
                               listeners=1, quota_entities=16, quota_windows=11)
    limit = record_bytes * per_second
    try:
        rate = held_rate(block, connections, workers_used, record_bytes, samples, limit)
    finally:
        block.close()
    # The requests in flight at the edges of the measured span are all the error there is.
    assert abs(rate - limit) <= limit * 0.001 + connections * record_bytes / 40, (rate, limit)


def test_the_held_rate_of_small_records_at_a_megabyte_a_second(block):
    """10,000 charges a second, each a tenth of a millisecond: the ns carry keeps them exact."""
    rate = held_rate(block, 3, 2, 100, 2, 1_000_000, seconds=10)
    assert abs(rate - 1_000_000) <= 1_000 + 3 * 100 / 10, rate
