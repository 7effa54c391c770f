"""The producer table's eviction at its bound (broker/shared/log/producers.py): the least
recently used producer without an open transaction goes, found in O(1); entries move back
over a forgotten one instead of leaving tombstones; ids a client picks cannot share a probe
run; a writer killed mid-change leaves a table that is reset or still right."""

import random
from collections import OrderedDict

import pytest

from broker.shared.log import producers as table_module
from broker.shared.log.producers import ProducerTable

LIVE_AT_BOUND = 48  # 64 slots at load factor 3/4


def new_table(tmp_path, max_entries: int = 64) -> ProducerTable:
    return ProducerTable(str(tmp_path), expiration_ms=10**12, max_entries=max_entries)


def listed(table: ProducerTable) -> list[int]:
    """Producer ids along the use list, oldest first."""
    words, ids, link = table.words, [], table.words[table_module.H_OLDEST]
    while link:
        at = table._at(link - 1)
        ids.append(words[at])
        link = words[at + table_module.E_NEWER]
    return ids


def check_consistent(table: ProducerTable) -> None:
    """Every live entry is found from its home slot; the list holds exactly the live entries
    without a transaction, linked both ways."""
    words, capacity = table.words, table.words[table_module.H_CAPACITY]
    live, idle = 0, set()
    for entry in range(capacity):
        at = table._at(entry)
        if words[at] == table_module.FREE:
            continue
        live += 1
        assert table._find(words[at]) == entry
        assert words[at + table_module.E_HASH] == table._hash(words[at])
        if not words[at + table_module.E_TXN]:
            idle.add(words[at])
    assert words[table_module.H_LIVE] == live
    forward = listed(table)
    assert sorted(forward) == sorted(idle)
    backward, link = [], words[table_module.H_NEWEST]
    while link:
        at = table._at(link - 1)
        backward.append(words[at])
        link = words[at + table_module.E_OLDER]
    assert backward == forward[::-1]


def record(table: ProducerTable, producer_id: int, use: int) -> None:
    table.record(producer_id, 0, use, use, use, use=use)


def forgotten(table: ProducerTable, producer_id: int) -> bool:
    """The producer's next sequence is refused as unknown (its entry is gone)."""
    return table.check(producer_id, 0, 10**6, 10**6)[0].value == "unknown_producer_id"


def test_the_least_recently_used_producer_goes_first(tmp_path):
    table = new_table(tmp_path)
    for producer in range(1, LIVE_AT_BOUND + 1):
        record(table, producer, producer)
    record(table, 1, 100)  # 1 used again: 2 is now the least recent
    record(table, 1000, 101)
    assert forgotten(table, 2)
    assert table.check(1, 0, 100, 100)[0].value == "duplicate"  # kept
    record(table, 1001, 102)
    assert forgotten(table, 3) and not forgotten(table, 4)
    assert listed(table)[:2] == [4, 5] and listed(table)[-3:] == [1, 1000, 1001]
    check_consistent(table)
    table.close()


def test_producers_in_a_transaction_are_never_evicted_and_rejoin_as_newest(tmp_path):
    table = new_table(tmp_path)
    for producer in range(1, LIVE_AT_BOUND + 1):
        record(table, producer, producer)
    table.begin_if_none(1, 0, 0)  # the least recent, but in a transaction
    record(table, 1000, 100)
    assert table.first_offset(1) == 0
    assert forgotten(table, 2)  # instead
    assert table.end(1, 0) == 0
    assert listed(table)[-1] == 1  # back as the most recent
    record(table, 1001, 101)
    assert forgotten(table, 3) and not forgotten(table, 1)
    check_consistent(table)
    table.close()


