"""Idempotent-producer state of one partition: `<partition dir>/producers`, shared by every
process through `mmap`, read and written only under the partition lock.

As Kafka does, the metadata of a producer's last five batches is kept, so a retried batch is
recognised as a duplicate and answered with its original offset instead of being appended
again.  Entries are kept until `producer.id.expiration.ms` after the producer's last write
(Kafka's rule), however many producers come and go: the table grows (doubling, up to
`pybroker.max.producers.per.partition` entries) instead of evicting live ones.  Only at that
bound, with every entry live, is the least recently used producer forgotten.  An unknown
producer whose batch does not start its sequence at 0 gets UNKNOWN_PRODUCER_ID, not an append:
its client resets its producer id (Kafka's pre-KIP-360 answer, which every client handles).

Transactions (KIP-98): an entry also holds the first offset of the producer's ongoing
transaction on this partition (`begin_if_none` on its first transactional batch, `end` on its
marker), from which the partition computes its last stable offset.  Such an entry is never
expired nor evicted at the bound: forgetting it would lose the LSO (the table then grows past
the bound rather than drop one).

Layout (8-byte words): a header, then `capacity` entries, open addressing on the producer id
with linear probing:

    header  0 magic   1 capacity   2 live entries   3 tombstones   4 resizing (non-zero while
            the table is rewritten: a crash then leaves it to be reset)   5..7 reserved
    entry   0 producer id (-1 free, -2 tombstone)   1 epoch   2 last use (append count)
            3 batches cached (0..5)   4 ring position   5..19 five (first seq, last seq, base
            offset)   20 last write, unix ms   21 first offset of the ongoing transaction + 1
            (0: none, so a zeroed file means none)

A file of another layout (an older MAGIC) is reset on first use, as a bad one is: its
producers are forgotten (their next batch at a sequence past 0 gets UNKNOWN_PRODUCER_ID).

Growing rewrites the file in place (ftruncate, then every live entry re-placed).  A process
holds the table as a mapping only (broker.shared.log.mapping: no descriptor); whoever changes
the file's size first bumps a generation word in the partition's state (which never shrinks),
so the others map it again at their next use, before touching a page the file may no longer
have.
"""

from __future__ import annotations

import os
import time
from enum import Enum
from typing import NamedTuple

from broker.shared.log.mapping import Mapping

FILE_NAME = "producers"
MAGIC = int.from_bytes(b"PYBRKPR2", "little")  # PR1: 21 words, no transactions
HEADER_WORDS = 8
ENTRY_WORDS = 22
FIRST_CAPACITY = 64
CACHED_BATCHES = 5
SEQUENCE_MODULUS = 2**31
FREE, TOMBSTONE = -1, -2
H_MAGIC, H_CAPACITY, H_LIVE, H_TOMBSTONES, H_RESIZING = range(5)
E_ID, E_EPOCH, E_USE, E_CACHED, E_RING = range(5)
E_BATCHES, E_WRITTEN, E_TXN = 5, 20, 21  # E_TXN: first offset of the open txn + 1


class Verdict(Enum):
    APPEND = "append"
    DUPLICATE = "duplicate"
    OUT_OF_ORDER = "out_of_order_sequence_number"
    FENCED = "invalid_producer_epoch"
    UNKNOWN = "unknown_producer_id"


