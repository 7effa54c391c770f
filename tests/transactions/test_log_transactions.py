"""Transactions in the log store (KIP-98): the LSO, markers, the aborted-transaction index,
fencing by markers, reads bounded by the LSO, crash repair and persistence."""

import os
import struct
import time

import pytest
from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatch

from broker.shared.log import producers as producer_table
from broker.shared.log import control_batches, records
from broker.shared.log.partition_state import W_DIRTY
from broker.shared.log.settings import LogSettings
from broker.shared.log.topics import Epoch, TopicRegistry
from tests.batches import make_batch

SETTINGS = LogSettings(segment_bytes=4096, index_interval_bytes=256, max_message_bytes=100_000)


@pytest.fixture
def registry(tmp_path):
    created = TopicRegistry((str(tmp_path),), SETTINGS, Epoch())
    yield created
    created.close()


@pytest.fixture
def partition(registry):
    registry.create("t", 1)
    return registry.partition("t", 0)


def txn_batch(count: int, producer_id: int, epoch: int, sequence: int, **kwargs) -> bytes:
    """A transactional batch: make_batch's with attribute bit 0x10 set, CRC recomputed."""
    batch = bytearray(make_batch(count, producer_id, epoch, sequence, **kwargs))
    attributes = struct.unpack_from(">h", batch, 21)[0]
    struct.pack_into(">h", batch, 21, attributes | records.TRANSACTIONAL)
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    return bytes(batch)


def appended(partition, batch: bytes) -> int:
    result = partition.append(batch)
    assert result.error is None, result
    return result.base_offset


def marked(partition, producer_id: int, epoch: int, commit: bool) -> int:
    result = partition.append_marker(producer_id, epoch, commit)
    assert result.error is None, result
    return result.base_offset


def headers(data: bytes) -> list[records.Batch]:
    return list(records.headers_in(data))


def test_the_lso_stays_at_an_open_transaction_while_plain_appends_move_the_hw(partition):
    assert partition.last_stable_offset == partition.high_watermark == 0
    appended(partition, make_batch(2))
    first = appended(partition, txn_batch(3, 7, 0, 0))
    appended(partition, txn_batch(2, 7, 0, 3))  # the same transaction: the start stays
    for _ in range(5):
        appended(partition, make_batch(2))
    assert first == 2 and partition.high_watermark == 17
    assert partition.last_stable_offset == 2
    marker = marked(partition, 7, 0, commit=True)
    assert marker == 17 and partition.high_watermark == 18
    assert partition.last_stable_offset == partition.high_watermark
    assert partition.aborted_transactions(0, 18) == []  # a commit is not indexed


def test_an_abort_is_indexed_and_listed_for_overlapping_ranges_only(partition):
    appended(partition, make_batch(2))  # 0..1
    appended(partition, txn_batch(3, 7, 0, 0))  # 2..4
    appended(partition, make_batch(2))  # 5..6
    assert marked(partition, 7, 0, commit=False) == 7
    assert partition.last_stable_offset == partition.high_watermark == 8
    assert partition.aborted_transactions(0, 8) == [(7, 2)]
    assert partition.aborted_transactions(7, 8) == [(7, 2)]  # the marker is at 7
    assert partition.aborted_transactions(8, 20) == []  # past its marker
    assert partition.aborted_transactions(0, 2) == []  # before its first offset
    assert partition.aborted_transactions(0, 3) == [(7, 2)]
    # The next transaction of the producer is a new one, indexed on its own.
    appended(partition, txn_batch(1, 7, 0, 3))  # 8
    assert partition.last_stable_offset == 8
    marked(partition, 7, 0, commit=False)  # 9
    assert partition.aborted_transactions(0, 10) == [(7, 2), (7, 8)]
    assert partition.aborted_transactions(8, 10) == [(7, 8)]


