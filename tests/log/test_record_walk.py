"""The C record walk (_recordwalk.c) against the Python walk it replaces: on sound batches,
mangled ones and random bytes both must return the same position and timestamp bounds or
refuse with the same Kafka error code.  And the timestamp lookup built on them against the
full listing of a batch's records."""


import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.shared.log import records
from broker.shared.log.record_errors import FaultRoom, Faults
from broker.shared.log.records import HEADER_BYTES, BatchError
from tests.batches import compressed, make_batch
from tests.raw_batches import batch_of, record

pytestmark = pytest.mark.skipif(records._recordwalk is None, reason="never: make install builds it")


LISTED = 5  # faulty records listed at most: the rest are only counted


def _outcome(walk, buffer, end, count, keyed, window):
    try:
        return walk(buffer, end, count, keyed, window)
    except BatchError as error:
        return error.code


def _python(buffer, end, count, keyed, window):
    faults = Faults(keyed, window, FaultRoom(LISTED))
    position, least, greatest = records._walk(buffer, HEADER_BYTES, end, 0, count, 2**63,
                                              -(2**63), None, faults)
    return position, least, greatest, faults.keyless, faults.stamped, faults.listed


def _c(buffer, end, count, keyed, window):
    listed: list = []
    low, high, none = window or (0, 0, 0)
    walked = records._recordwalk.walk(buffer, HEADER_BYTES, end, 0, count, keyed, listed, LISTED,
                                      window is not None, low, high, none)
    return (*walked, listed)


def _agree(buffer, end, count, keyed=False, window=None):
    """The verdict both walks reach: a refusal's code, or (position, least and greatest
    timestamp delta, keyless and out-of-window records counted, the first listed)."""
    expected = _outcome(_python, buffer, end, count, keyed, window)
    assert _outcome(_c, buffer, end, count, keyed, window) == expected
    return expected


def test_the_c_walk_is_built_by_make_install():
    assert records._recordwalk is not None


@settings(max_examples=400, deadline=None)
@given(count=st.integers(1, 40), value_size=st.integers(0, 300), stamps=st.lists(
    st.integers(-(2**40), 2**40), min_size=1, max_size=40), keyed=st.booleans(),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=4),
    cut=st.integers(0, 64))
def test_the_c_walk_agrees_with_the_python_walk(count, value_size, stamps, keyed, flips, cut):
    batch = bytearray(make_batch(count=len(stamps), value_size=value_size, timestamps=stamps))
    for where, byte in flips:
        batch[HEADER_BYTES + where % (len(batch) - HEADER_BYTES)] = byte
    end = max(HEADER_BYTES, len(batch) - cut)
    outcome = _agree(memoryview(batch)[:end], end, len(stamps), keyed)
    if not flips and not cut:
        assert outcome[:3] == (len(batch), min(stamps) - stamps[0], max(stamps) - stamps[0])


@settings(max_examples=400, deadline=None)
@given(body=st.binary(min_size=0, max_size=200), count=st.integers(1, 30),
       keyed=st.booleans())
def test_random_bytes_meet_the_same_verdict(body, count, keyed):
    buffer = bytes(HEADER_BYTES) + body
    _agree(buffer, len(buffer), count, keyed)


def test_a_length_near_two_to_the_63_never_reads_past_the_buffer():
    varint = bytes([0xFE] * 9 + [0x01])  # zigzag of 2**63 - 1: a huge positive length
    buffer = bytes(HEADER_BYTES) + varint + bytes(20)
    assert _agree(buffer, len(buffer), 1) == "corrupt_message"


def test_a_varint_wider_than_64_bits_is_refused_by_both():
    varint = bytes([0xFF] * 9 + [0x7F])
    buffer = bytes(HEADER_BYTES) + bytes([20, 0]) + varint + bytes(8)
    assert _agree(buffer, len(buffer), 1) == "corrupt_message"


def test_keyless_records_in_a_compacted_topic_are_listed_by_both():
    body = b"".join(record(index, index, key=None if index % 3 == 0 else b"k")
                    for index in range(20))
    buffer = bytes(HEADER_BYTES) + body
    *_, keyless, stamped, listed = _agree(buffer, len(buffer), 20, keyed=True)
    assert (keyless, stamped) == (7, 0)  # 0, 3, ... 18: all counted, LISTED of them listed
    assert listed == [(index, 1, index) for index in (0, 3, 6, 9, 12)]
    assert _agree(buffer, len(buffer), 20, keyed=False)[3:] == (0, 0, [])


def test_a_keyless_record_that_is_also_corrupt_is_refused_as_corrupt_by_both():
    """Kafka reads a record whole before it checks its key: the corruption wins."""
    batch = bytearray(make_batch(count=1))
    # The first record's key length follows its length, attributes, timestamp delta and
    # offset delta, one byte each here; -1 (zigzag 1) makes the key null, and the record
    # no longer fills its length.
    key_at = HEADER_BYTES + 4
    assert batch[key_at] == 4  # "k0"
    batch[key_at] = 1
    assert _agree(batch, len(batch), 1, keyed=True) == "corrupt_message"


