"""The log store on its own: appends, reads, segments, idempotence, recovery, retention."""

import multiprocessing
import os
import time

import pytest

from broker.shared.log import records
from broker.shared.log.settings import LogSettings
from broker.shared.log.topics import Epoch, TopicRegistry
from tests.batches import compressed, make_batch


@pytest.fixture
def registry(tmp_path):
    settings = LogSettings(segment_bytes=4096, index_interval_bytes=256, max_message_bytes=100_000)
    created = TopicRegistry((str(tmp_path),), settings, Epoch())
    yield created
    created.close()


def offsets_in(data: bytes) -> list[int]:
    return [offset for batch in records.headers_in(data)
            for offset in range(batch.base_offset, batch.next_offset)]


def test_topics_are_created_listed_and_deleted(registry):
    assert registry.create("orders", 3) is None
    assert registry.create("orders", 3) == "topic_already_exists"
    assert registry.create("bad/name", 1) == "invalid_topic_exception"
    assert registry.create("x", 0) == "invalid_partitions"
    assert registry.create("dry", 1, validate_only=True) is None and registry.get("dry") is None
    info = registry.get("orders")
    assert info.partitions == 3 and registry.by_id(info.topic_id) is info
    assert registry.delete("orders") is None
    assert registry.get("orders") is None and registry.delete("orders") == "unknown_topic_or_partition"


def test_a_second_registry_sees_changes_through_the_epoch(tmp_path):
    epoch = Epoch()
    first = TopicRegistry((str(tmp_path),), LogSettings(), epoch)
    second = TopicRegistry((str(tmp_path),), LogSettings(), epoch)
    assert second.topics() == {}
    first.create("t", 2)
    assert second.get("t").partitions == 2
    first.delete("t")
    assert second.get("t") is None


def test_appends_get_consecutive_offsets_and_read_back(registry):
    registry.create("t", 1)
    partition = registry.partition("t", 0)
    bases = [partition.append(make_batch(3)).base_offset for _ in range(50)]
    assert bases == list(range(0, 150, 3))
    assert partition.log_end_offset == partition.high_watermark == 150
    assert len([name for name in os.listdir(partition.directory) if name.endswith(".log")]) > 1
    data, high = partition.read(0, 10**9)
    assert high == 150 and offsets_in(data) == list(range(150))
    for start in (0, 1, 77, 148):  # any offset, across segments: the batch holding it comes first
        data, _ = partition.read(start, 500)
        first = next(records.headers_in(data))
        assert first.base_offset <= start < first.next_offset
    assert partition.read(150, 1000) == (b"", 150)


def test_read_returns_one_whole_batch_even_past_max_bytes(registry):
    registry.create("t", 1)
    partition = registry.partition("t", 0)
    partition.append(make_batch(5, value_size=2000))
    data, _ = partition.read(0, 10)
    assert offsets_in(data) == [0, 1, 2, 3, 4]
    assert partition.read(0, 10, at_least_one=False)[0] == b""


@pytest.mark.parametrize("mangle, error", [
    (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "corrupt_message"),
    (lambda b: b[:16] + b"\x01" + b[17:], "invalid_record"),
    (lambda b: b + b, "invalid_record"),
    (lambda b: b[:30], "corrupt_message"),
])
def test_bad_batches_are_refused_and_nothing_is_stored(registry, mangle, error):
    registry.create("t", 1)
    partition = registry.partition("t", 0)
    result = partition.append(mangle(make_batch(2)))
    assert result.error == error
    assert partition.log_end_offset == 0 and partition.read(0, 10**6)[0] == b""


def test_batches_over_message_max_bytes_are_refused(registry):
    registry.create("t", 1)
    partition = registry.partition("t", 0)
    assert partition.append(make_batch(1, value_size=200_000)).error == "message_too_large"