def test_interleaved_transactions_of_two_producers(partition):
    a = appended(partition, txn_batch(2, 1, 0, 0))  # 0..1
    b = appended(partition, txn_batch(2, 2, 0, 0))  # 2..3
    appended(partition, txn_batch(2, 1, 0, 2))  # 4..5
    appended(partition, make_batch(1))  # 6
    assert partition.last_stable_offset == a == 0
    marked(partition, 2, 0, commit=False)  # 7: b ends, a still holds the LSO
    assert partition.last_stable_offset == 0
    appended(partition, txn_batch(1, 2, 0, 2))  # 8: b's producer opens another
    marked(partition, 1, 0, commit=True)  # 9
    assert partition.last_stable_offset == 8
    assert [(first, producer) for producer, _, first in partition.producers.ongoing()] == [(8, 2)]
    marked(partition, 2, 0, commit=True)  # 10
    assert partition.last_stable_offset == partition.high_watermark == 11
    assert partition.aborted_transactions(0, 11) == [(2, b)]


@pytest.mark.parametrize("max_bytes", [1, 150, 400, 1000, 10**6])
def test_reads_bounded_by_the_lso_return_whole_batches_below_it(partition, max_bytes):
    for _ in range(20):  # across segments of 4 KiB
        appended(partition, make_batch(3, value_size=40))
    lso = appended(partition, txn_batch(2, 5, 0, 0, value_size=40))
    for _ in range(10):
        appended(partition, make_batch(3, value_size=40))
    assert partition.last_stable_offset == lso == 60
    high = partition.high_watermark
    for start in (0, 1, 30, 57, 59, 60, 75):
        data, returned_high = partition.read(start, max_bytes, upper=partition.last_stable_offset)
        assert returned_high == high
        found = headers(data)
        assert sum(batch.size for batch in found) == len(data)  # whole batches only
        assert all(batch.next_offset <= lso for batch in found)
        if start < lso:
            assert found and found[0].base_offset <= start < found[0].next_offset
        else:
            assert data == b""
        regions, _ = partition.read_regions(start, max_bytes, upper=lso)
        assert b"".join(segment.read(position, length)
                        for segment, position, length in regions) == data
    everything, _ = partition.read(0, 10**6, upper=lso)
    assert headers(everything)[-1].next_offset == lso
    without, _ = partition.read(0, 10**6)  # read_uncommitted: up to the high watermark
    assert headers(without)[-1].next_offset == high


def test_the_lso_never_passes_the_log_start_offset_nor_the_hw(partition):
    appended(partition, txn_batch(3, 5, 0, 0))
    appended(partition, make_batch(3))
    assert partition.delete_records(4) == (4, None)  # inside the plain batch
    assert partition.last_stable_offset == 4  # not below the log start
    data, _ = partition.read(4, 10**6, upper=partition.last_stable_offset)
    assert data == b""  # nothing lies between the log start and the LSO
    marked(partition, 5, 0, commit=False)
    assert partition.last_stable_offset == partition.high_watermark == 7
    assert partition.aborted_transactions(4, 7) == [(5, 0)]  # the marker is past the start


def test_a_stale_marker_is_refused_and_a_bumped_one_fences_the_old_epoch(partition):
    appended(partition, txn_batch(2, 9, 3, 0))
    refused = partition.append_marker(9, 2, commit=True)
    assert refused.error == "invalid_producer_epoch"
    assert partition.last_stable_offset == 0 and partition.high_watermark == 2  # nothing written
    marked(partition, 9, 4, commit=False)  # the coordinator aborts with a bumped epoch
    assert partition.aborted_transactions(0, 3) == [(9, 0)]
    late = partition.append(txn_batch(1, 9, 3, 2))  # the zombie's next batch
    assert late.error == "invalid_producer_epoch"
    assert partition.append(txn_batch(1, 9, 4, 5)).error == "out_of_order_sequence_number"
    assert partition.append(txn_batch(1, 9, 4, 0)).error is None  # the new epoch starts at 0
    assert partition.producers.epoch_of(9) == 4