@settings(max_examples=300, deadline=None)
@given(deltas=st.lists(st.integers(-50, 50), min_size=1, max_size=30),
       window=st.tuples(st.integers(-60, 60), st.integers(0, 60), st.integers(-60, 60)),
       keyless=st.sets(st.integers(0, 29)))
def test_timestamps_out_of_the_window_are_counted_and_listed_alike(deltas, window, keyless):
    low, width, none = window
    body = b"".join(record(index, delta, key=None if index in keyless else b"k")
                    for index, delta in enumerate(deltas))
    buffer = bytes(HEADER_BYTES) + body
    *_, keyless_found, stamped, listed = _agree(buffer, len(buffer), len(deltas), True,
                                                (low, low + width, none))
    expected = [(index, 1 if index in keyless else 2, delta)
                for index, delta in enumerate(deltas)
                if index in keyless or (delta != none and not low <= delta <= low + width)]
    assert (keyless_found + stamped, listed) == (len(expected), expected[:LISTED])


@settings(max_examples=300, deadline=None)
@given(deltas=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=20),
       keyed=st.booleans())
def test_timestamp_deltas_at_the_ends_of_64_bits_meet_the_same_verdict(deltas, keyed):
    body = b"".join(record(index, delta) for index, delta in enumerate(deltas))
    buffer = bytes(HEADER_BYTES) + body
    assert _agree(buffer, len(buffer), len(deltas), keyed)[:3] == (len(buffer), min(deltas),
                                                                   max(deltas))


@settings(max_examples=60, deadline=None)
@given(stamps=st.lists(st.integers(0, 50), min_size=1, max_size=40), repeat=st.integers(1, 300),
       wanted=st.integers(-1, 52), codec=st.sampled_from([0, 1, 4]),
       start=st.one_of(st.just(0), st.integers(0, 9000)))
def test_a_timestamp_lookup_finds_what_the_full_listing_finds(stamps, repeat, wanted, codec,
                                                              start):
    """Across the lookup's slices of FIND_SLICE records, compressed or not, from a log start
    offset inside the batch or not."""
    stamps = (stamps * repeat)[:9000]
    body = b"".join(record(index, stamp) for index, stamp in enumerate(stamps))
    batch = batch_of(body, len(stamps), 1000)
    if codec:
        batch = compressed(batch, codec)
    listing = records.record_timestamps(batch)
    assert listing == [(index, 1000 + stamp) for index, stamp in enumerate(stamps)]
    expected = next((item for item in listing if item[1] >= 1000 + wanted and item[0] >= start),
                    None)
    assert records.first_record_from(batch, 1000 + wanted, from_offset=start) == expected


def test_a_stored_timestamp_past_64_bits_is_read_as_java_reads_it():
    """Stored before such batches were refused: the lookup wraps, as a Java reader does."""
    batch = batch_of(record(0, 0) + record(1, 2), 2, 2**63 - 1)
    assert records.record_timestamps(batch) == [(0, 2**63 - 1), (1, -(2**63) + 1)]
    assert records.first_record_from(batch, 2**63 - 1) == (0, 2**63 - 1)
    assert records.first_record_from(batch, -5) == (0, 2**63 - 1)
    wrapped_up = batch_of(record(0, 0) + record(1, -2), 2, -(2**63))
    assert records.first_record_from(wrapped_up, 2**62) == (1, 2**63 - 2)


def test_a_log_append_time_batch_answers_its_first_record_at_or_past_the_log_start():
    """Every record of it carries the batch's max timestamp: the answer is the first record
    at or past `from_offset`, none when the search starts past the batch."""
    batch = batch_of(b"".join(record(index, 0) for index in range(3)), 3, 100, 500,
                     records.LOG_APPEND_TIME)
    assert records.first_record_from(batch, 400) == (0, 500)
    assert records.first_record_from(batch, 400, from_offset=2) == (2, 500)
    assert records.first_record_from(batch, 400, from_offset=3) is None
    assert records.first_record_from(batch, 501) is None


def test_a_lookup_without_a_start_answers_whatever_the_base_offset_says():
    """Without `from_offset` any record qualifies, as record_timestamps lists it: a header
    whose base offset is negative (bytes no broker stores, but the fuzz target reads) still
    answers its first record stamped at or after the time."""
    import struct

    batch = bytearray(make_batch(count=3, timestamps=[100, 200, 300]))
    struct.pack_into(">q", batch, 0, -(2**32))  # base offset
    assert records.first_record_from(bytes(batch), 150) == (-(2**32) + 1, 200)