def test_idempotent_producer_duplicates_and_sequence_gaps(registry):
    registry.create("t", 1)
    partition = registry.partition("t", 0)
    first = partition.append(make_batch(2, producer_id=42, epoch=0, sequence=0))
    second = partition.append(make_batch(2, producer_id=42, epoch=0, sequence=2))
    assert (first.base_offset, second.base_offset) == (0, 2)
    retry = partition.append(make_batch(2, producer_id=42, epoch=0, sequence=0))
    assert retry.error is None and retry.base_offset == 0  # the original offset, not stored again
    assert partition.log_end_offset == 4
    assert partition.append(make_batch(2, producer_id=42, epoch=0, sequence=9)).error == \
        "out_of_order_sequence_number"
    assert partition.append(make_batch(1, producer_id=42, epoch=1, sequence=0)).base_offset == 4
    assert partition.append(make_batch(1, producer_id=42, epoch=0, sequence=4)).error == \
        "invalid_producer_epoch"
    assert partition.log_end_offset == 5


def test_torn_tail_is_cut_on_recovery(registry):
    registry.create("t", 1)
    partition = registry.partition("t", 0)
    for _ in range(4):
        partition.append(make_batch(2))
    whole = partition.read(0, 10**6)[0]
    active = max(name for name in os.listdir(partition.directory) if name.endswith(".log"))
    with open(os.path.join(partition.directory, active), "ab") as log_file:
        log_file.write(make_batch(3)[:40])  # half a batch: a torn write
    assert partition.recover() == 40
    assert partition.log_end_offset == 8 and partition.read(0, 10**6)[0] == whole
    assert partition.append(make_batch(1)).base_offset == 8


def test_a_writer_that_died_mid_append_is_repaired_by_the_next(registry):
    registry.create("t", 1)
    partition = registry.partition("t", 0)
    partition.append(make_batch(2))
    partition.state[1] = 12345  # the dirty word: as if a worker was killed inside append
    segment = max(name for name in os.listdir(partition.directory) if name.endswith(".log"))
    with open(os.path.join(partition.directory, segment), "ab") as log_file:
        log_file.write(b"\xff" * 25)
    assert partition.append(make_batch(2)).base_offset == 2
    assert offsets_in(partition.read(0, 10**6)[0]) == [0, 1, 2, 3]


def test_retention_deletes_whole_old_segments(registry):
    registry.create("t", 1)
    partition = registry.partition("t", 0)
    for _ in range(200):
        partition.append(make_batch(3))
    segments = sorted(n for n in os.listdir(partition.directory) if n.endswith(".log"))
    assert len(segments) >= 4
    deleted = partition.enforce_retention(retention_bytes=8192, retention_ms=-1, now=time.time())
    assert deleted >= 1
    assert partition.log_start_offset == int(sorted(n for n in os.listdir(partition.directory)
                                                    if n.endswith(".log"))[0][:-4])
    data, _ = partition.read(partition.log_start_offset, 10**6)
    assert offsets_in(data)[0] == partition.log_start_offset
    assert partition.enforce_retention(-1, 0, time.time() + 10) >= 1  # everything old by time
    assert partition.log_end_offset == 600  # the active segment always stays


def test_timestamps_find_offsets(registry):
    registry.create("t", 1)
    partition = registry.partition("t", 0)
    for stamp in (1000, 2000, 3000):
        partition.append(make_batch(2, timestamp_ms=stamp))
    assert partition.offset_for_timestamp(1500) == (2, 2000)
    assert partition.offset_for_timestamp(2000) == (2, 2000)
    assert partition.offset_for_timestamp(5000) is None
    assert partition.max_timestamp_offset() == (4, 3000)  # the first record with the stamp


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_timestamp_lookups_read_the_records_of_compressed_batches(registry, codec):
    """Inside one batch (compressed or not) the lookup finds the record, not the
    batch; MAX_TIMESTAMP (KIP-734) is the record carrying the largest stamp."""
    registry.create("t", 1)
    partition = registry.partition("t", 0)
    t0 = 1_700_000_000_000
    batch = make_batch(timestamps=[t0 + step * 1000 for step in range(5)])
    assert partition.append(compressed(batch, codec) if codec else batch).error is None
    assert partition.offset_for_timestamp(t0 + 2500) == (3, t0 + 3000)
    assert partition.offset_for_timestamp(t0) == (0, t0)
    batch = make_batch(timestamps=[t0 + 5000, t0 + 9000, t0 + 1000])
    assert partition.append(compressed(batch, codec) if codec else batch).error is None
    assert partition.max_timestamp_offset() == (6, t0 + 9000)