def test_eviction_follows_a_model_lru_through_random_appends_and_transactions(tmp_path):
    """A reference LRU (an OrderedDict) and the table agree after every step."""
    chance = random.Random(7)
    table = new_table(tmp_path, max_entries=256)
    model: OrderedDict[int, None] = OrderedDict()  # idle producers, least recent first
    in_txn: set[int] = set()
    table.live()  # opened
    for use in range(1, 3000):
        producer = chance.randrange(600)
        action = chance.random()
        if action < 0.8:
            record(table, producer, use)
            if producer not in in_txn:
                model.pop(producer, None)
                model[producer] = None
        elif action < 0.9 and producer in model and len(in_txn) < 20:
            table.begin_if_none(producer, 0, use)
            del model[producer]
            in_txn.add(producer)
        elif in_txn:
            ending = chance.choice(sorted(in_txn))
            table.end(ending, 0)
            in_txn.discard(ending)
            model[ending] = None
        capacity = table.words[table_module.H_CAPACITY]
        while len(model) + len(in_txn) > capacity * 3 // 4:
            model.popitem(last=False)
        assert listed(table) == list(model)
    check_consistent(table)
    assert {producer for producer, _, _ in table.ongoing()} == in_txn
    table.close()


def test_ids_picked_to_share_a_slot_do_not_make_a_long_probe_run(tmp_path):
    """Multiples of the capacity all had slot 0 when the slot was the id modulo the
    capacity: one run of every entry, walked by each new id."""
    table = new_table(tmp_path, max_entries=4096)
    for n in range(3000):
        record(table, n * 65536, n + 1)
    words, capacity = table.words, table.words[table_module.H_CAPACITY]
    assert capacity == 4096
    distances = []
    for entry in range(capacity):
        at = table._at(entry)
        if words[at] != table_module.FREE:
            distances.append((entry - words[at + table_module.E_HASH] % capacity) % capacity)
    assert len(distances) == 3000
    assert sum(distances) / len(distances) < 8 and max(distances) < 200
    table.close()


def test_eviction_leaves_no_tombstones_and_probe_runs_stay_short(tmp_path):
    """Thousands of producers through a full table: every entry is found from its home slot
    and the free slots stay a quarter of the table."""
    table = new_table(tmp_path, max_entries=1024)
    for producer in range(20_000):
        record(table, producer, producer + 1)
    words, capacity = table.words, table.words[table_module.H_CAPACITY]
    assert capacity == 1024 and words[table_module.H_LIVE] == 768
    assert listed(table) == list(range(20_000 - 768, 20_000))
    check_consistent(table)
    table.close()


def test_a_writer_killed_while_relinking_leaves_the_order_to_be_rebuilt(tmp_path):
    table = new_table(tmp_path)
    for producer in range(1, 11):
        record(table, producer, producer)
    words = table.words
    at = table._at(table._find(5))
    words[table_module.H_RELINKING] = 1  # killed between unlinking 5 and linking it again
    words[at + table_module.E_OLDER] = words[at + table_module.E_NEWER] = 0
    words[table._at(table._find(4)) + table_module.E_NEWER] = table._find(6) + 1
    words[table._at(table._find(6)) + table_module.E_OLDER] = table._find(4) + 1
    other = new_table(tmp_path)  # another process's handle
    record(other, 3, 11)
    assert listed(other) == [1, 2, 4, 5, 6, 7, 8, 9, 10, 3]  # by last use
    assert other.words[table_module.H_RELINKING] == 0
    check_consistent(other)
    other.close()
    table.close()


def test_a_writer_killed_while_entries_move_leaves_the_table_reset(tmp_path):
    table = new_table(tmp_path)
    for producer in range(1, 11):
        record(table, producer, producer)
    table.words[table_module.H_RESIZING] = 1  # killed in the middle of a shift
    other = new_table(tmp_path)
    assert other.live() == 0 and other.check(5, 0, 6, 6)[0].value == "unknown_producer_id"
    other.close()
    table.close()


@pytest.mark.parametrize("magic", [b"PYBRKPR2", b"PYBRKPR1"])
def test_a_file_of_an_older_layout_is_reset(tmp_path, magic):
    table = new_table(tmp_path)
    record(table, 1, 1)
    table.words[table_module.H_MAGIC] = int.from_bytes(magic, "little")
    table.close()
    reopened = new_table(tmp_path)
    assert reopened.live() == 0 and reopened.words[table_module.H_MAGIC] == table_module.MAGIC
    reopened.close()
