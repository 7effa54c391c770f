"""Idempotent-producer state of one partition, kept in the partition's shared state file.

The table has ENTRIES entries of ENTRY_WORDS 8-byte words, read and written only under the
partition lock:

    0 producer id (-1 = free)   1 producer epoch   2 last use (the partition's append count)
    3 batches cached (0..5)     4 ring position    5..19 five (first seq, last seq, base offset)

As Kafka does, the metadata of a producer's last five batches is kept, so a retried batch is
recognised as a duplicate and answered with its original offset instead of being appended
again.  A full table evicts the least recently used producer.
"""

from __future__ import annotations

from enum import Enum

ENTRIES = 64
ENTRY_WORDS = 20
TABLE_WORDS = ENTRIES * ENTRY_WORDS
CACHED_BATCHES = 5
SEQUENCE_MODULUS = 2**31


class Verdict(Enum):
    APPEND = "append"
    DUPLICATE = "duplicate"
    OUT_OF_ORDER = "out_of_order_sequence_number"
    FENCED = "invalid_producer_epoch"


class ProducerTable:
    """A view over the table words; `words` is a memoryview cast to 'q'."""

    def __init__(self, words: memoryview, first_word: int):
        self.words = words
        self.base = first_word
        self._slots: dict[int, int] = {}  # producer id -> entry index, checked before use

    def reset(self) -> None:
        for entry in range(ENTRIES):
            self.words[self._at(entry)] = -1
        self._slots.clear()

    def _at(self, entry: int) -> int:
        return self.base + entry * ENTRY_WORDS

    def _find(self, producer_id: int) -> int | None:
        entry = self._slots.get(producer_id)
        if entry is not None and self.words[self._at(entry)] == producer_id:
            return entry
        for entry in range(ENTRIES):
            if self.words[self._at(entry)] == producer_id:
                self._slots[producer_id] = entry
                return entry
        return None

    def check(self, producer_id: int, epoch: int, first_seq: int, last_seq: int):
        """(Verdict, base offset of the duplicate or None) for a batch about to be appended."""
        entry = self._find(producer_id)
        if entry is None:
            return Verdict.APPEND, None  # unknown producers start anywhere (KIP-360)
        at = self._at(entry)
        words = self.words
        stored_epoch = words[at + 1]
        if epoch < stored_epoch:
            return Verdict.FENCED, None
        if epoch > stored_epoch:
            return (Verdict.APPEND if first_seq == 0 else Verdict.OUT_OF_ORDER), None
        cached = words[at + 3]
        for slot in range(cached):
            cell = at + 5 + 3 * slot
            if words[cell] == first_seq and words[cell + 1] == last_seq:
                return Verdict.DUPLICATE, words[cell + 2]
        if cached:
            newest = (words[at + 4] - 1) % CACHED_BATCHES
            expected = (words[at + 5 + 3 * newest + 1] + 1) % SEQUENCE_MODULUS
            if first_seq != expected:
                return Verdict.OUT_OF_ORDER, None
        return Verdict.APPEND, None

    def record(self, producer_id: int, epoch: int, first_seq: int, last_seq: int,
               base_offset: int, use: int) -> None:
        """Remember an appended batch (call after `check` said APPEND)."""
        entry = self._find(producer_id)
        words = self.words
        if entry is None or words[self._at(entry) + 1] != epoch:
            entry = entry if entry is not None else self._victim()
            at = self._at(entry)
            words[at + 1], words[at + 3], words[at + 4] = epoch, 0, 0
            words[at] = producer_id
            self._slots[producer_id] = entry
        at = self._at(entry)
        ring = words[at + 4]
        cell = at + 5 + 3 * ring
        words[cell], words[cell + 1], words[cell + 2] = first_seq, last_seq, base_offset
        words[at + 4] = (ring + 1) % CACHED_BATCHES
        words[at + 3] = min(CACHED_BATCHES, words[at + 3] + 1)
        words[at + 2] = use

    def _victim(self) -> int:
        oldest, chosen = None, 0
        for entry in range(ENTRIES):
            at = self._at(entry)
            if self.words[at] == -1:
                return entry
            if oldest is None or self.words[at + 2] < oldest:
                oldest, chosen = self.words[at + 2], entry
        self._slots.pop(self.words[self._at(chosen)], None)
        return chosen