def test_a_timestamp_lookup_never_expands_a_bomb(registry):
    """A stored batch that decompresses past pybroker.max.decompressed.batch.bytes is not
    expanded: the lookup falls back on the batch header."""

    bomb = compressed(make_batch(2, value_size=200_000, timestamp_ms=5000), 1)
    assert records.record_timestamps(bomb, max_decompressed=64 * 1024) is None
    assert records.record_timestamps(bomb)[1] == (1, 5000)


def _append_many(directory, count, results):
    registry = TopicRegistry((directory,), LogSettings(segment_bytes=8192, index_interval_bytes=128),
                             Epoch())
    partition = registry.partition("shared", 0)
    bases = [partition.append(make_batch(2)).base_offset for _ in range(count)]
    results.put(bases)
    registry.close()


def test_two_processes_append_to_one_partition_without_losing_offsets(tmp_path):
    TopicRegistry((str(tmp_path),), LogSettings(), Epoch()).create("shared", 1)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=_append_many, args=(str(tmp_path), 300, results))
                 for _ in range(2)]
    for process in processes:
        process.start()
    bases = results.get(timeout=60) + results.get(timeout=60)
    for process in processes:
        process.join(30)
    assert sorted(bases) == list(range(0, 1200, 2))
    registry = TopicRegistry((str(tmp_path),), LogSettings(), Epoch())
    partition = registry.partition("shared", 0)
    assert offsets_in(partition.read(0, 10**9)[0]) == list(range(1200))
    registry.close()


def _stamped(count: int, stamps: list[int]) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 20)
    for index in range(count):
        builder.append(index, timestamp=stamps[index], key=None, value=b"v", headers=[])
    return bytes(builder.build())


def test_validation_walks_the_records_and_fixes_the_max_timestamp():
    batch = _stamped(3, [5000, 9000, 1000])  # the greatest stamp is not the last
    assert records.validate(batch, 1 << 20).max_timestamp == 9000
    wrong = records.with_max_timestamp(batch, 4)  # a client that sent a wrong max timestamp
    assert records.max_timestamp_of(wrong) == 4
    assert records.validate(wrong, 1 << 20).max_timestamp == 9000
    assert records.record_timestamps(batch) == [(0, 5000), (1, 9000), (2, 1000)]


def test_timestamps_outside_the_configured_bounds_are_refused():
    bounds = records.TimestampBounds(before_ms=1000, after_ms=500)
    assert records.validate(_stamped(2, [10_000, 10_400]), 1 << 20, bounds, now_ms=10_000)
    for stamps in ([8_000, 10_000], [10_000, 10_600]):
        with pytest.raises(records.BatchError) as refused:
            records.validate(_stamped(2, stamps), 1 << 20, bounds, now_ms=10_000)
        assert refused.value.code == "invalid_timestamp"


def test_a_record_count_the_bytes_cannot_hold_never_drives_the_walk():
    import struct

    from crc32c import crc32c

    lying = bytearray(make_batch(1))
    struct.pack_into(">i", lying, 57, 2**31 - 1)
    struct.pack_into(">i", lying, 23, 2**31 - 2)
    struct.pack_into(">I", lying, 17, crc32c(bytes(lying[21:])))
    started = time.monotonic()
    with pytest.raises(records.BatchError):
        records.validate(bytes(lying), 1 << 20)
    assert records.record_timestamps(bytes(lying)) is None  # the header alone is believed
    assert time.monotonic() - started < 1


def test_a_batch_whose_offsets_would_overflow_the_segment_starts_a_new_one(registry):
    """The append path rolls before an offset relative to the segment base passes 2**31 - 1
    (a batch that large cannot be produced any more; it is written here below validation)."""
    registry.create("t", 1)
    partition = registry.partition("t", 0)
    partition.append(make_batch(1))
    huge = records.read_header(make_batch(1))._replace(last_offset_delta=2**31 - 1,
                                                        record_count=2**31)
    with partition.locked():
        partition._append_locked(make_batch(1), huge)
        partition._append_locked(make_batch(1), records.read_header(make_batch(1)))
    bases = sorted(int(name[:-4]) for name in os.listdir(partition.directory)
                   if name.endswith(".log"))
    # The huge batch starts a segment at 1; the next lies 2**31 past that base: another.
    assert bases == [0, 1, 2**31 + 1] and partition.log_end_offset == 2**31 + 2
    assert partition.recover() == 0  # and recovery reads it all back


