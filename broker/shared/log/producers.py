"""Idempotent-producer state of one partition: `<partition dir>/producers`, shared by every
process through `mmap`, read and written only under the partition lock.

As Kafka does, the metadata of a producer's last five batches is kept, so a retried batch is
recognised as a duplicate and answered with its original offset instead of being appended
again.  Entries are kept until `producer.id.expiration.ms` after the producer's last write
(Kafka's rule), however many producers come and go: the table grows (doubling, up to
`pybroker.max.producers.per.partition` entries) instead of evicting live ones.  Only at that
bound, with every entry live, is the least recently used producer forgotten: the entries
without an open transaction form a doubly linked list in order of use (each append moves its
producer to the newest end), so the one to forget is the list's oldest end, found in O(1)
however large the table.  An unknown producer whose batch does not start its sequence at 0
gets UNKNOWN_PRODUCER_ID, not an append:
its client resets its producer id (Kafka's pre-KIP-360 answer, which every client handles).

Transactions (KIP-98): an entry also holds the first offset of the producer's ongoing
transaction on this partition (`begin_if_none` on its first transactional batch, `end` on its
marker), from which the partition computes its last stable offset.  Such an entry is never
expired nor evicted at the bound: forgetting it would lose the LSO (the table then grows past
the bound rather than drop one).

Layout (8-byte words): a header, then `capacity` entries, open addressing with linear probing
on a keyed hash of the producer id (BLAKE2b under the table's own random key: producer ids are
the client's to choose, and ids picked to share a slot would otherwise make one probe run of
the whole table, walked at every append):

    header  0 magic   1 capacity   2 live entries   3 unused (0)   4 resizing (non-zero while
            the table is rewritten or entries move: a crash then leaves it to be reset)
            5 least recently used entry + 1   6 most recently used entry + 1 (0: the list is
            empty)   7 relinking (non-zero while the list's links change)   8 the hash key
            (0: none yet, made on first use)   9..15 reserved
    entry   0 producer id (-1 free)   1 epoch   2 last use (the partition's append count, or
            the newest's when known otherwise)   3 batches cached (0..5)   4 ring position
            5..19 five (first seq, last seq, base offset)   20 last write, unix ms   21 first
            offset of the ongoing transaction + 1 (0: none, so a zeroed file means none)
            22 the next older entry in the list + 1   23 the next newer + 1   24 the id's hash

Forgetting an entry shifts the entries after it in its probe run back over the hole (Knuth's
deletion for linear probing), so there are no tombstones: a probe run is as long as the keys
that share it, never longer for the producers that came and went.

The list holds every live entry without an open transaction (those are never evicted, so
they leave it while their transaction is open and come back at its newest end when it ends).
Links are entry numbers + 1, so a zeroed file holds an empty list.  A writer killed while it
changes links (word 7 set) leaves them to the next user, which links the list again from the
entries' last-use words (sorted, once): the producers are kept, their order approximately.

A file of another layout (an older MAGIC) is reset on first use, as a bad one is: its
producers are forgotten (their next batch at a sequence past 0 gets UNKNOWN_PRODUCER_ID).

Growing rewrites the file in place (ftruncate, then every live entry re-placed).  A process
holds the table as a mapping only (broker.shared.log.mapping: no descriptor); whoever changes
the file's size first bumps a generation word in the partition's state (which never shrinks),
so the others map it again at their next use, before touching a page the file may no longer
have.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from enum import Enum
from typing import NamedTuple

from broker.shared.log.mapping import Mapping

log = logging.getLogger("broker.shared.log.producers")
FILE_NAME = "producers"
MAGIC = int.from_bytes(b"PYBRKPR3", "little")  # PR2: 22 words, no use list; PR1: 21
HEADER_WORDS = 16
ENTRY_WORDS = 25
FIRST_CAPACITY = 64
CACHED_BATCHES = 5
SEQUENCE_MODULUS = 2**31
FREE = -1
H_MAGIC, H_CAPACITY, H_LIVE, H_TOMBSTONES, H_RESIZING = range(5)  # H_TOMBSTONES: always 0
H_OLDEST, H_NEWEST, H_RELINKING = 5, 6, 7  # the use list's ends (entry + 1), its crash flag
H_KEY = 8  # the hash key
E_ID, E_EPOCH, E_USE, E_CACHED, E_RING = range(5)
E_BATCHES, E_WRITTEN, E_TXN = 5, 20, 21  # E_TXN: first offset of the open txn + 1
E_OLDER, E_NEWER = 22, 23  # neighbours in the use list (entry + 1; 0: none)
E_HASH = 24  # the producer id's keyed hash: its home slot is this modulo the capacity


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
        self._hashed = (None, 0, 0)  # the last (producer id, key, hash): check, then record

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

    def _hash(self, producer_id: int) -> int:
        """The producer id's 63-bit hash under the table's key (made on first need)."""
        key = self.words[H_KEY]
        if not key:
            key = self.words[H_KEY] = int.from_bytes(os.urandom(8), "little") >> 1 or 1
        last_id, last_key, last_hash = self._hashed
        if last_id == producer_id and last_key == key:
            return last_hash
        digest = hashlib.blake2b(producer_id.to_bytes(8, "little", signed=True), digest_size=8,
                                 key=key.to_bytes(8, "little")).digest()
        found = int.from_bytes(digest, "little") >> 1
        self._hashed = (producer_id, key, found)
        return found

    def _find(self, producer_id: int) -> int | None:
        words, capacity = self.words, self.words[H_CAPACITY]
        entry = self._hash(producer_id) % capacity
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
        """Remember an appended batch (after `check` said APPEND, or found in the log);
        `use`, the partition's append count, orders the producers by their last use."""
        self._open()
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        entry = self._find(producer_id)
        words = self.words
        if entry is None:
            entry = self._insert(producer_id, now_ms, use)
            words = self.words  # the table may have been rewritten larger
        elif not words[self._at(entry) + E_TXN]:
            self._make_newest(entry)
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
        if self.words[self._at(entry) + E_TXN]:
            return False
        self._open_transaction(entry, first_offset)
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
        if first:
            self._close_transaction(entry)
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

    def _insert(self, producer_id: int, now_ms: int, use: int | None = None) -> int:
        """A new entry for the producer, at the use list's newest end (evicting the least
        recently used at the bound)."""
        words = self.words
        capacity = words[H_CAPACITY]
        if (words[H_LIVE] + 1) * 4 > capacity * 3:  # load factor 3/4
            if capacity * 2 <= self.max_entries:
                self._rebuild(now_ms)
                words, capacity = self.words, self.words[H_CAPACITY]
            while (words[H_LIVE] + 1) * 4 > capacity * 3:  # at the bound, every entry live:
                evicted = self._least_recent()  # the least recently used goes
                if evicted is None:  # all in transactions: grow past the bound instead
                    self._rebuild(now_ms, grow=True)
                    words, capacity = self.words, self.words[H_CAPACITY]
                    break
                self._forget(evicted)
        hashed = self._hash(producer_id)
        entry = hashed % capacity
        while words[self._at(entry)] != FREE:
            entry = (entry + 1) % capacity
        at = self._at(entry)
        words[at + E_HASH] = hashed
        words[at + E_EPOCH], words[at + E_CACHED], words[at + E_RING] = -1, 0, 0
        words[at + E_WRITTEN], words[at + E_TXN] = now_ms, 0
        words[at + E_USE] = self._latest_use() if use is None else use
        self._heal()
        words[H_RELINKING] = 1  # live and not linked yet
        words[at] = producer_id
        words[H_LIVE] += 1
        self._link_newest(entry)
        words[H_RELINKING] = 0
        return entry

    def _forget(self, entry: int) -> None:
        """Evict an entry of the use list; the entries after it in its probe run that may
        move back over the hole do (each probe run stays as short as its keys need)."""
        words, capacity = self.words, self.words[H_CAPACITY]
        self._heal()
        words[H_RESIZING] = 1  # entries move: a crash from here on leaves the table reset
        self._unlink(entry)
        hole = probe = entry
        for _ in range(capacity):
            probe = (probe + 1) % capacity
            at = self._at(probe)
            if words[at] == FREE:
                break
            home = words[at + E_HASH] % capacity
            if (probe - home) % capacity >= (probe - hole) % capacity:  # the hole is on its way
                self._move(probe, hole)
                hole = probe
        words[self._at(hole)] = FREE
        words[H_LIVE] -= 1
        words[H_RESIZING] = 0

    def _move(self, source: int, target: int) -> None:
        """Copy an entry to a free slot; its list neighbours point at it there."""
        words = self.words
        at, to = self._at(source), self._at(target)
        words[to:to + ENTRY_WORDS] = words[at:at + ENTRY_WORDS]
        if words[to + E_TXN]:  # not in the list
            return
        older, newer = words[to + E_OLDER], words[to + E_NEWER]
        if older:
            words[self._at(older - 1) + E_NEWER] = target + 1
        else:
            words[H_OLDEST] = target + 1
        if newer:
            words[self._at(newer - 1) + E_OLDER] = target + 1
        else:
            words[H_NEWEST] = target + 1

    def _least_recent(self) -> int | None:
        """The least recently used entry without an open transaction (None: there is none):
        the use list's oldest end."""
        self._heal()
        oldest = self.words[H_OLDEST]
        return oldest - 1 if oldest else None

    # --- the use list (under the partition lock; links are entry + 1, 0 for none) -----------

    def _make_newest(self, entry: int) -> None:
        """The producer of an entry in the list appended: it moves to the newest end."""
        words = self.words
        self._heal()
        if words[H_NEWEST] != entry + 1:
            words[H_RELINKING] = 1
            self._unlink(entry)
            self._link_newest(entry)
            words[H_RELINKING] = 0

    def _open_transaction(self, entry: int, first_offset: int) -> None:
        """The entry's transaction opens: it leaves the list (never evicted meanwhile)."""
        words = self.words
        self._heal()
        words[H_RELINKING] = 1
        self._unlink(entry)
        words[self._at(entry) + E_TXN] = first_offset + 1
        words[H_RELINKING] = 0

    def _close_transaction(self, entry: int) -> None:
        """The entry's transaction ended: it comes back at the list's newest end."""
        words, at = self.words, self._at(entry)
        self._heal()
        words[H_RELINKING] = 1
        words[at + E_TXN] = 0
        words[at + E_USE] = self._latest_use()
        self._link_newest(entry)
        words[H_RELINKING] = 0

    def _latest_use(self) -> int:
        newest = self.words[H_NEWEST]
        return self.words[self._at(newest - 1) + E_USE] if newest else 0

    def _unlink(self, entry: int) -> None:
        words, at = self.words, self._at(entry)
        older, newer = words[at + E_OLDER], words[at + E_NEWER]
        if older:
            words[self._at(older - 1) + E_NEWER] = newer
        else:
            words[H_OLDEST] = newer
        if newer:
            words[self._at(newer - 1) + E_OLDER] = older
        else:
            words[H_NEWEST] = older
        words[at + E_OLDER] = words[at + E_NEWER] = 0

    def _link_newest(self, entry: int) -> None:
        words, at = self.words, self._at(entry)
        newest = words[H_NEWEST]
        words[at + E_OLDER], words[at + E_NEWER] = newest, 0
        if newest:
            words[self._at(newest - 1) + E_NEWER] = entry + 1
        else:
            words[H_OLDEST] = entry + 1
        words[H_NEWEST] = entry + 1

    def _column(self, word: int) -> list[int]:
        """One word of every entry, in entry order (a strided slice: no Python loop)."""
        return self.words[HEADER_WORDS + word::ENTRY_WORDS].tolist()

    def _heal(self) -> None:
        """A writer died while it changed links (the flag is still set, and only a writer
        holding the partition lock sets it): link the list again, by last use."""
        words = self.words
        if not words[H_RELINKING]:
            return
        log.warning("%s: a writer died while reordering producers; ordering them again",
                    self.path)
        ids, txns, uses = self._column(E_ID), self._column(E_TXN), self._column(E_USE)
        listed = sorted((entry for entry, producer_id in enumerate(ids)
                         if producer_id >= 0 and not txns[entry]), key=uses.__getitem__)
        words[H_OLDEST] = words[H_NEWEST] = 0
        for entry in listed:
            self._link_newest(entry)
        for entry, producer_id in enumerate(ids):
            if producer_id >= 0 and txns[entry]:
                words[self._at(entry) + E_OLDER] = words[self._at(entry) + E_NEWER] = 0
        words[H_RELINKING] = 0

    def _by_use(self, now_ms: int) -> list[int]:
        """The live entries not expired: those with a transaction open, then the use list
        from its oldest end."""
        self._heal()
        words, ids, txns = self.words, self._column(E_ID), self._column(E_TXN)
        found = [entry for entry, producer_id in enumerate(ids)
                 if producer_id >= 0 and txns[entry]]
        link = words[H_OLDEST]
        for _ in range(words[H_LIVE]):  # bounded even if a link were wrong
            if not link:
                break
            found.append(link - 1)
            link = words[self._at(link - 1) + E_NEWER]
        return [entry for entry in found if not self._expired(entry, now_ms)]

    def _rebuild(self, now_ms: int, grow: bool = False) -> None:
        """Drop expired producers; double the capacity if still crowded (with `grow`, even
        past the bound: every entry holds an open transaction)."""
        words = self.words
        kept = [bytes(words[self._at(entry):self._at(entry) + ENTRY_WORDS])
                for entry in self._by_use(now_ms)]  # in order of use: relinked as they were
        capacity = words[H_CAPACITY]
        while (len(kept) + 1) * 2 > capacity and (grow or capacity * 2 <= self.max_entries):
            capacity *= 2
        words[H_RESIZING] = 1  # a crash from here on leaves a table to reset, not a wrong one
        self._map_file(8 * (HEADER_WORDS + capacity * ENTRY_WORDS))
        words = self.words
        for entry in range(capacity):
            words[self._at(entry)] = FREE
        words[H_CAPACITY], words[H_LIVE], words[H_TOMBSTONES] = capacity, 0, 0
        words[H_OLDEST] = words[H_NEWEST] = words[H_RELINKING] = 0
        for raw in kept:
            values = memoryview(raw).cast("q")
            entry = values[E_HASH] % capacity
            while words[self._at(entry)] != FREE:
                entry = (entry + 1) % capacity
            at = self._at(entry)
            words[at:at + ENTRY_WORDS] = values
            words[at + E_OLDER] = words[at + E_NEWER] = 0
            if not values[E_TXN]:
                self._link_newest(entry)
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
        # Columns read at C speed: Python looks at three words of a free or expired entry.
        ids, cached, txns = self._column(E_ID), self._column(E_CACHED), self._column(E_TXN)
        written, oldest_kept = self._column(E_WRITTEN), now_ms - self.expiration_ms
        for entry, producer_id in enumerate(ids):
            if producer_id < 0:
                continue
            if not txns[entry] and (not cached[entry] or written[entry] < oldest_kept):
                continue  # expired, or only fenced by a marker: nothing written to describe
            at = self._at(entry)
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
