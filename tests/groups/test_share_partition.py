"""A share partition's records in process (KIP-932): acquisition, acknowledgement, release,
lock expiry, the delivery limit, the bound on records in flight, the start offset."""

import pytest

from broker.parent.groups.share_partition import (ACCEPT, GAP, REJECT, RELEASE,
                                                  InvalidRecordState, Limits, RecordState,
                                                  SharePartition)

LIMITS = Limits(lock_seconds=30, delivery_limit=3, max_locks=10)


def test_records_are_acquired_once_and_the_start_moves_past_accepted_ones():
    partition = SharePartition(0, LIMITS)
    assert partition.acquire("a", log_end=5, max_records=3, now=0) == [(0, 2, 1)]
    assert partition.acquire("b", log_end=5, max_records=3, now=0) == [(3, 4, 1)]
    assert partition.acquire("c", log_end=5, max_records=3, now=0) == []
    partition.acknowledge("a", 0, 1, ACCEPT)
    assert (partition.start, partition.end) == (2, 5)
    with pytest.raises(InvalidRecordState):
        partition.acknowledge("b", 2, 2, ACCEPT)  # "a" holds it
    assert partition.records[2].state is RecordState.ACQUIRED  # nothing changed


def test_released_and_expired_records_come_back_with_their_count_until_the_limit():
    partition = SharePartition(0, LIMITS)
    partition.acquire("a", log_end=2, max_records=10, now=0)
    partition.acknowledge("a", 0, 0, RELEASE)
    assert partition.acquire("b", log_end=2, max_records=10, now=1) == [(0, 0, 2)]
    assert partition.expire(now=30.5) == 1  # "a" never said anything of offset 1
    assert partition.expire(now=31.5) == 1  # nor "b" of offset 0, delivered twice
    assert partition.acquire("c", log_end=2, max_records=10, now=40) == [(0, 0, 3), (1, 1, 2)]
    partition.release_member("c")  # offset 0's third delivery: archived; offset 1 back
    assert partition.records[1].state is RecordState.AVAILABLE
    assert partition.start == 1
    counts = partition.counts
    assert (counts.acquired, counts.redelivered, counts.released, counts.lock_expired,
            counts.delivery_limit) == (5, 3, 2, 2, 1)


def test_rejected_records_and_gaps_are_archived():
    partition = SharePartition(10, LIMITS)
    partition.acquire("a", log_end=14, max_records=10, now=0)
    partition.acknowledge("a", 10, 10, REJECT)
    partition.acknowledge("a", 11, 11, GAP)
    partition.archive([12])
    assert partition.start == 13 and partition.counts.rejected == 1


def test_records_in_flight_are_bounded():
    partition = SharePartition(0, LIMITS)
    assert partition.acquire("a", log_end=100, max_records=100, now=0) == [(0, 9, 1)]
    assert partition.acquire("b", log_end=100, max_records=100, now=0) == []
    partition.acknowledge("a", 0, 4, ACCEPT)
    assert partition.acquire("b", log_end=100, max_records=100, now=0) == [(10, 14, 1)]


def test_the_log_start_moving_drops_what_it_passed():
    partition = SharePartition(0, LIMITS)
    partition.acquire("a", log_end=5, max_records=10, now=0)
    partition.skip_to(3)
    assert (partition.start, sorted(partition.records)) == (3, [3, 4])
    partition.reset(50)
    assert (partition.start, partition.end, partition.records) == (50, 50, {})


def test_limits_are_checked():
    with pytest.raises(ValueError):
        Limits(lock_seconds=0, delivery_limit=1, max_locks=1)