def test_a_batch_larger_than_a_read_chunk_is_found_and_read_whole(tmp_path):
    settings = LogSettings(max_message_bytes=3 << 20)
    registry = TopicRegistry((str(tmp_path),), settings, Epoch())
    registry.create("t", 1)
    partition = registry.partition("t", 0)
    partition.append(make_batch(1))
    partition.append(make_batch(1, value_size=(1 << 20) + 5000))  # larger than READ_CHUNK
    partition.append(make_batch(1))
    for offset in (1, 2):
        data, _ = partition.read(offset, 1 << 20)
        assert records.read_header(data).base_offset == offset
    assert offsets_in(partition.read(1, 10)[0]) == [1]
    registry.close()


def test_a_partition_that_cannot_be_repaired_goes_offline_and_says_so(registry):
    registry.create("t", 1)
    partition = registry.partition("t", 0)
    partition.append(make_batch(1))
    epoch = registry.epoch.get()
    partition.state[1] = 12345  # dirty: a writer died mid-append
    partition._repair = lambda: (_ for _ in ()).throw(ValueError("unreadable segment"))
    result = partition.append(make_batch(1))
    assert result.error == "kafka_storage_error" and partition.offline
    assert registry.epoch.get() == epoch + 1 and registry.is_offline("t", 0)
    assert partition.append(make_batch(1)).error == "kafka_storage_error"


def test_staged_topics_appear_whole_and_a_losing_race_leaves_nothing(registry):
    first, second = registry.staging("t", 3), registry.staging("t", 2)
    first.build(2)
    assert registry.get("t") is None  # nothing visible while staging
    first.build(5)
    second.build(2)
    assert registry.commit([first]) == [None] and registry.get("t").partitions == 3
    assert registry.commit([second]) == ["topic_already_exists"]
    assert not [name for name in os.listdir(registry.log_dirs[0]) if "staging" in name]


def _brute_force(partition, timestamp: int):
    """The first record stamped at or after `timestamp`, by reading every batch."""
    from broker.shared.log.segment import Segment

    for base in sorted(int(n[:-4]) for n in os.listdir(partition.directory) if n.endswith(".log")):
        segment = Segment(partition.directory, base)
        try:
            for position, batch in segment.scan():
                if batch.max_timestamp >= timestamp:
                    stamps = records.record_timestamps(segment.read(position, batch.size))
                    return next(item for item in stamps if item[1] >= timestamp)
        finally:
            segment.close()
    return None


def test_lookups_by_time_agree_with_reading_everything_and_read_one_region(registry):
    import random

    registry.create("t", 1)
    partition = registry.partition("t", 0)
    rng = random.Random(5)
    clock = 1_000_000
    for _ in range(400):  # timestamps mostly rising, sometimes going back (clients' clocks)
        clock += rng.randrange(-50, 200)
        partition.append(make_batch(rng.randrange(1, 4), timestamp_ms=clock))
    assert len([n for n in os.listdir(partition.directory) if n.endswith(".log")]) > 3
    reads = []
    original = type(partition._segment(0)).read

    def counting(segment, position, length):
        reads.append(length)
        return original(segment, position, length)

    import broker.shared.log.segment as segment_module

    segment_module.Segment.read = counting
    try:
        for target in list(range(999_000, clock + 300, 997)) + [clock]:
            expected = _brute_force(partition, target)
            reads.clear()
            assert partition.offset_for_timestamp(target) == expected
            assert sum(reads) <= 256 + 2 * 200  # one region (and its batch), not the log
    finally:
        segment_module.Segment.read = original
    offset, stamp = partition.max_timestamp_offset()
    assert stamp == max(partition.offset_for_timestamp(0)[1], stamp)