class ProducerTable:
    """One thread's handle on a partition's producer file (mapped on first use).

    `state` and `generation_word`: the partition's state words and the one counting changes
    of this file's size; without them (a table on its own) the size is looked up instead."""

    def __init__(self, directory: str, expiration_ms: int, max_entries: int,
                 state: memoryview | None = None, generation_word: int = 0):
        self.path = os.path.join(directory, FILE_NAME)
        self.expiration_ms = expiration_ms
        self.max_entries = max(FIRST_CAPACITY, max_entries)
        self._state = state
        self._generation_word = generation_word
        self._seen_generation = -1
        self._map: Mapping | None = None
        self.words: memoryview | None = None
        self._mapped = 0

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
        self._map, self.words, self._mapped = None, None, 0

    # --- the file ---------------------------------------------------------------------------

    def _open(self) -> None:
        """Map the file (again, if another process changed its size); create or reset it
        if needed."""
        if self.words is None or self._size_changed():
            self._map_file()
        words = self.words
        if words is None or words[H_MAGIC] != MAGIC or words[H_RESIZING] or \
                self._mapped != 8 * (HEADER_WORDS + words[H_CAPACITY] * ENTRY_WORDS):
            self.reset()

    def _size_changed(self) -> bool:
        if self._state is not None:
            return self._state[self._generation_word] != self._seen_generation
        try:
            return os.stat(self.path).st_size != self._mapped
        except FileNotFoundError:
            return True

    def _map_file(self, size: int | None = None, create: bool = True) -> None:
        """Map the file as it is now, after setting its size to `size` if given (the
        generation bumped first, so other processes never touch a page it lost)."""
        fd = os.open(self.path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
        try:
            if size is not None:
                self._bump_generation()
                os.ftruncate(fd, size)
            if self._state is not None:
                self._seen_generation = self._state[self._generation_word]
            self._remap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)

    def _bump_generation(self) -> None:
        if self._state is not None:
            self._state[self._generation_word] += 1

    def _remap(self, fd: int, size: int) -> None:
        self.close()
        self._mapped = size
        if size >= 8 * HEADER_WORDS:
            self._map = Mapping(fd, size)
            self.words = self._map.words

    def reset(self, capacity: int = FIRST_CAPACITY) -> None:
        """An empty table (a new partition, a lost or half-rewritten file)."""
        size = 8 * (HEADER_WORDS + capacity * ENTRY_WORDS)
        self._map_file(0)
        self._map_file(size)
        words = self.words
        for entry in range(capacity):
            words[HEADER_WORDS + entry * ENTRY_WORDS] = FREE
        words[H_CAPACITY], words[H_LIVE], words[H_TOMBSTONES] = capacity, 0, 0
        words[H_RESIZING] = 0
        words[H_MAGIC] = MAGIC

    def clear(self) -> None:
        """Forget every producer (the partition's state is rebuilt); the file, if any, is
        emptied in place so that every process sees it, and made again on first use."""
        if self._map is None and not os.path.exists(self.path):
            return
        self._map_file(0, create=False)

    def flush(self) -> None:
        if self._map is not None:
            self._map.flush()

    # --- lookups ------------------------------------------------------------------------------

    def _at(self, entry: int) -> int:
        return HEADER_WORDS + entry * ENTRY_WORDS

    def _find(self, producer_id: int) -> int | None:
        words, capacity = self.words, self.words[H_CAPACITY]
        entry = hash(producer_id) % capacity
        for _ in range(capacity):
            found = words[self._at(entry)]
            if found == producer_id:
                return entry
            if found == FREE:
                return None
            entry = (entry + 1) % capacity
        return None

    def _expired(self, entry: int, now_ms: int) -> bool:
        at = self._at(entry)
        if self.words[at + E_TXN]:  # an open transaction holds the LSO: kept until it ends
            return False
        return self.words[at + E_WRITTEN] + self.expiration_ms < now_ms

    # --- checking and recording -------------------------------------------------------------

    def check(self, producer_id: int, epoch: int, first_seq: int, last_seq: int,
              now_ms: int | None = None):
        """(Verdict, base offset of the duplicate or None) for a batch about to be appended."""
        self._open()
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        entry = self._find(producer_id)
        if entry is None or self._expired(entry, now_ms):
            # Unknown (or forgotten after producer.id.expiration.ms): only a fresh sequence.
            return (Verdict.APPEND if first_seq == 0 else Verdict.UNKNOWN), None
        at = self._at(entry)
        words = self.words
        stored_epoch = words[at + E_EPOCH]
        if epoch < stored_epoch:
            return Verdict.FENCED, None
        if epoch > stored_epoch:
            return (Verdict.APPEND if first_seq == 0 else Verdict.OUT_OF_ORDER), None
        cached = words[at + E_CACHED]
        if not cached:  # known by its epoch alone (a marker fenced it): sequences restart
            return (Verdict.APPEND if first_seq == 0 else Verdict.OUT_OF_ORDER), None
        for slot in range(cached):
            cell = at + E_BATCHES + 3 * slot
            if words[cell] == first_seq and words[cell + 1] == last_seq:
                return Verdict.DUPLICATE, words[cell + 2]
        newest = (words[at + E_RING] - 1) % CACHED_BATCHES
        expected = (words[at + E_BATCHES + 3 * newest + 1] + 1) % SEQUENCE_MODULUS
        if first_seq != expected:
            return Verdict.OUT_OF_ORDER, None
        return Verdict.APPEND, None

    def record(self, producer_id: int, epoch: int, first_seq: int, last_seq: int,
               base_offset: int, use: int, now_ms: int | None = None) -> None:
        """Remember an appended batch (after `check` said APPEND, or found in the log)."""
        self._open()
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        entry = self._find(producer_id)
        words = self.words
        if entry is None:
            entry = self._insert(producer_id, now_ms)
            words = self.words  # the table may have been rewritten larger
        at = self._at(entry)
        if words[at + E_EPOCH] != epoch or self._expired(entry, now_ms):
            words[at + E_EPOCH], words[at + E_CACHED], words[at + E_RING] = epoch, 0, 0
        ring = words[at + E_RING]
        cell = at + E_BATCHES + 3 * ring
        words[cell], words[cell + 1], words[cell + 2] = first_seq, last_seq, base_offset
        words[at + E_RING] = (ring + 1) % CACHED_BATCHES
        words[at + E_CACHED] = min(CACHED_BATCHES, words[at + E_CACHED] + 1)
        words[at + E_USE] = use
        words[at + E_WRITTEN] = now_ms

    # --- transactions (call under the partition lock) -----------------------------------------

    def begin_if_none(self, producer_id: int, epoch: int, first_offset: int,
                      now_ms: int | None = None) -> bool:
        """A transactional batch at `first_offset` was appended: it opens the producer's
        transaction here unless one is open already.  Returns whether it opened one."""
        self._open()
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        entry = self._find(producer_id)
        if entry is None:  # a batch without sequence numbers was not recorded: known now
            entry = self._insert(producer_id, now_ms)
            self.words[self._at(entry) + E_EPOCH] = epoch
        at = self._at(entry)
        if self.words[at + E_TXN]:
            return False
        self.words[at + E_TXN] = first_offset + 1
        return True

    def end(self, producer_id: int, epoch: int, now_ms: int | None = None) -> int | None:
        """A marker of `epoch` ended the producer's transaction: the first offset it had here
        (None: none was open).  A higher epoch becomes the entry's, made if missing, so that
        the bumped epoch fences a zombie's later batches here too."""
        self._open()
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        entry = self._find(producer_id)
        if entry is None:
            entry = self._insert(producer_id, now_ms)
        words = self.words
        at = self._at(entry)
        if epoch > words[at + E_EPOCH]:  # the old epoch's sequences mean nothing now
            words[at + E_EPOCH], words[at + E_CACHED], words[at + E_RING] = epoch, 0, 0
            words[at + E_WRITTEN] = now_ms
        first = words[at + E_TXN]
        words[at + E_TXN] = 0
        return first - 1 if first else None

    def epoch_of(self, producer_id: int) -> int | None:
        """The epoch the table knows the producer at (None: unknown or expired)."""
        self._open()
        entry = self._find(producer_id)
        if entry is None or self._expired(entry, int(time.time() * 1000)):
            return None
        return self.words[self._at(entry) + E_EPOCH]

    def first_offset(self, producer_id: int) -> int | None:
        """Where the producer's ongoing transaction here starts (None: no transaction)."""
        self._open()
        entry = self._find(producer_id)
        first = 0 if entry is None else self.words[self._at(entry) + E_TXN]
        return first - 1 if first else None

    def ongoing(self) -> list[tuple[int, int, int]]:
        """(producer id, epoch, first offset) of every ongoing transaction, by first offset.
        Two strided slices of the map, not a Python loop over every entry: a marker recomputes
        the partition's LSO from them."""
        if self._map is None and not os.path.exists(self.path):
            return []  # no producer ever wrote here: no file made just to say so
        self._open()
        words, starts = self.words, HEADER_WORDS
        ids = words[starts + E_ID::ENTRY_WORDS].tolist()
        firsts = words[starts + E_TXN::ENTRY_WORDS].tolist()
        found = [(producer_id, words[self._at(entry) + E_EPOCH], firsts[entry] - 1)
                 for entry, producer_id in enumerate(ids)
                 if firsts[entry] and producer_id >= 0]  # free slots may hold stale words
        return sorted(found, key=lambda item: item[2])

    def _insert(self, producer_id: int, now_ms: int) -> int:
        words = self.words
        capacity = words[H_CAPACITY]
        if (words[H_LIVE] + words[H_TOMBSTONES] + 1) * 4 > capacity * 3:  # load factor 3/4
            if capacity * 2 <= self.max_entries or words[H_TOMBSTONES] * 8 > capacity:
                self._rebuild(now_ms)
                words, capacity = self.words, self.words[H_CAPACITY]
            while (words[H_LIVE] + 1) * 4 > capacity * 3:  # at the bound, every entry live:
                evicted = self._least_recent()  # the least recently used goes
                if evicted is None:  # all in transactions: grow past the bound instead
                    self._rebuild(now_ms, grow=True)
                    words, capacity = self.words, self.words[H_CAPACITY]
                    break
                self._forget(evicted)
        entry = hash(producer_id) % capacity
        while words[self._at(entry)] not in (FREE, TOMBSTONE):
            entry = (entry + 1) % capacity
        at = self._at(entry)
        if words[at] == TOMBSTONE:
            words[H_TOMBSTONES] -= 1
        words[at + E_EPOCH], words[at + E_CACHED], words[at + E_RING] = -1, 0, 0
        words[at + E_WRITTEN], words[at + E_TXN] = now_ms, 0
        words[at] = producer_id
        words[H_LIVE] += 1
        return entry

    def _forget(self, entry: int) -> None:
        self.words[self._at(entry)] = TOMBSTONE
        self.words[H_LIVE] -= 1
        self.words[H_TOMBSTONES] += 1

    def _least_recent(self) -> int | None:
        """The least recently used entry without an open transaction (None: there is none)."""
        words = self.words
        live = [entry for entry in range(words[H_CAPACITY])
                if words[self._at(entry)] >= 0 and not words[self._at(entry) + E_TXN]]
        return min(live, key=lambda entry: words[self._at(entry) + E_USE], default=None)

    def _rebuild(self, now_ms: int, grow: bool = False) -> None:
        """Drop expired producers and tombstones; double the capacity if still crowded (with
        `grow`, even past the bound: every entry holds an open transaction)."""
        words = self.words
        kept = []
        for entry in range(words[H_CAPACITY]):
            at = self._at(entry)
            if words[at] >= 0 and not self._expired(entry, now_ms):
                kept.append(bytes(words[at:at + ENTRY_WORDS]))
        capacity = words[H_CAPACITY]
        while (len(kept) + 1) * 2 > capacity and (grow or capacity * 2 <= self.max_entries):
            capacity *= 2
        words[H_RESIZING] = 1  # a crash from here on leaves a table to reset, not a wrong one
        self._map_file(8 * (HEADER_WORDS + capacity * ENTRY_WORDS))
        words = self.words
        for entry in range(capacity):
            words[self._at(entry)] = FREE
        words[H_CAPACITY], words[H_LIVE], words[H_TOMBSTONES] = capacity, 0, 0
        for raw in kept:
            values = memoryview(raw).cast("q")
            entry = hash(values[E_ID]) % capacity
            while words[self._at(entry)] != FREE:
                entry = (entry + 1) % capacity
            words[self._at(entry):self._at(entry) + ENTRY_WORDS] = values
            words[H_LIVE] += 1
        words[H_RESIZING] = 0

    def live(self) -> int:
        self._open()
        return self.words[H_LIVE]

    def states(self, now_ms: int | None = None) -> list["ProducerState"]:
        """Every producer not expired that wrote here or has a transaction open, by id (for
        DescribeProducers); call under the partition lock."""
        self._open()
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        words, found = self.words, []
        for entry in range(words[H_CAPACITY]):
            at = self._at(entry)
            if words[at] < 0 or self._expired(entry, now_ms):
                continue
            if not words[at + E_CACHED] and not words[at + E_TXN]:
                continue  # only fenced by a marker: nothing written to describe
            sequence = -1
            if words[at + E_CACHED]:
                newest = (words[at + E_RING] - 1) % CACHED_BATCHES
                sequence = words[at + E_BATCHES + 3 * newest + 1]
            found.append(ProducerState(words[at], words[at + E_EPOCH], sequence,
                                       words[at + E_WRITTEN], words[at + E_TXN] - 1))
        return sorted(found)


class ProducerState(NamedTuple):
    """One producer as DescribeProducers shows it."""

    producer_id: int
    epoch: int
    last_sequence: int  # -1: no batch with sequence numbers
    last_timestamp: int  # ms of its last write
    current_txn_start_offset: int  # -1: no transaction open here