def test_a_marker_fences_a_producer_unknown_to_the_partition(partition):
    marked(partition, 11, 2, commit=False)  # the transaction never wrote here
    assert partition.aborted_transactions(0, 10) == []
    assert partition.last_stable_offset == partition.high_watermark == 1
    assert partition.append(make_batch(1, 11, 1, 0)).error == "invalid_producer_epoch"
    assert partition.append(make_batch(1, 11, 2, 0)).error is None


@pytest.mark.parametrize("commit, kind", [(True, 1), (False, 0)])
def test_markers_are_kafkas_control_batches(partition, commit, kind):
    appended(partition, txn_batch(1, 21, 6, 0))
    before = int(time.time() * 1000)
    offset = partition.append_marker(21, 6, commit, coordinator_epoch=13).base_offset
    data, _ = partition.read(offset, 10**6)
    batch = DefaultRecordBatch(data)
    assert batch.is_control_batch and batch.is_transactional and batch.validate_crc()
    assert (batch.base_offset, batch.producer_id, batch.producer_epoch) == (offset, 21, 6)
    assert (batch.base_sequence, batch.last_offset_delta, batch.records_count) == (-1, 0, 1)
    assert batch.max_timestamp >= before
    [record] = list(batch)
    assert record.offset == offset and record.headers == []
    assert struct.unpack(">hh", record.key) == (0, kind)
    assert struct.unpack(">hi", record.value) == (0, 13)
    assert control_batches.control_type(data) == kind
    with pytest.raises(records.BatchError, match="control batches"):
        records.validate(data, 10**6)  # a client still may not write one


def test_another_process_handle_sees_the_lso_and_the_aborted_transactions(tmp_path):
    writer = TopicRegistry((str(tmp_path),), SETTINGS, Epoch())
    writer.create("t", 1)
    mine = writer.partition("t", 0)
    reader = TopicRegistry((str(tmp_path),), SETTINGS, Epoch())  # as another worker's
    other = reader.partition("t", 0)
    appended(mine, txn_batch(2, 3, 0, 0))
    appended(mine, make_batch(2))
    assert other.last_stable_offset == 0 and other.high_watermark == 4
    marked(mine, 3, 0, commit=False)
    assert other.aborted_transactions(0, 5) == [(3, 0)]
    appended(other, txn_batch(1, 4, 0, 0))  # 5, written by the other handle
    assert mine.last_stable_offset == 5
    marked(other, 4, 0, commit=False)
    assert mine.aborted_transactions(0, 7) == [(3, 0), (4, 5)]  # the new entry read
    assert other.aborted_transactions(5, 7) == [(4, 5)]
    reader.close()
    writer.close()


def test_transactions_survive_reopening_the_partition(tmp_path):
    first = TopicRegistry((str(tmp_path),), SETTINGS, Epoch())
    first.create("t", 1)
    partition = first.partition("t", 0)
    appended(partition, txn_batch(2, 3, 0, 0))  # 0..1
    marked(partition, 3, 0, commit=False)  # 2
    appended(partition, txn_batch(2, 4, 1, 0))  # 3..4, still open
    partition.flush(always=True)
    first.close()
    second = TopicRegistry((str(tmp_path),), SETTINGS, Epoch())
    reopened = second.partition("t", 0)
    assert reopened.consistent() is None
    assert reopened.last_stable_offset == 3 and reopened.high_watermark == 5
    assert reopened.aborted_transactions(0, 5) == [(3, 0)]
    assert reopened.recover() == 0  # a full repair agrees: no entry twice, the txn open
    assert reopened.aborted_transactions(0, 5) == [(3, 0)]
    assert reopened.last_stable_offset == 3
    marked(reopened, 4, 1, commit=True)
    assert reopened.last_stable_offset == reopened.high_watermark == 6
    second.close()


