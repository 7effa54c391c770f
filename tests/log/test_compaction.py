"""Log compaction: the latest record per key in closed segments, offsets
unchanged, tombstones gone after delete.retention.ms, codecs kept, crash-safe swaps; and a
real client reading a compacted topic back."""

from __future__ import annotations

import os
import time

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from broker.shared.log import compaction, records
from broker.shared.log.settings import LogSettings
from broker.shared.log.segment import list_bases
from broker.shared.log.topics import Epoch, TopicRegistry
from tests.batches import compressed
from tests.harness import BrokerProcess, wait_until
from tests.wire import KafkaSocket, decode_response, fetch_request

NOW = int(time.time() * 1000)  # the records' timestamps


def later(ms: int = 1000) -> int:
    """A cleaning time `ms` after now (segment ages count from their files' mtime)."""
    return int(time.time() * 1000) + ms


def keyed_batch(pairs, codec: int = 0) -> bytes:
    """A batch of (key, value) records; value None is a tombstone."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 20)
    for index, (key, value) in enumerate(pairs):
        builder.append(index, timestamp=NOW, key=key, value=value, headers=[])
    batch = bytes(builder.build())
    return compressed(batch, codec) if codec else batch


def read_all(partition) -> list[tuple[int, bytes, bytes | None]]:
    """(offset, key, value) of every record, compressed batches decompressed."""
    data, _ = partition.read(partition.log_start_offset, 1 << 30)
    found = []
    for header in records.headers_in(data):
        batch = data[header.position:header.position + header.size]
        found += [(header.base_offset + delta, bytes(key), None if value is None
                   else bytes(value))
                  for delta, key, value, _raw in compaction.batch_records(batch, header, 1 << 25)]
    return found


@pytest.fixture
def table(tmp_path):
    registry = TopicRegistry((str(tmp_path),), LogSettings(segment_bytes=600,
                                                           index_interval_bytes=64), Epoch())
    registry.create("table", 1)
    registry.set_configs("table", {"cleanup.policy": "compact"})
    yield registry.partition("table", 0)
    registry.close()


def fill(partition) -> list[tuple[int, bytes, bytes | None]]:
    """Five rounds of four keys (plain, gzip, zstd, lz4, snappy batches), k1 deleted in the
    last; then enough to close those segments."""
    for round_number, codec in enumerate((0, 1, 4, 3, 2)):
        pairs = [(b"k%d" % key, b"v%d-%d" % (key, round_number)) for key in range(4)]
        if round_number == 4:
            pairs[1] = (b"k1", None)
        assert partition.append(keyed_batch(pairs, codec)).error is None
    for _ in range(4):
        assert partition.append(keyed_batch([(b"filler", b"x" * 200)])).error is None
    return read_all(partition)


def test_the_latest_record_per_key_stays_at_its_offset(table):
    before = fill(table)
    closed = {offset for offset, *_ in before if offset < table.active_base}
    done = compaction.clean(table, later(), min_lag_ms=0, delete_retention_ms=10**9)
    assert done.segments >= 1 and done.removed > 0
    after = read_all(table)
    assert {(o, k, v) for o, k, v in after} <= set(before)  # nothing new, offsets unchanged
    latest = {}
    for offset, key, _value in before:
        if offset in closed:
            latest[key] = offset
    for offset, key, value in after:
        if offset in closed:
            assert latest[key] == offset, (offset, key)  # only the latest of each key
    assert (latest[b"k1"], b"k1", None) in after  # the tombstone stays, for now
    assert [o for o, *_ in after if o not in closed] == [o for o, *_ in before if o not in closed]
    data, _ = table.read(table.log_start_offset, 1 << 30)
    for header in records.headers_in(data):  # every rewritten batch is sound: CRC, records
        check = records.BatchCheck(data[header.position:header.position + header.size], 1 << 20)
        assert check.step(1 << 20)
    assert compaction.clean(table, later(2000), 0, 10**9).segments == 0  # nothing left to do
    compaction.clean(table, later(10**10), 0, delete_retention_ms=1000)  # past the horizon
    assert all(value is not None for offset, _key, value in read_all(table) if offset in closed)


def test_a_partition_is_cleaned_only_once_enough_of_it_is_dirty(table):
    fill(table)
    assert compaction.clean(table, later(), 0, 10**9, min_dirty_ratio=0.5).segments >= 1
    mapped_to = compaction.read_checkpoint(table.directory)[0]
    assert 0 < mapped_to <= table.active_base
    # One more closed segment of repeated keys: dirty, but a small share of the whole.
    before = table.active_base
    while table.active_base == before:
        assert table.append(keyed_batch([(b"k0", b"again")])).error is None
    bases = [base for base in list_bases(table.directory) if base < table.active_base]
    ratio = compaction.dirty_ratio(table.directory, bases)
    assert 0 < ratio < 0.9
    assert compaction.clean(table, later(), 0, 10**9, min_dirty_ratio=0.9).segments == 0
    assert compaction.read_checkpoint(table.directory)[0] == mapped_to  # nothing was mapped
    assert compaction.clean(table, later(), 0, 10**9, min_dirty_ratio=ratio / 2).segments >= 1
    assert compaction.read_checkpoint(table.directory)[0] == table.active_base
    # Nothing dirty, but the tombstone kept so far is past delete.retention.ms: cleaned.
    assert (b"k1", None) in {(key, value) for _offset, key, value in read_all(table)}
    assert compaction.clean(table, later(), 0, 10**9, min_dirty_ratio=0.99).segments == 0
    assert compaction.clean(table, later(10**10), 0, 10**9, min_dirty_ratio=0.99).segments >= 1
    assert (b"k1", None) not in {(key, value) for _offset, key, value in read_all(table)}
    assert compaction.read_checkpoint(table.directory)[1] == 0  # none left to wait for


def test_a_segment_younger_than_the_compaction_lag_is_left_alone(table):
    fill(table)
    assert compaction.clean(table, later(0), min_lag_ms=3_600_000,
                            delete_retention_ms=0).segments == 0


def test_a_crash_mid_swap_leaves_the_old_segment_or_the_new_one_whole(table):
    before = fill(table)
    closed = [base for base in sorted(int(n[:-4]) for n in os.listdir(table.directory)
                                      if n.endswith(".log")) if base < table.active_base]
    latest, _mapped = compaction._offset_map(table.directory, closed,
                                             table.settings.max_decompressed_bytes)
    base = closed[0]
    assert compaction._rewrite(table.directory, base, latest, False, 1 << 25,
                               table.settings) is not None
    table.recover()  # a crash before the commit point: the cleaned copy is dropped
    assert read_all(table) == before
    assert not os.path.exists(os.path.join(table.directory, compaction.CLEANING_DIR))
    compaction._rewrite(table.directory, base, latest, False, 1 << 25, table.settings)
    marker = os.path.join(table.directory, compaction.CLEANING_DIR, f"{base:020d}.swap")
    open(marker, "wb").close()  # a crash after the commit point, before the renames
    assert table.consistent() == "a compaction was interrupted"
    table.recover()
    after = read_all(table)
    assert len(after) < len(before) and set(after) <= set(before)


@pytest.mark.system
def test_confluent_kafka_reads_a_compacted_topic_back():
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    overrides = {"log.cleaner.backoff.ms": "200"}
    with BrokerProcess(workers=2, overrides=overrides) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("prices", 1, 1, config={
            "cleanup.policy": "compact", "segment.bytes": "2000",
            "delete.retention.ms": "1000", "min.compaction.lag.ms": "0"})])[
            "prices"].result(timeout=20)
        # A batch a round, gzip and lz4 in turn: the last round's (lz4) is rewritten once
        # its tombstone goes.
        producers = [Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 50,
                               "compression.type": codec}) for codec in ("gzip", "lz4")]
        for round_number in range(20):
            producer = producers[round_number % 2]
            for key in range(5):
                value = None if (key == 4 and round_number == 19) else b"%d" % round_number
                producer.produce("prices", key=b"item-%d" % key, value=value)
            producer.flush(30)
        for _ in range(10):  # more (incompressible) records: the ones above get closed in
            producer.produce("prices", key=b"filler", value=os.urandom(500))  # old segments
            producer.flush(30)

        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "readers",
                             "enable.auto.commit": False})

        def read_back():
            """Every record from the log start to the end (an assigned, not a group, read)."""
            from confluent_kafka import OFFSET_BEGINNING, TopicPartition

            _low, high = consumer.get_watermark_offsets(TopicPartition("prices", 0), timeout=10)
            consumer.assign([TopicPartition("prices", 0, OFFSET_BEGINNING)])
            seen, deadline = [], time.monotonic() + 20
            while (not seen or seen[-1][0] < high - 1) and time.monotonic() < deadline:
                message = consumer.poll(0.2)
                if message is not None and message.error() is None:
                    seen.append((message.offset(), message.key(), message.value()))
            consumer.unassign()
            return seen

        def compacted() -> bool:
            items = [row for row in read_back() if row[1] != b"filler"]
            keys = [key for _offset, key, _value in items]
            return len(keys) == len(set(keys)) and (b"item-4" not in keys)

        wait_until(compacted, timeout=30, interval=0.5)
        items = {key: (offset, value) for offset, key, value in read_back()}
        consumer.close()
        for key in range(4):
            assert items[b"item-%d" % key][1] == b"19"  # the latest value
        assert items[b"item-3"][0] == 19 * 5 + 3  # at the offset it was written at
        assert broker.metric("broker_worker_restarts_total") == 0
        # The rewritten lz4 batch is a frame of independent blocks: Kafka's Java consumer
        # (Lz4BlockInputStream) refuses any other.
        with KafkaSocket(broker.listeners["PLAINTEXT"]) as client:
            client.send(fetch_request("prices", offset=19 * 5))
            _, response = decode_response(1, 12, client.receive())
        data = response.responses[0].partitions[0].records
        header = next(records.headers_in(data))
        assert (header.base_offset, header.record_count, header.attributes & 7) == (95, 4, 3)
        frame_flags = data[records.HEADER_BYTES + 4]
        assert frame_flags & 0x20, f"lz4 frame flags {frame_flags:#x}: linked blocks"


def test_a_batch_that_decompresses_past_the_bound_is_kept_as_it_is(tmp_path):
    """A small batch expanding past pybroker.max.decompressed.batch.bytes is never expanded
    by the cleaner (written under a larger bound, cleaned under a smaller one)."""
    writer = TopicRegistry((str(tmp_path),), LogSettings(segment_bytes=600), Epoch())
    writer.create("table", 1)
    writer.set_configs("table", {"cleanup.policy": "compact"})
    partition = writer.partition("table", 0)
    big = keyed_batch([(b"k", b"z" * 2_000_000)], codec=1)  # about 2 KB compressed
    for _ in range(2):
        assert partition.append(big).error is None
    assert partition.append(keyed_batch([(b"filler", b"x" * 700)])).error is None
    before = read_all(partition)
    writer.close()
    cleaner = TopicRegistry((str(tmp_path),), LogSettings(segment_bytes=600,
                                                          max_decompressed_bytes=1 << 20), Epoch())
    done = compaction.clean(cleaner.partition("table", 0), later(), 0, 10**9)
    assert done.segments == 0 and read_all(cleaner.partition("table", 0)) == before
    cleaner.close()


def transactional_batch(pairs, producer_id: int, sequence: int = 0) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=True,
                                        producer_id=producer_id, producer_epoch=0,
                                        base_sequence=sequence, batch_size=1 << 20)
    for index, (key, value) in enumerate(pairs):
        builder.append(index, timestamp=NOW, key=key, value=value, headers=[])
    return bytes(builder.build())


def data_records(partition) -> list[tuple[bytes, bytes | None]]:
    """(key, value) of every data record, markers left out."""
    data, _ = partition.read(partition.log_start_offset, 1 << 30)
    found = []
    for header in records.headers_in(data):
        if header.attributes & records.CONTROL:
            continue
        batch = data[header.position:header.position + header.size]
        found += [(bytes(key), None if value is None else bytes(value))
                  for _delta, key, value, _raw in compaction.batch_records(batch, header, 1 << 25)]
    return found


def close_segments(partition) -> None:
    for _ in range(4):
        assert partition.append(keyed_batch([(b"filler", b"x" * 200)])).error is None


def test_aborted_records_supersede_nothing_and_are_cleaned_away(table):
    assert table.append(keyed_batch([(b"k", b"committed")])).error is None
    assert table.append(transactional_batch([(b"k", b"aborted")], 7)).error is None
    assert table.append_marker(7, 0, commit=False).error is None
    close_segments(table)
    assert compaction.clean(table, later(), 0, 10**9).removed >= 1
    kept = data_records(table)
    assert (b"k", b"committed") in kept and (b"k", b"aborted") not in kept


def test_segments_past_the_last_stable_offset_are_not_cleaned(table):
    assert table.append(transactional_batch([(b"t", b"open")], 8)).error is None
    assert table.append(keyed_batch([(b"k3", b"old")])).error is None
    close_segments(table)
    assert table.append(keyed_batch([(b"k3", b"new")])).error is None
    close_segments(table)
    compaction.clean(table, later(), 0, 10**9)
    assert (b"k3", b"old") in data_records(table)  # after the open transaction's start
    assert table.append_marker(8, 0, commit=True).error is None
    close_segments(table)
    compaction.clean(table, later(), 0, 10**9)
    kept = data_records(table)
    assert (b"k3", b"old") not in kept and (b"t", b"open") in kept


def test_a_reader_opening_a_segment_mid_swap_never_pairs_new_and_old_files(tmp_path):
    """Another process's handle (here: another registry, on a thread of its own) opens a
    segment while the cleaner has renamed its log but not yet its index: it waits for the
    swap, or opens the set again, and reads the cleaned segment whole.  Paired with the old
    index, the new log made a read from the last round's first offset skip that round."""
    import threading

    settings = LogSettings(segment_bytes=600, index_interval_bytes=64)
    cleaner = TopicRegistry((str(tmp_path),), settings, Epoch())
    cleaner.create("table", 1)
    partition = cleaner.partition("table", 0)
    start = next(offset for offset, _key, value in fill(partition) if value == b"v0-4")
    reader_registry = TopicRegistry((str(tmp_path),), settings, Epoch())
    reader = reader_registry.partition("table", 0)  # no segment of it open yet
    seen, renamed, real_replace = {}, threading.Event(), os.replace

    def read_from_start():
        data, _ = reader.read(start, 1 << 30)
        seen["offsets"] = {offset for batch in records.headers_in(data)
                           for offset in range(batch.base_offset, batch.next_offset)}

    thread = threading.Thread(target=read_from_start)

    def replace_and_read_between(source, target):
        real_replace(source, target)
        if target.endswith(".log") and not renamed.is_set():
            renamed.set()  # the new log is in place, the old index still: a reader now
            thread.start()
            thread.join(0.5)  # it must not finish in the middle of the swap

    compaction.os.replace = replace_and_read_between
    try:
        done = compaction.clean(partition, later(), min_lag_ms=0, delete_retention_ms=10**9)
    finally:
        compaction.os.replace = real_replace
    thread.join(10)
    assert renamed.is_set() and done.segments >= 1 and not thread.is_alive()
    kept = {offset for offset, _key, _value in read_all(partition) if offset >= start}
    assert kept <= seen["offsets"]  # later segments may still show records since cleaned
    reader_registry.close()
    cleaner.close()
