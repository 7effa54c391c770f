"""The shared counter block: layout, one writer per slot, archiving a dead worker's slot."""

import itertools
import os
import struct

import pytest

from shm.block import (AUTH_RESULTS, CLOSE_REASONS, DURATION_BUCKETS, HEADER_BYTES, INVALID_REASONS,
                       LAYOUT_VERSION, MAGIC, MUTE_REASONS, QUOTA_ENTITIES, QUOTA_TYPES,
                       QUOTA_WINDOWS, SASL_MECHANISMS, STATE_FREE, STATE_SERVING, WORKER_COUNTERS,
                       WORKER_GAUGES, WORKER_MAXIMA, SharedBlock, duration_bucket)


def test_header_describes_the_layout(block):
    with open(block.path, "rb") as handle:
        raw = handle.read()
    assert raw[:8] == MAGIC
    version, slots, listeners, slot_bytes, pid = struct.unpack_from("=qqqqq", raw, 8)
    assert (version, slots, listeners, pid) == (LAYOUT_VERSION, 3, 2, os.getpid())
    assert slot_bytes % 64 == 0
    assert len(raw) == SharedBlock.size_for(3, 2)
    assert block.slot_base(0) * 8 == HEADER_BYTES


def test_attach_sees_what_the_creator_wrote(block):
    block.words[block.worker_cell(1, "requests", 1, 18)] = 42
    other = SharedBlock.attach(block.path)
    try:
        assert other.words[other.worker_cell(1, "requests", 1, 18)] == 42
        other.words[other.worker_cell(2, "requests", 1, 18)] = 8
        assert block.worker_total("requests", 1, 18) == 50
    finally:
        other.close()


def test_attach_rejects_a_foreign_file(tmp_path):
    path = tmp_path / "junk"
    path.write_bytes(b"x" * 4096)
    with pytest.raises(RuntimeError, match="magic"):
        SharedBlock.attach(str(path))


def test_every_cell_has_its_own_word(block):
    sizes = {"listener": 2, "close_reason": len(CLOSE_REASONS), "api": 128,
             "bucket": len(DURATION_BUCKETS) + 1, "invalid_reason": len(INVALID_REASONS),
             "mute_reason": len(MUTE_REASONS), "quota_type": len(QUOTA_TYPES),
             "quota_entity": QUOTA_ENTITIES, "quota_window": QUOTA_WINDOWS,
             "sasl_mechanism": len(SASL_MECHANISMS), "auth_result": len(AUTH_RESULTS)}
    seen = set()
    for name, dims in WORKER_COUNTERS:
        for coords in itertools.product(*(range(sizes[dim]) for dim in dims)):
            word = block.worker_table.index(name, *coords)
            assert word not in seen, (name, coords)
            seen.add(word)
    assert min(seen) == 4 and max(seen) < block.slot_words  # after pid/generation/state/beat


def test_archiving_keeps_totals_and_frees_the_slot(block):
    block.claim_slot(0, pid=1234)
    block.set_state(0, STATE_SERVING)
    block.words[block.worker_cell(0, "connections_closed", 0, 0)] = 5
    block.words[block.worker_cell(1, "connections_closed", 0, 0)] = 2
    assert block.worker_total("connections_closed", 0, 0) == 7
    block.archive_slot_counters(0)
    assert block.worker_total("connections_closed", 0, 0) == 7
    assert block.words[block.worker_cell(0, "connections_closed", 0, 0)] == 0
    assert block.slot_state(0) == STATE_FREE
    generation = block.slot_generation(0)
    block.claim_slot(0, pid=5678)
    assert block.slot_pid(0) == 5678 and block.slot_generation(0) == generation + 1


def test_duration_buckets():
    assert duration_bucket(0) == 0
    assert duration_bucket(int(DURATION_BUCKETS[0] * 1e9)) == 0
    assert duration_bucket(int(DURATION_BUCKETS[0] * 1e9) + 1) == 1
    assert duration_bucket(10**12) == len(DURATION_BUCKETS)


def test_gauges_of_a_dead_worker_are_dropped_not_archived(block):
    block.words[block.worker_cell(0, "delayed_fetches")] = 3
    block.words[block.worker_cell(0, "requests", 0, 1)] = 9
    block.archive_slot_counters(0)
    assert block.worker_total("delayed_fetches") == 0
    assert block.worker_total("requests", 0, 1) == 9


def test_archiving_sums_totals_keeps_maxima_drops_gauges_in_every_cell(block):
    """Every cell of the dead worker's slot, first and last of each counter: a running total
    is added to the archive, a maximum keeps the greater, a gauge is dropped; all are zeroed."""
    base, archive = block.slot_base(0), block.slot_base(block.archive_slot)
    expected = {}
    for number, (name, _dims) in enumerate(WORKER_COUNTERS):
        cells = block._cells_of(name)
        for word in {cells.start, cells.stop - 1}:
            block.words[base + word] = 1000 + number
            block.words[archive + word] = 2000 if name in WORKER_MAXIMA else 7
            if name in WORKER_MAXIMA:
                expected[word] = 2000
            elif name in WORKER_GAUGES:
                expected[word] = 7
            else:
                expected[word] = 1007 + number
    block.words[block.worker_cell(0, "quota_origin_ns", 1, 5)] = 3000  # above the archive's
    block.archive_slot_counters(0)
    assert block.words[block.worker_cell(block.archive_slot, "quota_origin_ns", 1, 5)] == 3000
    assert {word: block.words[archive + word] for word in expected} == expected
    assert not any(block.words[base + 4:base + block.worker_table.words])
    assert block.slot_state(0) == STATE_FREE