def test_segments_without_a_time_index_get_one_on_first_lookup(registry):
    registry.create("t", 1)
    partition = registry.partition("t", 0)
    for n in range(60):
        partition.append(make_batch(2, timestamp_ms=10_000 + n * 10))
    expected = [partition.offset_for_timestamp(t) for t in (9_000, 10_205, 10_590, 20_000)]
    for name in os.listdir(partition.directory):
        if name.endswith(".timeindex"):
            os.unlink(os.path.join(partition.directory, name))  # as a segment from before
    fresh = TopicRegistry(registry.log_dirs, registry.settings, Epoch()).partition("t", 0)
    assert [fresh.offset_for_timestamp(t) for t in (9_000, 10_205, 10_590, 20_000)] == expected
    assert any(name.endswith(".timeindex") for name in os.listdir(partition.directory))
    fresh.close()


def test_a_retry_is_recognised_after_hundreds_of_other_producers(tmp_path):
    """64 entries used to be all: the 65th producer evicted the first, whose retry was then
    appended twice.  The table now grows, and two processes' handles agree on it."""
    settings = LogSettings(max_message_bytes=100_000)
    writer = TopicRegistry((str(tmp_path),), settings, Epoch())
    writer.create("t", 1)
    first = writer.partition("t", 0)
    original = first.append(make_batch(2, producer_id=7, epoch=0, sequence=0)).base_offset
    other = TopicRegistry((str(tmp_path),), settings, Epoch()).partition("t", 0)
    for producer in range(1000, 1500):  # from the other handle, as another worker would
        assert other.append(make_batch(1, producer_id=producer, epoch=0, sequence=0)).error is None
    retry = first.append(make_batch(2, producer_id=7, epoch=0, sequence=0))
    assert (retry.error, retry.base_offset) == (None, original)
    assert first.producers.live() == 501
    writer.close()


def test_an_unknown_producer_mid_sequence_is_refused_and_old_ones_expire(tmp_path):
    settings = LogSettings(max_message_bytes=100_000, producer_expiration_ms=1000)
    registry = TopicRegistry((str(tmp_path),), settings, Epoch())
    registry.create("t", 1)
    partition = registry.partition("t", 0)
    assert partition.append(make_batch(1, producer_id=9, epoch=0, sequence=5)).error == \
        "unknown_producer_id"
    assert partition.append(make_batch(1, producer_id=9, epoch=0, sequence=0)).error is None
    table = partition.producers
    now = int(time.time() * 1000)
    assert table.check(9, 0, 0, 0, now_ms=now)[0].value == "duplicate"
    assert table.check(9, 0, 1, 1, now_ms=now + 2000)[0].value == "unknown_producer_id"
    registry.close()


def test_the_producer_table_is_bounded_and_forgets_the_least_recent_at_its_bound(tmp_path):
    from broker.shared.log.producers import ProducerTable

    table = ProducerTable(str(tmp_path), expiration_ms=10**9, max_entries=128)
    for producer in range(200):
        table.record(producer, 0, 0, 0, producer, use=producer)
    assert table.live() <= 96 and table.words[1] == 128  # capacity and load factor kept
    assert table.check(199, 0, 0, 0)[0].value == "duplicate"  # the most recent are kept
    assert table.check(0, 0, 1, 1)[0].value == "unknown_producer_id"
    table.close()


@pytest.mark.parametrize("codec, xerial", [(1, False), (2, False), (2, True), (3, False),
                                           (4, False)])
def test_compressed_batches_are_decompressed_and_walked(codec, xerial):
    from tests.batches import compressed

    batch = compressed(make_batch(50, value_size=100), codec, xerial)
    assert records.validate(batch, 1 << 20).record_count == 50
    lying = bytearray(compressed(make_batch(50), codec, xerial))  # the count disagrees
    import struct

    from crc32c import crc32c

    struct.pack_into(">i", lying, 57, 60)  # 60 records claimed, 50 inside
    struct.pack_into(">i", lying, 23, 59)
    struct.pack_into(">I", lying, 17, crc32c(bytes(lying[21:])))
    with pytest.raises(records.BatchError):
        records.validate(bytes(lying), 1 << 20)
    bomb = compressed(make_batch(20_000, value_size=1000), codec, xerial)  # 20 MB of records
    with pytest.raises(records.BatchError, match="decompressed.batch.bytes"):
        records.validate(bomb, 1 << 24, max_decompressed=1 << 20)