def test_an_open_transaction_is_never_expired(tmp_path):
    settings = LogSettings(max_message_bytes=100_000, producer_expiration_ms=1000)
    registry = TopicRegistry((str(tmp_path),), settings, Epoch())
    registry.create("t", 1)
    partition = registry.partition("t", 0)
    appended(partition, txn_batch(1, 8, 0, 0))
    appended(partition, make_batch(1, 9, 0, 0))  # idempotent, no transaction
    table = partition.producers
    later = int(time.time() * 1000) + 5000
    assert table.check(8, 0, 1, 1, now_ms=later)[0].value == "append"  # still known
    assert table.check(9, 0, 1, 1, now_ms=later)[0].value == "unknown_producer_id"
    assert [state.producer_id for state in table.states(now_ms=later)] == [8]
    marked(partition, 8, 0, commit=True)
    assert table.check(8, 0, 1, 1, now_ms=later)[0].value == "unknown_producer_id"
    registry.close()


def test_the_lru_bound_never_evicts_an_open_transaction(tmp_path):
    table = producer_table.ProducerTable(str(tmp_path), expiration_ms=10**9, max_entries=64)
    table.record(1, 0, 0, 0, 0, use=0)  # the least recently used
    table.begin_if_none(1, 0, 0)
    for producer in range(100, 200):
        table.record(producer, 0, 0, 0, producer, use=producer)
    assert table.first_offset(1) == 0 and table.ongoing() == [(1, 0, 0)]
    assert table.check(100, 0, 1, 1)[0].value == "unknown_producer_id"  # evicted instead
    for producer in range(2, 80):  # every entry in a transaction: the table outgrows the bound
        table.begin_if_none(producer, 0, producer)
    assert len(table.ongoing()) == 79 and table.words[producer_table.H_CAPACITY] > 64
    table.close()


def test_producer_states_show_the_current_transaction_start(partition):
    appended(partition, make_batch(1, 1, 0, 0))
    appended(partition, txn_batch(2, 2, 5, 0))
    states = {state.producer_id: state for state in partition.producer_states()}
    assert states[1].current_txn_start_offset == -1
    assert (states[2].epoch, states[2].last_sequence, states[2].current_txn_start_offset) == \
        (5, 1, 1)
    assert [state[:3] for state in partition.producer_states()] == [(1, 0, 0), (2, 5, 1)]
    marked(partition, 2, 5, commit=True)
    assert [state.current_txn_start_offset for state in partition.producer_states()] == [-1, -1]


def test_an_old_format_producer_file_is_reset(tmp_path):
    table = producer_table.ProducerTable(str(tmp_path), expiration_ms=10**9, max_entries=64)
    table.record(1, 0, 0, 0, 0, use=0)
    table.close()
    path = os.path.join(tmp_path, producer_table.FILE_NAME)
    with open(path, "r+b") as handle:  # the previous magic, 21-word entries
        handle.truncate(8 * (8 + 64 * 21))
        handle.write(int.from_bytes(b"PYBRKPR1", "little").to_bytes(8, "little"))
    reopened = producer_table.ProducerTable(str(tmp_path), expiration_ms=10**9, max_entries=64)
    assert reopened.live() == 0 and reopened.ongoing() == []
    assert os.path.getsize(path) == \
        8 * (producer_table.HEADER_WORDS + 64 * producer_table.ENTRY_WORDS)
    reopened.close()


def test_a_writer_killed_after_placing_a_marker_is_repaired(partition):
    appended(partition, make_batch(1))
    appended(partition, txn_batch(2, 6, 0, 0))  # 1..2
    marker = control_batches.marker_batch(6, 0, False, 0, int(time.time() * 1000))
    with partition.locked():  # the marker is placed, then the writer dies
        partition.state[W_DIRTY] = 12345
        partition._place(marker, records.read_header(marker))
    assert partition.last_stable_offset == 1 and partition.aborted_transactions(0, 4) == []
    appended(partition, make_batch(1))  # the next appender repairs first
    assert partition.last_stable_offset == partition.high_watermark == 5
    assert partition.aborted_transactions(0, 5) == [(6, 1)]
    assert partition.producers.first_offset(6) is None
    partition.recover()  # replaying again changes nothing
    assert partition.aborted_transactions(0, 5) == [(6, 1)]