def test_a_snappy_java_frame_cut_inside_a_block_length_is_a_corrupt_message():
    """Found by the records fuzz target: a snappy-java frame ending two bytes into a block's
    length raised struct.error (a produce then closed the connection as a broker bug)."""
    import base64

    found = base64.b64decode("AAAAAAAAAAAAAACKAAAAAAKhoOM1AAIAAAAEAAABogzz/////4WBaOk4Wv////////"
                             "//////////AAAABYJTTkFQUFkAAAAAAQAAFwAANA==")
    assert records.record_timestamps(found) is None  # its records cannot be believed
    with pytest.raises(records.BatchError, match="snappy-java block length"):
        records.decompress(2, b"\x82SNAPPY\x00" + b"\0" * 8 + b"\0\0", 1 << 20)


def test_delete_records_moves_the_log_start_and_survives_a_restart(tmp_path):
    """DeleteRecords: the log start offset moves, whole segments below it go, a
    restart (recovery from the files) keeps it, and it never moves back."""
    settings = LogSettings(segment_bytes=300, index_interval_bytes=64)
    registry = TopicRegistry((str(tmp_path),), settings, Epoch())
    registry.create("t", 1)
    partition = registry.partition("t", 0)
    for _ in range(6):
        partition.append(make_batch(3))  # offsets 0..17, a few segments
    segments = len([n for n in os.listdir(partition.directory) if n.endswith(".log")])
    assert partition.delete_records(10) == (10, None)
    assert partition.log_start_offset == 10
    assert len([n for n in os.listdir(partition.directory) if n.endswith(".log")]) < segments
    assert partition.delete_records(4) == (10, None)  # below the start: nothing changes
    assert partition.delete_records(99) == (10, "offset_out_of_range")
    data, _ = partition.read(10, 10**6)
    assert offsets_in(data)[0] <= 10 <= offsets_in(data)[-1]
    registry.close()
    fresh = TopicRegistry((str(tmp_path),), settings, Epoch()).partition("t", 0)
    assert fresh.consistent() is None
    fresh.recover()
    assert fresh.log_start_offset == 10
    assert fresh.delete_records(-1) == (18, None)  # -1: up to the high watermark
    assert fresh.log_start_offset == fresh.high_watermark == 18


def test_a_compacted_topic_refuses_records_without_a_key(tmp_path):
    """Kafka's rule for cleanup.policy=compact: INVALID_RECORD for a null key, in its words."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    registry = TopicRegistry((str(tmp_path),), LogSettings(), Epoch())
    registry.create("table", 1)
    assert registry.set_configs("table", {"cleanup.policy": "compact"}) is None
    partition = registry.partition("table", 0)
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 20)
    builder.append(0, timestamp=1000, key=None, value=b"v", headers=[])
    refused = partition.append(bytes(builder.build()))
    assert (refused.error, refused.message) == (
        "invalid_record", "One or more records have been rejected due to 1 record errors in "
        "total, and only showing the first three errors at most: [RecordError(batchIndex=0, "
        "message='Compacted topic cannot accept message without key in topic partition "
        "table-0')]")
    assert partition.append(make_batch(2)).error is None  # keyed: accepted
    assert registry.set_configs("table", {}) is None  # delete again: null keys are fine
    assert registry.partition("table", 0).append(bytes(builder.build())).error is None
    registry.close()


def test_segment_ms_rolls_a_segment_at_the_first_append_past_its_age(registry):
    from broker.shared.log.partition_state import W_SEGMENT_STARTED
    registry.create("aging", 1)
    registry.set_configs("aging", {"segment.ms": "60000"})
    assert registry.settings_for("aging").segment_ms == 60000
    partition = registry.partition("aging", 0)
    for _ in range(3):  # stamped at the epoch: a record's own time does not roll
        assert partition.append(make_batch(1, timestamp_ms=0)).error is None
    assert partition.active_base == 0
    started = partition.state[W_SEGMENT_STARTED]
    assert abs(started - time.time() * 1000) < 60_000
    partition.state[W_SEGMENT_STARTED] = started - 61_000  # as if a minute had gone by
    assert partition.append(make_batch(1)).error is None
    assert partition.active_base == 3 and partition.state[W_SEGMENT_STARTED] >= started
    assert partition.append(make_batch(1)).error is None and partition.active_base == 3