def test_a_writer_killed_before_recording_a_transaction_start_is_repaired(partition):
    appended(partition, make_batch(1))
    batch = txn_batch(2, 6, 0, 0)
    with partition.locked():  # placed (the LSO held back), but not in the table
        partition.state[W_DIRTY] = 12345
        partition._place(batch, records.validate(batch, 10**6), opens_txn=True)
    assert partition.last_stable_offset == 1
    appended(partition, make_batch(1))
    assert partition.producers.first_offset(6) == 1 and partition.last_stable_offset == 1
    marked(partition, 6, 0, commit=True)
    assert partition.last_stable_offset == partition.high_watermark == 5


def test_a_torn_marker_is_cut_and_the_transaction_stays_open(partition):
    appended(partition, txn_batch(2, 6, 0, 0))
    marker = control_batches.marker_batch(6, 0, False, 0, int(time.time() * 1000))
    segment_path = os.path.join(partition.directory, f"{partition.active_base:020d}.log")
    with partition.locked():  # half of the marker reached the file
        partition.state[W_DIRTY] = 12345
        with open(segment_path, "ab") as handle:
            handle.write(records.base_offset_bytes(2) + marker[8:40])
    appended(partition, make_batch(1))  # repairs: the torn bytes go
    assert partition.producers.first_offset(6) == 0 and partition.last_stable_offset == 0
    assert partition.aborted_transactions(0, 10) == []
    marked(partition, 6, 0, commit=False)  # the coordinator's retry
    assert partition.aborted_transactions(0, 10) == [(6, 0)]


def test_retention_and_delete_records_keep_the_index_usable(partition):
    for producer in range(1, 30):  # many aborted transactions across segments
        appended(partition, txn_batch(3, producer, 0, 0, value_size=60))
        marked(partition, producer, 0, commit=False)
    assert len(partition.aborted_transactions(0, partition.high_watermark)) == 29
    deleted = partition.enforce_retention(4096, -1, time.time())
    assert deleted > 0
    start = partition.log_start_offset
    listed = partition.aborted_transactions(start, partition.high_watermark)
    assert listed and all(first + 3 >= start for _producer, first in listed)
    assert partition.delete_records(partition.high_watermark - 4)[1] is None
    assert partition.aborted_transactions(partition.log_start_offset,
                                          partition.high_watermark) == [(29, 112)]
    assert partition.last_stable_offset == partition.high_watermark


def test_aborts_below_the_log_start_leave_the_cache_and_the_rest_are_still_listed(partition):
    from broker.shared.log.control_batches import AbortedIndex

    firsts = []
    for number in range(2 * AbortedIndex.TRIM_AT_LEAST):
        firsts.append(appended(partition, txn_batch(1, 9, 0, number)))
        marked(partition, 9, 0, commit=False)
    high = partition.high_watermark
    assert len(partition.aborted_transactions(0, high)) == len(firsts)
    cut = firsts[AbortedIndex.TRIM_AT_LEAST + 10]
    assert partition.delete_records(cut)[1] is None  # the log now starts there
    listed = partition.aborted_transactions(cut, high)
    assert listed == [(9, first) for first in firsts if first >= cut]
    assert len(partition.aborted._lasts) == len(listed)  # the older ones left the cache
    # A later abort is still indexed once, and listed.
    last = appended(partition, txn_batch(1, 9, 0, len(firsts)))
    marked(partition, 9, 0, commit=False)
    assert partition.aborted_transactions(last, partition.high_watermark) == [(9, last)]
